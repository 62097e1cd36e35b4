// Causal attention over the KV cache for the step's tokens, with grouped-query heads.
// One workgroup per (head, token). Keys are taken in chunks of WG: first every invocation
// scores one key (with KEY_LANES, that many lanes score each key together), then the value sum
// runs with each invocation owning four dims of the head and a share of the chunk's keys; an
// online softmax (running max and sum) carries across
// chunks, so any context length fits in fixed workgroup memory. HD is a specialisation
// constant so the per-key loops have fixed trip counts.
//
// With SPLIT (decoding one token), the keys are divided among workgroups instead: workgroup
// (head, s) takes the s-th run of split_len keys and writes its unnormalised output with its
// running max and sum; the next product (the output projection, see matvec.wgsl COMBINE)
// merges the runs. That keeps long contexts parallel without another dispatch. The split
// kernel also takes the token's q, k and v straight from the fused QKV product, applies RoPE
// itself, and stores the new key and value in the cache (one workgroup per KV head), so
// decoding needs no separate RoPE pass.
//
// With FULL, attention is not causal and reads keys and values from a token-major buffer
// (`[key][...]` rows of kv_stride floats, k at k_off and v right after the kv heads' keys):
// an encoder's self-attention over its fused QKV rows, or cross-attention of decoder queries
// over an encoder's projected keys and values. Every query sees all `keys` keys.
//
// With RUNS (a batched decode step, with BATCH, or a short step of one sequence, over long
// contexts), each row as split: workgroup (head, row, r) takes the r-th run of the row's keys
// and writes its unnormalised output and (max, sum) to `out` and `split_stats` at
// [row][r][head]; the `merge_runs` entry point then merges each row's runs into its output
// (`run_parts` the runs' outputs, `out` the result).
//
// With RING (sliding-window layers), a query at position q sees keys q − window + 1 ..= q only,
// and position j lives in cache row j mod capacity: a rolling cache bounded by the window.
//
// With Q8, caches hold q8_0 blocks of 32 dims: int8 values four to a word (one quad per
// word), then every block's f32 scale from word `scale_base` on.
//
// Defines: WG, HD (head_dim, a multiple of 4; of 32 with Q8), F16 (f16 cache), Q8, SPLIT (with
// QSTEP: 2 where the QKV row interleaves query heads with gate heads; KEY_LANES: lanes scoring
// each key together, 0 for one lane a key), MIN_SPLIT, MAX_SPLITS,
// NO_ROPE (learned positions), ROT (rotating dims of a head), RING, FULL, HALVES (with FULL: q,
// kv and out hold f16 values, two to a word, offsets and strides still counted in values), TILED
// (the `tiled` entry point, with BQ and BK), SINKS (a logit per head in every softmax's
// denominator; not with SPLIT), RUNS (not with SPLIT), HEAD_NORM (with SPLIT: q_norm and k_norm).

#if FULL
struct Params {
    heads: u32,
    kv_heads: u32,
    keys: u32,
    // Floats between consecutive queries (rows of q) and between consecutive keys.
    q_stride: u32,
    scale: f32,
    kv_stride: u32,
    k_off: u32,
    _pad: u32,
}
#else
struct Params {
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    // Cache rows per KV head.
    capacity: u32,
    scale: f32,
    window: u32,
    // Q8: word offset of the block scales in each cache buffer.
    scale_base: u32,
    // HEAD_NORM: the head norms' epsilon.
    eps: f32,
}
#endif

