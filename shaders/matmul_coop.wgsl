enable f16;
enable wgpu_cooperative_matrix;

// The prompt product Y[m][n] = Σ_k X[m][k] · W[n][k] on tensor cores (cooperative matrices):
// f16 inputs, f32 accumulation. A workgroup is GM×GN subgroups; each subgroup owns WM×WN
// fragments of 16×16 outputs, so a tile is 16·WM·GM rows by 16·WN·GN columns. Each BK-deep
// k step (32 or 64) stages X (converted to f16) and W (f16, f32 or block-quantized, decoded as
// it is staged) in workgroup memory, eight values to a store, then every subgroup multiplies
// its fragments out of it.
// The accumulators leave through workgroup memory, one fragment at a time, so the epilogue
// of matmul_io.wgsl and the row and column bounds apply to each output as in the SIMT tiles.
//
// Defines: GM, GN (the subgroup grid), WM, WN (fragments per subgroup along m and n), SG (the
// subgroup size, fixed on the adapters this path runs on), TM (= 16·WM·GM), TN (= 16·WN·GN),
// BK and KSUB (= BK / 16), OUT_SG (subgroups whose fragments pass through workgroup memory at
// once in the epilogue: all, or half where 64-deep steps leave no room for more), XN and WG
// (see below), WRAW (dense f16 weights, staged as loaded), HALF_OUT (f16 outputs, written a
// pair to a word), HALF_IN (f16 X, staged as loaded), and those of
// matmul_io.wgsl (XV: X read as vec4 words, two 16-byte loads for eight values where k is a
// multiple of 4, or a convolution's input channels a multiple of 8; GLU).
//
// GLU: the first half of a tile's columns multiplies rows of W's first block, the second half
// the same rows of its second block, so each subgroup of the first half has a partner GN / 2
// subgroups on holding the other block's outputs for the same rows and columns; their fragments
// meet in workgroup memory and the first half's subgroups write the gated outputs.

const BK: u32 = {{BK}}u;
const SUBGROUPS: u32 = {{GM}}u * {{GN}}u;
const THREADS: u32 = SUBGROUPS * {{SG}}u;
// Invocations that stage one row's BK values, eight each.
const KPARTS: u32 = BK / 8u;
// Staging: invocation `tid` loads eight consecutive k (k0 + 8·(tid % KPARTS)) of X rows
// tid / KPARTS + RSTEP·i (XN of them, XN = TM / RSTEP) and of W rows tid / KPARTS + RSTEP·j
// (WG of them, WG = TN / RSTEP), and stores each eight as two units.
const RSTEP: u32 = THREADS / KPARTS;

// The staged tiles hold f16 values four to a unit, so that eight values go to workgroup
// memory in two stores; the fragment loads count offsets and strides in units. (Packed u32
// words, one store per eight values, fail to compile as fragment sources on NVIDIA's driver.)
const UNIT: u32 = 4u;
// Staged rows are BK + 8 halves (80 or 144 bytes): whole 16-byte words for the fragment
// loads, and consecutive rows start in different memory banks.
const LDU: u32 = (BK + 8u) / UNIT;
// A staged row in eight-value steps.
const ROW_EIGHTS: u32 = LDU / 2u;

// [m][k] and [n][k]: X fragments load row-major, W fragments column-major (W is Bᵀ).
var<workgroup> xs: array<vec4<f16>, {{TM}} * LDU>;
var<workgroup> ws: array<vec4<f16>, {{TN}} * LDU>;
// One 16×16 fragment per epilogue subgroup on its way out.
var<workgroup> outs: array<f32, {{OUT_SG}}u * 256u>;

#if GLU
// A tile's columns per block, and how far a partner's fragment lies in `outs`. (Epilogue
// halves are whole rows of the subgroup grid, so partners pass through `outs` together.)
const HALF_TN: u32 = {{TN}}u / 2u;
const PARTNER: u32 = ({{GN}}u / 2u) * 256u;
#endif

