// Routed experts (a mixture-of-experts MLP) for the step's tokens, in four kernels chosen by
// define, so that expert ids never leave the GPU:
//
// ROUTE: LANES lanes a token; each token takes the TOP_K largest router logits (ties to the
// lower expert) and their weights: a softmax over the chosen logits (SOFTMAX_ALL: the chosen
// experts' share of a softmax over all of them). Assignment a = token · TOP_K + slot. Then
// the assignments are listed by expert (`order`, each expert's run from `offsets[e]`), and
// the experts that have any (`live[0]` of them, from `live[1]` on). One workgroup does both
// for a decoded token; for prompts, SPLIT routes 256 / LANES tokens a workgroup and GROUP
// (one workgroup) lists them.
//
// EXPERT: workgroup (b, s) computes row block b of the s-th active expert for every
// assignment routed to it, so each expert's rows are read once per TB assignments, whatever
// the number of tokens: a decode step reads only its TOP_K experts, a prompt each expert
// once per TB tokens. The input of assignment a is row a / TOP_K of x (PER_TOKEN: the normed
// hidden state) or row a (the hidden rows of the gate/up product). With GLU, output row r
// of expert e is act(gate row e·expert_stride + r·row_step, the up row up_offset after it),
// SiLU-gated (CLAMPED: GPT-OSS's clamped form with alpha and limit), biases in the rows'
// order (BIAS).
//
// TILED: the same products for prompts, as tiled matrix products over each expert's
// assignments (see its section).
//
// COMBINE: x[t] += Σ_slot weight · (y[assignment] + the expert's bias (BIAS)).
//
// Defines: ROUTE (with EXPERTS and LANES, a power of two up to 256; SPLIT, or ROUTE_SG with
// ROUTING: one decoded token by subgroups, route.wgsl), GROUP (with
// EXPERTS), IDS (either of them), GROUPING (the kernel that lists), EXPERT, TILED (both with
// PRODUCT), COMBINE; TOP_K; SOFTMAX_ALL; QUANT (with quant.wgsl's
// defines; else F16 or f32 rows of ROW_VECS vec4 words), UNITS (32-value sub-blocks of a
// quantized row, vec4 words of a dense one), TPR (lanes per row, a power of two dividing
// 256), SGX (a row's lanes lie in one subgroup: shuffle reductions), XVEC4 (x read through
// a vec4 view: rows of a multiple of 4 values), GLU, CLAMPED, BIAS, PER_TOKEN, TB
// (assignments a pass, 1..4).

