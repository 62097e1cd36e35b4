// Expands a block-quantized matrix into dense f16 rows (the layout of f16 weights: rows of
// `cols` halves packed in u32 pairs) so prompts multiply at dense speed. The expansion lives in
// a scratch buffer reused by every product. Stores are arranged so that neighbouring
// invocations write neighbouring words: K-quants give each invocation WORDS 16-byte words of
// sub-block pairs; other formats decode one 32-weight sub-block per invocation into workgroup
// memory, then the workgroup copies its 16 KiB out word by word.
//
// Defines: the block format and SUBS (see quant.wgsl), QSTORE, WORDS.

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
// 256 sub-blocks of 16 words.
var<workgroup> staged: array<u32, 4096>;
#endif

// Workgroups of 256, K-quants with several words an invocation: launched as four to sixteen
// times as many workgroups of 64, one word each, the expansion wrote at well under half the
// memory rate of an H200.
@compute @workgroup_size(256)
fn main(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let group = wid.y * nwg.x + wid.x;
#if KQ
    // Eight words per sub-block pair (word `id` of the expansion is word id % 8 of pair
    // id / 8), WORDS of them per invocation, 256 apart, so that each store of a subgroup lands
    // in consecutive words; past the end the last word is decoded again and never stored.
    let words = p.rows * {{SUBS}}u * 4u;
#for i in 0..WORDS
    {
        let id = (group * {{WORDS}}u + {{i}}u) * 256u + lid;
        let at = min(id, words - 1u);
        let pair = at / 8u;
        let word = q_word(pair / ({{SUBS}}u / 2u), pair % ({{SUBS}}u / 2u), at % 8u);
        if (id < words) {
            dense[id] = word;
        }
    }
#endfor
#else
    let id = group * 256u + lid;
    let total = p.rows * {{SUBS}}u;
    if (id < total) {
        q_store(id / {{SUBS}}u, id % {{SUBS}}u, p.q_scales, lid * 16u);
    }
    workgroupBarrier();
    // A row of SUBS sub-blocks is 16·SUBS words of f16 pairs, so sub-block `id` starts at
    // word 16·id.
    let first = group * 4096u;
    for (var i = 0u; i < 16u; i++) {
        let at = i * 256u + lid;
        if (first + at < total * 16u) {
            dense[first + at] = staged[at];
        }
    }
#endif
}
