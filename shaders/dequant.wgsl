// Expands a block-quantized matrix into dense f16 rows (the layout of f16 weights: rows of
// `cols` halves packed in u32 pairs) so prompts multiply at dense speed; one invocation per
// 32-weight sub-block. The expansion lives in a scratch buffer reused by every product.
//
// Defines: the block format and SUBS (see quant.wgsl), QSTORE.

struct Params {
    rows: u32,
    q_scales: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(4) var<storage, read_write> dense: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = gid.y * nwg.x * 64u + gid.x;
    if (id >= p.rows * {{SUBS}}u) {
        return;
    }
    let row = id / {{SUBS}}u;
    let s = id % {{SUBS}}u;
    // A row of SUBS sub-blocks is 16·SUBS words of f16 pairs.
    q_store(row, s, p.q_scales, (row * {{SUBS}}u + s) * 16u);
}
