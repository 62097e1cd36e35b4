// The product of a few rows over the block formats that have int8 products (Q8_0, Q4_0, Q4_1,
// Q4_K, Q5_K, Q6_K): batched decode steps and prompts of a few rows. As in few_rows.wgsl, W is
// streamed once in its blocks and each piece is multiplied by every row while in registers;
// but the rows arrive quantized to int8 in 32-value blocks (quant_rows.wgsl) and the products
// are packed integer dots, as in the decode products (q_dot8_fetched in quant.wgsl). The float
// few-row products decode every weight to f32 for every eight values, which bounds them on
// block formats.
//
// Workgroups as few_rows_sums.wgsl describes; each lane group's lanes stride over the row's
// units (sub-blocks, or sub-block pairs with KPAIR), load a unit of all four weight rows, and
// keep a vec4 of sums per row of x, in named variables: GPUs keep per-invocation arrays in slow
// local memory. The int8 rows of x come from global memory, through the cache that lane groups
// side by side share.
//
// Defines: WG, WGROUPS, XROWS, UNITS (units per weight row), UNIT_WORDS (words of int8 input a unit
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

#if KPAIR
// A weight row's sub-block pair decoded once for every row of x: its quants as packed bytes
// (lo: sub-block 2·u, hi: 2·u + 1) and its scales and shifts. q_dot8_fetched decodes them
// again for every row and level; the products below are the same integer sums and the same
// float expression, so every result is bit for bit what it gives.
struct UnitQuants {
    lo0: vec4<u32>,
    lo1: vec4<u32>,
    hi0: vec4<u32>,
    hi1: vec4<u32>,
    scale: vec2<f32>,
    shift: vec2<f32>,
}

fn unit_quants(f: QFetch) -> UnitQuants {
    let kp = k_pair_of(f);
    return UnitQuants(
        vec4<u32>(k_quants8(kp.q[0], kp.h[0], kp.pair, 0u), k_quants8(kp.q[1], kp.h[1], kp.pair, 0u),
                  k_quants8(kp.q[2], kp.h[2], kp.pair, 0u), k_quants8(kp.q[3], kp.h[3], kp.pair, 0u)),
        vec4<u32>(k_quants8(kp.q[4], kp.h[4], kp.pair, 0u), k_quants8(kp.q[5], kp.h[5], kp.pair, 0u),
                  k_quants8(kp.q[6], kp.h[6], kp.pair, 0u), k_quants8(kp.q[7], kp.h[7], kp.pair, 0u)),
        vec4<u32>(k_quants8(kp.q[0], kp.h[0], kp.pair, 1u), k_quants8(kp.q[1], kp.h[1], kp.pair, 1u),
                  k_quants8(kp.q[2], kp.h[2], kp.pair, 1u), k_quants8(kp.q[3], kp.h[3], kp.pair, 1u)),
        vec4<u32>(k_quants8(kp.q[4], kp.h[4], kp.pair, 1u), k_quants8(kp.q[5], kp.h[5], kp.pair, 1u),
                  k_quants8(kp.q[6], kp.h[6], kp.pair, 1u), k_quants8(kp.q[7], kp.h[7], kp.pair, 1u)),
        kp.scale, kp.shift);
}

// A row of x's int8 words for unit u at one level, loaded once for the four weight rows.
struct UnitInput {
    lo0: vec4<u32>,
    lo1: vec4<u32>,
    hi0: vec4<u32>,
    hi1: vec4<u32>,
    d_lo: vec2<f32>,
    d_hi: vec2<f32>,
}