const QUADS: u32 = {{HD}}u / 4u;
#if KEY_LANES
const KEY_LANES: u32 = {{KEY_LANES}}u;
#endif
// Keys summed side by side in the value pass.
const KEY_GROUPS: u32 = {{WG}}u / QUADS;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> step: Step;
#if HALVES
// FULL over f16 operands, two values to a word: a quad of four is one vec2<u32>.
@group(0) @binding(2) var<storage, read> q: array<vec2<u32>>;
@group(0) @binding(3) var<storage, read> kv: array<vec2<u32>>;
#else
// Rotated queries [token][head][HD]; with SPLIT, the token's fused QKV row instead.
@group(0) @binding(2) var<storage, read> q: array<f32>;
#if FULL
@group(0) @binding(3) var<storage, read> kv: array<vec4<f32>>;
#endif
#endif
#if !FULL
#if SPLIT
#if Q8
@group(0) @binding(3) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(4) var<storage, read_write> v_cache: array<u32>;
#else
#if F16
@group(0) @binding(3) var<storage, read_write> k_cache: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read_write> v_cache: array<vec2<u32>>;
#else
@group(0) @binding(3) var<storage, read_write> k_cache: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> v_cache: array<vec4<f32>>;
#endif
#endif
#if !NO_ROPE
@group(0) @binding(7) var<storage, read> rope_cos: array<f32>;
@group(0) @binding(8) var<storage, read> rope_sin: array<f32>;
#endif
#else
#if Q8
@group(0) @binding(3) var<storage, read> k_cache: array<u32>;
@group(0) @binding(4) var<storage, read> v_cache: array<u32>;
#else
#if F16
@group(0) @binding(3) var<storage, read> k_cache: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read> v_cache: array<vec2<u32>>;
#else
@group(0) @binding(3) var<storage, read> k_cache: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> v_cache: array<vec4<f32>>;
#endif
#endif
#endif
#endif
#if HALVES
@group(0) @binding(5) var<storage, read_write> out: array<vec2<u32>>;
#else
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
#endif
#if SPLIT
// (running max, running sum) per (split, head).
@group(0) @binding(6) var<storage, read_write> split_stats: array<vec2<f32>>;
#endif
#if RUNS
// (running max, running sum) per (row, run, head).
@group(0) @binding(6) var<storage, read_write> split_stats: array<vec2<f32>>;
// The runs' unnormalised outputs [row][run][head][HD] (read by merge_runs).
@group(0) @binding(10) var<storage, read> run_parts: array<vec4<f32>>;
#endif
#if SINKS
// A logit per query head that joins every softmax's denominator (GPT-OSS's sinks).
@group(0) @binding(9) var<storage, read> sinks: array<f32>;
#endif
#if HEAD_NORM
// SPLIT: each query and key head's RMSNorm (Qwen3's and Gemma 3's q_norm and k_norm, before
// RoPE), applied as the head vectors are read from the QKV row, so that decoding needs no
// norm dispatch of its own; the row itself stays as the product wrote it.
@group(0) @binding(11) var<storage, read> q_gain: array<f32>;
@group(0) @binding(12) var<storage, read> k_gain: array<f32>;
#endif

// The factor that turns a head's unnormalised output into its attention output, given the
// running max and sum of its scores: 1 / sum, or with SINKS the sink's term added to the sum
// (both taken relative to the larger of the max and the sink, so neither overflows).
fn normaliser(head: u32, run_max: f32, run_sum: f32) -> f32 {
#if SINKS
    let m = max(run_max, sinks[head]);
    let kept = exp(run_max - m);
    return kept / (run_sum * kept + exp(sinks[head] - m));
#else
    return 1.0 / run_sum;
#endif
}

// Four values of an f16 word pair.
fn halves_quad(w: vec2<u32>) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}

// The four query values from value offset `b` (a multiple of 4).
fn q_quad(b: u32) -> vec4<f32> {
#if HALVES
    return halves_quad(q[b / 4u]);
#else
    return vec4<f32>(q[b], q[b + 1u], q[b + 2u], q[b + 3u]);
#endif
}

#if HALVES
// Writes four outputs from value offset `b` (a multiple of 4) as two f16 pairs.
fn store_halves(b: u32, o: vec4<f32>) {
    let h = clamp(o, vec4<f32>(-65504.0), vec4<f32>(65504.0));
    out[b / 4u] = vec2<u32>(pack2x16float(h.xy), pack2x16float(h.zw));
}
#endif

#if FULL
// Quad `index` of the keys and values' rows.
fn kv_quad(index: u32) -> vec4<f32> {
#if HALVES
    return halves_quad(kv[index]);
#else
    return kv[index];
#endif
}
#endif

var<workgroup> qs: array<vec4<f32>, QUADS>;
var<workgroup> probs: array<f32, {{WG}}>;
var<workgroup> red: array<f32, {{WG}}>;
var<workgroup> partial: array<vec4<f32>, {{WG}}>;
#if SPLIT
// The decoded token's own key and value (rotated key), taken from the QKV row.
var<workgroup> cur_k: array<vec4<f32>, QUADS>;
var<workgroup> cur_v: array<vec4<f32>, QUADS>;