// The weight row behind column `c` of the tile whose columns start at `n0`; p.n (no row)
// past the product.
fn w_row(n0: u32, c: u32) -> u32 {
#if GLU
    let width = p.n / 2u;
    let col = n0 / 2u + c % HALF_TN;
    return select(p.n, col + (c / HALF_TN) * width, col < width);
#else
    return n0 + c;
#endif
}

fn to_f16(v: vec4<f32>) -> vec4<f16> {
    // Saturate rather than overflow to infinity.
    return vec4<f16>(clamp(v, vec4<f32>(-65504.0), vec4<f32>(65504.0)));
}

fn f16_pair(word: u32) -> vec2<f16> {
    return vec2<f16>(unpack2x16float(word));
}

// Stores eight values (k order) at eight-value step `at` of a tile (units 2·at and 2·at + 1).
fn stage_x(at: u32, lo: vec4<f32>, hi: vec4<f32>) {
    xs[2u * at] = to_f16(lo);
    xs[2u * at + 1u] = to_f16(hi);
}

fn stage_w(at: u32, lo: vec4<f32>, hi: vec4<f32>) {
    ws[2u * at] = to_f16(lo);
    ws[2u * at + 1u] = to_f16(hi);
}

// Eight f16 values of X as stored (four words).
fn stage_x_raw(at: u32, word: vec4<u32>) {
    xs[2u * at] = vec4<f16>(f16_pair(word.x), f16_pair(word.y));
    xs[2u * at + 1u] = vec4<f16>(f16_pair(word.z), f16_pair(word.w));
}

// Eight f16 weights as stored (four words).
fn stage_w_raw(at: u32, word: vec4<u32>) {
    ws[2u * at] = vec4<f16>(f16_pair(word.x), f16_pair(word.y));
    ws[2u * at + 1u] = vec4<f16>(f16_pair(word.z), f16_pair(word.w));
}

// The next k step's tiles, loaded while the current one is multiplied. Named registers, not
// arrays (see `#for` in engine/src/gpu/shader.rs).
#for i in 0..XN
#if HALF_IN
var<private> xr{{i}}: vec4<u32>;
#else
var<private> xlo{{i}}: vec4<f32>;
var<private> xhi{{i}}: vec4<f32>;
#endif
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