struct Params {
    experts: u32,
    // Outputs per assignment (rows of the product) and inputs (its k).
    rows: u32,
    cols: u32,
    expert_stride: u32,
    row_step: u32,
    up_offset: u32,
    q_scales: u32,
    // Most assignments a step can have (the routing buffers' length).
    max_assignments: u32,
    alpha: f32,
    limit: f32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> step: Step;

// An expert's hidden value from its gate and up rows' sums.
fn silu(v: f32) -> f32 {
    return v / (1.0 + exp(-v));
}

fn activate(gate: f32, up: f32) -> f32 {
#if CLAMPED
    let g = min(gate, p.limit);
    let u = clamp(up, -p.limit, p.limit);
    return g / (1.0 + exp(-p.alpha * g)) * (u + 1.0);
#else
    return silu(gate) * up;
#endif
}


#if ROUTE
@group(0) @binding(2) var<storage, read> logits: array<f32>;
@group(0) @binding(5) var<storage, read_write> weights: array<f32>;
#endif
#if IDS
@group(0) @binding(4) var<storage, read_write> ids: array<u32>;
#endif
#if GROUPING
@group(0) @binding(6) var<storage, read_write> order: array<u32>;
@group(0) @binding(7) var<storage, read_write> offsets: array<u32>;
@group(0) @binding(8) var<storage, read_write> live: array<u32>;

var<workgroup> counts: array<atomic<u32>, {{EXPERTS}}>;
var<workgroup> cursor: array<atomic<u32>, {{EXPERTS}}>;

// Lists the step's assignments by expert (every expert's count is in `counts`). One
// workgroup, as each expert's run must be known before any expert product starts.
fn group(tid: u32) {
    if (tid == 0u) {
        var start = 0u;
        var listed = 0u;
        for (var e = 0u; e < p.experts; e++) {
            let c = atomicLoad(&counts[e]);
            offsets[e] = start;
            atomicStore(&cursor[e], start);
            if (c > 0u) {
                live[1u + listed] = e;
                listed += 1u;
            }
            start += c;
        }
        offsets[p.experts] = start;
        live[0] = listed;
    }
    workgroupBarrier();
    // Within an expert's run the order is whatever the atomics give: every assignment's
    // output has a place of its own, so the results do not depend on it.
    for (var a = tid; a < step.n_tokens * {{TOP_K}}u; a += 256u) {
        let at = atomicAdd(&cursor[min(ids[a], p.experts - 1u)], 1u);
        order[at] = a;
    }
}

fn count_assignments(tid: u32) {
    for (var a = tid; a < step.n_tokens * {{TOP_K}}u; a += 256u) {
        atomicAdd(&counts[min(ids[a], p.experts - 1u)], 1u);
    }
}

fn zero_counts(tid: u32) {
    for (var e = tid; e < p.experts; e += 256u) {
        atomicStore(&counts[e], 0u);
    }
}
#endif

#if ROUTE

// Whether (v, e) comes before (best, at) in the order of choice: larger logits first, equal
// ones by lower expert.
fn before(v: f32, e: u32, best: f32, at: u32) -> bool {
    return v > best || (v == best && e < at);
}

// Lanes that route one token together: each scans every LANES-th expert, then the lanes'
// choices are reduced in workgroup memory. Decoding's one token takes many; a prompt's tokens
// fill the workgroup with fewer each, as every pass waits on barriers.
const LANES: u32 = {{LANES}}u;
const NO_EXPERT: u32 = 0xFFFFFFFFu;
var<workgroup> cand_v: array<f32, 256>;
var<workgroup> cand_e: array<u32, 256>;

// Whether candidate (v, e) beats (bv, be), where NO_EXPERT is no candidate.
fn beats(v: f32, e: u32, bv: f32, be: u32) -> bool {
    return e != NO_EXPERT && (be == NO_EXPERT || before(v, e, bv, be));
}

// Routes tokens first .. end LANES lanes each, 256 / LANES at a time: each of the TOP_K
// choices is the best expert after the previous choice in the order of choice; lane 0 of a
// token writes its experts into `ids` and their weights into `weights`.
fn route_tokens(tid: u32, first: u32, end: u32) {
    let lane = tid % LANES;
    let slot = tid / LANES;
    for (var base = first; base < end; base += 256u / LANES) {
        let t = base + slot;
        let valid = t < end;
        let row = min(t, step.n_tokens - 1u) * p.experts;
        var chosen: array<f32, {{TOP_K}}>;
        var prev_v = 3.4e38;
        var prev_e = NO_EXPERT;
        for (var j = 0u; j < {{TOP_K}}u; j++) {
            var bv = -3.4e38;
            var be = NO_EXPERT;
            for (var e = lane; e < p.experts; e += LANES) {
                let v = logits[row + e];
                let after_prev = prev_e == NO_EXPERT || before(prev_v, prev_e, v, e);
                if (after_prev && beats(v, e, bv, be)) {
                    bv = v;
                    be = e;
                }
            }
            cand_v[tid] = bv;
            cand_e[tid] = be;
            workgroupBarrier();
            for (var s = LANES / 2u; s > 0u; s = s >> 1u) {
                if (lane < s && beats(cand_v[tid + s], cand_e[tid + s], cand_v[tid], cand_e[tid])) {
                    cand_v[tid] = cand_v[tid + s];
                    cand_e[tid] = cand_e[tid + s];
                }
                workgroupBarrier();
            }
            prev_v = cand_v[slot * LANES];
            prev_e = cand_e[slot * LANES];
            workgroupBarrier();
            chosen[j] = prev_v;
            if (lane == 0u && valid) {
                ids[t * {{TOP_K}}u + j] = prev_e;
            }
        }
        if (lane == 0u && valid) {
            let top = chosen[0];
            var total = 0.0;
#if SOFTMAX_ALL
            for (var e = 0u; e < p.experts; e++) {
                total += exp(logits[row + e] - top);
            }
#else
            for (var j = 0u; j < {{TOP_K}}u; j++) {
                total += exp(chosen[j] - top);
            }
#endif
            for (var j = 0u; j < {{TOP_K}}u; j++) {
                weights[t * {{TOP_K}}u + j] = exp(chosen[j] - top) / total;
            }
        }
    }
}

#if ROUTE_SG
fn router_logit(e: u32) -> f32 {
    return logits[e];
}

// Decoding's one token, routed by each subgroup alike (route.wgsl), where SPLIT reduces every
// choice through workgroup memory. Invocation 0 records the choices, as route_tokens does.
@compute @workgroup_size(32)
fn main(
    @builtin(local_invocation_index) tid: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) size: u32,
) {
    var route = route_token(lane, size);
    if (tid == 0u) {
        for (var j = 0u; j < {{TOP_K}}u; j++) {
            ids[j] = route.experts[j];
            weights[j] = route.weights[j];
        }
    }
}
#else
#if SPLIT
// Workgroup w routes tokens w · 256 / LANES onwards; GROUP lists them afterwards.
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let first = wid.x * (256u / LANES);
    route_tokens(tid, first, min(first + 256u / LANES, step.n_tokens));
}
#else
// One workgroup routes every token, then lists the assignments by expert.
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) tid: u32) {
    zero_counts(tid);
    route_tokens(tid, 0u, step.n_tokens);
    // Other invocations' `ids` are read next.
    storageBarrier();
    workgroupBarrier();
    count_assignments(tid);
    workgroupBarrier();
    group(tid);
}
#endif
#endif
#endif