// Element d of the head vector at `base` in the QKV row: with HEAD_NORM scaled by the head's
// inverse RMS `inv` and the query's or the key's (`is_k`) gain.
fn head_at(base: u32, d: u32, inv: f32, is_k: bool) -> f32 {
#if HEAD_NORM
    return q[base + d] * inv * select(q_gain[d], k_gain[d], is_k);
#else
    return q[base + d];
#endif
}

// The inverse RMS of the head vector at `base` (HEAD_NORM; 1 otherwise), in every invocation.
fn head_inv_rms(tid: u32, base: u32, sg_lane: u32, sg_size: u32) -> f32 {
#if HEAD_NORM
    var sq = 0.0;
    for (var d = tid; d < {{HD}}u; d += {{WG}}u) {
        let v = q[base + d];
        sq += v * v;
    }
    return inverseSqrt(wg_reduce(tid, sq, sg_lane, sg_size, false) / f32({{HD}}u) + p.eps);
#else
    return 1.0;
#endif
}

// Element d of the head vector at `base` in the QKV row (normalised as head_at), rotated (HF
// rotate-half over the first ROT dims; the rest pass through) for `pos`.
fn rotated(base: u32, d: u32, pos: u32, inv: f32, is_k: bool) -> f32 {
#if NO_ROPE
    return head_at(base, d, inv, is_k);
#else
    let half = {{ROT}}u / 2u;
    let v = head_at(base, d, inv, is_k);
    if (d >= {{ROT}}u) {
        return v;
    }
    let row = (pos + step.rope_row) * half;
    if (d < half) {
        let i = row + d;
        return v * rope_cos[i] - head_at(base, d + half, inv, is_k) * rope_sin[i];
    }
    let i = row + d - half;
    return v * rope_cos[i] + head_at(base, d - half, inv, is_k) * rope_sin[i];
#endif
}

#if Q8
// Stores the 32 dims of block b (eight quads from workgroup memory) as q8_0: int8 values,
// four to a word, and the block's scale (absmax / 127) as f32 bits after all values.
fn store_block(is_k: bool, quad0: u32, b: u32) {
    var amax = 0.0;
    for (var i = 0u; i < 8u; i++) {
        let v = select(cur_v[8u * b + i], cur_k[8u * b + i], is_k);
        amax = max(amax, max(max(abs(v.x), abs(v.y)), max(abs(v.z), abs(v.w))));
    }
    let d = amax / 127.0;
    let inv = select(0.0, 1.0 / d, d > 0.0);
    for (var i = 0u; i < 8u; i++) {
        let v = select(cur_v[8u * b + i], cur_k[8u * b + i], is_k);
        let w = q8_pack(v * inv);
        if (is_k) {
            k_cache[quad0 + 8u * b + i] = w;
        } else {
            v_cache[quad0 + 8u * b + i] = w;
        }
    }
    let scale_at = p.scale_base + (quad0 + 8u * b) / 8u;
    if (is_k) {
        k_cache[scale_at] = bitcast<u32>(d);
    } else {
        v_cache[scale_at] = bitcast<u32>(d);
    }
}
#else
fn store_quad(is_k: bool, index: u32, v: vec4<f32>) {
#if F16
    let w = vec2<u32>(pack2x16float(v.xy), pack2x16float(v.zw));
#else
    let w = v;
#endif
    if (is_k) {
        k_cache[index] = w;
    } else {
        v_cache[index] = w;
    }
}
#endif
#endif

// The cache row of position j.
fn cache_row(j: u32) -> u32 {
#if RING
    return j % p.capacity;
#else
    return j;
#endif
}

// The first key position the query at position q sees.
fn first_visible(q: u32) -> u32 {
#if RING
    return select(0u, q + 1u - p.window, q + 1u > p.window);
#else
    return 0u;
#endif
}

// A finite stand-in for -inf: exp() of it minus any real score is exactly zero.
const NEG_BIG: f32 = -3.0e38;

#if Q8
// Four int8 values of a word, sign-extended.
fn q8_unpack(w: u32) -> vec4<f32> {
    let b = bitcast<vec4<i32>>(vec4<u32>(w << 24u, w << 16u, w << 8u, w)) >> vec4<u32>(24u);
    return vec4<f32>(b);
}

