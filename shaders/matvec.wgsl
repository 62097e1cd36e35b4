// Matrix-vector product for decoding: y = W·x̂ for one token, where x̂ is the last row of x,
// optionally normalised on the fly (RMSNorm / LayerNorm fused in front of the product).
// W is row-major [n][k] with rows padded to whole vec4 words; f16 weights are read as packed
// u32 pairs, so no shader-f16 support is needed. Each workgroup computes WG/TPR rows, TPR lanes
// per row striding over k, then reduces each row (subgroups where available); RB such blocks of
// rows per workgroup share the staged input.
//
// Defines: WG, TPR, RB, EPV (elements per vec4 word: 4 for f32, 8 for f16), ROW_VECS (the row
// stride in vec4 words, fixed per pipeline so the loop over a row has a known trip count),
// SGX (each row's TPR lanes lie in one subgroup of fixed size: shuffle reduction), F16, NORM,
// NORM_LAYER, BIAS, GLU (y = silu(W_gate·x̂) * (W_up·x̂), the up block at
// glu_offset; with GELU too, gelu_tanh(W_gate·x̂) * (W_up·x̂)), GELU (tanh form), GELU_ERF, RESIDUAL (y += ...), SUBGROUP, XCACHE (x̂ staged once in workgroup memory,
// for short rows), XVEC4 (k is a multiple of 4: x is also read through a vec4 view), KPAIR
// (K-quant rows by sub-block pairs, see q_dot_pairs), NR (rows per lane group, 1..4), COMBINE
// (x is the attention output of one token, split over runs of keys as attention.wgsl SPLIT
// leaves it: the runs are merged while staging; needs XCACHE; SINKS: with a sink logit per
// head in each softmax's denominator), MIN_SPLIT, MAX_SPLITS,
// WINDOW (the keys a sliding-window layer's attention saw), PIPE (int8 products with UNROLL:
// each trip's weights are loaded one trip ahead, the first before the prologue), PIPE_NEXT
// (PIPE with more than one trip), XQ8 (the input quantized to int8
// per workgroup, products by packed integer dots: Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K; XQ8_VIEW for
// the formats that read their blocks through the 16-byte view), GAIN4 (NORM with k a multiple
// of 4: the gains are read as vec4s, a quarter of the loads in every workgroup's prologue),
// XQ8_FINE (and LEVELS = 2: a
// second int8 level carries the rounding remainders), RMS_LATE (XQ8 with a fused
// RMSNorm: its scale applied to the row sums), UNROLL and UNITS (dense or XQ8 rows of UNITS
// vec4 words, sub-blocks, or sub-block pairs with KPAIR: where they are a multiple of TPR,
// every lane takes as many, UNROLL a trip of a loop with a constant trip count, so that their
// weight loads issue together; int8 rows with UNIT_TAIL take LANE_UNITS, rounded up, see
// ITERS), XQ8_IN (the int8 input handed off by the product before, see matvec_handoff.wgsl),
// XQ8_OUT (hand the output row off so; OUT_GAIN: scaled by the next norm's gains), HAND_INPUT
// (the first workgroup hands the input off, as the product reads it), HANDS_OFF (either),
// OUT_LEVELS and OUT_FINE (the levels handed off), EXPERTS
// (routed experts of one decoded token: workgroup row wid.y computes the rows of the wid.y-th
// chosen expert, see weight_row; with IN_PER_SLOT its input is row wid.y of x; CLAMPED:
// GPT-OSS's clamped SwiGLU; ROUTED, with TOP_K and SOFTMAX_ALL: the workgroups route the token
// themselves, ROUTED_SG giving them subgroups where SUBGROUP is unset), ROUTES (a router's
// product in one workgroup, which then routes the token from its outputs; with TOP_K,
// SOFTMAX_ALL, ROUTED_SG), ROUTING (either ROUTED or ROUTES).

