// Tiled matrix-matrix product for prompts: Y[m][n] = Σ_k X[m][k] · W[n][k] for the
// step's n_tokens rows. 64×64 output tiles, 16-wide k slices staged in workgroup memory,
// 4×4 outputs per invocation. W rows are padded to whole vec4 words (f16 packed in u32 pairs).
//
// With SPLIT_K, workgroup z of the grid takes the z-th slice of k and writes its partial tile
// to a scratch buffer; `reduce` then sums the slices and applies the epilogue. Prompts of a
// few hundred tokens give too few output tiles to fill a large GPU otherwise.
//
// Defines: F16, EPV (4 for f32, 8 for f16), BIAS, GELU (tanh form), GELU_ERF, QUICK_GELU,
// RESIDUAL (Y += ...), RELU (after the residual), SPLIT_K, CONV (X is a convolution's input,
// see `Conv`), BIG (128-wide tiles, see below).

// The bindings, epilogue and k-slice reduction are in matmul_io.wgsl.

#if BIG
// 128×128 output tiles, 8×8 outputs per invocation in two 4-row and two 4-column groups 64
// apart, so neighbouring invocations read neighbouring workgroup-memory words. Twice the
// arithmetic per staged value of the 64-wide tile: for products with thousands of rows (an
// image's pixels). No k split. Written out without private arrays: a dynamically indexed one
// would live in slow local memory.
const TILE: u32 = 128u;
const BK: u32 = 16u;

// [k][m/4] and [k][n/4], rows padded by one vec4: the invocations staging one row's 16 k
// values write 33 words apart, which spreads them over the memory banks (32 apart would put
// all of them in one bank).
const ROW: u32 = 33u;
var<workgroup> xs: array<vec4<f32>, 528>;
var<workgroup> ws: array<vec4<f32>, 528>;

// Stages X[m0 + mm][col] (zero outside the product; for a convolution, tap `tap` = (ky, kx,
// channel) from the corner (cy, cx)).
fn stage_x(m0: u32, mm: u32, col: u32, cy: i32, cx: i32, tap: vec3<u32>) {
    var v = 0.0;
#if CONV
    let iy = cy + i32(tap.x);
    let ix = cx + i32(tap.y);
    let inside = iy >= 0 && ix >= 0 && iy < i32(cv.in_h << cv.up) && ix < i32(cv.in_w << cv.up);
    if (m0 + mm < step.n_tokens && col < p.k && inside) {
        v = x[((u32(iy) >> cv.up) * cv.in_w + (u32(ix) >> cv.up)) * cv.cin + tap.z];
    }
#else
    if (m0 + mm < step.n_tokens && col < p.k) {
        v = x[(m0 + mm) * p.k + col];
    }
#endif
    xs[(col % BK) * ROW + mm / 4u][mm % 4u] = v;
}