#if GROUP
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) tid: u32) {
    zero_counts(tid);
    workgroupBarrier();
    count_assignments(tid);
    workgroupBarrier();
    group(tid);
}
#endif

#if PRODUCT
// What both forms of the expert products (EXPERT, TILED) share: the routing state they read,
// the live expert a workgroup takes, and how an output is made from its row sums.
@group(0) @binding(6) var<storage, read> order: array<u32>;
@group(0) @binding(7) var<storage, read> offsets: array<u32>;
@group(0) @binding(8) var<storage, read> live: array<u32>;
@group(0) @binding(9) var<storage, read_write> y: array<f32>;
#if BIAS
@group(0) @binding(10) var<storage, read> bias: array<f32>;
#endif

// The products' input rows (row a / TOP_K of the normed hidden states, PER_TOKEN, or row a of
// the hidden rows), with XVEC4 also as vec4 words; dense weights (block formats are
// quant.wgsl's `qw`).
@group(0) @binding(2) var<storage, read> xin: array<f32>;
#if XVEC4
@group(0) @binding(12) var<storage, read> xv: array<vec4<f32>>;
#endif
#if !QUANT
#if F16
@group(0) @binding(3) var<storage, read> w: array<vec4<u32>>;
#else
@group(0) @binding(3) var<storage, read> w: array<vec4<f32>>;
#endif
#endif

var<workgroup> run: vec3<u32>;

// Four inputs of the row at `xbase` from k0 (zero past the row's end); quant.wgsl's q_dot
// reads through it.
fn xin4(xbase: u32, k0: u32) -> vec4<f32> {
#if XVEC4
    if (k0 < p.cols) {
        return xv[(xbase + k0) / 4u];
    }
    return vec4<f32>(0.0);
#else
    var v = vec4<f32>(0.0);
    for (var i = 0u; i < 4u; i++) {
        if (k0 + i < p.cols) {
            v[i] = xin[xbase + k0 + i];
        }
    }
    return v;
#endif
}

// The s-th live expert's id, first assignment (in `order`) and assignment count, the same for
// every invocation; no assignments past the last live expert.
fn expert_run(tid: u32, s: u32) -> vec3<u32> {
    if (tid == 0u) {
        var e = 0u;
        var first = 0u;
        var count = 0u;
        if (s < live[0]) {
            e = live[1u + s];
            first = offsets[e];
            count = offsets[e + 1u] - first;
        }
        run = vec3<u32>(e, first, count);
    }
    return workgroupUniformLoad(&run);
}

// An output from its gate row's sum (and with GLU its up row's), biases in the rows' order.
fn output_value(gate_row: u32, sum: f32, up_sum: f32) -> f32 {
    var v = sum;
#if GLU
    var u = up_sum;
#if BIAS
    v += bias[gate_row];
    u += bias[gate_row + p.up_offset];
#endif
    return activate(v, u);
#else
#if BIAS
    v += bias[gate_row];
#endif
    return v;
#endif
}
#endif

#if EXPERT

const WG: u32 = 256u;
const ROWS: u32 = WG / {{TPR}}u;

// Unit u of weight row `row` against the input row at `xbase`.
fn unit_dot(row: u32, u: u32, xbase: u32) -> f32 {
#if QUANT
    return q_dot(row, u, p.q_scales, xbase);
#else
    let word = w[row * {{ROW_VECS}}u + u];
#if F16
    let k0 = u * 8u;
    let lo = vec4<f32>(unpack2x16float(word.x), unpack2x16float(word.y));
    let hi = vec4<f32>(unpack2x16float(word.z), unpack2x16float(word.w));
    return dot(lo, xin4(xbase, k0)) + dot(hi, xin4(xbase, k0 + 4u));
#else
    return dot(word, xin4(xbase, u * 4u));
#endif
#endif
}

