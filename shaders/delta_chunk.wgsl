// Gated DeltaNet over a prompt in chunks of CH tokens: the chunked gated delta rule of
// flash-linear-attention, as transformers' `torch_chunk_gated_delta_rule` computes it. The
// token-by-token recurrence (delta_net.wgsl's DELTA) runs one token after another; here only
// the chunks follow one another, and the work inside a chunk is products over its tokens.
// The input rows are delta_net.wgsl's: q/k/v first in each token's row, and z and the gates
// [b | a] after them or in rows of their own (Params).
//
// Per value head h and chunk (tokens 0..L), with q and k L2-normalized (q also by 1/√DK),
// β = sigmoid(b), g = A · softplus(a + dt_bias) and G the running sum of g in the chunk:
//   M[i][j] = β_i (k_i·k_j) e^{G_i − G_j} for j < i;  T = (I + M)⁻¹ (unit lower triangular)
//   W = T (β e^G k),  U = T (β v),  P[i][j] = (q_i·k_j) e^{G_i − G_j} for j ≤ i
// then, from the state S (DK × DV) the chunk starts with:
//   V' = U − W S,  O = (e^G q) S + P V',  S ← e^{G_L} S + (e^{G_L − G} k)ᵀ V'
// and the output is RMSNorm(O) · w · SiLU(z) per head.
//
// CONV_ALL convolves every token and channel at once into rows of their own, and CONV_STATE
// keeps the step's last inputs for the next one. QKNORM normalizes q and k in place
// (workgroup per key head and token). PREP computes W, U,
// P and G for every chunk at once (workgroup per value head and chunk). WALK carries the state
// through the chunks in order (workgroup per value head and COLS state columns, the columns in
// workgroup memory): V' and the state each chunk starts from, the only work that must wait
// for the chunk before. OUT computes O for every chunk at once from those, and GNORM applies
// the gated norm in place. OUT's grid has a third axis, blocks of 64 value columns.
//
// Appended to delta_net.wgsl, whose Params, step, silu, softplus and convolution ring it uses;
// PREP is in delta_chunk_prep.wgsl, WALK and OUT in delta_chunk_walk.wgsl, appended to this.
//
// Defines: K; one of CONV_ALL, CONV_STATE, QKNORM, PREP, WALK (with WALK_THREADS, COLS, ROWS,
// WALK_DH, TILE_PART: values of a staged tile each invocation loads, and WALK_DPER: a staged
// tile's dims each group of invocations updates), OUT, GNORM; DK, DV, NK, NV; TILED (value
// head h reads key head h mod NK, GGUF's order, instead of h / (NV / NK)).

const CH: u32 = 64u;
const DK: u32 = {{DK}}u;
const DV: u32 = {{DV}}u;
const NK: u32 = {{NK}}u;
const NV: u32 = {{NV}}u;

fn key_head(h: u32) -> u32 {
#if TILED
    return h % NK;
#else
    return h / (NV / NK);
#endif
}

#if CONV_ALL
// [channels][K]: tap j multiplies the input K − 1 − j tokens back.
@group(0) @binding(3) var<storage, read> conv_w: array<f32>;
// [tokens][in_stride]: the input product's rows, q/k/v first.
@group(0) @binding(14) var<storage, read> in_rows: array<f32>;
// [channels][K]: the sequence's inputs by position (delta_net.wgsl's ring of K slots).
@group(0) @binding(4) var<storage, read> conv_state: array<f32>;
// [tokens][channels]: the convolved q/k/v.
@group(0) @binding(2) var<storage, read_write> rows: array<f32>;

// The causal convolution with SiLU, every token and channel at once (the recurrent form's
// CONV walks each channel through the tokens in place).
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    let t = gid.y;
    if (c >= p.channels) {
        return;
    }
    var sum = 0.0;
    for (var j = 0u; j < {{K}}u; j++) {
        // The input K − 1 − j tokens back: this step's row, or the carried state's slot of
        // that position (delta_net.wgsl's ring of K).
        let back = KEEP - j;
        var x = 0.0;
        if (t >= back) {
            x = in_rows[(t - back) * p.in_stride + c];
        } else {
            x = conv_state[c * {{K}}u + ring_slot(step.pos0 + t, back)];
        }
        sum += conv_w[c * {{K}}u + j] * x;
    }
    rows[t * p.row_stride + c] = silu(sum);
}
#endif

#if CONV_STATE
@group(0) @binding(4) var<storage, read_write> conv_state: array<f32>;
@group(0) @binding(14) var<storage, read> in_rows: array<f32>;

// The step's last K − 1 inputs go to their slots of the ring (the step has at least that
// many).
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    if (c >= p.channels) {
        return;
    }
    for (var j = 0u; j < KEEP; j++) {
        let t = step.n_tokens - KEEP + j;
        conv_state[c * {{K}}u + ring_slot(step.pos0 + t, 0u)] = in_rows[t * p.in_stride + c];
    }
}
#endif

#if QKNORM
@group(0) @binding(2) var<storage, read_write> rows: array<f32>;

var<workgroup> sums: array<f32, 128>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let q_at = wid.y * p.row_stride + wid.x * DK;
    let k_at = q_at + NK * DK;
    var q2 = 0.0;
    var k2 = 0.0;
    for (var i = tid; i < DK; i += 64u) {
        let q = rows[q_at + i];
        let k = rows[k_at + i];
        q2 += q * q;
        k2 += k * k;
    }
    sums[tid] = q2;
    sums[64u + tid] = k2;
    for (var s = 32u; s > 0u; s = s >> 1u) {
        workgroupBarrier();
        if (tid < s) {
            sums[tid] += sums[tid + s];
            sums[64u + tid] += sums[64u + tid + s];
        }
    }
    workgroupBarrier();
    // As transformers' l2norm: x · rsqrt(Σx² + 1e-6).
    let q_scale = inverseSqrt(sums[0] + 1e-6) * inverseSqrt(f32(DK));
    let k_scale = inverseSqrt(sums[64] + 1e-6);
    for (var i = tid; i < DK; i += 64u) {
        rows[q_at + i] *= q_scale;
        rows[k_at + i] *= k_scale;
    }
}
#endif

#if GNORM
// [DV]: the output norm's weight.
@group(0) @binding(3) var<storage, read> norm_w: array<f32>;
@group(0) @binding(10) var<storage, read_write> out: array<f32>;
@group(0) @binding(11) var<storage, read> z_rows: array<f32>;

var<workgroup> sums: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let h = wid.x;
    let t = wid.y;
    let o_at = t * NV * DV + h * DV;
    var o2 = 0.0;
    for (var i = tid; i < DV; i += 64u) {
        let o = out[o_at + i];
        o2 += o * o;
    }
    sums[tid] = o2;
    for (var s = 32u; s > 0u; s = s >> 1u) {
        workgroupBarrier();
        if (tid < s) {
            sums[tid] += sums[tid + s];
        }
    }
    workgroupBarrier();
    let inv_rms = inverseSqrt(sums[0] / f32(DV) + p.eps);
    let z_at = t * p.z_stride + p.z_at + h * DV;
    for (var i = tid; i < DV; i += 64u) {
        out[o_at + i] = norm_w[i] * (out[o_at + i] * inv_rms) * silu(z_rows[z_at + i]);
    }
}
#endif
