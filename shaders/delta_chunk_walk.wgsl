// The chunked gated delta rule's walk through the chunks and its outputs (see
// delta_chunk.wgsl). Appended to delta_chunk.wgsl.

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
const THREADS: u32 = {{WALK_THREADS}}u;
const GROUPS: u32 = THREADS / COLS;
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
        let e = tid + {{i}}u * THREADS;
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
        let e = tid + {{i}}u * THREADS;
        let r = e / DH;
        tile[r * TILE_ROW + e % DH] = select(next{{i}}, next{{i}} * g_left[r], of_k);
    }
#endfor
}

// THREADS invocations: COLS state columns × GROUPS groups, a group taking a share of the
// chunk's rows for V' and of the state's rows for its update.
@compute @workgroup_size(THREADS)
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
        for (var r = tid; r < CH; r += THREADS) {
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
            // The group's dims of the tile side by side: one pass over the rows, each V'
            // value read once for all of them (one dim at a time was a chain of dependent
            // sums as long as the chunk, for each dim).
#for q in 0..WALK_DPER
            var sum{{q}} = 0.0;
#endfor
            for (var r = 0u; r < len; r++) {
                let vr = v_tile[r * COLS + c];
#for q in 0..WALK_DPER
                sum{{q}} += tile[r * TILE_ROW + group + {{q}}u * GROUPS] * vr;
#endfor
            }
#for q in 0..WALK_DPER
            {
                let d = d0 + group + {{q}}u * GROUPS;
                if (d < DK) {
                    s_tile[d * COLS + c] = carry * s_tile[d * COLS + c] + sum{{q}};
                }
            }
#endfor
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

// O = e^G (q S) + P V' for one chunk, head and block of 64 output columns, as one product
// over k = q's DK dims then the chunk's CH tokens: tiles of KT of those, q or P (64 rows) and
// S or V' (64 columns) staged in workgroup memory, each invocation a 4×4 block of outputs.
const KT: u32 = 32u;
const A_ROW: u32 = KT + 1u;
const Q_TILES: u32 = (DK + KT - 1u) / KT;
const OUT_TILES: u32 = Q_TILES + CH / KT;

// [row][KT], rows padded so that a tile's staging stores fall in different banks.
var<workgroup> a_tile: array<f32, CH * A_ROW>;
// [KT][64 columns], four columns a vec4.
var<workgroup> b_tile: array<vec4<f32>, KT * 16u>;

// The next tile, loaded while the current one is multiplied (named registers: see `#for` in
// engine/src/gpu/shader.rs).
#for i in 0..8
var<private> a_next{{i}}: f32;
#endfor
#for i in 0..2
var<private> b_next{{i}}: vec4<f32>;
#endfor

// Loads tile `n`: q's dims n·KT.. and the chunk's starting state's rows there, then P's
// columns and V''s rows (n − Q_TILES)·KT.. Zero past the chunk, the head's dims and DV.
fn fetch_out(n: u32, h: u32, ch: u32, t0: u32, len: u32, v0: u32, tid: u32) {
    let of_q = n < Q_TILES;
    let k0 = select((n - Q_TILES) * KT, n * KT, of_q);
    let q_base = key_head(h) * DK;
#for i in 0..8
    {
        let e = tid + {{i}}u * 256u;
        let r = e / KT;
        let kk = k0 + e % KT;
        let row = t0 + min(r, len - 1u);
        var v = 0.0;
        if (r < len) {
            if (of_q) {
                if (kk < DK) {
                    v = rows[row * p.row_stride + q_base + kk];
                }
            } else {
                v = p_rows[(row * NV + h) * CH + kk];
            }
        }
        a_next{{i}} = v;
    }
#endfor
#for i in 0..2
    {
        let e = tid + {{i}}u * 256u;
        let kk = k0 + e / 16u;
        let col = v0 + 4u * (e % 16u);
        var b = vec4<f32>(0.0);
        var at = 0u;
        var inside = false;
        if (of_q) {
            at = ((ch * NV + h) * DK + min(kk, DK - 1u)) * DV;
            inside = kk < DK;
        } else {
            at = ((t0 + min(kk, len - 1u)) * NV + h) * DV;
            inside = kk < len;
        }
        if (inside) {
            for (var c = 0u; c < 4u; c++) {
                if (col + c < DV) {
                    if (of_q) {
                        b[c] = chunk_states[at + col + c];
                    } else {
                        b[c] = u_rows[at + col + c];
                    }
                }
            }
        }
        b_next{{i}} = b;
    }
#endfor
}

fn stage_out(tid: u32) {
#for i in 0..8
    {
        let e = tid + {{i}}u * 256u;
        a_tile[(e / KT) * A_ROW + e % KT] = a_next{{i}};
    }
#endfor
#for i in 0..2
    b_tile[tid + {{i}}u * 256u] = b_next{{i}};
#endfor
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let h = wid.x;
    let ch = wid.y;
    let v0 = wid.z * 64u;
    let t0 = ch * CH;
    let len = min(CH, step.n_tokens - t0);
    let tx = tid % 16u;
    let r0 = (tid / 16u) * 4u;
#for i in 0..4
    var acc{{i}} = vec4<f32>(0.0);
#endfor
    fetch_out(0u, h, ch, t0, len, v0, tid);
    for (var n = 0u; n < OUT_TILES; n++) {
        workgroupBarrier();
        stage_out(tid);
        workgroupBarrier();
        if (n + 1u < OUT_TILES) {
            fetch_out(n + 1u, h, ch, t0, len, v0, tid);
        }
        for (var kk = 0u; kk < KT; kk++) {
            let b = b_tile[kk * 16u + tx];
#for i in 0..4
            acc{{i}} += a_tile[(r0 + {{i}}u) * A_ROW + kk] * b;
#endfor
        }
        if (n + 1u == Q_TILES) {
            // q S is done: its rows take their decay before P V' adds to them.
#for i in 0..4
            acc{{i}} *= exp(decays[(t0 + min(r0 + {{i}}u, len - 1u)) * NV + h]);
#endfor
        }
    }
#for i in 0..4
    if (r0 + {{i}}u < len) {
        let at = (t0 + r0 + {{i}}u) * NV * DV + h * DV;
        for (var c = 0u; c < 4u; c++) {
            let v = v0 + 4u * tx + c;
            if (v < DV) {
                out[at + v] = acc{{i}}[c];
            }
        }
    }
#endfor
}
#endif
