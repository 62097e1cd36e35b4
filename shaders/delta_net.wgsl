// Gated DeltaNet (Qwen3.5's linear-attention layers) after their input product, for the
// step's tokens, carrying the sequence's state between steps. A token's projected row is
// [q (NK·DK) | k (NK·DK) | v (NV·DV) | z (NV·DV) | b (NV) | a (NV)]: the layer's input
// projections stacked into one product.
//
// CONV: the causal depthwise convolution (K taps, no bias) over the q, k and v channels of
// the rows, then SiLU, in place. Invocation c walks channel c through the tokens in order,
// holding the K − 1 inputs before the current one; `conv_state` keeps the inputs by position
// in a ring of K slots.
//
// Where the layer's input products are stacked into one (every part in one format), z, b and
// a follow q/k/v in each row; otherwise they come in rows of their own (Params).
//
// DELTA: workgroup h runs value head h through the tokens in order; GROUPS invocations share
// column v of the head's state S (DK × DV, f32), each holding DKQ of its rows. Per token: q and k of key head h / (NV / NK),
// L2-normalized (and q scaled by 1/√DK); β = sigmoid(b), decay = exp(A · softplus(a + dt_bias))
// with A = −exp(A_log) < 0; then S ← decay·S, S ← S + k ⊗ β(v − Sᵀk), o = Sᵀq; the output is
// RMSNorm(o) · w · SiLU(z) over the head's DV values.
//
// FUSED (a decode step of one token): DELTA convolves its head's q, k and v channels itself,
// one dispatch a layer.
//
// Defines: K; CONV, or DELTA (with DK, DV, the workgroup size WG, GROUPS, DKQ, NK, NV, FUSED;
// TILED: value
// head h reads key head h mod NK, GGUF's order, instead of h / (NV / NK)).

struct Params {
    // The convolved channels (2·NK·DK + NV·DV) and the length of the rows holding them.
    channels: u32,
    row_stride: u32,
    eps: f32,
    // Where z and the gates [b | a] are in the rows of `z_rows` and `gate_rows`: the stacked
    // rows themselves after q/k/v, or rows of their own where their products are apart.
    z_at: u32,
    z_stride: u32,
    gates_at: u32,
    gates_stride: u32,
    // Where q/k/v are convolved into rows of their own (delta_chunk.wgsl), the input rows'
    // stride; `row_stride` is then the convolved rows' (`channels`).
    in_stride: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> step: Step;

fn silu(v: f32) -> f32 {
    return v / (1.0 + exp(-v));
}

// log(1 + eˣ), as torch computes it (linear past 20).
fn softplus(x: f32) -> f32 {
    if (x > 20.0) {
        return x;
    }
    return log(1.0 + exp(x));
}

const KEEP: u32 = {{K}}u - 1u;

// The convolution state's slot of the input `back` positions before `pos` (pos − back, which
// may be before the sequence: its slot then still holds the zero it was cleared to). Slots
// form a ring of K: a step reads the K − 1 inputs before its first token and writes its own
// token's slot, never one the step reads, so workgroups sharing a channel need no order.
fn ring_slot(pos: u32, back: u32) -> u32 {
    return (pos + 16u * {{K}}u - back) % {{K}}u;
}

#if CONV
// [tokens][row_stride], the q/k/v channels convolved in place.
@group(0) @binding(2) var<storage, read_write> rows: array<f32>;
// [channels][K]: tap j multiplies the input K − 1 − j tokens back.
@group(0) @binding(3) var<storage, read> conv_w: array<f32>;
// [channels][K]: the sequence's inputs by position, position u in slot u mod K (see
// `ring_slot`).
@group(0) @binding(4) var<storage, read_write> conv_state: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    if (c >= p.channels) {
        return;
    }
    var window: array<f32, {{K}}>;
    for (var j = 0u; j < KEEP; j++) {
        window[j] = conv_state[c * {{K}}u + ring_slot(step.pos0, KEEP - j)];
    }
    for (var t = 0u; t < step.n_tokens; t++) {
        let at = t * p.row_stride + c;
        let x = rows[at];
        window[KEEP] = x;
        var sum = 0.0;
        for (var j = 0u; j < {{K}}u; j++) {
            sum += conv_w[c * {{K}}u + j] * window[j];
        }
        rows[at] = silu(sum);
        // The window is in registers: later tokens never read the slot this overwrites.
        conv_state[c * {{K}}u + ring_slot(step.pos0 + t + 1u, 1u)] = x;
        for (var j = 0u; j < KEEP; j++) {
            window[j] = window[j + 1u];
        }
    }
}
#endif

