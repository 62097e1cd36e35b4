enable f16;
enable wgpu_cooperative_matrix;

// The expert products of prompts on tensor cores (cooperative matrices): moe.wgsl's TILED
// products with f16 tiles and f32 accumulation, appended to moe.wgsl (its PRODUCT section).
// Workgroup (b, s, z) computes TN output rows of the s-th live expert for TM of its
// assignments (the z-th run of them): m runs over assignments, n over the expert's rows.
// Each BK-deep k step stages the assignments' input rows and the weight rows (the gate rows,
// then with GLU the same rows' up rows), decoded to f16, in workgroup memory; every subgroup
// then multiplies its WM×WN fragments (and with GLU their up twins) out of it. The
// accumulators leave through workgroup memory a fragment (pair) at a time, so the activation
// and biases of moe.wgsl's `output_value` apply to each output.
//
// Defines: GM, GN (the subgroup grid), WM, WN (fragments per subgroup along m and n), SG (the
// subgroup size, fixed on the adapters this path runs on), TM (= 16·WM·GM), TN (= 16·WN·GN),
// KSUB (= BK / 16), XN and WG (input and weight eights an invocation stages a step: whole
// passes of the workgroup over TM and over the weight rows), XVEC4 (inputs read as vec4 words: rows of a multiple of 4 values), and
// moe.wgsl's PRODUCT defines (QUANT with quant.wgsl's, F16, ROW_VECS, GLU, CLAMPED, BIAS,
// PER_TOKEN, TOP_K).

const BK: u32 = {{KSUB}}u * 16u;
const SUBGROUPS: u32 = {{GM}}u * {{GN}}u;
const THREADS: u32 = SUBGROUPS * {{SG}}u;
// Invocations that stage one row's BK values, eight each.
const KPARTS: u32 = BK / 8u;
// The staged tiles hold f16 values four to a unit (as in matmul_coop.wgsl); rows are BK + 8
// halves, whole 16-byte words whose starts fall in different memory banks.
const UNIT: u32 = 4u;
const LDU: u32 = (BK + 8u) / UNIT;
const ROW_EIGHTS: u32 = LDU / 2u;
#if GLU
const WROWS: u32 = 2u * {{TN}}u;
// A gate fragment and its up twin on their way out.
const FRAG: u32 = 512u;
#else
const WROWS: u32 = {{TN}}u;
const FRAG: u32 = 256u;
#endif

// [m][k] and [n][k]: input fragments load row-major, weight fragments column-major.
var<workgroup> xs: array<vec4<f16>, {{TM}} * LDU>;
var<workgroup> ws: array<vec4<f16>, WROWS * LDU>;
var<workgroup> outs: array<f32, SUBGROUPS * FRAG>;
// The tile's assignments and where their input rows start.
var<workgroup> assigned: array<u32, {{TM}}>;
var<workgroup> input_at: array<u32, {{TM}}>;

