// The chunked gated delta rule's preparation (see delta_chunk.wgsl): per value head and chunk,
// the decays G, the Gram products, T = (I + M)⁻¹, and W, U and P. Appended to delta_chunk.wgsl.

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
// The triangular solve's blocks: T's diagonal blocks of TB rows are inverted first, then the
// blocks below them one row of blocks at a time.
const TB: u32 = 16u;
const TB2: u32 = TB * TB;
// Where the solve keeps the diagonal blocks' inverses and the sums of the row of blocks in
// hand, in `tiles`.
const T_DIAG: u32 = 0u;
const T_SUMS: u32 = (CH / TB) * TB2;
// Columns of k or v a pass of W and U takes.
const WU_COLS: u32 = 32u;

var<workgroup> g_run: array<f32, CH>;
var<workgroup> betas: array<f32, CH>;
// M, then T below the diagonal (zero on and above it; T's unit diagonal is implicit), as vec4s
// so that W and U read four of a row's values in one load.
var<workgroup> m: array<vec4<f32>, 1024>;
// The Gram products' staged q and k ([dim][row], rows padded to G_ROW); then the solve's
// diagonal inverses and block sums; then a pass of W and U's inputs. Four values a vec4, so
// that the Gram products read four rows in one load.
const G_ROW: u32 = CH + 4u;
const K_TILE: u32 = DT * G_ROW;
var<workgroup> tiles: array<vec4<f32>, 2u * K_TILE / 4u>;

fn tile_at(i: u32) -> f32 {
    return tiles[i / 4u][i % 4u];
}

fn tile_put(i: u32, v: f32) {
    tiles[i / 4u][i % 4u] = v;
}

// The next Gram tile, loaded while the current one is multiplied (named registers: see `#for`
// in engine/src/gpu/shader.rs): four values of q and four of k.
#for i in 0..4
var<private> q_next{{i}}: f32;
var<private> k_next{{i}}: f32;
#endfor

// Loads dims d0.. of the chunk's q and k rows, zero past the chunk and the head's dims.
fn fetch_gram(d0: u32, t0: u32, len: u32, kh: u32, tid: u32) {
#for i in 0..4
    {
        let e = tid + {{i}}u * 256u;
        let row = e / DT;
        let d = d0 + e % DT;
        let at = (t0 + min(row, len - 1u)) * p.row_stride + kh * DK + min(d, DK - 1u);
        let inside = row < len && d < DK;
        q_next{{i}} = select(0.0, rows[at], inside);
        k_next{{i}} = select(0.0, rows[at + NK * DK], inside);
    }
#endfor
}

fn stage_gram(tid: u32) {
#for i in 0..4
    {
        let e = tid + {{i}}u * 256u;
        let at = (e % DT) * G_ROW + e / DT;
        tile_put(at, q_next{{i}});
        tile_put(K_TILE + at, k_next{{i}});
    }
#endfor
}

fn m_at(i: u32) -> f32 {
    return m[i / 4u][i % 4u];
}

fn m_put(i: u32, v: f32) {
    m[i / 4u][i % 4u] = v;
}