// Four values already divided by the block scale, rounded to int8 in one word.
fn q8_pack(v: vec4<f32>) -> u32 {
    let q = vec4<i32>(round(clamp(v, vec4<f32>(-127.0), vec4<f32>(127.0))));
    let u = bitcast<vec4<u32>>(q) & vec4<u32>(255u);
    return u.x | (u.y << 8u) | (u.z << 16u) | (u.w << 24u);
}
#endif

// Four consecutive dims starting at quad index `index` (in units of 4 elements).
fn k_quad(index: u32) -> vec4<f32> {
#if FULL
    return kv_quad(index);
#else
#if Q8
    return q8_unpack(k_cache[index]) * bitcast<f32>(k_cache[p.scale_base + index / 8u]);
#else
#if F16
    let w = k_cache[index];
    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
#else
    return k_cache[index];
#endif
#endif
#endif
}

fn v_quad(index: u32) -> vec4<f32> {
#if FULL
    return kv_quad(index);
#else
#if Q8
    return q8_unpack(v_cache[index]) * bitcast<f32>(v_cache[p.scale_base + index / 8u]);
#else
#if F16
    let w = v_cache[index];
    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
#else
    return v_cache[index];
#endif
#endif
#endif
}

// Workgroup-wide max (`want_max`) or sum; every invocation gets the result. With subgroups,
// each subgroup reduces in registers and one pass over the subgroups' results follows: two
// barriers instead of one per halving.
fn wg_reduce(tid: u32, v: f32, sg_lane: u32, sg_size: u32, want_max: bool) -> f32 {
#if SUBGROUP
    var mine: f32;
    if (want_max) {
        mine = subgroupMax(v);
    } else {
        mine = subgroupAdd(v);
    }
    if (sg_lane == 0u) {
        red[tid / sg_size] = mine;
    }
    workgroupBarrier();
    var r = red[0];
    for (var i = 1u; i < {{WG}}u / sg_size; i++) {
        r = select(r + red[i], max(r, red[i]), want_max);
    }
#else
    red[tid] = v;
    workgroupBarrier();
    for (var s = {{WG}}u / 2u; s > 0u; s = s >> 1u) {
        if (tid < s) {
            red[tid] = select(red[tid] + red[tid + s], max(red[tid], red[tid + s]), want_max);
        }
        workgroupBarrier();
    }
    let r = red[0];
#endif
    workgroupBarrier();
    return r;
}

#if RUNS
// One past the last key row t sees: its own position's. Without BATCH (a short step of one
// sequence) never past seq_len, as a padded prompt's pad rows see only the real tokens.
fn row_end(t: u32) -> u32 {
#if BATCH
    return token_pos(t) + 1u;
#else
    return min(token_pos(t) + 1u, step.seq_len);
#endif
}

// Row t's first visible key and the length of its runs (at least MIN_SPLIT keys, at most
// MAX_SPLITS runs, as a split decode step takes them).
fn row_runs(t: u32) -> vec2<u32> {
    let lowest = first_visible(row_end(t) - 1u);
    let visible = row_end(t) - lowest;
    return vec2<u32>(lowest, max({{MIN_SPLIT}}u, (visible + {{MAX_SPLITS}}u - 1u) / {{MAX_SPLITS}}u));
}

// Where run r of row t's head `head` keeps its output and stats.
fn run_slot(t: u32, r: u32, head: u32) -> u32 {
    return (t * {{MAX_SPLITS}}u + r) * p.heads + head;
}

// Merges row wid.y's runs of head wid.x: each run's output weighted by exp(its max − the
// largest), over the weighted sums.
@compute @workgroup_size(32)
fn merge_runs(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let head = wid.x;
    let t = wid.y;
    let run_keys = row_runs(t);
    let runs = (row_end(t) - run_keys.x + run_keys.y - 1u) / run_keys.y;
    var largest = NEG_BIG;
    for (var r = 0u; r < runs; r++) {
        largest = max(largest, split_stats[run_slot(t, r, head)].x);
    }
    var sum = 0.0;
    for (var r = 0u; r < runs; r++) {
        let st = split_stats[run_slot(t, r, head)];
        sum += exp(st.x - largest) * st.y;
    }
    let scale = normaliser(head, largest, sum);
    for (var quad = tid; quad < QUADS; quad += 32u) {
        var o = vec4<f32>(0.0);
        for (var r = 0u; r < runs; r++) {
            let at = run_slot(t, r, head);
            o += exp(split_stats[at].x - largest) * run_parts[at * QUADS + quad];
        }
        o *= scale;
        let b = (t * p.heads + head) * {{HD}}u + 4u * quad;
        out[b] = o.x;
        out[b + 1u] = o.y;
        out[b + 2u] = o.z;
        out[b + 3u] = o.w;
    }
}
#endif

