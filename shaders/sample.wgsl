// Picks the next token on the GPU from the logits of the last position, in the order HF
// transformers applies its processors: repetition penalty (over every token seen in prompt and
// output), then greedy argmax, or temperature, top-k, top-p and a seeded draw. One workgroup;
// the chosen id is appended to the history buffer, where the next step's embedding reads it,
// and marked as seen.
//
// Top-k / top-p usually concern a few hundred tokens near the maximum: those within WINDOW
// (scaled) logits of it are compacted in token order into workgroup memory, sorted, and
// filtered there. When they cannot decide the answer (too many near-ties, or a nucleus that
// reaches further down), thresholds are found exactly by bisection over an order-preserving
// integer key of the f32 logits across the whole vocabulary.
//
// The logits are read as vec4 words (the buffer is padded to a multiple of 4) so that one
// workgroup keeps enough bytes in flight to stream a large vocabulary.
//
// A grammar's mask, when `masked` is set, leaves only the tokens whose bit is set: the others
// become NEG_BIG before any other processor sees them.
//
// With BATCH, workgroup r samples row r of a batched decode step: its logits are row r of
// `logits` (rows of `vocab` values), its settings and mask those of the row's slot,
// and the token goes to that sequence's history after the row's position.
//
// Defines: WG (a power of two; also the candidate capacity), BATCH.

struct Params {
    vocab: u32,
    top_k: u32,
    seed: u32,
    greedy: u32,
    temperature: f32,
    top_p: f32,
    repeat_penalty: f32,
    masked: u32,
}

#if BATCH
// Settings per cache slot; the row's are copied into workgroup memory, which keeps every
// branch on them uniform across the workgroup.
@group(0) @binding(0) var<storage, read> slot_params: array<Params>;
var<workgroup> p: Params;
var<workgroup> row: u32;
#else
@group(0) @binding(0) var<uniform> p: Params;
#endif
@group(0) @binding(1) var<uniform> step: Step;
#if BATCH
// Rows of `vocab` logits, not always whole vec4 words: read and written a value at a time.
@group(0) @binding(2) var<storage, read_write> logits: array<f32>;
#else
@group(0) @binding(2) var<storage, read_write> logits: array<vec4<f32>>;
#endif
@group(0) @binding(3) var<storage, read_write> history: array<u32>;
@group(0) @binding(4) var<storage, read_write> seen: array<atomic<u32>>;
@group(0) @binding(5) var<storage, read> mask: array<u32>;

const NEG_BIG: f32 = -3.0e38;
// Tokens more than this many (scaled) logits below the best have relative probability
// below e^-16 ≈ 1.1e-7 each.
const WINDOW: f32 = 16.0;

var<workgroup> red_f: array<f32, {{WG}}>;
var<workgroup> red_u: array<u32, {{WG}}>;
var<workgroup> cand_key: array<u32, {{WG}}>;
var<workgroup> cand_idx: array<u32, {{WG}}>;
var<workgroup> cand_p: array<f32, {{WG}}>;
var<workgroup> chosen_chunk: u32;
var<workgroup> chosen_offset: f32;
var<workgroup> chosen_token: u32;

// Monotone map from f32 to u32: a < b  <=>  key(a) < key(b).
fn key(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    return select(b | 0x80000000u, ~b, (b >> 31u) == 1u);
}

fn unkey(k: u32) -> f32 {
    return bitcast<f32>(select(~k, k & 0x7fffffffu, (k >> 31u) == 1u));
}

fn hash(v: u32) -> u32 {
    var h = v * 747796405u + 2891336453u;
    h = ((h >> ((h >> 28u) + 4u)) ^ h) * 277803737u;
    return (h >> 22u) ^ h;
}

