// Gated DeltaNet over a prompt in chunks of CH tokens: the chunked gated delta rule of
// flash-linear-attention, as transformers' `torch_chunk_gated_delta_rule` computes it. The
// token-by-token recurrence (delta_net.wgsl's DELTA) runs one token after another; here only
// the chunks follow one another, and the work inside a chunk is products over its tokens.
// The rows are delta_net.wgsl's: q/k/v per token, convolved (CONV), and z and the gates
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
// QKNORM normalizes q and k in place (workgroup per key head and token). PREP computes W, U,
// P and G for every chunk at once (workgroup per value head and chunk, invocation per row).
// CHUNK walks the chunks in order (workgroup per value head and COLS state columns,
// invocation per column; a column's state lives in registers, and no column reads
// another's). GNORM applies the gated norm in place.
//
// Defines: one of QKNORM, PREP, CHUNK, GNORM; DK, DV, NK, NV; TILED (value head h reads key
// head h mod NK, GGUF's order, instead of h / (NV / NK)).

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
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> step: Step;

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

#if PREP
@group(0) @binding(2) var<storage, read> rows: array<f32>;
// Per value head: A = −exp(A_log), dt_bias.
@group(0) @binding(3) var<storage, read> decay_a: array<f32>;
@group(0) @binding(4) var<storage, read> dt_bias: array<f32>;
// [tokens][NV]: G, the running log decay within the token's chunk.
@group(0) @binding(5) var<storage, read_write> decays: array<f32>;
// [tokens][NV][DK]: W.
@group(0) @binding(6) var<storage, read_write> w_rows: array<f32>;
// [tokens][NV][DV]: U.
@group(0) @binding(7) var<storage, read_write> u_rows: array<f32>;
// [tokens][NV][CH]: P's rows.
@group(0) @binding(8) var<storage, read_write> p_rows: array<f32>;
@group(0) @binding(12) var<storage, read> gate_rows: array<f32>;

var<workgroup> g_run: array<f32, CH>;
var<workgroup> betas: array<f32, CH>;
// M, then T below the diagonal (zero above it; T's unit diagonal is implicit).
var<workgroup> m: array<f32, 4096>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) i: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let h = wid.x;
    let t0 = wid.y * CH;
    let len = min(CH, step.n_tokens - t0);
    let kh = key_head(h);
    let valid = i < len;
    // Rows past the prompt read its last row and are masked.
    let t = t0 + min(i, len - 1u);
    let gates = t * p.gates_stride + p.gates_at;
    let beta = select(0.0, 1.0 / (1.0 + exp(-gate_rows[gates + h])), valid);
    g_run[i] = select(0.0, decay_a[h] * softplus(gate_rows[gates + NV + h] + dt_bias[h]), valid);
    betas[i] = beta;
    workgroupBarrier();
    var g = 0.0;
    for (var j = 0u; j <= i; j++) {
        g += g_run[j];
    }
    workgroupBarrier();
    g_run[i] = g;
    workgroupBarrier();
    if (valid) {
        decays[t * NV + h] = g;
    }

    // Row i of M and P. Every invocation walks the same j, so k_j's loads are shared.
    let q_i = t * p.row_stride + kh * DK;
    let k_i = q_i + NK * DK;
    let p_at = (t * NV + h) * CH;
    for (var j = 0u; j < CH; j++) {
        var kk = 0.0;
        var qk = 0.0;
        if (j < len) {
            let k_j = (t0 + j) * p.row_stride + NK * DK + kh * DK;
            for (var d = 0u; d < DK; d++) {
                let kj = rows[k_j + d];
                kk += rows[k_i + d] * kj;
                qk += rows[q_i + d] * kj;
            }
        }
        // G_i − G_j ≤ 0 where it is used (j ≤ i); the clamp keeps the rest finite.
        let decay = exp(min(g - g_run[j], 0.0));
        m[i * CH + j] = select(0.0, beta * kk * decay, j < i && valid);
        if (valid) {
            p_rows[p_at + j] = select(0.0, qk * decay, j <= i);
        }
    }
    workgroupBarrier();

    // T = (I + M)⁻¹ row by row: T[r][j] = −M[r][j] − Σ_{j<k<r} M[r][k] T[k][j]. Invocation j
    // holds column j; rows above r already hold T.
    for (var r = 1u; r < len; r++) {
        var x = 0.0;
        if (i < r) {
            x = -m[r * CH + i];
            for (var k = i + 1u; k < r; k++) {
                x -= m[r * CH + k] * m[k * CH + i];
            }
        }
        workgroupBarrier();
        if (i < r) {
            m[r * CH + i] = x;
        }
        workgroupBarrier();
    }

    // W = T (β e^G k) and U = T (β v), a column per invocation: the column's inputs in
    // registers, T's rows shared.
    var col: array<f32, CH>;
    for (var d = i; d < DK; d += CH) {
        for (var j = 0u; j < CH; j++) {
            let at = (t0 + min(j, len - 1u)) * p.row_stride + NK * DK + kh * DK + d;
            col[j] = select(0.0, betas[j] * exp(g_run[j]) * rows[at], j < len);
        }
        for (var r = 0u; r < len; r++) {
            var acc = col[r];
            for (var j = 0u; j < r; j++) {
                acc += m[r * CH + j] * col[j];
            }
            w_rows[((t0 + r) * NV + h) * DK + d] = acc;
        }
    }
    for (var d = i; d < DV; d += CH) {
        for (var j = 0u; j < CH; j++) {
            let at = (t0 + min(j, len - 1u)) * p.row_stride + 2u * NK * DK + h * DV + d;
            col[j] = select(0.0, betas[j] * rows[at], j < len);
        }
        for (var r = 0u; r < len; r++) {
            var acc = col[r];
            for (var j = 0u; j < r; j++) {
                acc += m[r * CH + j] * col[j];
            }
            u_rows[((t0 + r) * NV + h) * DV + d] = acc;
        }
    }
}
#endif