@compute @workgroup_size({{WG}})
fn main(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
#if SUBGROUP
    @builtin(subgroup_invocation_id) sg_lane: u32,
    @builtin(subgroup_size) sg_size: u32,
#endif
) {
#if !SUBGROUP
    let sg_lane = 0u;
    let sg_size = 1u;
#endif
    let head = wid.x;
#if SPLIT
    let t = 0u;
    let split = wid.y;
    let all_keys = step.pos0 + 1u;
    let lowest = first_visible(step.pos0);
    let visible = all_keys - lowest;
    let split_len = max({{MIN_SPLIT}}u, (visible + {{MAX_SPLITS}}u - 1u) / {{MAX_SPLITS}}u);
    let first_key = min(lowest + split * split_len, all_keys);
    let n_keys = min(first_key + split_len, all_keys);
#else
    let t = wid.y;
#if FULL
    let first_key = 0u;
#if CAUSAL
    // Query t sees keys 0..=t (a text encoder's causal mask).
    let n_keys = min(p.keys, t + 1u);
#else
    let n_keys = p.keys;
#endif
#else
#if RUNS
    let run = wid.z;
    let run_keys = row_runs(t);
    let first_key = run_keys.x + run * run_keys.y;
    let n_keys = min(first_key + run_keys.y, row_end(t));
    // A run past the row's keys (the grid covers the longest row's): nothing to write, and
    // merge_runs reads only the row's own runs.
    if (first_key >= n_keys) {
        return;
    }
#else
#if BATCH
    // Each row its own sequence's token: its keys are its position's and those before.
    let n_keys = token_pos(t) + 1u;
    let first_key = first_visible(token_pos(t));
#else
    // Causal, and never past seq_len: a padded prompt's pad rows see only the real tokens.
    let n_keys = min(step.pos0 + t + 1u, step.seq_len);
    let first_key = first_visible(step.pos0 + t);
#endif
#endif
#endif
#endif
    let kv_head = head / (p.heads / p.kv_heads);
#if FULL
    // Token-major rows: key j of this head at k_off + j·kv_stride + kv_head·HD; its value
    // follows the keys of all kv heads.
    let cache_base = (p.k_off + kv_head * {{HD}}u) / 4u;
    let row_quads = p.kv_stride / 4u;
    let v_base = cache_base + p.kv_heads * QUADS;
#else
    // Cache rows in quads: head kv_head of slot s starts at (s·kv_heads + kv_head)·capacity
    // rows.
    let cache_base = (token_slot(t) * p.kv_heads + kv_head) * p.capacity * QUADS;
    let row_quads = QUADS;
    let v_base = cache_base;
#endif
#if SPLIT
    let pos = step.pos0;
    // With QSTEP 2 the row interleaves each query head with its output gate's head.
    let k_src = (p.heads * {{QSTEP}}u + kv_head) * {{HD}}u;
    let v_src = (p.heads * {{QSTEP}}u + p.kv_heads + kv_head) * {{HD}}u;
    let q_src = head * {{QSTEP}}u * {{HD}}u;
    let q_inv = head_inv_rms(tid, q_src, sg_lane, sg_size);
    let k_inv = head_inv_rms(tid, k_src, sg_lane, sg_size);
    // The softmax scale is folded into q.
    for (var d = tid; d < {{HD}}u; d += {{WG}}u) {
        qs[d / 4u][d % 4u] = rotated(q_src, d, pos, q_inv, false) * p.scale;
        cur_k[d / 4u][d % 4u] = rotated(k_src, d, pos, k_inv, true);
        cur_v[d / 4u][d % 4u] = q[v_src + d];
    }
    workgroupBarrier();
    // The first head of each KV group stores the new key and value, from the run holding
    // the position; every workgroup reads them from workgroup memory, never from the cache.
    if (head % (p.heads / p.kv_heads) == 0u && pos >= first_key && pos < n_keys) {
#if Q8
        for (var b = tid; b < QUADS / 8u; b += {{WG}}u) {
            store_block(true, cache_base + cache_row(pos) * QUADS, b);
            store_block(false, cache_base + cache_row(pos) * QUADS, b);
        }
#else
        for (var i = tid; i < QUADS; i += {{WG}}u) {
            store_quad(true, cache_base + cache_row(pos) * QUADS + i, cur_k[i]);
            store_quad(false, cache_base + cache_row(pos) * QUADS + i, cur_v[i]);
        }
#endif
    }
#else
#if FULL
    let q_base = t * p.q_stride + head * {{HD}}u;
#else
    let q_base = (t * p.heads + head) * {{HD}}u;
#endif
    let out_base = (t * p.heads + head) * {{HD}}u;
    // The softmax scale is folded into q.
    for (var i = tid; i < QUADS; i += {{WG}}u) {
        let b = q_base + 4u * i;
        qs[i] = q_quad(b) * p.scale;
    }
    workgroupBarrier();
#endif
    let quad = tid % QUADS;
    let group = tid / QUADS;
    let sums_values = group < KEY_GROUPS;
    var running_max = NEG_BIG;
    var running_sum = 0.0;
    var acc = vec4<f32>(0.0);
    for (var c0 = first_key; c0 < n_keys; c0 += {{WG}}u) {
        let j = c0 + tid;
#if KEY_LANES
        // KEY_LANES lanes score each key, each a strided share of its quads, so that a load
        // instruction reads whole runs of a key row rather than one quad from each of a
        // subgroup's rows; shuffles sum the shares. Trips are uniform (the chunk's last key
        // repeated, its score unused) so every lane takes part in every shuffle.
        let chunk_keys = min({{WG}}u, n_keys - c0);
        let key_lane = tid % KEY_LANES;
        for (var k0 = 0u; k0 < chunk_keys; k0 += {{WG}}u / KEY_LANES) {
            let slot = k0 + tid / KEY_LANES;
            let kj = c0 + min(slot, chunk_keys - 1u);
            let row = cache_base + cache_row(kj) * row_quads;
            var part = 0.0;
            for (var t = 0u; t < QUADS / KEY_LANES; t++) {
                let i = key_lane + t * KEY_LANES;
#if SPLIT
                // This token's key from workgroup memory (its cache row may be in flight).
                part += dot(qs[i], select(k_quad(row + i), cur_k[i], kj == pos));
#else
                part += dot(qs[i], k_quad(row + i));
#endif
            }
            for (var off = KEY_LANES / 2u; off > 0u; off = off >> 1u) {
                part += subgroupShuffleXor(part, off);
            }
            if (key_lane == 0u && slot < chunk_keys) {
                probs[slot] = part;
            }
        }
        workgroupBarrier();
        let score = select(NEG_BIG, probs[tid], j < n_keys);
#else
        var score = NEG_BIG;
        if (j < n_keys) {
            let row = cache_base + cache_row(j) * row_quads;
            var s = 0.0;
#if SPLIT
            if (j == pos) {
                for (var i = 0u; i < QUADS; i++) {
                    s += dot(qs[i], cur_k[i]);
                }
            } else {
                for (var i = 0u; i < QUADS; i++) {
                    s += dot(qs[i], k_quad(row + i));
                }
            }
#else
            for (var i = 0u; i < QUADS; i++) {
                s += dot(qs[i], k_quad(row + i));
            }
#endif
            score = s;
        }
#endif
        let new_max = max(running_max, wg_reduce(tid, score, sg_lane, sg_size, true));
        let correction = exp(running_max - new_max);
        let prob = select(0.0, exp(score - new_max), j < n_keys);
        probs[tid] = prob;
        running_sum = running_sum * correction + wg_reduce(tid, prob, sg_lane, sg_size, false);
        acc *= correction;
        let chunk_len = min({{WG}}u, n_keys - c0);
        if (sums_values) {
            // Four keys a trip, their value loads in flight together (indices clamped into
            // the chunk, the extra keys weighted zero).
            for (var jj0 = group; jj0 < chunk_len; jj0 += 4u * KEY_GROUPS) {
#for c in 0..4
                {
                    let jj = min(jj0 + {{c}}u * KEY_GROUPS, chunk_len - 1u);
                    let weight = select(0.0, probs[jj], jj0 + {{c}}u * KEY_GROUPS < chunk_len);
                    let cached = v_quad(v_base + cache_row(c0 + jj) * row_quads + quad);
#if SPLIT
                    // This token's value: from workgroup memory, as the cache may not hold it yet
                    // (another workgroup may be writing that row now; what is read there is
                    // discarded).
                    acc += weight * select(cached, cur_v[quad], c0 + jj == pos);
#else
                    acc += weight * cached;
#endif
                }
#endfor
            }
        }
        running_max = new_max;
        workgroupBarrier();
    }
    partial[tid] = acc;
    workgroupBarrier();
    if (tid < QUADS) {
        var total = vec4<f32>(0.0);
        for (var g = 0u; g < KEY_GROUPS; g++) {
            total += partial[g * QUADS + tid];
        }
#if SPLIT
        let o = total;
        let b = (split * p.heads + head) * {{HD}}u + 4u * tid;
        if (tid == 0u) {
            split_stats[split * p.heads + head] = vec2<f32>(running_max, running_sum);
        }
#else
#if RUNS
        let o = total;
        let at = run_slot(t, run, head);
        let b = at * {{HD}}u + 4u * tid;
        if (tid == 0u) {
            split_stats[at] = vec2<f32>(running_max, running_sum);
        }
#else
        let o = total * normaliser(head, running_max, running_sum);
        let b = out_base + 4u * tid;
#endif
#endif
#if HALVES
        store_halves(b, o);
#else
        out[b] = o.x;
        out[b + 1u] = o.y;
        out[b + 2u] = o.z;
        out[b + 3u] = o.w;
#endif
    }
}