// T = (I + M)⁻¹ in blocks: each diagonal block (I + M_ii)⁻¹ by forward substitution, one
// invocation a column, then for each row of blocks i, T_ij = −T_ii Σ_{j≤k<i} M_ik T_kj for
// every j < i at once. A row-by-row substitution over the whole chunk was 63 steps of two
// barriers each with most invocations idle; this is seven.
fn invert_unit_lower(tid: u32) {
    if (tid < CH) {
        let b = tid / TB;
        let j = tid % TB;
        let at = b * TB;
        let inv = T_DIAG + b * TB2;
        for (var r = 0u; r < TB; r++) {
            var x = select(0.0, 1.0, r == j);
            if (r > j) {
                x = -m_at((at + r) * CH + at + j);
                for (var k = j + 1u; k < r; k++) {
                    x -= m_at((at + r) * CH + at + k) * tile_at(inv + k * TB + j);
                }
            }
            tile_put(inv + r * TB + j, x);
        }
    }
    workgroupBarrier();
    for (var i = 1u; i < CH / TB; i++) {
        // The sums Σ_k M_ik T_kj: M's row of blocks i is still in m, the rows above hold T.
        for (var e = tid; e < i * TB2; e += 256u) {
            let j = e / TB2;
            let r = (e / TB) % TB;
            let c = e % TB;
            let m_row = (i * TB + r) * CH;
            var x = 0.0;
            for (var q = 0u; q < TB; q++) {
                x += m_at(m_row + j * TB + q) * tile_at(T_DIAG + j * TB2 + q * TB + c);
            }
            for (var k = j + 1u; k < i; k++) {
                for (var q = 0u; q < TB; q++) {
                    x += m_at(m_row + k * TB + q) * m_at((k * TB + q) * CH + j * TB + c);
                }
            }
            tile_put(T_SUMS + e, x);
        }
        workgroupBarrier();
        for (var e = tid; e < i * TB2; e += 256u) {
            let j = e / TB2;
            let r = (e / TB) % TB;
            let c = e % TB;
            var t = 0.0;
            for (var q = 0u; q <= r; q++) {
                t -= tile_at(T_DIAG + i * TB2 + r * TB + q) * tile_at(T_SUMS + j * TB2 + q * TB + c);
            }
            m_put((i * TB + r) * CH + j * TB + c, t);
        }
        workgroupBarrier();
    }
    // The diagonal blocks' inverses below their diagonals.
    for (var e = tid; e < CH * TB; e += 256u) {
        let b = e / TB2;
        let r = (e / TB) % TB;
        let c = e % TB;
        if (r > c) {
            m_put((b * TB + r) * CH + b * TB + c, tile_at(T_DIAG + e));
        }
    }
    workgroupBarrier();
}

// The k and v passes of W and U.
const K_PASSES: u32 = (DK + WU_COLS - 1u) / WU_COLS;
const WU_PASSES: u32 = K_PASSES + (DV + WU_COLS - 1u) / WU_COLS;

// The next pass's inputs, loaded while the current one is multiplied (the first during the
// solve).
#for i in 0..8
var<private> wu_next{{i}}: f32;
#endfor

// Loads pass `part`'s inputs: β e^G k or β v, WU_COLS columns of the chunk's rows, zero past
// the chunk and the head's dims.
fn fetch_wu(part: u32, h: u32, t0: u32, len: u32, k_base: u32, tid: u32) {
    let is_k = part < K_PASSES;
    let d0 = select((part - K_PASSES) * WU_COLS, part * WU_COLS, is_k);
    let dims = select(DV, DK, is_k);
    let src = select(2u * NK * DK + h * DV, k_base, is_k);
#for i in 0..8
    {
        let e = tid + {{i}}u * 256u;
        let j = e / WU_COLS;
        let d = d0 + e % WU_COLS;
        let at = (t0 + min(j, len - 1u)) * p.row_stride + src + min(d, dims - 1u);
        let scale = betas[j] * select(1.0, exp(g_run[j]), is_k);
        wu_next{{i}} = select(0.0, scale * rows[at], j < len && d < dims);
    }
#endfor
}