struct Params {
    n: u32,
    k: u32,
    row_vecs: u32,
    glu_offset: u32,
    eps: f32,
    heads: u32,
    head_dim: u32,
    // Quantized weights: word offset of the block scales (see quant.wgsl).
    q_scales: u32,
    // EXPERTS: expert e's output row r reads weight row e·expert_stride + r·row_step, its up
    // row up_offset further; ids past `experts` are clamped. CLAMPED's alpha and limit.
    expert_stride: u32,
    row_step: u32,
    up_offset: u32,
    experts: u32,
    alpha: f32,
    limit: f32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read> x: array<f32>;
#if !QUANT
#if F16
@group(0) @binding(3) var<storage, read> w: array<vec4<u32>>;
#else
@group(0) @binding(3) var<storage, read> w: array<vec4<f32>>;
#endif
#endif
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
#if XVEC4
@group(0) @binding(8) var<storage, read> xv: array<vec4<f32>>;
#endif
#if COMBINE
@group(0) @binding(9) var<storage, read> partials: array<vec4<f32>>;
@group(0) @binding(10) var<storage, read> split_stats: array<vec2<f32>>;
#if GATED
// The token's QKV row, whose slot 2h + 1 holds query head h's output gate (Qwen3.5).
@group(0) @binding(17) var<storage, read> gates: array<f32>;
#endif
#if SINKS
// A logit per query head that joins its softmax's denominator (GPT-OSS's sinks).
@group(0) @binding(19) var<storage, read> sinks: array<f32>;
#endif
#endif
#if BIAS
@group(0) @binding(5) var<storage, read> bias: array<f32>;
#endif
#if NORM
@group(0) @binding(6) var<storage, read> norm_w: array<f32>;
#if GAIN4
// The gains again as vec4s (k is a multiple of 4), one load for four.
@group(0) @binding(13) var<storage, read> norm_w4: array<vec4<f32>>;
#endif
#endif
#if NORM_LAYER
@group(0) @binding(7) var<storage, read> norm_b: array<f32>;
#endif
#if EXPERTS
#if ROUTED
// ROUTED: each workgroup routes the token itself from the router's logits (each subgroup
// alike, its maxima one choice at a time) and the workgroups at x = 0 record each slot's
// expert and weight for the products after; otherwise routing left the ids here.
@group(0) @binding(18) var<storage, read_write> expert_ids: array<u32>;
@group(0) @binding(20) var<storage, read> router_logits: array<f32>;
@group(0) @binding(21) var<storage, read_write> route_weights: array<f32>;
var<workgroup> routed_expert: u32;

// Routes the token (every subgroup alike, `lane` of `size`, so that the subgroup operations
// stay in uniform control flow) and returns the expert of `slot` to every invocation; `record`:
// also write the slot's id and weight.
fn route_slot(tid: u32, lane: u32, size: u32, slot: u32, record: bool) -> u32 {
    var route = route_token(lane, size);
    if (tid == 0u) {
        routed_expert = route.experts[slot];
        if (record) {
            expert_ids[slot] = route.experts[slot];
            route_weights[slot] = route.weights[slot];
        }
    }
    return workgroupUniformLoad(&routed_expert);
}
#else
// The chosen experts of the token, one per workgroup row (routing leaves them on the GPU).
@group(0) @binding(18) var<storage, read> expert_ids: array<u32>;
#endif
#endif
#if ROUTES
// ROUTES: this one workgroup computed every router logit (y); it then routes the token from
// them and records each slot's expert and weight for the expert products after.
@group(0) @binding(18) var<storage, read_write> expert_ids: array<u32>;
@group(0) @binding(21) var<storage, read_write> route_weights: array<f32>;

// Records the token's route (every subgroup alike, as route_slot).
fn record_route(tid: u32, lane: u32, size: u32) {
    // The other invocations' logits are read next.
    storageBarrier();
    var route = route_token(lane, size);
    if (tid == 0u) {
        for (var j = 0u; j < {{TOP_K}}u; j++) {
            expert_ids[j] = route.experts[j];
            route_weights[j] = route.weights[j];
        }
    }
}
#endif
#if ROUTING
const NO_EXPERT: u32 = 0xFFFFFFFFu;

// The logits route_token (route.wgsl) reads: this product's own outputs with ROUTES.
fn router_logit(e: u32) -> f32 {
#if ROUTES
    return y[e];
#else
    return router_logits[e];
#endif
}
#endif

// The first weight row of this workgroup's expert, and where its outputs start (EXPERTS;
// 0 otherwise).
var<private> expert_row0: u32;
var<private> out_row0: u32;

// The weight row of output row `row` (in this workgroup's expert), and of its up row (GLU).
fn weight_row(row: u32) -> u32 {
#if EXPERTS
    return expert_row0 + row * p.row_step;
#else
    return row;
#endif
}

fn up_row(row: u32) -> u32 {
#if EXPERTS
    return weight_row(row) + p.up_offset;
#else
    return row + p.n;
#endif
}

var<workgroup> red: array<f32, {{WG}}>;
var<workgroup> norm_stats: vec2<f32>;
#if XCACHE
var<workgroup> xs: array<vec4<f32>, {{ROW_VECS}}u * {{EPV}}u / 4u>;

// Where vec4 i of x̂ is staged. Quantized products give each lane whole 32-element sub-blocks
// (64-element pairs with KPAIR), so lanes read the same vec4 of consecutive units at once:
// vec4 j of unit s sits at j·(units) + s, which puts those reads in consecutive words rather
// than in a few banks.
#if KPAIR
const XS_UNIT: u32 = 16u;
#else
const XS_UNIT: u32 = 8u;
#endif
fn xs_slot(i: u32) -> u32 {
#if QUANT
    return (i % XS_UNIT) * ({{ROW_VECS}}u / XS_UNIT) + i / XS_UNIT;
#else
    return i;
#endif
}
#endif

#if XQ8
// The input row quantized to int8 once per workgroup (see q_dot8 in quant.wgsl): word i holds
// values 4i..4i+3 at xq_slot(i); block b of 32 values has (scale, dequantized sum) xqd[b].
// Lanes read word j of consecutive sub-blocks (pairs with KPAIR) at once, so word j of unit u
// sits at j·(units) + u: consecutive words rather than a few banks.
// With XQ8_FINE a second level follows the first (words from ROW_VECS, blocks from
// ROW_VECS / 8): each value's rounding remainder, quantized again, so that x = d·q + d₂·q₂ to
// about 1/64,000 of its block's largest value (LM heads, whose logits pick tokens).
const LEVELS: u32 = {{LEVELS}}u;
var<workgroup> xq: array<u32, {{ROW_VECS}}u * LEVELS>;
var<workgroup> xqd: array<vec2<f32>, {{ROW_VECS}}u / 8u * LEVELS>;
#if KPAIR
const XQ_UNIT: u32 = 16u;
#else
const XQ_UNIT: u32 = 8u;
#endif
fn xq_slot(i: u32) -> u32 {
    return (i % XQ_UNIT) * ({{ROW_VECS}}u / XQ_UNIT) + i / XQ_UNIT;
}

// Word i of level `level` of the int8 input.
fn xq_at(level: u32, i: u32) -> u32 {
    return level * {{ROW_VECS}}u + xq_slot(i);
}

// Scale and dequantized sum of block b of level `level`.
fn xqd_at(level: u32, b: u32) -> vec2<f32> {
    return xqd[level * ({{ROW_VECS}}u / 8u) + b];
}

// Quantizes the (normalised, or merged) input into xq / xqd: one 32-value block per
// invocation, symmetric, scale = max |x| / 127.
fn stage_int8(tid: u32, base: u32, sg_lane: u32, sg_size: u32) {
    var squares = 0.0;
    for (var b = tid; b < {{ROW_VECS}}u / 8u; b += {{WG}}u) {
#if RMS_LATE
        // RMSNorm scales a row by one number, which int8 blocks absorb in their scales: the
        // gains are applied here and the norm's scale to the row sums (finish_row), so the
        // input is read once and summed once.
#for j in 0..8
        let raw{{j}} = x4_raw(base, 32u * b + 4u * {{j}}u);
        squares += dot(raw{{j}}, raw{{j}});
        let v{{j}} = raw{{j}} * norm_gain4(32u * b + 4u * {{j}}u);
#endfor
#else
#for j in 0..8
        let v{{j}} = xin4(base, 32u * b + 4u * {{j}}u);
#endfor
#endif
        let m = max(max(max(abs(v0), abs(v1)), max(abs(v2), abs(v3))),
                    max(max(abs(v4), abs(v5)), max(abs(v6), abs(v7))));
        let amax = max(max(m.x, m.y), max(m.z, m.w));
        let inv = select(0.0, 127.0 / amax, amax > 0.0);
        let d = amax / 127.0;
        var total = vec4<i32>(0);
#if XQ8_FINE
        // Remainders are at most d / 2: the second level's scale is d / 254.
        let d2 = d / 254.0;
        let inv2 = select(0.0, 254.0 / d, amax > 0.0);
        var total2 = vec4<i32>(0);
#endif
#for j in 0..8
        {
            let q = vec4<i32>(round(v{{j}} * inv));
            total += q;
            xq[xq_slot(8u * b + {{j}}u)] = pack4xI8(q);
#if XQ8_FINE
            let q2 = clamp(vec4<i32>(round((v{{j}} - vec4<f32>(q) * d) * inv2)), vec4<i32>(-127), vec4<i32>(127));
            total2 += q2;
            xq[xq_at(1u, 8u * b + {{j}}u)] = pack4xI8(q2);
#endif
        }
#endfor
        xqd[b] = vec2<f32>(d, d * f32(total.x + total.y + total.z + total.w));
#if XQ8_FINE
        xqd[{{ROW_VECS}}u / 8u + b] = vec2<f32>(d2, d2 * f32(total2.x + total2.y + total2.z + total2.w));
#endif
    }
#if RMS_LATE
    set_rms_stats(tid, squares, sg_lane, sg_size);
#endif
    workgroupBarrier();
}
#endif

// RMSNorm statistics from each invocation's sum of squares (read after a barrier).
fn set_rms_stats(tid: u32, squares: f32, sg_lane: u32, sg_size: u32) {
    let mean_sq = wg_sum(tid, squares, sg_lane, sg_size) / f32(p.k);
    if (tid == 0u) {
        norm_stats = vec2<f32>(0.0, inverseSqrt(mean_sq + p.eps));
    }
}

fn wg_sum(tid: u32, v: f32, sg_lane: u32, sg_size: u32) -> f32 {
#if SUBGROUP
    // As row_sum: subgroups of consecutive invocations, then their sums.
    let s = subgroupAdd(v);
    if (sg_lane == 0u) {
        red[tid / sg_size] = s;
    }
    workgroupBarrier();
    var total = 0.0;
    for (var i = 0u; i < {{WG}}u / sg_size; i++) {
        total += red[i];
    }
    workgroupBarrier();
    return total;
#else
    red[tid] = v;
    workgroupBarrier();
    for (var s = {{WG}}u / 2u; s > 0u; s = s >> 1u) {
        if (tid < s) {
            red[tid] += red[tid + s];
        }
        workgroupBarrier();
    }
    let total = red[0];
    workgroupBarrier();
    return total;
#endif
}

// Sum of `v` over the TPR lanes of each row; the result is valid in lane 0.
fn row_sum(tid: u32, lane: u32, v: f32, sg_lane: u32, sg_size: u32) -> f32 {
#if SGX
    // A row's TPR lanes sit inside one subgroup: a butterfly of shuffles sums them, with no
    // workgroup memory and no barrier.
    var s = v;
    for (var off = {{TPR}}u / 2u; off > 0u; off = off >> 1u) {
        s += subgroupShuffleXor(s, off);
    }
    return s;
#else
#if SUBGROUP
    // TPR is a multiple of the subgroup size, so a subgroup never spans two rows.
    let s = subgroupAdd(v);
    if (sg_lane == 0u) {
        red[tid / sg_size] = s;
    }
    workgroupBarrier();
    var total = 0.0;
    if (lane == 0u) {
        let first = tid / sg_size;
        for (var i = 0u; i < {{TPR}}u / sg_size; i++) {
            total += red[first + i];
        }
    }
    workgroupBarrier();
    return total;
#else
    red[tid] = v;
    workgroupBarrier();
    for (var s = {{TPR}}u / 2u; s > 0u; s = s >> 1u) {
        if (lane < s) {
            red[tid] += red[tid + s];
        }
        workgroupBarrier();
    }
    let total = red[tid];
    workgroupBarrier();
    return total;
#endif
#endif
}

// Four inputs starting at k0 (zero past the end), normalised if a norm is fused.
fn x4(base: u32, k0: u32) -> vec4<f32> {
#if RMS_LATE
    return x4_raw(base, k0) * norm_gain4(k0);
#else
    var v = x4_raw(base, k0);
#if NORM
    var g = norm_gain4(k0);
    var b = vec4<f32>(0.0);
#if NORM_LAYER
    for (var i = 0u; i < 4u; i++) {
        b[i] = select(0.0, norm_b[min(k0 + i, p.k - 1u)], k0 + i < p.k);
    }
#endif
    v = (v - norm_stats.x) * norm_stats.y * g + b;
#endif
    return v;
#endif
}

// The norm's gains for the four inputs at k0 (zero past the end; ones without a norm).
fn norm_gain4(k0: u32) -> vec4<f32> {
    var g = vec4<f32>(1.0);
#if GAIN4
    if (k0 + 4u <= p.k) {
        return norm_w4[k0 / 4u];
    }
#endif
#if NORM
    for (var i = 0u; i < 4u; i++) {
        g[i] = select(0.0, norm_w[min(k0 + i, p.k - 1u)], k0 + i < p.k);
    }
#endif
    return g;
}

// Four inputs starting at k0 as stored (zero past the end).
fn x4_raw(base: u32, k0: u32) -> vec4<f32> {
    var v: vec4<f32>;
    if (k0 + 4u <= p.k) {
#if XVEC4
        v = xv[(base + k0) / 4u];
#else
        v = vec4<f32>(x[base + k0], x[base + k0 + 1u], x[base + k0 + 2u], x[base + k0 + 3u]);
#endif
    } else {
        for (var i = 0u; i < 4u; i++) {
            v[i] = select(0.0, x[base + min(k0 + i, p.k - 1u)], k0 + i < p.k);
        }
    }
    return v;
}

// Four normalised inputs at k0, from workgroup memory when staged.
fn xin4(base: u32, k0: u32) -> vec4<f32> {
#if XCACHE
    return xs[xs_slot(k0 / 4u)];
#else
    return x4(base, k0);
#endif
}

#if F16
fn dot_row(word: vec4<u32>, xa: vec4<f32>, xb: vec4<f32>) -> f32 {
    let lo = vec4<f32>(unpack2x16float(word.x), unpack2x16float(word.y));
    let hi = vec4<f32>(unpack2x16float(word.z), unpack2x16float(word.w));
    return dot(lo, xa) + dot(hi, xb);
}
#endif

fn silu(v: f32) -> f32 {
    return v / (1.0 + exp(-v));
}

// Lane groups per block: the distance between the NR rows of one lane group.
const ROW_STEP: u32 = {{WG}}u / {{TPR}}u;

// Row r of the lane group whose first row is row0, clamped into the matrix: rows past the end
// are computed on the last row and never written.
fn row_at(row0: u32, r: u32) -> u32 {
    return min(row0 + r * ROW_STEP, p.n - 1u);
}

// The first row of the lane group of invocation `tid` in row block `rb` of a workgroup.
fn block_row0(group: u32, rb: u32, tid: u32) -> u32 {
    return (group * {{RB}}u + rb) * {{NR}}u * ROW_STEP + tid / {{TPR}}u;
}

#if XQ8
#if UNROLL
// Int8 products take their units in trips of UNROLL: each trip's weight words, for every row
// it computes, are loaded into these registers (named, not an array: see `#for`) before any
// of its products, so that the loads are in flight together (with PIPE, one trip ahead,
// while the previous trip's products are computed). Lanes take
// LANE_UNITS units each, a whole number of trips; with UNIT_TAIL the row's units are no
// multiple of its lanes, and units past the row's end are read at its last unit and left out.
const ITERS: u32 = {{LANE_UNITS}}u;

// Unit `u` of a row, clamped into it.
fn unit_in_row(u: u32) -> u32 {
#if UNIT_TAIL
    return min(u, {{UNITS}}u - 1u);
#else
    return u;
#endif
}

// A unit's product, zero for units past the row's end.
fn unit_dot(f: QFetch, u: u32) -> f32 {
    let d = q_dot8_levels(f, unit_in_row(u));
#if UNIT_TAIL
    return select(0.0, d, u < {{UNITS}}u);
#else
    return d;
#endif
}
#for u in 0..UNROLL
#for r in 0..NR
var<private> next{{u}}_{{r}}: QFetch;
#if GLU
var<private> next_up{{u}}_{{r}}: QFetch;
#endif
#endfor
#endfor

// Loads the words of the trip from unit `it` (per lane) of the NR rows from row0.
fn fetch_trip(row0: u32, it: u32, lane: u32) {
#for u in 0..UNROLL
#for r in 0..NR
    next{{u}}_{{r}} = q_fetch8(weight_row(row_at(row0, {{r}}u)), unit_in_row(lane + (it + {{u}}u) * {{TPR}}u), p.q_scales);
#if GLU
    next_up{{u}}_{{r}} = q_fetch8(up_row(row_at(row0, {{r}}u)), unit_in_row(lane + (it + {{u}}u) * {{TPR}}u), p.q_scales);
#endif
#endfor
#endfor
}
#endif
#endif

// Reduces one row's lane sums and writes the row (called by every invocation alike, since the
// reduction may synchronise the workgroup).
fn finish_row(row: u32, acc: f32, acc_up: f32, tid: u32, lane: u32, sg_lane: u32, sg_size: u32) {
    var r = row_sum(tid, lane, acc, sg_lane, sg_size);
#if GLU
    var up = row_sum(tid, lane, acc_up, sg_lane, sg_size);
#endif
#if RMS_LATE
    r *= norm_stats.y;
#if GLU
    up *= norm_stats.y;
#endif
#endif
    if (row < p.n && lane == 0u) {
#if BIAS
        r += bias[weight_row(row)];
#endif
#if GLU
#if BIAS
        up += bias[up_row(row)];
#endif
#if GELU
        r = gelu_tanh(r) * up;
#else
#if CLAMPED
        // GPT-OSS: the gate clamped above, the up value on both sides, then gate·σ(α·gate)·(up + 1).
        let g = min(r, p.limit);
        r = g / (1.0 + exp(-p.alpha * g)) * (clamp(up, -p.limit, p.limit) + 1.0);
#else
        r = silu(r) * up;
#endif
#endif
#else
#if GELU
        r = gelu_tanh(r);
#endif
#if GELU_ERF
        r = gelu_erf(r);
#endif
#endif
#if RESIDUAL
        r += y[row];
#endif
        y[out_row0 + row] = r;
#if XQ8_OUT
        hand_off_row(row, r);
#endif
    }
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
#if ROUTED_SG
    // Subgroups for routing where the reductions take none (SUBGROUP unset).
    @builtin(subgroup_invocation_id) route_lane: u32,
    @builtin(subgroup_size) route_size: u32,
#endif
) {
#if !SUBGROUP
    let sg_lane = 0u;
    let sg_size = 1u;
#endif
#if EXPERTS
    let group = wid.x;
#if ROUTED
#if ROUTED_SG
    let expert = route_slot(tid, route_lane, route_size, wid.y, wid.x == 0u);
#else
    let expert = route_slot(tid, sg_lane, sg_size, wid.y, wid.x == 0u);
#endif
#else
    let expert = expert_ids[wid.y];
#endif
    expert_row0 = min(expert, p.experts - 1u) * p.expert_stride;
    out_row0 = wid.y * p.n;
#if XQ8_OUT
    handoff_row0 = wid.y * {{OUT_LEVELS}}u * handoff_level_words(p.n);
#endif
#else
    let group = wid.y * nwg.x + wid.x;
#endif
    let lane = tid % {{TPR}}u;
#if XQ8_OUT
    load_out_gains(group, tid);
#endif
#if PIPE
    // The first trip's weights are requested before the input is staged (and normalised, or
    // merged), so that their latency overlaps that prologue and its barriers.
    fetch_trip(block_row0(group, 0u, tid), 0u, lane);
#endif
    // Decoding has one token; for a prompt only the last token's output is wanted.
#if IN_PER_SLOT
    let base = wid.y * p.k;
#else
    let base = (step.n_tokens - 1u) * p.k;
#endif
#if NORM
#if !RMS_LATE
    var s = 0.0;
#if NORM_LAYER
    for (var k = tid; k < p.k; k += {{WG}}u) {
        s += x[base + k];
    }
    let mean = wg_sum(tid, s, sg_lane, sg_size) / f32(p.k);
    var sq = 0.0;
    for (var k = tid; k < p.k; k += {{WG}}u) {
        let d = x[base + k] - mean;
        sq += d * d;
    }
    let variance = wg_sum(tid, sq, sg_lane, sg_size) / f32(p.k);
    if (tid == 0u) {
        norm_stats = vec2<f32>(mean, inverseSqrt(variance + p.eps));
    }
#else
    // Four inputs a load (zero past the end), as they are staged.
    for (var i = tid; i < (p.k + 3u) / 4u; i += {{WG}}u) {
        let v = x4_raw(base, 4u * i);
        s += dot(v, v);
    }
    set_rms_stats(tid, s, sg_lane, sg_size);
#endif
    workgroupBarrier();
#endif
#endif
#if COMBINE
    // The keys attention saw: the whole context, or the last WINDOW positions.
    let all_keys = min(step.pos0 + 1u, {{WINDOW}}u);
    let split_len = max({{MIN_SPLIT}}u, (all_keys + {{MAX_SPLITS}}u - 1u) / {{MAX_SPLITS}}u);
    let splits = (all_keys + split_len - 1u) / split_len;
    // Each quad merges its runs in one pass (running max, the sum and the outputs rescaled to
    // it), eight runs a trip with their loads in flight together (indices clamped, the extra
    // runs weighted zero): no pass over the heads' statistics and no barrier before it, since
    // this prologue stands before every weight load.
    let quads = p.k / 4u;
    for (var i = tid; i < {{ROW_VECS}}u * {{EPV}}u / 4u; i += {{WG}}u) {
        var merged = vec4<f32>(0.0);
        if (i < quads) {
            let h = (4u * i) / p.head_dim;
            var top = -3.0e38;
            var total = 0.0;
            for (var s0 = 0u; s0 < splits; s0 += 8u) {
#for c in 0..8
                let run{{c}} = min(s0 + {{c}}u, splits - 1u);
                let st{{c}} = select(vec2<f32>(-3.0e38, 0.0), split_stats[run{{c}} * p.heads + h],
                                     s0 + {{c}}u < splits);
                let part{{c}} = partials[run{{c}} * quads + i];
#endfor
                let next = max(max(max(top, st0.x), max(st1.x, st2.x)),
                               max(max(st3.x, st4.x), max(max(st5.x, st6.x), st7.x)));
                let kept = exp(top - next);
                merged *= kept;
                total *= kept;
#for c in 0..8
                let w{{c}} = exp(st{{c}}.x - next);
                merged += part{{c}} * w{{c}};
                total += st{{c}}.y * w{{c}};
#endfor
                top = next;
            }
#if SINKS
            // The sink joins the denominator, both taken relative to the larger of the runs'
            // max and the sink so that neither overflows.
            let m = max(top, sinks[h]);
            let kept = exp(top - m);
            merged *= kept;
            total = total * kept + exp(sinks[h] - m);
#endif
            merged /= total;
#if GATED
            let g = (2u * h + 1u) * p.head_dim + (4u * i) % p.head_dim;
            let gate = vec4<f32>(gates[g], gates[g + 1u], gates[g + 2u], gates[g + 3u]);
            merged /= vec4<f32>(1.0) + exp(-gate);
#endif
        }
        xs[xs_slot(i)] = merged;
    }
    workgroupBarrier();
#else
#if XCACHE
    for (var i = tid; i < {{ROW_VECS}}u * {{EPV}}u / 4u; i += {{WG}}u) {
        xs[xs_slot(i)] = x4(base, 4u * i);
    }
    workgroupBarrier();
#endif
#if HAND_INPUT
    if (group == 0u) {
        hand_input_off(tid, base);
    }
#endif
#endif
#if XQ8
#if XQ8_IN
#if IN_PER_SLOT
    stage_handoff(tid, sg_lane, sg_size, wid.y * LEVELS * IN_LEVEL_VEC4S);
#else
    stage_handoff(tid, sg_lane, sg_size, 0u);
#endif
#else
    stage_int8(tid, base, sg_lane, sg_size);
#endif
#endif
    // RB blocks of NR·WG/TPR rows share one staged (and normalised) input. Each lane group
    // takes NR rows of a block, ROW_STEP apart, and reads each input once for all of them.
    for (var rb = 0u; rb < {{RB}}u; rb++) {
        let row0 = block_row0(group, rb, tid);
        var acc = vec4<f32>(0.0);
        var acc_up = vec4<f32>(0.0);
        if (row0 < p.n) {
#if QUANT
#if XQ8
#if UNROLL
            for (var it = 0u; it < ITERS; it += {{UNROLL}}u) {
#if !PIPE
                fetch_trip(row0, it, lane);
#endif
#for u in 0..UNROLL
#for r in 0..NR
                let cur{{u}}_{{r}} = next{{u}}_{{r}};
#if GLU
                let cur_up{{u}}_{{r}} = next_up{{u}}_{{r}};
#endif
#endfor
#endfor
#if PIPE_NEXT
                // The next trip's weights are requested before this one's are used: the next
                // units of these rows, else the first of the next block (after the last trip,
                // the last block's again, unused).
                let last = it + {{UNROLL}}u >= ITERS;
                fetch_trip(block_row0(group, select(rb, min(rb + 1u, {{RB}}u - 1u), last), tid),
                           select(it + {{UNROLL}}u, 0u, last), lane);
#endif
#for u in 0..UNROLL
#for r in 0..NR
                acc[{{r}}] += unit_dot(cur{{u}}_{{r}}, lane + (it + {{u}}u) * {{TPR}}u);
#if GLU
                acc_up[{{r}}] += unit_dot(cur_up{{u}}_{{r}}, lane + (it + {{u}}u) * {{TPR}}u);
#endif
#endfor
#endfor
            }
#else
            for (var unit = lane; unit < {{UNITS}}u; unit += {{TPR}}u) {
#for r in 0..NR
                acc[{{r}}] += q_dot8(weight_row(row_at(row0, {{r}}u)), unit, p.q_scales);
#if GLU
                acc_up[{{r}}] += q_dot8(up_row(row_at(row0, {{r}}u)), unit, p.q_scales);
#endif
#endfor
            }
#endif
#else
#if KPAIR
            for (var sp = lane; sp < {{SUBS}}u / 2u; sp += {{TPR}}u) {
                acc += q_dot_pairs(row0, p.n - 1u, sp, base);
#if GLU
                acc_up += q_dot_pairs(row0 + p.n, 2u * p.n - 1u, sp, base);
#endif
            }
#else
            for (var sb = lane; sb < {{SUBS}}u; sb += {{TPR}}u) {
#for r in 0..NR
                acc[{{r}}] += q_dot(weight_row(row_at(row0, {{r}}u)), sb, p.q_scales, base);
#if GLU
                acc_up[{{r}}] += q_dot(up_row(row_at(row0, {{r}}u)), sb, p.q_scales, base);
#endif
#endfor
            }
#endif
#endif
#else
#if UNROLL
            for (var it = 0u; it < {{UNITS}}u / {{TPR}}u; it += {{UNROLL}}u) {
#for u in 0..UNROLL
            {
                let v = lane + (it + {{u}}u) * {{TPR}}u;
#else
            for (var v = lane; v < {{ROW_VECS}}u; v += {{TPR}}u) {
            {
#endif
#if XCACHE
#if F16
                let xa = xs[2u * v];
                let xb = xs[2u * v + 1u];
#else
                let xa = xs[v];
#endif
#else
                let k0 = v * {{EPV}}u;
                let xa = x4(base, k0);
#if F16
                let xb = x4(base, k0 + 4u);
#endif
#endif
#for r in 0..NR
                {
                    let wv = row_at(row0, {{r}}u) * {{ROW_VECS}}u + v;
#if F16
                    acc[{{r}}] += dot_row(w[wv], xa, xb);
#if GLU
                    acc_up[{{r}}] += dot_row(w[p.glu_offset + wv], xa, xb);
#endif
#else
                    acc[{{r}}] += dot(w[wv], xa);
#if GLU
                    acc_up[{{r}}] += dot(w[p.glu_offset + wv], xa);
#endif
#endif
                }
#endfor
            }
#if UNROLL
#endfor
#endif
            }
#endif
        }
#for r in 0..NR
        finish_row(row0 + {{r}}u * ROW_STEP, acc[{{r}}], acc_up[{{r}}], tid, lane, sg_lane, sg_size);
#endfor
    }
#if XQ8_OUT
    hand_off(group, tid);
#endif
#if ROUTES
#if ROUTED_SG
    record_route(tid, route_lane, route_size);
#else
    record_route(tid, sg_lane, sg_size);
#endif
#endif
}
