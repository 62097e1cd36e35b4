// Token embedding gather from a block-quantized table (GGUF keeps its embedding quantized, and
// a tied LM head multiplies by the same blocks): one invocation per (token, 32-weight
// sub-block of its row). Token ids come from the GPU history buffer; tokens are marked seen
// for the repetition penalty. Rows are multiplied by `scale` (Gemma's √hidden; 1 elsewhere).
//
// Defines: the block format and SUBS (see quant.wgsl), QGATHER.

struct Params {
    dim: u32,
    q_scales: u32,
    vocab: u32,
    scale: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read> history: array<u32>;
@group(0) @binding(4) var<storage, read_write> x: array<f32>;
@group(0) @binding(5) var<storage, read_write> seen: array<atomic<u32>>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = gid.y * nwg.x * 64u + gid.x;
    if (id >= step.n_tokens * {{SUBS}}u) {
        return;
    }
    let t = id / {{SUBS}}u;
    let s = id % {{SUBS}}u;
    let token = min(history[token_history(t) + token_pos(t)], p.vocab - 1u);
    let at = t * p.dim + 32u * s;
    q_gather(token, s, p.q_scales, at);
    if (p.scale != 1.0) {
        for (var i = 0u; i < 32u; i++) {
            x[at + i] *= p.scale;
        }
    }
    if (s == 0u) {
        atomicOr(&seen[token_seen(t) + token / 32u], 1u << (token % 32u));
    }
}
