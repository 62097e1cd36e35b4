// What the few-row products (few_rows.wgsl, few_rows_int8.wgsl) share around their loops over
// k. A weight group is four weight rows (four consecutive rows, or for GLU two gate rows and
// the two up rows they pair with); a workgroup takes WGROUPS consecutive weight groups, each
// with GROUP_LANES = WG / WGROUPS lanes, and a chunk of XROWS rows of x, the chunk being the
// fastest-varying part of its index, so that the chunks of one weight group run together and
// share its reads through the cache. The weight groups of one workgroup walk k side by side,
// so each piece of x they read is fetched once for all of them. Each lane ends its loop with
// a vec4 of sums (over the four weight rows) per row of x; add_row_sums adds one row's over
// the lane group, write_rows writes the outputs through matmul_io.wgsl's epilogues. Each
// output is summed alike whatever the number of rows.
//
// Defines: WG, WGROUPS (with SUBGROUP, subgroups never span two lane groups), XROWS,
// SUBGROUP, GLU.

const WGROUPS: u32 = {{WGROUPS}}u;
const GROUP_LANES: u32 = {{WG}}u / WGROUPS;

#if SUBGROUP
// Row r's sum of subgroup j at r·(WG / 4) + j (subgroups of at least four lanes).
var<workgroup> row_sums: array<vec4<f32>, {{WG}} / 4 * {{XROWS}}>;
#else
var<workgroup> lane_sums: array<vec4<f32>, {{WG}}>;
// Row r's sum of lane group j at r·WGROUPS + j.
var<workgroup> row_sums: array<vec4<f32>, {{XROWS}} * {{WGROUPS}}>;
#endif

// Weight groups of four weight rows (for GLU, two outputs each).
fn weight_groups() -> u32 {
#if GLU
    return (p.n / 2u + 1u) / 2u;
#else
    return (p.n + 3u) / 4u;
#endif
}

// Workgroup `flat`'s first weight group and first row of x.
fn group_and_first(flat: u32) -> vec2<u32> {
    let chunks = (step.n_tokens + {{XROWS}}u - 1u) / {{XROWS}}u;
    return vec2<u32>(flat / chunks * WGROUPS, (flat % chunks) * {{XROWS}}u);
}

// The weight group of lane group `slot` in a workgroup whose first is `g0`: a group past the
// last computes the last one again and writes nothing (see write_rows), so that every lane
// reaches the workgroup's barriers.
fn lane_group(g0: u32, slot: u32) -> u32 {
    return min(g0 + slot, weight_groups() - 1u);
}

// Weight row `o` (0..3) of group `g`, clamped into the matrix: rows past the end are computed
// on the last row and never written.
fn weight_row(g: u32, o: u32) -> u32 {
#if GLU
    let row = select(p.n / 2u + 2u * g + o - 2u, 2u * g + o, o < 2u);
#else
    let row = 4u * g + o;
#endif
    return min(row, p.n - 1u);
}

// Adds row r's lane sums `v` over each lane group. Every invocation calls it alike, row after
// row; a barrier follows the last row's before write_rows.
fn add_row_sums(tid: u32, r: u32, v: vec4<f32>, sg_lane: u32, sg_size: u32) {
#if SUBGROUP
    let s = subgroupAdd(v);
    if (sg_lane == 0u) {
        row_sums[r * ({{WG}}u / 4u) + tid / sg_size] = s;
    }
#else
    lane_sums[tid] = v;
    workgroupBarrier();
    for (var half = GROUP_LANES / 2u; half > 0u; half >>= 1u) {
        if (tid % GROUP_LANES < half) {
            lane_sums[tid] += lane_sums[tid + half];
        }
        workgroupBarrier();
    }
    if (tid % GROUP_LANES == 0u) {
        row_sums[r * WGROUPS + tid / GROUP_LANES] = lane_sums[tid];
    }
    workgroupBarrier();
#endif
}

// Writes the outputs of the workgroup's weight groups (from g0) for rows first .. first + rows
// of x: one lane per (weight group, row of x, weight row).
fn write_rows(tid: u32, g0: u32, first: u32, rows: u32, sg_size: u32) {
    for (var i = tid; i < rows * 4u * WGROUPS; i += {{WG}}u) {
        let slot = i / (rows * 4u);
        let r = i % (rows * 4u) / 4u;
        let o = i % 4u;
        let g = g0 + slot;
        if (g >= weight_groups()) {
            continue;
        }
#if SUBGROUP
        var v = vec4<f32>(0.0);
        let per_group = GROUP_LANES / sg_size;
        for (var j = slot * per_group; j < (slot + 1u) * per_group; j++) {
            v += row_sums[r * ({{WG}}u / 4u) + j];
        }
#else
        let v = row_sums[r * WGROUPS + slot];
#endif
        let row = first + r;
#if GLU
        let width = p.n / 2u;
        let col = 2u * g + o;
        if (o < 2u && col < width) {
            y[row * width + col] = glu_epilogue(v[o], v[o + 2u], col);
        }
#else
        let col = 4u * g + o;
        if (col < p.n) {
            y[row * p.n + col] = epilogue(v[o], row, col);
        }
#endif
    }
}
