// Token embedding gather for the step's tokens. Token ids come from the history buffer on the
// GPU (the prompt written by the host, later tokens by the sampler), so decoding needs no
// host round trip. Marks each token as seen for the repetition penalty. Rows are multiplied by
// `scale` (Gemma's √hidden; 1 elsewhere).
//
// Defines: F16 (table stored as packed f16 pairs), POSITIONS (add a learned position table).

struct Params {
    dim: u32,
    row_stride: u32,
    vocab: u32,
    scale: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read> history: array<u32>;
#if F16
@group(0) @binding(3) var<storage, read> table: array<u32>;
#else
@group(0) @binding(3) var<storage, read> table: array<f32>;
#endif
@group(0) @binding(4) var<storage, read_write> x: array<f32>;
@group(0) @binding(5) var<storage, read_write> seen: array<atomic<u32>>;
#if POSITIONS
@group(0) @binding(6) var<storage, read> positions: array<f32>;
#endif

fn table_at(index: u32) -> f32 {
#if F16
    return unpack2x16float(table[index / 2u])[index % 2u];
#else
    return table[index];
#endif
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = gid.y * nwg.x * 64u + gid.x;
    if (id >= step.n_tokens * p.dim) {
        return;
    }
    let t = id / p.dim;
    let d = id % p.dim;
    let token = min(history[token_history(t) + token_pos(t)], p.vocab - 1u);
    var v = table_at(token * p.row_stride + d);
#if POSITIONS
    v += positions[token_pos(t) * p.dim + d];
#endif
    x[t * p.dim + d] = v * p.scale;
    if (d == 0u) {
        atomicOr(&seen[token_seen(t) + token / 32u], 1u << (token % 32u));
    }
}