// Writes four consecutive outputs of a row through the epilogue.
fn store4(row: u32, col0: u32, v: vec4<f32>) {
    if (row >= step.n_tokens) {
        return;
    }
    for (var j = 0u; j < 4u; j++) {
        let col = col0 + j;
        if (col < p.n) {
            y[row * p.n + col] = epilogue(v[j], row, col);
        }
    }
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let m0 = wid.y * TILE;
    let n0 = wid.x * TILE;
    let tx = tid % 16u;
    let ty = tid / 16u;
    // This invocation stages k = kk of rows r + 16·i.
    let kk = tid % BK;
    let r = tid / BK;
    let cy0 = corner(m0 + r + 0u).x;
    let cx0 = corner(m0 + r + 0u).y;
    let cy1 = corner(m0 + r + 16u).x;
    let cx1 = corner(m0 + r + 16u).y;
    let cy2 = corner(m0 + r + 32u).x;
    let cx2 = corner(m0 + r + 32u).y;
    let cy3 = corner(m0 + r + 48u).x;
    let cx3 = corner(m0 + r + 48u).y;
    let cy4 = corner(m0 + r + 64u).x;
    let cx4 = corner(m0 + r + 64u).y;
    let cy5 = corner(m0 + r + 80u).x;
    let cx5 = corner(m0 + r + 80u).y;
    let cy6 = corner(m0 + r + 96u).x;
    let cx6 = corner(m0 + r + 96u).y;
    let cy7 = corner(m0 + r + 112u).x;
    let cx7 = corner(m0 + r + 112u).y;
    var c0 = vec4<f32>(0.0);
    var c1 = vec4<f32>(0.0);
    var c2 = vec4<f32>(0.0);
    var c3 = vec4<f32>(0.0);
    var c4 = vec4<f32>(0.0);
    var c5 = vec4<f32>(0.0);
    var c6 = vec4<f32>(0.0);
    var c7 = vec4<f32>(0.0);
    var c8 = vec4<f32>(0.0);
    var c9 = vec4<f32>(0.0);
    var c10 = vec4<f32>(0.0);
    var c11 = vec4<f32>(0.0);
    var c12 = vec4<f32>(0.0);
    var c13 = vec4<f32>(0.0);
    var c14 = vec4<f32>(0.0);
    var c15 = vec4<f32>(0.0);
    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        let col = k0 + kk;
#if CONV
        let t = col / cv.cin;
        let tap = vec3<u32>(t / cv.ksize, t % cv.ksize, col % cv.cin);
#else
        let tap = vec3<u32>(0u);
#endif
        stage_x(m0, r + 0u, col, cy0, cx0, tap);
        stage_x(m0, r + 16u, col, cy1, cx1, tap);
        stage_x(m0, r + 32u, col, cy2, cx2, tap);
        stage_x(m0, r + 48u, col, cy3, cx3, tap);
        stage_x(m0, r + 64u, col, cy4, cx4, tap);
        stage_x(m0, r + 80u, col, cy5, cx5, tap);
        stage_x(m0, r + 96u, col, cy6, cx6, tap);
        stage_x(m0, r + 112u, col, cy7, cx7, tap);
#if F16
        {
            let nn = tid / 2u;
            let kv = tid % 2u;
            let vec_index = k0 / 8u + kv;
            var word = vec4<u32>(0u);
            if (n0 + nn < p.n && vec_index < p.row_vecs && vec_index * 8u < p.k) {
                word = w[(n0 + nn) * p.row_vecs + vec_index];
            }
            let base = kv * 8u * ROW + nn / 4u;
            let lane = nn % 4u;
            let v0 = unpack2x16float(word.x);
            let v1 = unpack2x16float(word.y);
            let v2 = unpack2x16float(word.z);
            let v3 = unpack2x16float(word.w);
            ws[base][lane] = v0.x;
            ws[base + ROW][lane] = v0.y;
            ws[base + 2u * ROW][lane] = v1.x;
            ws[base + 3u * ROW][lane] = v1.y;
            ws[base + 4u * ROW][lane] = v2.x;
            ws[base + 5u * ROW][lane] = v2.y;
            ws[base + 6u * ROW][lane] = v3.x;
            ws[base + 7u * ROW][lane] = v3.y;
        }
#else
        for (var half = 0u; half < 2u; half++) {
            let nn = tid / 4u + half * 64u;
            let kv = tid % 4u;
            let vec_index = k0 / 4u + kv;
            var vals = vec4<f32>(0.0);
            if (n0 + nn < p.n && vec_index < p.row_vecs && vec_index * 4u < p.k) {
                vals = w[(n0 + nn) * p.row_vecs + vec_index];
            }
            let base = kv * 4u * ROW + nn / 4u;
            let lane = nn % 4u;
            ws[base][lane] = vals.x;
            ws[base + ROW][lane] = vals.y;
            ws[base + 2u * ROW][lane] = vals.z;
            ws[base + 3u * ROW][lane] = vals.w;
        }
#endif
        workgroupBarrier();
        for (var k = 0u; k < BK; k++) {
            let a0 = xs[k * ROW + ty];
            let a1 = xs[k * ROW + 16u + ty];
            let b0 = ws[k * ROW + tx];
            let b1 = ws[k * ROW + 16u + tx];
            c0 += a0.x * b0;
            c1 += a0.x * b1;
            c2 += a0.y * b0;
            c3 += a0.y * b1;
            c4 += a0.z * b0;
            c5 += a0.z * b1;
            c6 += a0.w * b0;
            c7 += a0.w * b1;
            c8 += a1.x * b0;
            c9 += a1.x * b1;
            c10 += a1.y * b0;
            c11 += a1.y * b1;
            c12 += a1.z * b0;
            c13 += a1.z * b1;
            c14 += a1.w * b0;
            c15 += a1.w * b1;
        }
        workgroupBarrier();
    }
    store4(m0 + 0u + ty * 4u + 0u, n0 + 0u + tx * 4u, c0);
    store4(m0 + 0u + ty * 4u + 0u, n0 + 64u + tx * 4u, c1);
    store4(m0 + 0u + ty * 4u + 1u, n0 + 0u + tx * 4u, c2);
    store4(m0 + 0u + ty * 4u + 1u, n0 + 64u + tx * 4u, c3);
    store4(m0 + 0u + ty * 4u + 2u, n0 + 0u + tx * 4u, c4);
    store4(m0 + 0u + ty * 4u + 2u, n0 + 64u + tx * 4u, c5);
    store4(m0 + 0u + ty * 4u + 3u, n0 + 0u + tx * 4u, c6);
    store4(m0 + 0u + ty * 4u + 3u, n0 + 64u + tx * 4u, c7);
    store4(m0 + 64u + ty * 4u + 0u, n0 + 0u + tx * 4u, c8);
    store4(m0 + 64u + ty * 4u + 0u, n0 + 64u + tx * 4u, c9);
    store4(m0 + 64u + ty * 4u + 1u, n0 + 0u + tx * 4u, c10);
    store4(m0 + 64u + ty * 4u + 1u, n0 + 64u + tx * 4u, c11);
    store4(m0 + 64u + ty * 4u + 2u, n0 + 0u + tx * 4u, c12);
    store4(m0 + 64u + ty * 4u + 2u, n0 + 64u + tx * 4u, c13);
    store4(m0 + 64u + ty * 4u + 3u, n0 + 0u + tx * 4u, c14);
    store4(m0 + 64u + ty * 4u + 3u, n0 + 64u + tx * 4u, c15);
}
#else
const TILE: u32 = 64u;
const BK: u32 = 16u;

