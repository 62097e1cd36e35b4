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
// the gated norm in place.
//
// Appended to delta_net.wgsl, whose Params, step, silu, softplus and convolution ring it uses.
//
// Defines: K; one of CONV_ALL, CONV_STATE, QKNORM, PREP, WALK (with COLS, ROWS, WALK_DH and
// TILE_PART: values of a staged tile each invocation loads), OUT,
// GNORM; DK, DV, NK, NV; TILED (value head h reads key head h mod NK, GGUF's order, instead
// of h / (NV / NK)).

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

#if PREP
@group(0) @binding(2) var<storage, read> rows: array<f32>;
// Per value head: A = −exp(A_log), dt_bias.
@group(0) @binding(3) var<storage, read> decay_a: array<f32>;
@group(0) @binding(4) var<storage, read> dt_bias: array<f32>;
// [tokens][NV]: G, the running log decay within the token's chunk.
@group(0) @binding(5) var<storage, read_write> decays: array<f32>;
// [tokens][NV][DK]: W.
@group(0) @binding(6) var<storage, read_write> w_rows: array<f32>;
// [tokens][NV][DV]: U (the walk turns it into V').
@group(0) @binding(7) var<storage, read_write> u_rows: array<f32>;
// [tokens][NV][CH]: P's rows.
@group(0) @binding(8) var<storage, read_write> p_rows: array<f32>;
@group(0) @binding(12) var<storage, read> gate_rows: array<f32>;

// Dims of q and k staged at a time for the Gram products.
const DT: u32 = 16u;

var<workgroup> g_run: array<f32, CH>;
var<workgroup> betas: array<f32, CH>;
// M, then T below the diagonal (zero above it; T's unit diagonal is implicit).
var<workgroup> m: array<f32, 4096>;
var<workgroup> k_tile: array<f32, 1024>;
var<workgroup> q_tile: array<f32, 1024>;

// 256 invocations: the Gram products four per row (16 columns each), the solve one per
// column, W and U one per column of k and v.
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let h = wid.x;
    let t0 = wid.y * CH;
    let len = min(CH, step.n_tokens - t0);
    let kh = key_head(h);
    let k_base = NK * DK + kh * DK;
    if (tid < CH) {
        let valid = tid < len;
        // Rows past the prompt read its last row and are masked.
        let gates = (t0 + min(tid, len - 1u)) * p.gates_stride + p.gates_at;
        let a = gate_rows[gates + NV + h];
        betas[tid] = select(0.0, 1.0 / (1.0 + exp(-gate_rows[gates + h])), valid);
        g_run[tid] = select(0.0, decay_a[h] * softplus(a + dt_bias[h]), valid);
    }
    workgroupBarrier();
    var g_sum = 0.0;
    if (tid < CH) {
        for (var j = 0u; j <= tid; j++) {
            g_sum += g_run[j];
        }
    }
    workgroupBarrier();
    if (tid < CH) {
        g_run[tid] = g_sum;
        if (tid < len) {
            decays[(t0 + tid) * NV + h] = g_sum;
        }
    }

    // Row i's k·k_j and q·k_j for its 16 columns j, over staged tiles of the chunk's q and k.
    let i = tid / 4u;
    let j0 = (tid % 4u) * 16u;
#for jj in 0..16
    var kk{{jj}} = 0.0;
    var qk{{jj}} = 0.0;
#endfor
    for (var d0 = 0u; d0 < DK; d0 += DT) {
        workgroupBarrier();
        for (var e = tid; e < CH * DT; e += 256u) {
            let row = e / DT;
            let d = d0 + e % DT;
            // Rows and dims past the chunk read inside it and are masked.
            let at = (t0 + min(row, len - 1u)) * p.row_stride + kh * DK + min(d, DK - 1u);
            let inside = row < len && d < DK;
            q_tile[e] = select(0.0, rows[at], inside);
            k_tile[e] = select(0.0, rows[at + NK * DK], inside);
        }
        workgroupBarrier();
        for (var dd = 0u; dd < DT; dd++) {
            let ki = k_tile[i * DT + dd];
            let qi = q_tile[i * DT + dd];
#for jj in 0..16
            let kj{{jj}} = k_tile[(j0 + {{jj}}u) * DT + dd];
            kk{{jj}} += ki * kj{{jj}};
            qk{{jj}} += qi * kj{{jj}};
#endfor
        }
    }
    let g_i = g_run[i];
    let beta_i = betas[i];
    let row_valid = i < len;
    let p_at = ((t0 + min(i, len - 1u)) * NV + h) * CH;
