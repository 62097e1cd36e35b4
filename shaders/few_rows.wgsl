// The product of a few rows (a speculative verification's, a prompt rejoining its cache, a
// batched decode step's): like a decode product, it streams W once, in its own format (block
// formats are not expanded to f16 first), and multiplies each piece by every row while it is
// in registers. The tiles of matmul.wgsl and matmul_coop.wgsl compute at least a tile of rows:
// for four rows of Llama-3.1-8B in f16 on an H200, a forward pass takes 12.5 ms here against
// 18.5 ms there (docs/performance-log.md), still well short of what the weights' bytes allow.
//
// Workgroups as few_rows_sums.wgsl describes (eight rows of x each); lanes stride over k eight
// values at a time and keep one vec4 of sums per row of x, in named variables: GPUs keep
// per-invocation arrays in slow local memory. X is bound as vec4 words (XV; k a multiple of 8).
//
// Defines: WG, XROWS (8), SUBGROUP and matmul_io.wgsl's (F16, QUANT and the block format,
// BIAS, GELU…, RESIDUAL, GLU).

struct Eight {
    a: vec4<f32>,
    b: vec4<f32>,
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
    add_row_sums(tid, 0u, a0, sg_lane, sg_size);
    if (rows > 1u) { add_row_sums(tid, 1u, a1, sg_lane, sg_size); }
    if (rows > 2u) { add_row_sums(tid, 2u, a2, sg_lane, sg_size); }
    if (rows > 3u) { add_row_sums(tid, 3u, a3, sg_lane, sg_size); }
    if (rows > 4u) { add_row_sums(tid, 4u, a4, sg_lane, sg_size); }
    if (rows > 5u) { add_row_sums(tid, 5u, a5, sg_lane, sg_size); }
    if (rows > 6u) { add_row_sums(tid, 6u, a6, sg_lane, sg_size); }
    if (rows > 7u) { add_row_sums(tid, 7u, a7, sg_lane, sg_size); }
    workgroupBarrier();
    write_rows(tid, g, first, rows, sg_size);
}