// [k][m/4] and [k][n/4]: each invocation reads one vec4 of each per k. Rows padded by one
// vec4 so the invocations staging one row's 16 k values hit different memory banks.
const ROW: u32 = 17u;
var<workgroup> xs: array<vec4<f32>, 272>;
var<workgroup> ws: array<vec4<f32>, 272>;

@compute @workgroup_size(256)
fn main(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let m_rows = step.n_tokens;
    // This workgroup's slice of k, whole BK steps (all of k without SPLIT_K).
    let slice = (((p.k + nwg.z - 1u) / nwg.z + BK - 1u) / BK) * BK;
    let k_begin = min(wid.z * slice, p.k);
    let k_end = min(k_begin + slice, p.k);
    let m0 = wid.y * TILE;
    let n0 = wid.x * TILE;
    let tx = tid % 16u;
    let ty = tid / 16u;
    var acc: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i++) {
        acc[i] = vec4<f32>(0.0);
    }
#if CONV
    // The top-left input pixel of each output row this invocation loads.
    var conv_y: array<i32, 4>;
    var conv_x: array<i32, 4>;
    for (var i = 0u; i < 4u; i++) {
        let row = m0 + (tid + i * 256u) / BK;
        conv_y[i] = i32((row / cv.out_w) * cv.stride) - i32(cv.pad);
        conv_x[i] = i32((row % cv.out_w) * cv.stride) - i32(cv.pad);
    }
