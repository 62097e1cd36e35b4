enable f16;
enable wgpu_cooperative_matrix;

// The prompt product Y[m][n] = Σ_k X[m][k] · W[n][k] on tensor cores (cooperative matrices):
// f16 inputs, f32 accumulation. A workgroup is four subgroups in a 2×2 grid; each subgroup
// owns WM×WN fragments of 16×16 outputs, so a tile is 32·WM rows by 32·WN columns. Each
// 32-deep k step stages X (converted to f16) and W (f16, f32 or block-quantized, decoded as
// it is staged) in workgroup memory, then every subgroup multiplies its fragments out of it.
// The accumulators leave through workgroup memory, one fragment at a time, so the epilogue
// of matmul_io.wgsl and the row and column bounds apply to each output as in the SIMT tiles.
//
// Defines: WM, WN (fragments per subgroup along m and n), SG (the subgroup
// size, fixed on the adapters this path runs on), TM (= 32·WM), TN (= 32·WN), XN and WG (see
// below), WRAW (dense f16 weights, staged as loaded), and those of matmul_io.wgsl.

const BK: u32 = 32u;
// Staged rows are BK + 8 halves (80 bytes): whole 16-byte words for the fragment loads, and
// consecutive rows start in different memory banks.
const LDS: u32 = 40u;
const THREADS: u32 = 4u * {{SG}}u;
// Staging: invocation `tid` loads k = tid % BK of rows tid / BK + RSTEP·i (XN of them, XN =
// TM / RSTEP), and WG groups of eight k of W rows, four invocations to a row (WG = TN·4 /
// THREADS).
const RSTEP: u32 = THREADS / BK;

// [m][k] and [n][k]: X fragments load row-major, W fragments column-major (W is Bᵀ).
var<workgroup> xs: array<f16, {{TM}} * 40>;
var<workgroup> ws: array<f16, {{TN}} * 40>;
// One 16×16 fragment per subgroup on its way through the epilogue.
var<workgroup> outs: array<f32, 1024>;

fn to_f16(v: f32) -> f16 {
    // Saturate rather than overflow to infinity.
    return f16(clamp(v, -65504.0, 65504.0));
}

fn f16_pair(word: u32) -> vec2<f16> {
    return vec2<f16>(unpack2x16float(word));
}

// The next k step's tiles, loaded while the current one is multiplied. Named registers, not
// arrays (see `#for` in engine/src/gpu/shader.rs).
#for i in 0..XN
var<private> xr{{i}}: f32;
#endfor
#for j in 0..WG
#if WRAW
var<private> wr{{j}}: vec4<u32>;
#else
var<private> wlo{{j}}: vec4<f32>;
var<private> whi{{j}}: vec4<f32>;
#endif
#endfor
#if CONV
// The top-left input pixel of each output row this invocation stages.
#for i in 0..XN
var<private> corner{{i}}: vec2<i32>;
#endfor
#endif

// X[row][col] (zero outside the product); for a convolution `tap` is (ky, kx, channel) of
// column `col` and `corner` the row's top-left input pixel.
fn x_at(row: u32, col: u32, k_end: u32, corner: vec2<i32>, tap: vec3<i32>) -> f32 {
#if CONV
    let iy = corner.x + tap.x;
    let ix = corner.y + tap.y;
    let inside = iy >= 0 && ix >= 0 && iy < i32(cv.in_h << cv.up) && ix < i32(cv.in_w << cv.up);
    if (row < step.n_tokens && col < k_end && inside) {
        return x[((u32(iy) >> cv.up) * cv.in_w + (u32(ix) >> cv.up)) * cv.cin + u32(tap.z)];
    }
#else
    if (row < step.n_tokens && col < k_end) {
        return x[row * p.k + col];
    }
#endif
    return 0.0;
}

#if WRAW
// Eight f16 weights of row `row` from column `kc` as they are stored.
fn w_raw(row: u32, kc: u32, k_end: u32) -> vec4<u32> {
    if (row < p.n && kc < k_end) {
        return w[row * p.row_vecs + kc / 8u];
    }
    return vec4<u32>(0u);
}