fn unit_input(u: u32, level: u32) -> UnitInput {
    let w = 16u * u;
    return UnitInput(
        vec4<u32>(xq[xq_at(level, w)], xq[xq_at(level, w + 1u)], xq[xq_at(level, w + 2u)],
                  xq[xq_at(level, w + 3u)]),
        vec4<u32>(xq[xq_at(level, w + 4u)], xq[xq_at(level, w + 5u)], xq[xq_at(level, w + 6u)],
                  xq[xq_at(level, w + 7u)]),
        vec4<u32>(xq[xq_at(level, w + 8u)], xq[xq_at(level, w + 9u)], xq[xq_at(level, w + 10u)],
                  xq[xq_at(level, w + 11u)]),
        vec4<u32>(xq[xq_at(level, w + 12u)], xq[xq_at(level, w + 13u)], xq[xq_at(level, w + 14u)],
                  xq[xq_at(level, w + 15u)]),
        xqd_at(level, 2u * u), xqd_at(level, 2u * u + 1u));
}

fn dot4x4(a: vec4<u32>, b: vec4<u32>) -> i32 {
    return dot4I8Packed(a.x, b.x) + dot4I8Packed(a.y, b.y) + dot4I8Packed(a.z, b.z)
        + dot4I8Packed(a.w, b.w);
}

fn quants_dot(w: UnitQuants, x: UnitInput) -> f32 {
    let lo = dot4x4(w.lo0, x.lo0) + dot4x4(w.lo1, x.lo1);
    let hi = dot4x4(w.hi0, x.hi0) + dot4x4(w.hi1, x.hi1);
    return w.scale.x * x.d_lo.x * f32(lo) + w.scale.y * x.d_hi.x * f32(hi)
        - (w.shift.x * x.d_lo.y + w.shift.y * x.d_hi.y);
}

// The four weight rows' unit against row `row` of x, every level.
fn quants_dots(w0: UnitQuants, w1: UnitQuants, w2: UnitQuants, w3: UnitQuants, u: u32,
               row: u32) -> vec4<f32> {
    let x = unit_input(u, row * LEVELS);
    var d = vec4<f32>(quants_dot(w0, x), quants_dot(w1, x), quants_dot(w2, x), quants_dot(w3, x));
#if XQ8_FINE
    let xf = unit_input(u, row * LEVELS + 1u);
    d += vec4<f32>(quants_dot(w0, xf), quants_dot(w1, xf), quants_dot(w2, xf), quants_dot(w3, xf));
#endif
    return d;
}
#endif

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
    let first = at.y;
    if (at.x >= weight_groups()) {
        return;
    }
    let g = lane_group(at.x, tid / GROUP_LANES);
    let lane = tid % GROUP_LANES;
    let rows = min(step.n_tokens - first, {{XROWS}}u);
    let r0 = weight_row(g, 0u);
    let r1 = weight_row(g, 1u);
    let r2 = weight_row(g, 2u);
    let r3 = weight_row(g, 3u);
#for r in 0..XROWS
    var a{{r}} = vec4<f32>(0.0);
#endfor
    for (var u = lane; u < {{UNITS}}u; u += GROUP_LANES) {
        let f0 = q_fetch8(r0, u, p.q_scales);
        let f1 = q_fetch8(r1, u, p.q_scales);
        let f2 = q_fetch8(r2, u, p.q_scales);
        let f3 = q_fetch8(r3, u, p.q_scales);
#if KPAIR
        let w0 = unit_quants(f0);
        let w1 = unit_quants(f1);
        let w2 = unit_quants(f2);
        let w3 = unit_quants(f3);
#for r in 0..XROWS
        if (rows > {{r}}u) {
            a{{r}} += quants_dots(w0, w1, w2, w3, u, first + {{r}}u);
        }
#endfor
#else
#for r in 0..XROWS
        if (rows > {{r}}u) {
            a{{r}} += unit_dots(f0, f1, f2, f3, u, first + {{r}}u);
        }
#endfor
#endif
    }
#for r in 0..XROWS
    if (rows > {{r}}u) {
        add_row_sums(tid, {{r}}u, a{{r}}, sg_lane, sg_size);
    }
#endfor
    workgroupBarrier();
    write_rows(tid, at.x, first, rows, sg_size);
}
