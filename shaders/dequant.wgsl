// Expands a block-quantized matrix into dense f16 rows (the layout of f16 weights: rows of
// `cols` halves packed in u32 pairs) so prompts multiply at dense speed. The expansion lives in
// a scratch buffer reused by every product. Stores are arranged so that neighbouring
// invocations write neighbouring words: K-quants give each invocation one 16-byte word of a
// sub-block pair; other formats decode one 32-weight sub-block per invocation into workgroup
// memory, then the workgroup copies its 4 KiB out word by word.
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
// 64 sub-blocks of 16 words.
var<workgroup> staged: array<u32, 1024>;
#endif

@compute @workgroup_size(64)
fn main(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let group = wid.y * nwg.x + wid.x;
    let id = group * 64u + lid;
#if KQ
    // Eight invocations per sub-block pair, one output word each.
    if (id >= p.rows * {{SUBS}}u * 4u) {
        return;
    }
    let t = id % 8u;
    let pair = id / 8u;
    q_store_word(pair / ({{SUBS}}u / 2u), pair % ({{SUBS}}u / 2u), t);
#else
    let total = p.rows * {{SUBS}}u;
    if (id < total) {
        q_store(id / {{SUBS}}u, id % {{SUBS}}u, p.q_scales, lid * 16u);
    }
    workgroupBarrier();
    // A row of SUBS sub-blocks is 16·SUBS words of f16 pairs, so sub-block `id` starts at
    // word 16·id.
    let first = group * 1024u;
    for (var i = 0u; i < 16u; i++) {
        let at = i * 64u + lid;
        if (first + at < total * 16u) {
            dense[first + at] = staged[at];
        }
    }
#endif
}
