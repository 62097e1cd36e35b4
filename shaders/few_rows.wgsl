// The product of a few rows (a speculative verification's, a prompt rejoining its cache): like
// a decode product, it streams W once, in its own format (block formats are not expanded to
// f16 first), and multiplies each piece by every row while it is in registers. The tiles of
// matmul.wgsl and matmul_coop.wgsl compute at least a tile of rows: for four rows of
// Llama-3.1-8B in f16 on an H200, a forward pass takes 12.5 ms here against 18.5 ms there
// (docs/performance-log.md), still well short of what the weights' bytes allow.
//
// Each workgroup takes four weight rows (for GLU, two gate rows and the two up rows they pair
// with); its lanes stride over k eight values at a time and keep one vec4 of sums (over the
// four weight rows) per row of x, in named variables: GPUs keep per-invocation arrays in slow
// local memory. The workgroup then adds its lanes' sums in workgroup memory. Rows of x:
// step.n_tokens, eight to a workgroup: a step of more rows takes chunks of eight, the chunk
// being the fastest-varying part of the workgroup's index (so that the chunks of one weight
// group run together and share its reads through the cache). Each output's sum is the same
// whatever the number of rows. X is bound as vec4 words (XV; k a multiple of 8).
//
// With SUBGROUP, each subgroup adds its lanes' sums in registers and one pass over the
// subgroups' sums follows (one barrier rather than one per halving).
//
// Defines: WG, SUBGROUP and matmul_io.wgsl's (F16, QUANT and the block format, BIAS, GELU…,
// RESIDUAL, GLU).

const ROWS: u32 = 8u;

#if SUBGROUP
// Row r's sum of subgroup j at r·(WG / 4) + j (subgroups of at least four lanes).
var<workgroup> sums: array<vec4<f32>, {{WG}} / 4 * 8>;
#else
var<workgroup> sums: array<vec4<f32>, {{WG}} * 8>;
#endif

struct Eight {
    a: vec4<f32>,
    b: vec4<f32>,
}

// Weight row `o` (0..3) of group `g`: four consecutive rows, or for GLU two gate rows and
// their up rows.
fn weight_row(g: u32, o: u32) -> u32 {
#if GLU
    return select(p.n / 2u + 2u * g + o - 2u, 2u * g + o, o < 2u);
#else
    return 4u * g + o;
#endif
}

// Eight weights of row `row` from k0 (a multiple of 8).
fn w8(row: u32, k0: u32) -> Eight {
#if QUANT
    let pair = q_pair(row, k0 / 32u, p.q_scales, (k0 % 32u) / 4u);
    return Eight(pair.a, pair.b);
#else
#if F16
    let word = w[row * p.row_vecs + k0 / 8u];
    return Eight(
        vec4<f32>(unpack2x16float(word.x), unpack2x16float(word.y)),
        vec4<f32>(unpack2x16float(word.z), unpack2x16float(word.w)));
#else
    return Eight(w[row * p.row_vecs + k0 / 4u], w[row * p.row_vecs + k0 / 4u + 1u]);
#endif
#endif
}