#for jj in 0..16
    {
        let j = j0 + {{jj}}u;
        // G_i − G_j ≤ 0 where it is used (j ≤ i); the clamp keeps the rest finite.
        let decay = exp(min(g_i - g_run[j], 0.0));
        m[i * CH + j] = select(0.0, beta_i * kk{{jj}} * decay, j < i && row_valid);
        if (row_valid) {
            p_rows[p_at + j] = select(0.0, qk{{jj}} * decay, j <= i);
        }
    }
#endfor
    workgroupBarrier();

    // T = (I + M)⁻¹ row by row: T[r][j] = −M[r][j] − Σ_{j<k<r} M[r][k] T[k][j]. Invocation j
    // holds column j; rows above r already hold T.
    for (var r = 1u; r < len; r++) {
        var x = 0.0;
        if (tid < r) {
            x = -m[r * CH + tid];
            for (var k = tid + 1u; k < r; k++) {
                x -= m[r * CH + k] * m[k * CH + tid];
            }
        }
        workgroupBarrier();
        if (tid < r) {
            m[r * CH + tid] = x;
        }
        workgroupBarrier();
    }

    // W = T (β e^G k) and U = T (β v), a column of k or v per invocation: the column's inputs
    // in registers, T's rows shared.
    var col: array<f32, CH>;
    for (var c = tid; c < DK + DV; c += 256u) {
        let is_k = c < DK;
        let d = select(c - DK, c, is_k);
        let src = select(2u * NK * DK + h * DV + d, k_base + d, is_k);
        for (var j = 0u; j < CH; j++) {
            let at = (t0 + min(j, len - 1u)) * p.row_stride + src;
            let scale = betas[j] * select(1.0, exp(g_run[j]), is_k);
            col[j] = select(0.0, scale * rows[at], j < len);
        }
        for (var r = 0u; r < len; r++) {
            var acc = col[r];
            for (var j = 0u; j < r; j++) {
                acc += m[r * CH + j] * col[j];
            }
            if (is_k) {
                w_rows[((t0 + r) * NV + h) * DK + d] = acc;
            } else {
                u_rows[((t0 + r) * NV + h) * DV + d] = acc;
            }
        }
    }
}
#endif

#if WALK
@group(0) @binding(2) var<storage, read> rows: array<f32>;
@group(0) @binding(5) var<storage, read> decays: array<f32>;
@group(0) @binding(6) var<storage, read> w_rows: array<f32>;
// U in, V' out (each value read, then written, by the same invocation).
@group(0) @binding(7) var<storage, read_write> u_rows: array<f32>;
// [NV][DK][DV]: the sequence's state, carried in and out.
@group(0) @binding(9) var<storage, read_write> state: array<f32>;
// [chunks][NV][DK][DV]: the state each chunk starts from.
@group(0) @binding(13) var<storage, read_write> chunk_states: array<f32>;

const COLS: u32 = {{COLS}}u;
const GROUPS: u32 = 128u / COLS;
// ROWS: CH / GROUPS, the chunk's rows a group takes.
const ROWS_PER: u32 = {{ROWS}}u;

// Dims of W or k staged at a time (WALK_DH), and a staged row's stride (padded so that the
// groups' rows fall in different banks).
const DH: u32 = {{WALK_DH}}u;
const TILE_ROW: u32 = DH + 1u;
// A chunk's tiles: DK / DH of W (for V'), then as many of the decayed k (for the state).
const W_TILES: u32 = DK / DH + select(0u, 1u, DK % DH != 0u);
const TILES: u32 = 2u * W_TILES;

// The state's COLS columns of this workgroup, [DK][COLS].
var<workgroup> s_tile: array<f32, DK * COLS>;
var<workgroup> tile: array<f32, CH * TILE_ROW>;
var<workgroup> v_tile: array<f32, CH * COLS>;
var<workgroup> g_left: array<f32, CH>;

// The next tile's values this invocation stages, loaded while the current tile is multiplied:
// W and k do not depend on the walk, so only their loads' latency stands in its way. (Named
// registers, not an array: see `#for` in engine/src/gpu/shader.rs.)
#for i in 0..TILE_PART
var<private> next{{i}}: f32;
#endfor