// W = T (β e^G k) and U = T (β v), WU_COLS columns of k or v a pass: the pass's inputs staged,
// invocation (g, c) takes column c for the chunk's rows 8g..8g + 7. Pass 0's inputs are
// already fetched.
fn solve_rows(tid: u32, h: u32, t0: u32, len: u32, k_base: u32) {
    let c = tid % WU_COLS;
    let r0 = (tid / WU_COLS) * 8u;
    for (var part = 0u; part < WU_PASSES; part++) {
        let is_k = part < K_PASSES;
        let d = select((part - K_PASSES) * WU_COLS, part * WU_COLS, is_k) + c;
        let dims = select(DV, DK, is_k);
        workgroupBarrier();
#for i in 0..8
        tile_put(tid + {{i}}u * 256u, wu_next{{i}});
#endfor
        workgroupBarrier();
        if (part + 1u < WU_PASSES) {
            fetch_wu(part + 1u, h, t0, len, k_base, tid);
        }
        // Row r's output is its input plus Σ_{j<r} T[r][j] · input[j]; T is zero from the
        // diagonal on, so the rows of a group share one loop to their last row.
#for i in 0..8
        var acc{{i}} = tile_at((r0 + {{i}}u) * WU_COLS + c);
#endfor
        for (var j = 0u; j < r0 + 8u; j += 4u) {
            let x = vec4<f32>(tile_at(j * WU_COLS + c), tile_at((j + 1u) * WU_COLS + c),
                              tile_at((j + 2u) * WU_COLS + c), tile_at((j + 3u) * WU_COLS + c));
#for i in 0..8
            acc{{i}} += dot(m[((r0 + {{i}}u) * CH + j) / 4u], x);
#endfor
        }
        if (d < dims) {
#for i in 0..8
            if (r0 + {{i}}u < len) {
                if (is_k) {
                    w_rows[((t0 + r0 + {{i}}u) * NV + h) * DK + d] = acc{{i}};
                } else {
                    u_rows[((t0 + r0 + {{i}}u) * NV + h) * DV + d] = acc{{i}};
                }
            }
#endfor
        }
    }
}

// 256 invocations: the Gram products a 4×4 block of each per invocation, the solve in blocks,
// W and U a column of k or v per invocation for eight rows.
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

    // The Gram products k·kᵀ and q·kᵀ, invocation (ty, tx) taking rows 4ty.. and columns
    // 4tx.., over staged tiles of DT dims of the chunk's q and k.
    let r0 = (tid / 16u) * 4u;
    let c0 = (tid % 16u) * 4u;
#for a in 0..4
    var kk{{a}} = vec4<f32>(0.0);
    var qk{{a}} = vec4<f32>(0.0);
#endfor
    fetch_gram(0u, t0, len, kh, tid);
    for (var d0 = 0u; d0 < DK; d0 += DT) {
        workgroupBarrier();
        stage_gram(tid);
        workgroupBarrier();
        if (d0 + DT < DK) {
            fetch_gram(d0 + DT, t0, len, kh, tid);
        }
        for (var dd = 0u; dd < DT; dd++) {
            let ki = tiles[(K_TILE + dd * G_ROW + r0) / 4u];
            let qi = tiles[(dd * G_ROW + r0) / 4u];
            let kj = tiles[(K_TILE + dd * G_ROW + c0) / 4u];
#for a in 0..4
            kk{{a}} += ki[{{a}}] * kj;
            qk{{a}} += qi[{{a}}] * kj;
#endfor
        }
    }
#for a in 0..4
    {
        let i = r0 + {{a}}u;
        let g_i = g_run[i];
        let beta_i = betas[i];
        let row_valid = i < len;
        let p_at = ((t0 + min(i, len - 1u)) * NV + h) * CH;
        for (var b = 0u; b < 4u; b++) {
            let j = c0 + b;
            // G_i − G_j ≤ 0 where it is used (j ≤ i); the clamp keeps the rest finite.
            let decay = exp(min(g_i - g_run[j], 0.0));
            m_put(i * CH + j, select(0.0, beta_i * kk{{a}}[b] * decay, j < i && row_valid));
            if (row_valid) {
                p_rows[p_at + j] = select(0.0, qk{{a}}[b] * decay, j <= i);
            }
        }
    }
#endfor
    workgroupBarrier();

    fetch_wu(0u, h, t0, len, k_base, tid);
    invert_unit_lower(tid);
    solve_rows(tid, h, t0, len, k_base);
}
#endif
