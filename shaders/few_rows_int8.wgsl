// The product of a few rows over the block formats that have int8 products (Q8_0, Q4_0, Q4_1,
// Q4_K, Q5_K, Q6_K): batched decode steps. As in few_rows.wgsl, W is streamed once in its
// blocks and each piece is multiplied by every row while in registers; but the rows arrive
// quantized to int8 in 32-value blocks (quant_rows.wgsl) and the products are packed integer
// dots, as in the decode products (q_dot8_fetched in quant.wgsl). The float few-row products
// decode every weight to f32 for every eight values, which bounds them on block formats.
//
// Each workgroup takes four weight rows (for GLU, two gate rows and the two up rows they pair
// with) and a chunk of XROWS rows of x; the chunk is the fastest-varying part of the
// workgroup's index, so the chunks of one weight group run together and share its reads
// through the cache. Lanes stride over the row's units (sub-blocks, or sub-block pairs with
// KPAIR), load a unit of all four weight rows, and keep a vec4 of sums (over the four weight
// rows) per row of x, in named variables: GPUs keep per-invocation arrays in slow local memory.
//
// Defines: WG, XROWS, UNITS (units per weight row), UNIT_WORDS (words of int8 input a unit
// takes: 8, or 16 for a sub-block pair), LEVELS (with XQ8_FINE, 2), SUBGROUP,
// quant.wgsl's (QDOT, XQ8, KPAIR or XQ8_VIEW, the format) and matmul_io.wgsl's epilogues.

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

#if SUBGROUP
// Row r's sum of subgroup j at r·(WG / 4) + j (subgroups of at least four lanes).
var<workgroup> row_sums: array<vec4<f32>, {{WG}} / 4 * {{XROWS}}>;
#else
var<workgroup> lane_sums: array<vec4<f32>, {{WG}}>;
var<workgroup> row_sums: array<vec4<f32>, {{XROWS}}>;
#endif

// Weight row `o` (0..3) of group `g`: four consecutive rows, or for GLU two gate rows and
// their up rows.
fn weight_row(g: u32, o: u32) -> u32 {
#if GLU
    return select(p.n / 2u + 2u * g + o - 2u, 2u * g + o, o < 2u);
#else
    return 4u * g + o;
#endif
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

// Adds the lanes' sums of one row of x (every invocation calls it alike: it synchronises).
#if !SUBGROUP
fn reduce_row(tid: u32, r: u32, v: vec4<f32>) {
    lane_sums[tid] = v;
    workgroupBarrier();
    for (var s = {{WG}}u / 2u; s > 0u; s >>= 1u) {
        if (tid < s) {
            lane_sums[tid] += lane_sums[tid + s];
        }
        workgroupBarrier();
    }
    if (tid == 0u) {
        row_sums[r] = lane_sums[0];
    }
    workgroupBarrier();
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
    let flat = wid.y * nwg.x + wid.x;
    let chunks = (step.n_tokens + {{XROWS}}u - 1u) / {{XROWS}}u;
    let g = flat / chunks;
    let first = (flat % chunks) * {{XROWS}}u;
#if GLU
    let width = p.n / 2u;
    let groups = (width + 1u) / 2u;
#else
    let groups = (p.n + 3u) / 4u;
#endif
    if (g >= groups) {
        return;
    }
    let rows = min(step.n_tokens - first, {{XROWS}}u);
    // Rows past the end read the last row (in bounds) and are never written.
    let last = p.n - 1u;
    let r0 = min(weight_row(g, 0u), last);
    let r1 = min(weight_row(g, 1u), last);
    let r2 = min(weight_row(g, 2u), last);
    let r3 = min(weight_row(g, 3u), last);
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
#if SUBGROUP
    const STRIDE = {{WG}}u / 4u;
    let sg = tid / sg_size;
#for r in 0..XROWS
    {
        let s = subgroupAdd(a{{r}});
        if (sg_lane == 0u) {
            row_sums[{{r}}u * STRIDE + sg] = s;
        }
    }
#endfor
    workgroupBarrier();
#else
#for r in 0..XROWS
    if (rows > {{r}}u) {
        reduce_row(tid, {{r}}u, a{{r}});
    }
#endfor
#endif
    // One lane per (row of x, weight row) writes its output.
    for (var i = tid; i < rows * 4u; i += {{WG}}u) {
        let r = i / 4u;
        let o = i % 4u;
#if SUBGROUP
        var v = vec4<f32>(0.0);
        for (var j = 0u; j < {{WG}}u / sg_size; j++) {
            v += row_sums[r * STRIDE + j];
        }
#else
        let v = row_sums[r];
#endif
        let row = first + r;
#if GLU
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