// Loads tile `n` of the walk (chunk n / TILES; then W's or k's dims from DH · (n % W_TILES)),
// zero past the chunk's tokens or the head's dims. k's decay is applied as it is staged.
fn fetch_tile(n: u32, h: u32, k_base: u32, tid: u32) {
    let t0 = (n / TILES) * CH;
    if (t0 >= step.n_tokens) {
        return;
    }
    let len = min(CH, step.n_tokens - t0);
    let of_k = (n % TILES) >= W_TILES;
    let d0 = (n % W_TILES) * DH;
#for i in 0..TILE_PART
    {
        let e = tid + {{i}}u * 128u;
        let r = e / DH;
        let d = min(d0 + e % DH, DK - 1u);
        let row = t0 + min(r, len - 1u);
        let inside = r < len && d0 + e % DH < DK;
        let at = select(((row * NV + h) * DK) + d, row * p.row_stride + k_base + d, of_k);
        var v = 0.0;
        if (inside) {
            if (of_k) {
                v = rows[at];
            } else {
                v = w_rows[at];
            }
        }
        next{{i}} = v;
    }
#endfor
}

// Stages the fetched tile, k's rows scaled by their decay to the chunk's end.
fn stage_tile(of_k: bool, tid: u32) {
#for i in 0..TILE_PART
    {
        let e = tid + {{i}}u * 128u;
        let r = e / DH;
        tile[r * TILE_ROW + e % DH] = select(next{{i}}, next{{i}} * g_left[r], of_k);
    }
#endfor
}

// 128 invocations: COLS state columns × GROUPS groups, a group taking a share of the
// chunk's rows for V' and of the state's rows for its update.
@compute @workgroup_size(128)
fn main(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let h = wid.y;
    let c = tid % COLS;
    let group = tid / COLS;
    let v = wid.x * COLS + c;
    let owns = v < DV;
    let vc = min(v, DV - 1u);
    let kh = key_head(h);
    let k_base = NK * DK + kh * DK;
    for (var d = group; d < DK; d += GROUPS) {
        s_tile[d * COLS + c] = select(0.0, state[(h * DK + d) * DV + vc], owns);
    }
    let chunks = (step.n_tokens + CH - 1u) / CH;
    fetch_tile(0u, h, k_base, tid);
    for (var ch = 0u; ch < chunks; ch++) {
        let t0 = ch * CH;
        let len = min(CH, step.n_tokens - t0);
        let g_last = decays[(t0 + len - 1u) * NV + h];
        workgroupBarrier();
        for (var r = tid; r < CH; r += 128u) {
            g_left[r] = select(0.0, exp(g_last - decays[(t0 + min(r, len - 1u)) * NV + h]), r < len);
        }
        // The state this chunk starts from, for the outputs.
        if (owns) {
            for (var d = group; d < DK; d += GROUPS) {
                chunk_states[((ch * NV + h) * DK + d) * DV + v] = s_tile[d * COLS + c];
            }
        }
        // V' = U − W S over this group's rows (named accumulators stay in registers), W
        // staged DH dims at a time.
        let r0 = group * ROWS_PER;
#for k in 0..ROWS
        var acc{{k}} = 0.0;
#endfor
        for (var wt = 0u; wt < W_TILES; wt++) {
            let d0 = wt * DH;
            workgroupBarrier();
            stage_tile(false, tid);
            workgroupBarrier();
            fetch_tile(ch * TILES + wt + 1u, h, k_base, tid);
            for (var dd = 0u; dd < DH; dd++) {
                let sv = s_tile[min(d0 + dd, DK - 1u) * COLS + c];
#for k in 0..ROWS
                acc{{k}} += tile[(r0 + {{k}}u) * TILE_ROW + dd] * sv;
#endfor
            }
        }
#for k in 0..ROWS
        // Columns past DV read nothing another workgroup writes; their V' is never used.
        if (r0 + {{k}}u < len && owns) {
            let at = ((t0 + r0 + {{k}}u) * NV + h) * DV + v;
            let fresh = u_rows[at] - acc{{k}};
            v_tile[(r0 + {{k}}u) * COLS + c] = fresh;
            u_rows[at] = fresh;
        }
#endfor
        // S ← e^{G_L} S + (e^{G_L − G} k)ᵀ V' over this group's rows of the state, the
        // decayed k staged DH dims at a time (the next chunk's first W tile fetched during
        // the last).
        let carry = exp(g_last);
        for (var kt = 0u; kt < W_TILES; kt++) {
            let d0 = kt * DH;
            workgroupBarrier();
            stage_tile(true, tid);
            workgroupBarrier();
            fetch_tile(ch * TILES + W_TILES + kt + 1u, h, k_base, tid);
            for (var d = d0 + group; d < min(d0 + DH, DK); d += GROUPS) {
                var sum = 0.0;
                for (var r = 0u; r < len; r++) {
                    sum += tile[r * TILE_ROW + d - d0] * v_tile[r * COLS + c];
                }
                s_tile[d * COLS + c] = carry * s_tile[d * COLS + c] + sum;
            }
        }
    }
    workgroupBarrier();
    if (owns) {
        for (var d = group; d < DK; d += GROUPS) {
            state[(h * DK + d) * DV + v] = s_tile[d * COLS + c];
        }
    }
}
#endif