#endif
    for (var k0 = k_begin; k0 < k_end; k0 += BK) {
        // X tile: 64 rows × 16 k, four values per invocation.
#if CONV
        {
            // One k per invocation across its four rows: the tap and channel are worked out
            // once per tile, the rows' corners once per product (above).
            let kk = tid % BK;
            let col = k0 + kk;
            let ci = col % cv.cin;
            let tap = col / cv.cin;
            let ky = i32(tap / cv.ksize);
            let kx = i32(tap % cv.ksize);
            let in_h = i32(cv.in_h << cv.up);
            let in_w = i32(cv.in_w << cv.up);
            for (var i = 0u; i < 4u; i++) {
                let mm = (tid + i * 256u) / BK;
                let iy = conv_y[i] + ky;
                let ix = conv_x[i] + kx;
                var v = 0.0;
                if (m0 + mm < m_rows && col < k_end && iy >= 0 && ix >= 0 && iy < in_h && ix < in_w) {
                    v = x[((u32(iy) >> cv.up) * cv.in_w + (u32(ix) >> cv.up)) * cv.cin + ci];
                }
                xs[kk * ROW + mm / 4u][mm % 4u] = v;
            }
        }
#else
        for (var i = 0u; i < 4u; i++) {
            let idx = tid + i * 256u;
            let mm = idx / BK;
            let kk = idx % BK;
            let row = m0 + mm;
            let col = k0 + kk;
            var v = 0.0;
            if (row < m_rows && col < k_end) {
                v = x[row * p.k + col];
            }
            xs[kk * ROW + mm / 4u][mm % 4u] = v;
        }
#endif
        // W tile: 64 rows × 16 k.
#if QUANT
        if (tid < 128u) {
            // Eight consecutive k of one row, from its 32-weight sub-block.
            let nn = tid / 2u;
            let hh = tid % 2u;
            let kk = k0 + 8u * hh;
            var a = vec4<f32>(0.0);
            var b = vec4<f32>(0.0);
            if (n0 + nn < p.n && kk < k_end) {
                let pair = q_pair(n0 + nn, kk / 32u, p.q_scales, (kk % 32u) / 4u);
                a = pair.a;
                b = pair.b;
            }
            for (var c = 0u; c < 4u; c++) {
                ws[(8u * hh + c) * ROW + nn / 4u][nn % 4u] = a[c];
                ws[(8u * hh + 4u + c) * ROW + nn / 4u][nn % 4u] = b[c];
            }
        }
#else
#if F16
        if (tid < 128u) {
            let nn = tid / 2u;
            let kv = tid % 2u;
            let vec_index = k0 / 8u + kv;
            var word = vec4<u32>(0u);
            if (n0 + nn < p.n && vec_index < p.row_vecs && vec_index * 8u < k_end) {
                word = w[(n0 + nn) * p.row_vecs + vec_index];
            }
            let vals = array<vec2<f32>, 4>(
                unpack2x16float(word.x), unpack2x16float(word.y),
                unpack2x16float(word.z), unpack2x16float(word.w));
            for (var j = 0u; j < 8u; j++) {
                ws[(kv * 8u + j) * ROW + nn / 4u][nn % 4u] = vals[j / 2u][j % 2u];
            }
        }
#else
        {
            let nn = tid / 4u;
            let kv = tid % 4u;
            let vec_index = k0 / 4u + kv;
            var vals = vec4<f32>(0.0);
            if (n0 + nn < p.n && vec_index < p.row_vecs && vec_index * 4u < k_end) {
                vals = w[(n0 + nn) * p.row_vecs + vec_index];
            }
            for (var j = 0u; j < 4u; j++) {
                ws[(kv * 4u + j) * ROW + nn / 4u][nn % 4u] = vals[j];
            }
        }
#endif
#endif
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk++) {
            let a = xs[kk * ROW + ty];
            let b = ws[kk * ROW + tx];
            acc[0] += a.x * b;
            acc[1] += a.y * b;
            acc[2] += a.z * b;
            acc[3] += a.w * b;
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        let row = m0 + ty * 4u + i;
        if (row >= m_rows) {
            continue;
        }
        for (var j = 0u; j < 4u; j++) {
            let col = n0 + tx * 4u + j;
            if (col >= p.n) {
                continue;
            }
#if SPLIT_K
            scratch[(wid.z * m_rows + row) * p.n + col] = acc[i][j];
#else
            y[row * p.n + col] = epilogue(acc[i][j], row, col);
#endif
        }
    }
}

#endif