fn sum_f(tid: u32, v: f32) -> f32 {
    red_f[tid] = v;
    workgroupBarrier();
    for (var s = {{WG}}u / 2u; s > 0u; s = s >> 1u) {
        if (tid < s) {
            red_f[tid] += red_f[tid + s];
        }
        workgroupBarrier();
    }
    let r = red_f[0];
    workgroupBarrier();
    return r;
}

fn max_f(tid: u32, v: f32) -> f32 {
    red_f[tid] = v;
    workgroupBarrier();
    for (var s = {{WG}}u / 2u; s > 0u; s = s >> 1u) {
        if (tid < s) {
            red_f[tid] = max(red_f[tid], red_f[tid + s]);
        }
        workgroupBarrier();
    }
    let r = red_f[0];
    workgroupBarrier();
    return r;
}

fn sum_u(tid: u32, v: u32) -> u32 {
    red_u[tid] = v;
    workgroupBarrier();
    for (var s = {{WG}}u / 2u; s > 0u; s = s >> 1u) {
        if (tid < s) {
            red_u[tid] += red_u[tid + s];
        }
        workgroupBarrier();
    }
    let r = red_u[0];
    workgroupBarrier();
    return r;
}

fn words() -> u32 {
    return (p.vocab + 3u) / 4u;
}

// Word `w` (logits 4w .. 4w + 3) of this workgroup's row; past the vocabulary, whatever the
// buffer holds there (`lane` ignores it).
fn load_word(w: u32) -> vec4<f32> {
#if BATCH
    let b = row * p.vocab + 4u * w;
    return vec4<f32>(logits[b], logits[b + 1u], logits[b + 2u], logits[b + 3u]);
#else
    return logits[w];
#endif
}

fn store_word(w: u32, v: vec4<f32>) {
#if BATCH
    for (var c = 0u; c < 4u; c++) {
        if (4u * w + c < p.vocab) {
            logits[row * p.vocab + 4u * w + c] = v[c];
        }
    }
#else
    logits[w] = v;
#endif
}

// Word `i` of this row's mask.
fn mask_word(i: u32) -> u32 {
#if BATCH
    return token_slot(row) * ((p.vocab + 31u) / 32u) + i;
#else
    return i;
#endif
}

// The sequence length after this row's token: where the sampled token goes.
fn next_len() -> u32 {
#if BATCH
    return token_pos(row) + 1u;
#else
    return step.seq_len;
#endif
}

// Where this row's sequence keeps its history and seen-token set.
fn history_at() -> u32 {
#if BATCH
    return token_history(row);
#else
    return step.history_base;
#endif
}

fn seen_at() -> u32 {
#if BATCH
    return token_seen(row);
#else
    return step.seen_base;
#endif
}

// Logit `c` of word `w`, or NEG_BIG past the vocabulary.
fn lane(w: vec4<f32>, word: u32, c: u32) -> f32 {
    return select(NEG_BIG, w[c], word * 4u + c < p.vocab);
}

// Probability mass (relative to the max) of logits whose key is >= threshold.
fn mass_above(tid: u32, threshold: u32, top: f32) -> f32 {
    var m = 0.0;
    for (var w = tid; w < words(); w += {{WG}}u) {
        let l4 = load_word(w);
        for (var c = 0u; c < 4u; c++) {
            let l = lane(l4, w, c);
            if (key(l) >= threshold && l > NEG_BIG) {
                m += exp(l - top);
            }
        }
    }
    return sum_f(tid, m);
}

fn uniform01() -> f32 {
    let r = hash(hash(p.seed) ^ (next_len() * 0x9E3779B9u));
    return f32(r >> 8u) / 16777216.0;
}

// Greedy: argmax, the lowest index winning a tie as torch.argmax does.
fn pick_greedy(tid: u32, local_max: f32, best: u32) {
    red_f[tid] = local_max;
    red_u[tid] = best;
    workgroupBarrier();
    for (var s = {{WG}}u / 2u; s > 0u; s = s >> 1u) {
        if (tid < s) {
            let a = red_f[tid];
            let b = red_f[tid + s];
            if (b > a || (b == a && red_u[tid + s] < red_u[tid])) {
                red_f[tid] = b;
                red_u[tid] = red_u[tid + s];
            }
        }
        workgroupBarrier();
    }
    if (tid == 0u) {
        chosen_token = red_u[0];
    }
}