struct Eight {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

#if CONV
// A convolution column's tap: (ky, kx, input channel).
fn tap_of(col: u32) -> vec3<i32> {
    let t = col / cv.cin;
    return vec3<i32>(i32(t / cv.ksize), i32(t % cv.ksize), i32(col % cv.cin));
}

// The tap of the next column (channels first, then kx, then ky).
fn tap_next(t: vec3<i32>) -> vec3<i32> {
    var r = t + vec3<i32>(0, 0, 1);
    if (r.z == i32(cv.cin)) {
        r.z = 0;
        r.y += 1;
        if (r.y == i32(cv.ksize)) {
            r.y = 0;
            r.x += 1;
        }
    }
    return r;
}

#if XV
// Eight consecutive values of an implicit-product row from column `col`, whose tap is `t0`:
// with input channels a multiple of eight, the eight lie in one tap, eight consecutive
// channels of one input pixel, so two 16-byte loads under one bounds check.
fn x_eight(row: u32, col: u32, k_end: u32, corner: vec2<i32>, t0: vec3<i32>) -> Eight {
    let iy = corner.x + t0.x;
    let ix = corner.y + t0.y;
    let inside = iy >= 0 && ix >= 0 && iy < i32(cv.in_h << cv.up) && ix < i32(cv.in_w << cv.up);
    if (row < step.n_tokens && col < k_end && inside) {
        let at = (((u32(iy) >> cv.up) * cv.in_w + (u32(ix) >> cv.up)) * cv.cin + u32(t0.z)) / 4u;
#if NORM_IN
        // The folded GroupNorm and SiLU; padding stays zero, as after them.
        let c = u32(t0.z) / 4u;
        let shifts = cv.cin / 4u;
        let lo = xv[at] * conv_norm[c] + conv_norm[shifts + c];
        let hi = xv[at + 1u] * conv_norm[c + 1u] + conv_norm[shifts + c + 1u];
        return Eight(lo / (1.0 + exp(-lo)), hi / (1.0 + exp(-hi)));
#else
        return Eight(xv[at], xv[at + 1u]);
#endif
    }
    return Eight(vec4<f32>(0.0), vec4<f32>(0.0));
}
#else
// X[row][col] of a convolution: the input pixel under tap `tap` of the row's window (zero
// outside the input and past k).
fn x_conv(row: u32, col: u32, k_end: u32, corner: vec2<i32>, tap: vec3<i32>) -> f32 {
    let iy = corner.x + tap.x;
    let ix = corner.y + tap.y;
    let inside = iy >= 0 && ix >= 0 && iy < i32(cv.in_h << cv.up) && ix < i32(cv.in_w << cv.up);
    if (row < step.n_tokens && col < k_end && inside) {
        return x[((u32(iy) >> cv.up) * cv.in_w + (u32(ix) >> cv.up)) * cv.cin + u32(tap.z)];
    }
    return 0.0;
}

// Eight consecutive values of an implicit-product row from column `col`, whose taps are `t0`…
fn x_eight(row: u32, col: u32, k_end: u32, corner: vec2<i32>, t0: vec3<i32>) -> Eight {
    let t1 = tap_next(t0);
    let t2 = tap_next(t1);
    let t3 = tap_next(t2);
    let t4 = tap_next(t3);
    let t5 = tap_next(t4);
    let t6 = tap_next(t5);
    let t7 = tap_next(t6);
    return Eight(
        vec4<f32>(x_conv(row, col, k_end, corner, t0), x_conv(row, col + 1u, k_end, corner, t1),
                  x_conv(row, col + 2u, k_end, corner, t2), x_conv(row, col + 3u, k_end, corner, t3)),
        vec4<f32>(x_conv(row, col + 4u, k_end, corner, t4), x_conv(row, col + 5u, k_end, corner, t5),
                  x_conv(row, col + 6u, k_end, corner, t6), x_conv(row, col + 7u, k_end, corner, t7)));
}
#endif
#else
#if HALF_IN
// Eight f16 values of row `row` of X from column `col` as they are stored (zero outside the
// product; k is a multiple of 8, so eight are all inside or all outside).
fn x_raw(row: u32, col: u32, k_end: u32) -> vec4<u32> {
    if (row < step.n_tokens && col < k_end) {
        return xh[(row * p.k + col) / 8u];
    }
    return vec4<u32>(0u);
}
#else
#if !XV
fn x_one(at: u32, col: u32, k_end: u32) -> f32 {
    if (col < k_end) {
        return x[at];
    }
    return 0.0;
}
#endif

// Eight consecutive values of row `row` of X from column `col` (zero outside the product).
fn x_eight(row: u32, col: u32, k_end: u32) -> Eight {
    var out = Eight(vec4<f32>(0.0), vec4<f32>(0.0));
    if (row < step.n_tokens) {
        let at = row * p.k + col;
#if XV
        // Slices of k are whole 32-value steps, so a row ends on a four or an eight.
        if (col + 7u < k_end) {
            out = Eight(xv[at / 4u], xv[at / 4u + 1u]);
        } else if (col + 3u < k_end) {
            out.lo = xv[at / 4u];
        }
#else
        if (col + 7u < k_end) {
            out = Eight(vec4<f32>(x[at], x[at + 1u], x[at + 2u], x[at + 3u]),
                        vec4<f32>(x[at + 4u], x[at + 5u], x[at + 6u], x[at + 7u]));
        } else {
            out = Eight(
                vec4<f32>(x_one(at, col, k_end), x_one(at + 1u, col + 1u, k_end),
                          x_one(at + 2u, col + 2u, k_end), x_one(at + 3u, col + 3u, k_end)),
                vec4<f32>(x_one(at + 4u, col + 4u, k_end), x_one(at + 5u, col + 5u, k_end),
                          x_one(at + 6u, col + 6u, k_end), x_one(at + 7u, col + 7u, k_end)));
        }
#endif
    }
    return out;
}
#endif
#endif

#if WRAW
// Eight f16 weights of row `row` from column `kc` as they are stored.
fn w_raw(row: u32, kc: u32, k_end: u32) -> vec4<u32> {
    if (row < p.n && kc < k_end) {
        return w[row * p.row_vecs + kc / 8u];
    }
    return vec4<u32>(0u);
}
#else
// Eight weights of row `row` from column `kc`, decoded to f32.
fn w_eight(row: u32, kc: u32, k_end: u32) -> Eight {
    var out = Eight(vec4<f32>(0.0), vec4<f32>(0.0));
    if (row < p.n && kc < k_end) {
#if QUANT
        let pair = q_pair(row, kc / 32u, p.q_scales, (kc % 32u) / 4u);
        out = Eight(pair.a, pair.b);
#else
        out = Eight(w[row * p.row_vecs + kc / 4u], w[row * p.row_vecs + kc / 4u + 1u]);
#endif
    }
    return out;
}
#endif

// Loads the X and W values this invocation stages for the k step from `k0` into registers.
fn fetch(k0: u32, k_end: u32, m0: u32, n0: u32, tid: u32) {
    let kc = k0 + (tid % KPARTS) * 8u;
    let r0 = tid / KPARTS;
#if CONV
    let tap = tap_of(kc);
#endif
#for i in 0..XN
#if HALF_IN
    xr{{i}} = x_raw(m0 + r0 + {{i}}u * RSTEP, kc, k_end);
#else
    {
#if CONV
        let e = x_eight(m0 + r0 + {{i}}u * RSTEP, kc, k_end, corner{{i}}, tap);
#else
        let e = x_eight(m0 + r0 + {{i}}u * RSTEP, kc, k_end);
#endif
        xlo{{i}} = e.lo;
        xhi{{i}} = e.hi;
    }
#endif
#endfor
#for j in 0..WG
#if WRAW
    wr{{j}} = w_raw(w_row(n0, r0 + {{j}}u * RSTEP), kc, k_end);
#else
    {
        let e = w_eight(w_row(n0, r0 + {{j}}u * RSTEP), kc, k_end);
        wlo{{j}} = e.lo;
        whi{{j}} = e.hi;
    }
#endif
#endfor
}

// Writes the fetched values to the staged tiles as f16.
fn stage(tid: u32) {
    // In eight-value steps: step tid % KPARTS of row tid / KPARTS.
    let at = (tid / KPARTS) * ROW_EIGHTS + tid % KPARTS;
#for i in 0..XN
#if HALF_IN
    stage_x_raw(at + {{i}}u * RSTEP * ROW_EIGHTS, xr{{i}});
#else
    stage_x(at + {{i}}u * RSTEP * ROW_EIGHTS, xlo{{i}}, xhi{{i}});
#endif
#endfor
#for j in 0..WG
#if WRAW
    stage_w_raw(at + {{j}}u * RSTEP * ROW_EIGHTS, wr{{j}});
#else
    stage_w(at + {{j}}u * RSTEP * ROW_EIGHTS, wlo{{j}}, whi{{j}});
#endif
#endfor
}

// Writes the fragment staged at `outs[at]` (rows row0.., tile columns c0.. of the tile at n0)
// through the epilogue, or to the k slice's scratch (columns in weight rows).
fn write_fragment(at: u32, row0: u32, c0: u32, n0: u32, lane: u32, slice: u32) {
#if GLU
#if !SPLIT_K
    // The second block's outputs are gated by their partners.
    if (c0 >= HALF_TN) {
        return;
    }
#endif
#endif
#if HALF_OUT
    // Two neighbouring outputs a word (n is even, so a pair is inside the product or not).
    for (var e = 2u * lane; e < 256u; e += 2u * {{SG}}u) {
        let row = row0 + e / 16u;
        let col = n0 + c0 + e % 16u;
        if (row < step.n_tokens && col < p.n) {
            let pair = vec2<f32>(epilogue(outs[at + e], row, col), epilogue(outs[at + e + 1u], row, col + 1u));
            y[(row * p.n + col) / 2u] = pack2x16float(clamp(pair, vec2<f32>(-65504.0), vec2<f32>(65504.0)));
        }
    }
#else
    for (var e = lane; e < 256u; e += {{SG}}u) {
        let row = row0 + e / 16u;
        let c = c0 + e % 16u;
#if SPLIT_K
        let col = w_row(n0, c);
        if (row < step.n_tokens && col < p.n) {
            scratch[(slice * step.n_tokens + row) * p.n + col] = outs[at + e];
        }
#else
#if GLU
        let col = n0 / 2u + c;
        let width = p.n / 2u;
        if (row < step.n_tokens && col < width) {
            y[row * width + col] = glu_epilogue(outs[at + e], outs[at + PARTNER + e], col);
        }
#else
        let col = n0 + c;
        if (row < step.n_tokens && col < p.n) {
            y[row * p.n + col] = epilogue(outs[at + e], row, col);
        }
#endif
#endif
    }
#endif
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
    let sm = (sg / {{GN}}u) * 16u * {{WM}}u;
    let sn = (sg % {{GN}}u) * 16u * {{WN}}u;
#for i in 0..WM
#for j in 0..WN
    var acc{{i}}_{{j}} = coop_mat16x16<f32, C>();
#endfor
#endfor
#if CONV
#for i in 0..XN
    corner{{i}} = corner(m0 + tid / KPARTS + {{i}}u * RSTEP);
#endfor
#endif
    // One staging buffer: a barrier after the products of a step and one after the staging of
    // the next. (Two buffers, alternating with one barrier a step, ran slower on an H200.)
    fetch(k_begin, k_end, m0, n0, tid);
    for (var it = 0u; it < steps; it++) {
        stage(tid);
        workgroupBarrier();
        // The next step's loads are in flight during this step's products.
        if (it + 1u < steps) {
            fetch(k_begin + (it + 1u) * BK, k_end, m0, n0, tid);
        }
#for s in 0..KSUB
        {
#for i in 0..WM
            let a{{i}} = coopLoadT<coop_mat16x16<f16, A>>(&xs[(sm + {{i}}u * 16u) * LDU + {{s}}u * (16u / UNIT)], LDU);
#endfor
#for j in 0..WN
            let b{{j}} = coopLoad<coop_mat16x16<f16, B>>(&ws[(sn + {{j}}u * 16u) * LDU + {{s}}u * (16u / UNIT)], LDU);
#for i in 0..WM
            acc{{i}}_{{j}} = coopMultiplyAdd(a{{i}}, b{{j}}, acc{{i}}_{{j}});
#endfor
#endfor
        }
#endfor
        workgroupBarrier();
    }
#if OUT_SPLIT
    // Half of the subgroups at a time: the first half's fragments, then the second's.
    let at = (sg % {{OUT_SG}}u) * 256u;
    let second = sg >= {{OUT_SG}}u;
#else
    let at = sg * 256u;
#endif
#for i in 0..WM
#for j in 0..WN
#if OUT_SPLIT
    if (!second) {
        coopStoreT(acc{{i}}_{{j}}, &outs[at], 16u);
    }
    workgroupBarrier();
    if (!second) {
        write_fragment(at, m0 + sm + {{i}}u * 16u, sn + {{j}}u * 16u, n0, lane, wid.z);
    }
    workgroupBarrier();
    if (second) {
        coopStoreT(acc{{i}}_{{j}}, &outs[at], 16u);
    }
    workgroupBarrier();
    if (second) {
        write_fragment(at, m0 + sm + {{i}}u * 16u, sn + {{j}}u * 16u, n0, lane, wid.z);
    }
    workgroupBarrier();
#else
    coopStoreT(acc{{i}}_{{j}}, &outs[at], 16u);
    workgroupBarrier();
    write_fragment(at, m0 + sm + {{i}}u * 16u, sn + {{j}}u * 16u, n0, lane, wid.z);
    workgroupBarrier();
#endif
#endfor
#endfor
}