struct Eight {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

fn to_f16(v: vec4<f32>) -> vec4<f16> {
    // Saturate rather than overflow to infinity.
    return vec4<f16>(clamp(v, vec4<f32>(-65504.0), vec4<f32>(65504.0)));
}

#if QUANT
alias WRaw = QRaw;
#else
// Eight weights' words: f32 rows' two vec4s as bits, f16 rows' one word in `a`.
struct WRaw {
    a: vec4<u32>,
    b: vec4<u32>,
}
#endif

// The words of eight weights of row `row` from column `kc` (a multiple of 8), loaded and not
// yet used (zero past the row's end): a k step's loads are issued before the step before it
// multiplies, and decoded by `w_decode` after.
fn w_load(row: u32, kc: u32) -> WRaw {
    var r = WRaw(vec4<u32>(0u), vec4<u32>(0u));
    if (kc < p.cols) {
#if QUANT
        r = q_pair_raw(row, kc / 32u, p.q_scales, (kc % 32u) / 4u);
#else
#if F16
        // Rows are padded with zeros to whole eights.
        r.a = w[row * {{ROW_VECS}}u + kc / 8u];
#else
        r.a = bitcast<vec4<u32>>(w[row * {{ROW_VECS}}u + kc / 4u]);
        r.b = bitcast<vec4<u32>>(w[row * {{ROW_VECS}}u + kc / 4u + 1u]);
#endif
#endif
    }
    return r;
}

// The eight weights of `w_load`'s words, as f32; zero past the row's end.
fn w_decode(r: WRaw, row: u32, kc: u32) -> Eight {
    var out = Eight(vec4<f32>(0.0), vec4<f32>(0.0));
    if (kc < p.cols) {
#if QUANT
        let pair = q_pair_from(r, row, kc / 32u, (kc % 32u) / 4u);
        out = Eight(pair.a, pair.b);
#else
#if F16
        out = Eight(vec4<f32>(unpack2x16float(r.a.x), unpack2x16float(r.a.y)),
                    vec4<f32>(unpack2x16float(r.a.z), unpack2x16float(r.a.w)));
#else
        out = Eight(bitcast<vec4<f32>>(r.a), bitcast<vec4<f32>>(r.b));
#endif
#endif
    }
    return out;
}

// The weight row that staging step `at` of a k step reads: rows past the expert's end repeat
// its last one (their outputs are not written); with GLU the second TN are the up rows.
fn weight_row(at: u32, row0: u32, e: u32) -> u32 {
    let slot = at / KPARTS;
    let out_row = min(row0 + slot % {{TN}}u, p.rows - 1u);
    var row = e * p.expert_stride + out_row * p.row_step;
    if (slot >= {{TN}}u) {
        row += p.up_offset;
    }
    return row;
}

// The next k step's inputs and weight words, loaded while the current one is multiplied: XN
// input and WG weight eights per invocation. Named registers, not arrays (see `#for` in
// engine/src/gpu/shader.rs).
#for i in 0..XN
var<private> xlo{{i}}: vec4<f32>;
var<private> xhi{{i}}: vec4<f32>;
#endfor
#for j in 0..WG
var<private> wr{{j}}: WRaw;
#endfor

// Loads the k step from `k0`: the tile's `count` input rows (zeros after them) and its weight
// rows of expert `e` from output row `row0`. Eight-value step `tid + i·THREADS` of the tiles.
fn fetch(k0: u32, row0: u32, e: u32, count: u32, tid: u32) {
#for i in 0..XN
    {
        let at = tid + {{i}}u * THREADS;
        let slot = at / KPARTS;
        let kc = k0 + 8u * (at % KPARTS);
        xlo{{i}} = vec4<f32>(0.0);
        xhi{{i}} = vec4<f32>(0.0);
        if (slot < count) {
            xlo{{i}} = xin4(input_at[slot], kc);
            xhi{{i}} = xin4(input_at[slot], kc + 4u);
        }
    }
#endfor
#for j in 0..WG
    {
        let at = tid + {{j}}u * THREADS;
        wr{{j}} = w_load(weight_row(at, row0, e), k0 + 8u * (at % KPARTS));
    }
#endfor
}

// Decodes the fetched k step (from `k0`) and writes it to the staged tiles as f16.
fn stage(k0: u32, row0: u32, e: u32, tid: u32) {
#for i in 0..XN
    {
        let at = tid + {{i}}u * THREADS;
        let unit = 2u * ((at / KPARTS) * ROW_EIGHTS + at % KPARTS);
        xs[unit] = to_f16(xlo{{i}});
        xs[unit + 1u] = to_f16(xhi{{i}});
    }
#endfor
#for j in 0..WG
    {
        let at = tid + {{j}}u * THREADS;
        let unit = 2u * ((at / KPARTS) * ROW_EIGHTS + at % KPARTS);
        let v = w_decode(wr{{j}}, weight_row(at, row0, e), k0 + 8u * (at % KPARTS));
        ws[unit] = to_f16(v.lo);
        ws[unit + 1u] = to_f16(v.hi);
    }
#endfor
}

// Writes the fragment (pair) staged at `outs[at]`: assignments m0.. of the tile, output rows
// row0 + c0.. of expert `e`.
fn write_fragment(at: u32, m0: u32, c0: u32, row0: u32, e: u32, count: u32, lane: u32) {
    for (var i = lane; i < 256u; i += {{SG}}u) {
        let slot = m0 + i / 16u;
        let out_row = row0 + c0 + i % 16u;
        if (slot < count && out_row < p.rows) {
            let gate_row = e * p.expert_stride + out_row * p.row_step;
#if GLU
            let up = outs[at + 256u + i];
#else
            let up = 0.0;
#endif
            y[assigned[slot] * p.rows + out_row] = output_value(gate_row, outs[at + i], up);
        }
    }
}

@compute @workgroup_size(THREADS)
fn main(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let r = expert_run(tid, wid.y);
    let e = r.x;
    let t0 = wid.z * {{TM}}u;
    if (t0 >= r.z) {
        return;
    }
    let count = min(r.z - t0, {{TM}}u);
    for (var i = tid; i < {{TM}}u; i += THREADS) {
        let a = order[r.y + t0 + min(i, count - 1u)];
        assigned[i] = a;
#if PER_TOKEN
        input_at[i] = (a / {{TOP_K}}u) * p.cols;
#else
        input_at[i] = a * p.cols;
#endif
    }
    workgroupBarrier();
    let row0 = wid.x * {{TN}}u;
    // Subgroups are consecutive runs of SG invocations (as matmul_coop.wgsl takes them).
    let sg = tid / {{SG}}u;
    let lane = tid % {{SG}}u;
    let sm = (sg / {{GN}}u) * 16u * {{WM}}u;
    let sn = (sg % {{GN}}u) * 16u * {{WN}}u;
#for i in 0..WM
#for j in 0..WN
    var acc{{i}}_{{j}} = coop_mat16x16<f32, C>();
#if GLU
    var accu{{i}}_{{j}} = coop_mat16x16<f32, C>();
#endif
#endfor
#endfor
    // One staging buffer: a barrier after the products of a step and one after the staging of
    // the next, whose loads are in flight during this step's products.
    let steps = (p.cols + BK - 1u) / BK;
    fetch(0u, row0, e, count, tid);
    for (var it = 0u; it < steps; it++) {
        stage(it * BK, row0, e, tid);
        workgroupBarrier();
        if (it + 1u < steps) {
            fetch((it + 1u) * BK, row0, e, count, tid);
        }
#for s in 0..KSUB
        {
#for i in 0..WM
            let a{{i}} = coopLoadT<coop_mat16x16<f16, A>>(&xs[(sm + {{i}}u * 16u) * LDU + {{s}}u * (16u / UNIT)], LDU);
#endfor
#for j in 0..WN
            let b{{j}} = coopLoad<coop_mat16x16<f16, B>>(&ws[(sn + {{j}}u * 16u) * LDU + {{s}}u * (16u / UNIT)], LDU);
#if GLU
            let bu{{j}} = coopLoad<coop_mat16x16<f16, B>>(&ws[({{TN}}u + sn + {{j}}u * 16u) * LDU + {{s}}u * (16u / UNIT)], LDU);
#endif
#for i in 0..WM
            acc{{i}}_{{j}} = coopMultiplyAdd(a{{i}}, b{{j}}, acc{{i}}_{{j}});
#if GLU
            accu{{i}}_{{j}} = coopMultiplyAdd(a{{i}}, bu{{j}}, accu{{i}}_{{j}});
#endif
#endfor
#endfor
        }
#endfor
        workgroupBarrier();
    }
    let at = sg * FRAG;
#for i in 0..WM
#for j in 0..WN
    coopStoreT(acc{{i}}_{{j}}, &outs[at], 16u);
#if GLU
    coopStoreT(accu{{i}}_{{j}}, &outs[at + 256u], 16u);
#endif
    workgroupBarrier();
    write_fragment(at, sm + {{i}}u * 16u, sn + {{j}}u * 16u, row0, e, count, lane);
    workgroupBarrier();
#endfor
#endfor
}