// Candidates (count of them given) are in workgroup memory in token order: sort them by logit
// (ties by token id, so the order is fully determined), apply top-k and top-p, and draw.
fn pick_from_candidates(tid: u32, count: u32, top: f32) {
    // Bitonic sort, descending key, ascending id on ties; empty slots hold key 0.
    for (var k = 2u; k <= {{WG}}u; k = k << 1u) {
        for (var j = k >> 1u; j > 0u; j = j >> 1u) {
            let i = tid;
            let l = i ^ j;
            if (l > i) {
                let ki = cand_key[i];
                let kl = cand_key[l];
                let ii = cand_idx[i];
                let il = cand_idx[l];
                // Does element l belong before element i?
                let l_first = kl > ki || (kl == ki && il < ii);
                let descending = (i & k) == 0u;
                if (l_first == descending) {
                    cand_key[i] = kl;
                    cand_key[l] = ki;
                    cand_idx[i] = il;
                    cand_idx[l] = ii;
                }
            }
            workgroupBarrier();
        }
    }
    // Top-k keeps every candidate at or above the k-th value (ties included, as transformers).
    var kept = count;
    if (p.top_k > 0u && p.top_k < count) {
        let kth = cand_key[p.top_k - 1u];
        kept = sum_u(tid, select(0u, 1u, tid < count && cand_key[tid] >= kth));
    }
    // Inclusive prefix sums of the kept probabilities, in sorted order.
    var prob = 0.0;
    if (tid < kept) {
        prob = exp(unkey(cand_key[tid]) - top);
    }
    cand_p[tid] = prob;
    workgroupBarrier();
    for (var offset = 1u; offset < {{WG}}u; offset = offset << 1u) {
        var add = 0.0;
        if (tid >= offset) {
            add = cand_p[tid - offset];
        }
        workgroupBarrier();
        cand_p[tid] += add;
        workgroupBarrier();
    }
    var n = kept;
    if (p.top_p < 1.0 && kept > 0u) {
        // Keep a token while the mass ranked above it is below top_p of the whole.
        let wanted = p.top_p * cand_p[kept - 1u];
        n = sum_u(tid, select(0u, 1u, tid < kept && cand_p[tid] - prob < wanted));
        n = max(n, 1u);
    }
    let goal = uniform01() * cand_p[n - 1u];
    // The first kept position whose inclusive sum passes the goal.
    let hit = tid < n && cand_p[tid] > goal && (tid == 0u || cand_p[tid - 1u] <= goal);
    red_u[tid] = select(0xffffffffu, tid, hit);
    workgroupBarrier();
    for (var s = {{WG}}u / 2u; s > 0u; s = s >> 1u) {
        if (tid < s) {
            red_u[tid] = min(red_u[tid], red_u[tid + s]);
        }
        workgroupBarrier();
    }
    if (tid == 0u) {
        let at = select(red_u[0], n - 1u, red_u[0] == 0xffffffffu);
        chosen_token = cand_idx[at];
    }
}