#if DELTA
// [tokens][row_stride], q, k and v convolved.
@group(0) @binding(2) var<storage, read> rows: array<f32>;
// Per value head: A = −exp(A_log), dt_bias.
@group(0) @binding(5) var<storage, read> decay_a: array<f32>;
@group(0) @binding(6) var<storage, read> dt_bias: array<f32>;
// [DV]: the output norm's weight.
@group(0) @binding(7) var<storage, read> norm_w: array<f32>;
// [NV][DK][DV].
@group(0) @binding(8) var<storage, read_write> state: array<f32>;
// [tokens][NV·DV].
@group(0) @binding(9) var<storage, read_write> out: array<f32>;
// z ([NV·DV] at z_at) and the gates ([b (NV) | a (NV)] at gates_at) of each token.
@group(0) @binding(11) var<storage, read> z_rows: array<f32>;
@group(0) @binding(12) var<storage, read> gate_rows: array<f32>;
#if FUSED
// The convolution's weights and state, as CONV reads them: the decode step convolves its own
// channels (one token).
@group(0) @binding(3) var<storage, read> conv_w: array<f32>;
@group(0) @binding(4) var<storage, read_write> conv_state: array<f32>;
#endif

const DK: u32 = {{DK}}u;
const DV: u32 = {{DV}}u;
const WG: u32 = {{WG}}u;
// GROUPS groups of VP invocations: invocation (g, v) holds rows g·DKQ … of state column v.
const GROUPS: u32 = {{GROUPS}}u;
const VP: u32 = WG / GROUPS;
const DKQ: u32 = {{DKQ}}u;

var<workgroup> qs: array<f32, DK>;
var<workgroup> ks: array<f32, DK>;
#if FUSED
// The token's convolved q, k and v of this head.
var<workgroup> mixed: array<f32, 2u * DK + DV>;
#endif
var<workgroup> red_q: array<f32, WG>;
var<workgroup> red_k: array<f32, WG>;
// The groups' partial sums over their rows of the state.
var<workgroup> part: array<f32, WG>;

// Sums `red_q` and `red_k` into their first elements (every invocation calls it alike).
fn reduce_pair(tid: u32) {
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        workgroupBarrier();
        if (tid < s) {
            red_q[tid] += red_q[tid + s];
            red_k[tid] += red_k[tid + s];
        }
    }
    workgroupBarrier();
}