#if TILED
// Tiled attention for many queries: FULL (an encoder's 1500 positions, a prompt's
// cross-attention), or causal over the KV cache (a prompt's self-attention, query t of the
// step seeing keys up to pos0 + t). A workgroup takes BQ queries of one head and walks the keys
// in tiles of BK staged in workgroup memory, so each key and value is read once per query
// block instead of once per query. TPQ invocations share a query: each scores KPT keys of the tile, the
// group combines their maxima and sums through workgroup memory (online softmax, the running
// max and sum kept in registers by every invocation of the group), and each adds the tile's
// weighted values into the output dims it owns.
const BQ: u32 = {{BQ}}u;
const BK: u32 = {{BK}}u;
// Invocations per query, keys each scores, output dims each owns.
const TPQ: u32 = {{WG}}u / BQ;
const KPT: u32 = BK / TPQ;
// Quads (four output dims) each invocation owns: lane, lane + TPQ, ...
const VPT: u32 = (QUADS + TPQ - 1u) / TPQ;
// Key rows padded by one quad so the lanes of a query, which read different rows at once,
// fall in different memory banks.
const K_ROW: u32 = QUADS + 1u;

var<workgroup> tk: array<vec4<f32>, BK * K_ROW>;
var<workgroup> tv: array<vec4<f32>, BK * QUADS>;
var<workgroup> tp: array<f32, BQ * BK>;
// Per invocation: its keys' maximum, then their sum.
var<workgroup> t_red: array<f32, {{WG}}>;