// Exact thresholds over the whole vocabulary by bisection, then a draw in token order.
fn pick_by_bisection(tid: u32, top: f32) {
    // Top-k: the largest key with at least k logits at or above it.
    var kth = 0u;
    if (p.top_k > 0u && p.top_k < p.vocab) {
        for (var i = 0u; i < 32u; i++) {
            let candidate = kth | (1u << (31u - i));
            var count = 0u;
            for (var w = tid; w < words(); w += {{WG}}u) {
                let l4 = load_word(w);
                for (var c = 0u; c < 4u; c++) {
                    let l = lane(l4, w, c);
                    count += select(0u, 1u, key(l) >= candidate && l > NEG_BIG);
                }
            }
            if (sum_u(tid, count) >= p.top_k) {
                kth = candidate;
            }
        }
    }
    // Top-p: the largest key whose tokens at or above it hold at least top_p of the top-k
    // mass (the smallest such set of most likely tokens).
    var cut = kth;
    if (p.top_p < 1.0) {
        let wanted = p.top_p * mass_above(tid, kth, top);
        cut = 0u;
        for (var i = 0u; i < 32u; i++) {
            let candidate = cut | (1u << (31u - i));
            if (mass_above(tid, candidate, top) >= wanted) {
                cut = candidate;
            }
        }
    }
    let total = mass_above(tid, cut, top);
    let goal = uniform01() * total;
    // Inverse CDF in token order: contiguous chunks of words per invocation, a scan over the
    // chunk sums, then one invocation walks its chunk.
    let chunk = (words() + {{WG}}u - 1u) / {{WG}}u;
    let lo = min(tid * chunk, words());
    let hi = min(lo + chunk, words());
    var m = 0.0;
    for (var w = lo; w < hi; w++) {
        let l4 = load_word(w);
        for (var c = 0u; c < 4u; c++) {
            let l = lane(l4, w, c);
            if (key(l) >= cut && l > NEG_BIG) {
                m += exp(l - top);
            }
        }
    }
    red_f[tid] = m;
    workgroupBarrier();
    if (tid == 0u) {
        var acc = 0.0;
        var pick = 0u;
        var offset = 0.0;
        for (var c = 0u; c < {{WG}}u; c++) {
            let cm = red_f[c];
            if (cm > 0.0) {
                pick = c;
                offset = acc;
                if (acc + cm > goal) {
                    break;
                }
            }
            acc += cm;
        }
        chosen_chunk = pick;
        chosen_offset = offset;
    }
    workgroupBarrier();
    if (tid == chosen_chunk) {
        var acc = chosen_offset;
        var last = lo * 4u;
        var picked = false;
        for (var w = lo; w < hi && !picked; w++) {
            let l4 = load_word(w);
            for (var c = 0u; c < 4u; c++) {
                let l = lane(l4, w, c);
                if (key(l) >= cut && l > NEG_BIG) {
                    acc += exp(l - top);
                    last = w * 4u + c;
                    if (acc > goal) {
                        chosen_token = last;
                        picked = true;
                        break;
                    }
                }
            }
        }
        if (!picked) {
            chosen_token = last;
        }
    }
}

