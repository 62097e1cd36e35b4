// Expands a block-quantized matrix into dense f16 rows (the layout of f16 weights: rows of
// `cols` halves packed in u32 pairs) so prompts multiply at dense speed; one invocation per
// 32-weight sub-block (per pair of them for the K formats). The expansion lives in a scratch buffer reused by every product.
//
// Defines: the block format and SUBS (see quant.wgsl), QSTORE.

struct Params {
    rows: u32,
    q_scales: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
#if KQ
@group(0) @binding(4) var<storage, read_write> dense: array<vec4<u32>>;
#else
@group(0) @binding(4) var<storage, read_write> dense: array<u32>;
#endif

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = gid.y * nwg.x * 64u + gid.x;
#if KQ
    // K-quants: one invocation per sub-block pair, whole 16-byte loads and stores.
    if (id >= p.rows * {{SUBS}}u / 2u) {
        return;
    }
    q_store_pair(id / ({{SUBS}}u / 2u), id % ({{SUBS}}u / 2u));
#else
    if (id >= p.rows * {{SUBS}}u) {
        return;
    }
    let row = id / {{SUBS}}u;
    let s = id % {{SUBS}}u;
    // A row of SUBS sub-blocks is 16·SUBS words of f16 pairs.
    q_store(row, s, p.q_scales, (row * {{SUBS}}u + s) * 16u);
#endif
}