var<workgroup> red: array<vec4<f32>, WG>;
#if GLU
var<workgroup> red_up: array<vec4<f32>, WG>;
#endif

// Sums each lane group's values into its first lane (every invocation calls it alike).
#if SGX
fn lanes_sum(tid: u32, lane: u32) {
    var v = red[tid];
#if GLU
    var u = red_up[tid];
#endif
    for (var s = {{TPR}}u / 2u; s > 0u; s = s >> 1u) {
        v += subgroupShuffleXor(v, s);
#if GLU
        u += subgroupShuffleXor(u, s);
#endif
    }
    red[tid] = v;
#if GLU
    red_up[tid] = u;
#endif
}
#else
fn lanes_sum(tid: u32, lane: u32) {
    for (var s = {{TPR}}u / 2u; s > 0u; s = s >> 1u) {
        workgroupBarrier();
        if (lane < s) {
            red[tid] += red[tid + s];
#if GLU
            red_up[tid] += red_up[tid + s];
#endif
        }
    }
    workgroupBarrier();
}
#endif

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let r = expert_run(tid, wid.y);
    let e = r.x;
    let first = r.y;
    let count = r.z;
    let lane = tid % {{TPR}}u;
    let out_row = wid.x * ROWS + tid / {{TPR}}u;
    let row = min(out_row, p.rows - 1u);
    let gate_row = e * p.expert_stride + row * p.row_step;
    for (var c0 = 0u; c0 < count; c0 += {{TB}}u) {
        var acc = vec4<f32>(0.0);
        var acc_up = vec4<f32>(0.0);
        var xb = vec4<u32>(0u);
        for (var i = 0u; i < {{TB}}u; i++) {
            let a = order[first + min(c0 + i, count - 1u)];
#if PER_TOKEN
            xb[i] = (a / {{TOP_K}}u) * p.cols;
#else
            xb[i] = a * p.cols;
#endif
        }
        // Slots past the expert's last assignment are skipped (a decode step has one).
        let filled = min(count - c0, {{TB}}u);
        for (var u = lane; u < {{UNITS}}u; u += {{TPR}}u) {
#for i in 0..TB
            if ({{i}}u < filled) {
                acc[{{i}}] += unit_dot(gate_row, u, xb[{{i}}]);
#if GLU
                acc_up[{{i}}] += unit_dot(gate_row + p.up_offset, u, xb[{{i}}]);
#endif
            }
#endfor
        }
        red[tid] = acc;
#if GLU
        red_up[tid] = acc_up;
#endif
        lanes_sum(tid, lane);
        if (lane == 0u && out_row < p.rows) {
            let sums = red[tid];
#if GLU
            let ups = red_up[tid];
#endif
            for (var i = 0u; i < {{TB}}u; i++) {
                if (c0 + i < count) {
                    let a = order[first + c0 + i];
#if GLU
                    let up = ups[i];
#else
                    let up = 0.0;
#endif
                    y[a * p.rows + out_row] = output_value(gate_row, sums[i], up);
                }
            }
        }
        workgroupBarrier();
    }
}
#endif

#if TILED
// The expert products of prompts: workgroup (b, s, z) computes a tile of BR output rows of the
// s-th live expert for BT of its assignments (the z-th run of them), staging BK inputs of the
// weight rows (decoded once for all BT assignments) and of the assignments' input rows in
// workgroup memory, as a tiled matrix product does. Each invocation keeps 4 rows × 2
// assignments (and their up rows with GLU).
const BR: u32 = 64u;
const BT: u32 = 32u;
const BK: u32 = 32u;
// Rows of the staged tiles, one longer than BK so that invocations reading one k of
// consecutive rows fall in different memory banks.
const STRIDE: u32 = BK + 1u;
#if GLU
const WROWS: u32 = 2u * BR;
#else
const WROWS: u32 = BR;
#endif

// The staged weights: named `x` because quant.wgsl's q_gather writes there.
var<workgroup> x: array<f32, WROWS * STRIDE>;
var<workgroup> xs: array<f32, BT * STRIDE>;
var<workgroup> assigned: array<u32, BT>;
var<workgroup> input_at: array<u32, BT>;

