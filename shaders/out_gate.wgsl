// The output gate of Qwen3.5's attention, in place: attn[t][h·D + d] ·= sigmoid(gate), where
// the gate is head slot 2h + 1 of token t's QKV row (the query product interleaves each
// query head with its gate head; the row's key and value heads follow them).
//
// With ROWS, each row of `heads · head_dim` values takes one gate, qkv[t] (Qwen3.5-MoE's shared
// expert, scaled by sigmoid of its one-row gate product).

struct Params {
    heads: u32,
    head_dim: u32,
    // Head slots of a QKV row: 2·heads + 2·kv_heads.
    row_slots: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read> qkv: array<f32>;
@group(0) @binding(3) var<storage, read_write> attn: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = gid.y * nwg.x * 256u + gid.x;
    let width = p.heads * p.head_dim;
    if (id >= step.n_tokens * width) {
        return;
    }
    let t = id / width;
    let h = (id % width) / p.head_dim;
    let d = id % p.head_dim;
#if ROWS
    let gate = qkv[t];
#else
    let gate = qkv[(t * p.row_slots + 2u * h + 1u) * p.head_dim + d];
#endif
    attn[id] = attn[id] / (1.0 + exp(-gate));
}