@compute @workgroup_size({{WG}})
fn main(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
#if BATCH
    if (tid == 0u) {
        row = wid.x;
        p = slot_params[token_slot(wid.x)];
    }
    workgroupBarrier();
#endif
    var local_max = NEG_BIG;
    var best = 0u;
    let n_words = words();
    if (p.greedy != 0u && p.repeat_penalty == 1.0 && p.masked == 0u) {
        // Plain argmax, the common case: read only, two words in flight per invocation.
        for (var base = tid; base < n_words; base += 2u * {{WG}}u) {
            let second = base + {{WG}}u;
            let a = load_word(base);
            let b = load_word(min(second, n_words - 1u));
            // Increasing token order per invocation: strictly greater keeps the lowest index.
            for (var c = 0u; c < 4u; c++) {
                let l = lane(a, base, c);
                if (l > local_max) {
                    local_max = l;
                    best = base * 4u + c;
                }
            }
            if (second < n_words) {
                for (var c = 0u; c < 4u; c++) {
                    let l = lane(b, second, c);
                    if (l > local_max) {
                        local_max = l;
                        best = second * 4u + c;
                    }
                }
            }
        }
    } else {
        for (var w = tid; w < n_words; w += {{WG}}u) {
            var l4 = load_word(w);
            for (var c = 0u; c < 4u; c++) {
                let v = w * 4u + c;
                if (v >= p.vocab || (p.masked != 0u && (mask[mask_word(v / 32u)] & (1u << (v % 32u))) == 0u)) {
                    l4[c] = NEG_BIG;
                    continue;
                }
                var l = l4[c];
                if (p.repeat_penalty != 1.0) {
                    let bits = atomicLoad(&seen[seen_at() + v / 32u]);
                    if ((bits & (1u << (v % 32u))) != 0u) {
                        l = select(l * p.repeat_penalty, l / p.repeat_penalty, l > 0.0);
                    }
                }
                if (p.greedy == 0u) {
                    l = l / p.temperature;
                }
                l4[c] = l;
                if (l > local_max) {
                    local_max = l;
                    best = v;
                }
            }
            store_word(w, l4);
        }
    }
    if (p.greedy != 0u) {
        pick_greedy(tid, local_max, best);
    } else {
        let top = max_f(tid, local_max);
        // How many logits lie within the window, and how much of the mass they hold.
        var count = 0u;
        var near_mass = 0.0;
        var all_mass = 0.0;
        for (var w = tid; w < n_words; w += {{WG}}u) {
            let l4 = load_word(w);
            for (var c = 0u; c < 4u; c++) {
                let l = lane(l4, w, c);
                let e = select(0.0, exp(l - top), l > NEG_BIG);
                all_mass += e;
                if (l >= top - WINDOW) {
                    count += 1u;
                    near_mass += e;
                }
            }
        }
        let near = sum_u(tid, count);
        let near_total = sum_f(tid, near_mass);
        let total = sum_f(tid, all_mass);
        let filtered = p.top_k > 0u || p.top_p < 1.0;
        // The window decides the answer when it holds the whole top-k set (top_k <= near)
        // or, without top-k, the whole nucleus.
        let k_inside = p.top_k > 0u && p.top_k <= near;
        let p_inside = p.top_k == 0u && p.top_p < 1.0 && near_total >= p.top_p * total;
        if (filtered && near <= {{WG}}u && (k_inside || p_inside)) {
            // Compact the window's tokens in token order: contiguous chunks per invocation,
            // offsets from a scan of the per-chunk counts.
            let chunk = (n_words + {{WG}}u - 1u) / {{WG}}u;
            let lo = min(tid * chunk, n_words);
            let hi = min(lo + chunk, n_words);
            var mine = 0u;
            for (var w = lo; w < hi; w++) {
                let l4 = load_word(w);
                for (var c = 0u; c < 4u; c++) {
                    mine += select(0u, 1u, lane(l4, w, c) >= top - WINDOW);
                }
            }
            red_u[tid] = mine;
            workgroupBarrier();
            for (var offset = 1u; offset < {{WG}}u; offset = offset << 1u) {
                var add = 0u;
                if (tid >= offset) {
                    add = red_u[tid - offset];
                }
                workgroupBarrier();
                red_u[tid] += add;
                workgroupBarrier();
            }
            var at = red_u[tid] - mine;
            cand_key[tid] = 0u;
            cand_idx[tid] = 0xffffffffu;
            workgroupBarrier();
            for (var w = lo; w < hi; w++) {
                let l4 = load_word(w);
                for (var c = 0u; c < 4u; c++) {
                    let l = lane(l4, w, c);
                    if (l >= top - WINDOW) {
                        cand_key[at] = key(l);
                        cand_idx[at] = w * 4u + c;
                        at += 1u;
                    }
                }
            }
            workgroupBarrier();
            pick_from_candidates(tid, near, top);
        } else {
            pick_by_bisection(tid, top);
        }
    }
    workgroupBarrier();
    if (tid == 0u) {
        let token = chosen_token;
        history[history_at() + next_len()] = token;
        atomicOr(&seen[seen_at() + token / 32u], 1u << (token % 32u));
    }
}