#if CHUNK
const COLS: u32 = 32u;

@group(0) @binding(2) var<storage, read> rows: array<f32>;
@group(0) @binding(5) var<storage, read> decays: array<f32>;
@group(0) @binding(6) var<storage, read> w_rows: array<f32>;
@group(0) @binding(7) var<storage, read> u_rows: array<f32>;
@group(0) @binding(8) var<storage, read> p_rows: array<f32>;
// [NV][DK][DV].
@group(0) @binding(9) var<storage, read_write> state: array<f32>;
// [tokens][NV·DV]: O, before the gated norm.
@group(0) @binding(10) var<storage, read_write> out: array<f32>;

// Per row of the chunk: e^G and e^{G_L − G}.
var<workgroup> grow: array<f32, CH>;
var<workgroup> gleft: array<f32, CH>;
// V' per row, a column per invocation (each reads only its own).
var<workgroup> v_new: array<f32, 2048>;

@compute @workgroup_size(32)
fn main(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let h = wid.y;
    let v = wid.x * COLS + tid;
    let owns = v < DV;
    let vc = min(v, DV - 1u);
    let kh = key_head(h);
    var s: array<f32, DK>;
    for (var d = 0u; d < DK; d++) {
        s[d] = state[(h * DK + d) * DV + vc];
    }
    let chunks = (step.n_tokens + CH - 1u) / CH;
    for (var c = 0u; c < chunks; c++) {
        let t0 = c * CH;
        let len = min(CH, step.n_tokens - t0);
        let g_last = decays[(t0 + len - 1u) * NV + h];
        // The previous chunk is done with the decays.
        workgroupBarrier();
        for (var r = tid; r < len; r += COLS) {
            let g = decays[(t0 + r) * NV + h];
            grow[r] = exp(g);
            gleft[r] = exp(g_last - g);
        }
        workgroupBarrier();
        for (var r = 0u; r < len; r++) {
            let t = t0 + r;
            let w_at = (t * NV + h) * DK;
            let q_at = t * p.row_stride + kh * DK;
            var ws = 0.0;
            var qs = 0.0;
            for (var d = 0u; d < DK; d++) {
                ws += w_rows[w_at + d] * s[d];
                qs += rows[q_at + d] * s[d];
            }
            let fresh = u_rows[(t * NV + h) * DV + vc] - ws;
            v_new[r * COLS + tid] = fresh;
            let p_at = (t * NV + h) * CH;
            var o = grow[r] * qs;
            for (var j = 0u; j <= r; j++) {
                o += p_rows[p_at + j] * v_new[j * COLS + tid];
            }
            if (owns) {
                out[t * NV * DV + h * DV + v] = o;
            }
        }
        let carry = exp(g_last);
        for (var d = 0u; d < DK; d++) {
            var acc = 0.0;
            for (var r = 0u; r < len; r++) {
                let k = rows[(t0 + r) * p.row_stride + NK * DK + kh * DK + d];
                acc += k * gleft[r] * v_new[r * COLS + tid];
            }
            s[d] = carry * s[d] + acc;
        }
    }
    if (owns) {
        for (var d = 0u; d < DK; d++) {
            state[(h * DK + d) * DV + v] = s[d];
        }
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