// Stages inputs k0 .. k0 + BK of weight row `row` at staged row `slot`.
fn stage_row(row: u32, k0: u32, slot: u32) {
#if QUANT
    q_gather(row, k0 / 32u, p.q_scales, slot * STRIDE);
#else
    for (var j = 0u; j < BK / {{EPV}}u; j++) {
        let word_at = k0 / {{EPV}}u + j;
        let inside = word_at < {{ROW_VECS}}u;
        let word = w[row * {{ROW_VECS}}u + min(word_at, {{ROW_VECS}}u - 1u)];
#if F16
        let lo = vec4<f32>(unpack2x16float(word.x), unpack2x16float(word.y));
        let hi = vec4<f32>(unpack2x16float(word.z), unpack2x16float(word.w));
        for (var i = 0u; i < 4u; i++) {
            x[slot * STRIDE + 8u * j + i] = select(0.0, lo[i], inside);
            x[slot * STRIDE + 8u * j + 4u + i] = select(0.0, hi[i], inside);
        }
#else
        for (var i = 0u; i < 4u; i++) {
            x[slot * STRIDE + 4u * j + i] = select(0.0, word[i], inside);
        }
#endif
    }
#endif
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let r = expert_run(tid, wid.y);
    let e = r.x;
    let t0 = wid.z * BT;
    if (t0 >= r.z) {
        return;
    }
    let count = r.z - t0;
    if (tid < BT) {
        let a = order[r.y + t0 + min(tid, count - 1u)];
        assigned[tid] = a;
#if PER_TOKEN
        input_at[tid] = (a / {{TOP_K}}u) * p.cols;
#else
        input_at[tid] = a * p.cols;
#endif
    }
    workgroupBarrier();
    let row0 = wid.x * BR;
    let tr = tid / 16u;
    let tt = tid % 16u;
    var acc: array<vec2<f32>, 4>;
#if GLU
    var acc_up: array<vec2<f32>, 4>;
#endif
    for (var k0 = 0u; k0 < p.cols; k0 += BK) {
        for (var slot = tid; slot < WROWS; slot += 256u) {
            let out_row = min(row0 + slot % BR, p.rows - 1u);
            var row = e * p.expert_stride + out_row * p.row_step;
            if (slot >= BR) {
                row += p.up_offset;
            }
            stage_row(row, k0, slot);
        }
        for (var i = tid; i < BT * BK; i += 256u) {
            let t = i / BK;
            let k = k0 + i % BK;
            xs[t * STRIDE + i % BK] = select(0.0, xin[input_at[t] + min(k, p.cols - 1u)], k < p.cols);
        }
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk++) {
            let xa = vec2<f32>(xs[(2u * tt) * STRIDE + kk], xs[(2u * tt + 1u) * STRIDE + kk]);
            for (var j = 0u; j < 4u; j++) {
                acc[j] += x[(4u * tr + j) * STRIDE + kk] * xa;
#if GLU
                acc_up[j] += x[(BR + 4u * tr + j) * STRIDE + kk] * xa;
#endif
            }
        }
        workgroupBarrier();
    }
    for (var j = 0u; j < 4u; j++) {
        let out_row = row0 + 4u * tr + j;
        if (out_row >= p.rows) {
            continue;
        }
        let gate_row = e * p.expert_stride + out_row * p.row_step;
        for (var i = 0u; i < 2u; i++) {
            let t = 2u * tt + i;
            if (t >= count) {
                continue;
            }
#if GLU
            let up = acc_up[j][i];
#else
            let up = 0.0;
#endif
            y[assigned[t] * p.rows + out_row] = output_value(gate_row, acc[j][i], up);
        }
    }
}
#endif

#if COMBINE
@group(0) @binding(4) var<storage, read> ids: array<u32>;
@group(0) @binding(5) var<storage, read> weights: array<f32>;
@group(0) @binding(9) var<storage, read> y: array<f32>;
#if BIAS
@group(0) @binding(10) var<storage, read> bias: array<f32>;
#endif
@group(0) @binding(11) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let width = p.rows;
    let i = gid.x;
    if (i >= step.n_tokens * width) {
        return;
    }
    let t = i / width;
    let c = i % width;
    var sum = 0.0;
    for (var j = 0u; j < {{TOP_K}}u; j++) {
        let a = t * {{TOP_K}}u + j;
        var v = y[a * width + c];
#if BIAS
        v += bias[min(ids[a], p.experts - 1u) * width + c];
#endif
        sum += weights[a] * v;
    }
    out[i] += sum;
}
#endif