// The sum over the groups of `part` for column v (after a barrier).
fn column_sum(v: u32) -> f32 {
    var sum = 0.0;
    for (var g = 0u; g < GROUPS; g++) {
        sum += part[g * VP + v];
    }
    return sum;
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let h = wid.x;
#if TILED
    let kh = h % {{NK}}u;
#else
    let kh = h / ({{NV}}u / {{NK}}u);
#endif
    let v_col = tid % VP;
    let group = tid / VP;
    let owns = v_col < DV;
    let vc = min(v_col, DV - 1u);
    let d0 = group * DKQ;
    // This invocation's rows of the state column, in named registers (zero past DK).
#for k in 0..DKQ
    var s{{k}} = 0.0;
    if (d0 + {{k}}u < DK) {
        s{{k}} = state[(h * DK + d0 + {{k}}u) * DV + vc];
    }
#endfor
    let q_at = kh * DK;
    let k_at = {{NK}}u * DK + kh * DK;
    let v_at = 2u * {{NK}}u * DK + h * DV;
    for (var t = 0u; t < step.n_tokens; t++) {
        let row = t * p.row_stride;
#if FUSED
        // The convolution of this head's q, k and v channels with SiLU (the step is one
        // token). Each channel's input goes to its ring slot once: q and k by the first
        // value head reading the key head, v by its own.
#if TILED
        let writes_keys = h < {{NK}}u;
#else
        let writes_keys = h % ({{NV}}u / {{NK}}u) == 0u;
#endif
        for (var i = tid; i < 2u * DK + DV; i += WG) {
            var c = v_at + i - 2u * DK;
            if (i < DK) {
                c = q_at + i;
            } else if (i < 2u * DK) {
                c = k_at + i - DK;
            }
            let x = rows[row + c];
            var sum = conv_w[c * {{K}}u + KEEP] * x;
            for (var j = 0u; j < KEEP; j++) {
                let slot = ring_slot(step.pos0 + t, KEEP - j);
                sum += conv_w[c * {{K}}u + j] * conv_state[c * {{K}}u + slot];
            }
            mixed[i] = silu(sum);
            if (i >= 2u * DK || writes_keys) {
                conv_state[c * {{K}}u + ring_slot(step.pos0 + t + 1u, 1u)] = x;
            }
        }
        workgroupBarrier();
#endif
        var q2 = 0.0;
        var k2 = 0.0;
        for (var i = tid; i < DK; i += WG) {
#if FUSED
            let qv = mixed[i];
            let kv = mixed[DK + i];
#else
            let qv = rows[row + q_at + i];
            let kv = rows[row + k_at + i];
#endif
            qs[i] = qv;
            ks[i] = kv;
            q2 += qv * qv;
            k2 += kv * kv;
        }
        red_q[tid] = q2;
        red_k[tid] = k2;
        reduce_pair(tid);
        // As transformers' l2norm: x · rsqrt(Σx² + 1e-6); q also by 1/√DK.
        let q_scale = inverseSqrt(red_q[0] + 1e-6) * inverseSqrt(f32(DK));
        let k_scale = inverseSqrt(red_k[0] + 1e-6);
        let z_at = t * p.z_stride + p.z_at;
        let b_at = t * p.gates_stride + p.gates_at;
        let beta = 1.0 / (1.0 + exp(-gate_rows[b_at + h]));
        let a = gate_rows[b_at + {{NV}}u + h];
        let decay = exp(decay_a[h] * softplus(a + dt_bias[h]));
        var kv = 0.0;
#for k in 0..DKQ
        let key{{k}} = select(0.0, ks[min(d0 + {{k}}u, DK - 1u)] * k_scale, d0 + {{k}}u < DK);
        s{{k}} *= decay;
        kv += s{{k}} * key{{k}};
#endfor
        part[tid] = kv;
        workgroupBarrier();
#if FUSED
        let v_in = mixed[2u * DK + vc];
#else
        let v_in = rows[row + v_at + vc];
#endif
        let delta = beta * (v_in - column_sum(v_col));
        var o = 0.0;
#for k in 0..DKQ
        s{{k}} += key{{k}} * delta;
        o += s{{k}} * select(0.0, qs[min(d0 + {{k}}u, DK - 1u)], d0 + {{k}}u < DK);
#endfor
        // Every invocation has read the kv partials.
        workgroupBarrier();
        part[tid] = o;
        workgroupBarrier();
        let o_all = column_sum(v_col) * q_scale;
        // The gated RMSNorm over the head's DV outputs.
        red_q[tid] = select(0.0, o_all * o_all, owns && group == 0u);
        red_k[tid] = 0.0;
        reduce_pair(tid);
        let inv_rms = inverseSqrt(red_q[0] / f32(DV) + p.eps);
        if (owns && group == 0u) {
            let gate = z_rows[z_at + h * DV + v_col];
            out[t * {{NV}}u * DV + h * DV + v_col] = norm_w[v_col] * (o_all * inv_rms) * silu(gate);
        }
        // qs, ks, part and the reductions are reused by the next token.
        workgroupBarrier();
    }
    if (owns) {
#for k in 0..DKQ
        if (d0 + {{k}}u < DK) {
            state[(h * DK + d0 + {{k}}u) * DV + v_col] = s{{k}};
        }
#endfor
    }
}
#endif