fn stage_raw(at: u32, word: vec4<u32>) {
    let h0 = f16_pair(word.x);
    let h1 = f16_pair(word.y);
    let h2 = f16_pair(word.z);
    let h3 = f16_pair(word.w);
    ws[at] = h0.x;
    ws[at + 1u] = h0.y;
    ws[at + 2u] = h1.x;
    ws[at + 3u] = h1.y;
    ws[at + 4u] = h2.x;
    ws[at + 5u] = h2.y;
    ws[at + 6u] = h3.x;
    ws[at + 7u] = h3.y;
}
#else
struct W8 {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

// Eight weights of row `row` from column `kc`, decoded to f32.
fn w_eight(row: u32, kc: u32, k_end: u32) -> W8 {
    var out = W8(vec4<f32>(0.0), vec4<f32>(0.0));
    if (row < p.n && kc < k_end) {
#if QUANT
        let pair = q_pair(row, kc / 32u, p.q_scales, (kc % 32u) / 4u);
        out = W8(pair.a, pair.b);
#else
        out = W8(w[row * p.row_vecs + kc / 4u], w[row * p.row_vecs + kc / 4u + 1u]);
#endif
    }
    return out;
}

fn stage_eight(at: u32, lo: vec4<f32>, hi: vec4<f32>) {
    ws[at] = to_f16(lo.x);
    ws[at + 1u] = to_f16(lo.y);
    ws[at + 2u] = to_f16(lo.z);
    ws[at + 3u] = to_f16(lo.w);
    ws[at + 4u] = to_f16(hi.x);
    ws[at + 5u] = to_f16(hi.y);
    ws[at + 6u] = to_f16(hi.z);
    ws[at + 7u] = to_f16(hi.w);
}
#endif

// Loads the X and W values this invocation stages for the k step from `k0` into registers.
fn fetch(k0: u32, k_end: u32, m0: u32, n0: u32, tid: u32) {
    let col = k0 + tid % BK;
    let r0 = m0 + tid / BK;
#if CONV
    let t = col / cv.cin;
    let tap = vec3<i32>(i32(t / cv.ksize), i32(t % cv.ksize), i32(col % cv.cin));
#else
    let tap = vec3<i32>(0);
#endif
#for i in 0..XN
#if CONV
    xr{{i}} = x_at(r0 + {{i}}u * RSTEP, col, k_end, corner{{i}}, tap);
#else
    xr{{i}} = x_at(r0 + {{i}}u * RSTEP, col, k_end, vec2<i32>(0), tap);
#endif
#endfor
    let kc = k0 + (tid % 4u) * 8u;
    let w0 = n0 + tid / 4u;
#for j in 0..WG
#if WRAW
    wr{{j}} = w_raw(w0 + {{j}}u * (THREADS / 4u), kc, k_end);
#else
    {
        let e = w_eight(w0 + {{j}}u * (THREADS / 4u), kc, k_end);
        wlo{{j}} = e.lo;
        whi{{j}} = e.hi;
    }
#endif
#endfor
}

// Writes the fetched values to the staged tiles as f16.
fn stage(tid: u32) {
    let x0 = (tid / BK) * LDS + tid % BK;
#for i in 0..XN
    xs[x0 + {{i}}u * RSTEP * LDS] = to_f16(xr{{i}});
#endfor
    let w0 = (tid / 4u) * LDS + (tid % 4u) * 8u;
#for j in 0..WG
#if WRAW
    stage_raw(w0 + {{j}}u * (THREADS / 4u) * LDS, wr{{j}});
#else
    stage_eight(w0 + {{j}}u * (THREADS / 4u) * LDS, wlo{{j}}, whi{{j}});
#endif
#endfor
}

// Writes the fragment staged at `outs[at]` to outputs (row0.., col0..) through the epilogue
// (or to the k slice's scratch).
fn write_fragment(at: u32, row0: u32, col0: u32, lane: u32, slice: u32) {
    for (var e = lane; e < 256u; e += {{SG}}u) {
        let row = row0 + e / 16u;
        let col = col0 + e % 16u;
        if (row < step.n_tokens && col < p.n) {
#if SPLIT_K
            scratch[(slice * step.n_tokens + row) * p.n + col] = outs[at + e];
#else
            y[row * p.n + col] = epilogue(outs[at + e], row, col);
#endif
        }
    }
}

@compute @workgroup_size(THREADS)
fn main(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    // This workgroup's slice of k, whole BK steps (all of k without SPLIT_K).
    let slice = (((p.k + nwg.z - 1u) / nwg.z + BK - 1u) / BK) * BK;
    let k_begin = min(wid.z * slice, p.k);
    let k_end = min(k_begin + slice, p.k);
    let steps = (k_end - k_begin + BK - 1u) / BK;
    let m0 = wid.y * {{TM}}u;
    let n0 = wid.x * {{TN}}u;
    // Subgroups are taken as consecutive runs of SG invocations (as NVIDIA's driver forms them,
    // where the parity tests ran); the fragments' loads and stores must be uniform in each.
    let sg = tid / {{SG}}u;
    let lane = tid % {{SG}}u;
    // This subgroup's corner inside the tile.
    let sm = (sg / 2u) * 16u * {{WM}}u;
    let sn = (sg % 2u) * 16u * {{WN}}u;
#for i in 0..WM
#for j in 0..WN
    var acc{{i}}_{{j}} = coop_mat16x16<f32, C>();
#endfor
#endfor
#if CONV
#for i in 0..XN
    {
        let row = m0 + tid / BK + {{i}}u * RSTEP;
        corner{{i}} = vec2<i32>(i32((row / cv.out_w) * cv.stride) - i32(cv.pad),
                                i32((row % cv.out_w) * cv.stride) - i32(cv.pad));
    }
#endfor
#endif
    fetch(k_begin, k_end, m0, n0, tid);
    for (var it = 0u; it < steps; it++) {
        stage(tid);
        workgroupBarrier();
        // The next step's loads are in flight during this step's products.
        if (it + 1u < steps) {
            fetch(k_begin + (it + 1u) * BK, k_end, m0, n0, tid);
        }
#for s in 0..2
        {
#for i in 0..WM
            let a{{i}} = coopLoadT<coop_mat16x16<f16, A>>(&xs[(sm + {{i}}u * 16u) * LDS + {{s}}u * 16u], LDS);
#endfor
#for j in 0..WN
            let b{{j}} = coopLoad<coop_mat16x16<f16, B>>(&ws[(sn + {{j}}u * 16u) * LDS + {{s}}u * 16u], LDS);
#for i in 0..WM
            acc{{i}}_{{j}} = coopMultiplyAdd(a{{i}}, b{{j}}, acc{{i}}_{{j}});
#endfor
#endfor
        }
#endfor
        workgroupBarrier();
    }
    let at = sg * 256u;
#for i in 0..WM
#for j in 0..WN
    coopStoreT(acc{{i}}_{{j}}, &outs[at], 16u);
    workgroupBarrier();
    write_fragment(at, m0 + sm + {{i}}u * 16u, n0 + sn + {{j}}u * 16u, lane, wid.z);
    workgroupBarrier();
#endfor
#endfor
}