// The four weight rows' products with row r of x at k0, added to `acc`.
fn add_row(acc: vec4<f32>, r: u32, k0: u32, w0: Eight, w1: Eight, w2: Eight, w3: Eight) -> vec4<f32> {
    let xa = xv[(r * p.k + k0) / 4u];
    let xb = xv[(r * p.k + k0) / 4u + 1u];
    return acc + vec4<f32>(
        dot(w0.a, xa) + dot(w0.b, xb),
        dot(w1.a, xa) + dot(w1.b, xb),
        dot(w2.a, xa) + dot(w2.b, xb),
        dot(w3.a, xa) + dot(w3.b, xb));
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
    let flat = wid.y * nwg.x + wid.x;
    let row_chunks = (step.n_tokens + ROWS - 1u) / ROWS;
    let g = flat / row_chunks;
    let first = (flat % row_chunks) * ROWS;
#if GLU
    let width = p.n / 2u;
    let groups = (width + 1u) / 2u;
#else
    let groups = (p.n + 3u) / 4u;
#endif
    if (g >= groups) {
        return;
    }
    let rows = min(step.n_tokens - first, ROWS);
    // Rows past the end read the last row (in bounds) and are never written.
    let last = p.n - 1u;
    let r0 = min(weight_row(g, 0u), last);
    let r1 = min(weight_row(g, 1u), last);
    let r2 = min(weight_row(g, 2u), last);
    let r3 = min(weight_row(g, 3u), last);
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    var a4 = vec4<f32>(0.0);
    var a5 = vec4<f32>(0.0);
    var a6 = vec4<f32>(0.0);
    var a7 = vec4<f32>(0.0);
    let chunks = p.k / 8u;
    for (var c = tid; c < chunks; c += {{WG}}u) {
        let k0 = 8u * c;
        let w0 = w8(r0, k0);
        let w1 = w8(r1, k0);
        let w2 = w8(r2, k0);
        let w3 = w8(r3, k0);
        a0 = add_row(a0, first, k0, w0, w1, w2, w3);
        if (rows > 1u) { a1 = add_row(a1, first + 1u, k0, w0, w1, w2, w3); }
        if (rows > 2u) { a2 = add_row(a2, first + 2u, k0, w0, w1, w2, w3); }
        if (rows > 3u) { a3 = add_row(a3, first + 3u, k0, w0, w1, w2, w3); }
        if (rows > 4u) { a4 = add_row(a4, first + 4u, k0, w0, w1, w2, w3); }
        if (rows > 5u) { a5 = add_row(a5, first + 5u, k0, w0, w1, w2, w3); }
        if (rows > 6u) { a6 = add_row(a6, first + 6u, k0, w0, w1, w2, w3); }
        if (rows > 7u) { a7 = add_row(a7, first + 7u, k0, w0, w1, w2, w3); }
    }
#if SUBGROUP
    const STRIDE = {{WG}}u / 4u;
    let sg = tid / sg_size;
    let s0 = subgroupAdd(a0);
    let s1 = subgroupAdd(a1);
    let s2 = subgroupAdd(a2);
    let s3 = subgroupAdd(a3);
    let s4 = subgroupAdd(a4);
    let s5 = subgroupAdd(a5);
    let s6 = subgroupAdd(a6);
    let s7 = subgroupAdd(a7);
    if (sg_lane == 0u) {
        sums[0u * STRIDE + sg] = s0;
        sums[1u * STRIDE + sg] = s1;
        sums[2u * STRIDE + sg] = s2;
        sums[3u * STRIDE + sg] = s3;
        sums[4u * STRIDE + sg] = s4;
        sums[5u * STRIDE + sg] = s5;
        sums[6u * STRIDE + sg] = s6;
        sums[7u * STRIDE + sg] = s7;
    }
    workgroupBarrier();
#else
    const STRIDE = {{WG}}u;
    sums[0u * {{WG}}u + tid] = a0;
    sums[1u * {{WG}}u + tid] = a1;
    sums[2u * {{WG}}u + tid] = a2;
    sums[3u * {{WG}}u + tid] = a3;
    sums[4u * {{WG}}u + tid] = a4;
    sums[5u * {{WG}}u + tid] = a5;
    sums[6u * {{WG}}u + tid] = a6;
    sums[7u * {{WG}}u + tid] = a7;
    workgroupBarrier();
    for (var s = {{WG}}u / 2u; s > 0u; s >>= 1u) {
        for (var i = tid; i < ROWS * s; i += {{WG}}u) {
            let slot = i / s;
            let lane = i % s;
            sums[slot * {{WG}}u + lane] += sums[slot * {{WG}}u + lane + s];
        }
        workgroupBarrier();
    }
#endif
    // One lane per (row of x, weight row) writes its output.
    for (var i = tid; i < rows * 4u; i += {{WG}}u) {
        let r = i / 4u;
        let o = i % 4u;
#if SUBGROUP
        var v = vec4<f32>(0.0);
        for (var j = 0u; j < {{WG}}u / sg_size; j++) {
            v += sums[r * STRIDE + j];
        }
#else
        let v = sums[r * STRIDE];
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