@compute @workgroup_size({{WG}})
fn tiled(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let head = wid.x;
    let q0 = wid.y * BQ;
    let n_queries = step.n_tokens;
    let kv_head = head / (p.heads / p.kv_heads);
    let qi = tid / TPQ;
    let lane = tid % TPQ;
    let group = qi * TPQ;
    // The query, scaled, in registers.
    var qv: array<vec4<f32>, QUADS>;
    let row = q0 + qi;
#if FULL
    let q_row = row * p.q_stride + head * {{HD}}u;
    let k_base = (p.k_off + kv_head * {{HD}}u) / 4u;
    let row_quads = p.kv_stride / 4u;
    let v_base = k_base + p.kv_heads * QUADS;
    // Keys the block walks, and the keys this query sees.
    let keys_end = p.keys;
    let visible = p.keys;
    let keys_start = 0u;
    let lowest = 0u;
#else
    let q_row = (row * p.heads + head) * {{HD}}u;
    let k_base = (step.slot * p.kv_heads + kv_head) * p.capacity * QUADS;
    let row_quads = QUADS;
    let v_base = k_base;
    let keys_end = min(step.pos0 + min(q0 + BQ, n_queries), step.seq_len);
    let visible = min(step.pos0 + row + 1u, step.seq_len);
    // The block's first query sees the earliest keys.
    let keys_start = first_visible(step.pos0 + q0);
    let lowest = first_visible(step.pos0 + row);
#endif
    for (var c = 0u; c < QUADS; c++) {
        var v = vec4<f32>(0.0);
        if (row < n_queries) {
            let b = q_row + 4u * c;
            v = q_quad(b) * p.scale;
        }
        qv[c] = v;
    }
    var acc: array<vec4<f32>, VPT>;
    for (var u = 0u; u < VPT; u++) {
        acc[u] = vec4<f32>(0.0);
    }
    var run_max = NEG_BIG;
    var run_sum = 0.0;
    for (var k0 = keys_start; k0 < keys_end; k0 += BK) {
        // The previous tile is no longer read.
        workgroupBarrier();
        for (var i = tid; i < BK * QUADS; i += {{WG}}u) {
            let j = k0 + i / QUADS;
            var kq = vec4<f32>(0.0);
            var vq = vec4<f32>(0.0);
            if (j < keys_end) {
                kq = k_quad(k_base + cache_row(j) * row_quads + i % QUADS);
                vq = v_quad(v_base + cache_row(j) * row_quads + i % QUADS);
            }
            tk[(i / QUADS) * K_ROW + i % QUADS] = kq;
            tv[i] = vq;
        }
        workgroupBarrier();
        var scores: array<f32, KPT>;
        var local_max = NEG_BIG;
        for (var s = 0u; s < KPT; s++) {
            // Interleaved keys: neighbouring lanes read neighbouring rows.
            let kj = s * TPQ + lane;
            var score = 0.0;
            for (var c = 0u; c < QUADS; c++) {
                score += dot(qv[c], tk[kj * K_ROW + c]);
            }
            score = select(NEG_BIG, score, k0 + kj < visible && k0 + kj >= lowest);
            scores[s] = score;
            local_max = max(local_max, score);
        }
        t_red[tid] = local_max;
        workgroupBarrier();
        var tile_max = NEG_BIG;
        for (var l = 0u; l < TPQ; l++) {
            tile_max = max(tile_max, t_red[group + l]);
        }
        let new_max = max(run_max, tile_max);
        var local_sum = 0.0;
        for (var s = 0u; s < KPT; s++) {
            let e = exp(scores[s] - new_max);
            tp[qi * BK + s * TPQ + lane] = e;
            local_sum += e;
        }
        // Everyone has read the maxima before they are overwritten with sums.
        workgroupBarrier();
        t_red[tid] = local_sum;
        workgroupBarrier();
        var tile_sum = 0.0;
        for (var l = 0u; l < TPQ; l++) {
            tile_sum += t_red[group + l];
        }
        let corr = exp(run_max - new_max);
        run_sum = run_sum * corr + tile_sum;
        run_max = new_max;
        for (var u = 0u; u < VPT; u++) {
            let quad = lane + u * TPQ;
            if (quad < QUADS) {
                var a = acc[u] * corr;
                for (var j = 0u; j < BK; j++) {
                    a += tp[qi * BK + j] * tv[j * QUADS + quad];
                }
                acc[u] = a;
            }
        }
    }
    if (row < n_queries) {
        let inv = normaliser(head, run_max, run_sum);
        let b = (row * p.heads + head) * {{HD}}u;
        for (var u = 0u; u < VPT; u++) {
            let quad = lane + u * TPQ;
            if (quad < QUADS) {
                let o = acc[u] * inv;
#if HALVES
                store_halves(b + 4u * quad, o);
#else
                out[b + 4u * quad] = o.x;
                out[b + 4u * quad + 1u] = o.y;
                out[b + 4u * quad + 2u] = o.z;
                out[b + 4u * quad + 3u] = o.w;
#endif
            }
        }
    }
}
#endif
