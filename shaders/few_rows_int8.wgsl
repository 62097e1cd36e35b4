// The product of a few rows over the block formats that have int8 products (Q8_0, Q4_0, Q4_1,
// Q4_K, Q5_K, Q6_K): batched decode steps and prompts of a few rows. As in few_rows.wgsl, W is
// streamed once in its blocks and each piece is multiplied by every row while in registers;
// but the rows arrive quantized to int8 in 32-value blocks (quant_rows.wgsl) and the products
// are packed integer dots, as in the decode products (q_dot8_fetched in quant.wgsl). The float
// few-row products decode every weight to f32 for every eight values, which bounds them on
// block formats.
//
// Workgroups as few_rows_sums.wgsl describes; lanes stride over the row's units (sub-blocks,
// or sub-block pairs with KPAIR), load a unit of all four weight rows, and keep a vec4 of sums
// per row of x, in named variables: GPUs keep per-invocation arrays in slow local memory.
//
// Defines: WG, XROWS, UNITS (units per weight row), UNIT_WORDS (words of int8 input a unit
// takes: 8, or 16 for a sub-block pair), LEVELS (with XQ8_FINE, 2), SUBGROUP, quant.wgsl's
// (QDOT, XQ8, KPAIR or XQ8_VIEW, the format) and matmul_io.wgsl's epilogues.

// The int8 rows, level after level of row after row (see quant_rows.wgsl): within a level,
// word j of unit u at j·UNITS + u, so that lanes, which take consecutive units, read
// consecutive words.
@group(0) @binding(7) var<storage, read> xq: array<u32>;
@group(0) @binding(9) var<storage, read> xqd: array<vec2<f32>>;

const LEVELS: u32 = {{LEVELS}}u;

// quant.wgsl's int8 products name the input by level: here a level is a row's level, and
// word i of it is word i % UNIT_WORDS of unit i / UNIT_WORDS.
fn xq_at(level: u32, i: u32) -> u32 {
    return level * (p.k / 4u) + (i % {{UNIT_WORDS}}u) * {{UNITS}}u + i / {{UNIT_WORDS}}u;
}

fn xqd_at(level: u32, b: u32) -> vec2<f32> {
    return xqd[level * (p.k / 32u) + b];
}

// quant.wgsl's float decode products (q_dot, q_dot_pairs) come with QDOT; this kernel never
// calls them, but they must compile.
const ROW_STEP: u32 = 1u;
fn xin4(base: u32, k0: u32) -> vec4<f32> {
    return vec4<f32>(0.0);
}

// One unit of a weight row against row `row` of x, every level.
fn row_dot(f: QFetch, unit: u32, row: u32) -> f32 {
    var d = q_dot8_fetched(f, unit, row * LEVELS);
#if XQ8_FINE
    d += q_dot8_fetched(f, unit, row * LEVELS + 1u);
#endif
    return d;
}

fn unit_dots(f0: QFetch, f1: QFetch, f2: QFetch, f3: QFetch, unit: u32, row: u32) -> vec4<f32> {
    return vec4<f32>(row_dot(f0, unit, row), row_dot(f1, unit, row), row_dot(f2, unit, row),
                     row_dot(f3, unit, row));
}

@compute @workgroup_size({{WG}})
fn main(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
#if SUBGROUP
    @builtin(subgroup_invocation_id) sg_lane: u32,
    @builtin(subgroup_size) sg_size: u32,
#endif
) {
#if !SUBGROUP
    let sg_lane = 0u;
    let sg_size = 1u;
#endif
    let at = group_and_first(wid.y * nwg.x + wid.x);
    let g = at.x;
    let first = at.y;
    if (g >= weight_groups()) {
        return;
    }
    let rows = min(step.n_tokens - first, {{XROWS}}u);
    let r0 = weight_row(g, 0u);
    let r1 = weight_row(g, 1u);
    let r2 = weight_row(g, 2u);
    let r3 = weight_row(g, 3u);
#for r in 0..XROWS
    var a{{r}} = vec4<f32>(0.0);
#endfor
    for (var u = tid; u < {{UNITS}}u; u += {{WG}}u) {
        let f0 = q_fetch8(r0, u, p.q_scales);
        let f1 = q_fetch8(r1, u, p.q_scales);
        let f2 = q_fetch8(r2, u, p.q_scales);
        let f3 = q_fetch8(r3, u, p.q_scales);
#for r in 0..XROWS
        if (rows > {{r}}u) {
            a{{r}} += unit_dots(f0, f1, f2, f3, u, first + {{r}}u);
        }
#endfor
    }
#for r in 0..XROWS
    if (rows > {{r}}u) {
        add_row_sums(tid, {{r}}u, a{{r}}, sg_lane, sg_size);
    }
#endfor
    workgroupBarrier();
    write_rows(tid, g, first, rows, sg_size);
}