#if OUT
@group(0) @binding(2) var<storage, read> rows: array<f32>;
@group(0) @binding(5) var<storage, read> decays: array<f32>;
// V'.
@group(0) @binding(7) var<storage, read> u_rows: array<f32>;
@group(0) @binding(8) var<storage, read> p_rows: array<f32>;
// [tokens][NV·DV]: O, before the gated norm.
@group(0) @binding(10) var<storage, read_write> out: array<f32>;
@group(0) @binding(13) var<storage, read> chunk_states: array<f32>;

// Dims of q and of the state staged at a time, and a staged q row's stride (padded so that
// the row groups' rows fall in different banks).
const DH: u32 = 32u;
const Q_ROW: u32 = DH + 1u;

var<workgroup> q_tile: array<f32, CH * Q_ROW>;
var<workgroup> s_tile: array<f32, DH * 32u>;
var<workgroup> v_tile: array<f32, CH * 32u>;

// O = (e^G q) S + P V' for one chunk and head, 32 output columns at a time: invocation
// (group, c) takes column c of the block for 16 of the chunk's rows (named accumulators stay
// in registers); q, the state's columns and V' staged in workgroup memory.
@compute @workgroup_size(128)
fn main(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let h = wid.x;
    let ch = wid.y;
    let t0 = ch * CH;
    let len = min(CH, step.n_tokens - t0);
    let kh = key_head(h);
    let c = tid % 32u;
    let r0 = (tid / 32u) * 16u;
    for (var v0 = 0u; v0 < DV; v0 += 32u) {
        let v = min(v0 + c, DV - 1u);
#for k in 0..16
        var acc{{k}} = 0.0;
#endfor
        for (var d0 = 0u; d0 < DK; d0 += DH) {
            workgroupBarrier();
            for (var e = tid; e < CH * DH; e += 128u) {
                let r = e / DH;
                let d = min(d0 + e % DH, DK - 1u);
                let inside = r < len && d0 + e % DH < DK;
                let at = (t0 + min(r, len - 1u)) * p.row_stride + kh * DK + d;
                q_tile[r * Q_ROW + e % DH] = select(0.0, rows[at], inside);
            }
            for (var e = tid; e < DH * 32u; e += 128u) {
                let d = min(d0 + e / 32u, DK - 1u);
                let col = min(v0 + e % 32u, DV - 1u);
                s_tile[e] = chunk_states[((ch * NV + h) * DK + d) * DV + col];
            }
            workgroupBarrier();
            for (var dd = 0u; dd < DH; dd++) {
                let sv = s_tile[dd * 32u + c];
#for k in 0..16
                acc{{k}} += q_tile[(r0 + {{k}}u) * Q_ROW + dd] * sv;
#endfor
            }
        }
        // V' of the block's columns.
        workgroupBarrier();
        for (var e = tid; e < CH * 32u; e += 128u) {
            let r = min(e / 32u, len - 1u);
            let col = min(v0 + e % 32u, DV - 1u);
            v_tile[e] = u_rows[((t0 + r) * NV + h) * DV + col];
        }
        workgroupBarrier();
#for k in 0..16
        {
            let r = r0 + {{k}}u;
            if (r < len) {
                let t = t0 + r;
                var o = exp(decays[t * NV + h]) * acc{{k}};
                let p_at = (t * NV + h) * CH;
                for (var j = 0u; j <= r; j++) {
                    o += p_rows[p_at + j] * v_tile[j * 32u + c];
                }
                if (v0 + c < DV) {
                    out[t * NV * DV + h * DV + v] = o;
                }
            }
        }
#endfor
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
