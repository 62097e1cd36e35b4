// Whisper's logit rules, applied in place to the logits of the last position before the
// sampler picks a token, in transformers' order: suppressed tokens, tokens suppressed at the
// first generated position, then (with timestamps) the timestamp rules of OpenAI's decoder —
// no <|notimestamps|>; timestamps come in pairs (after a single timestamp only a timestamp
// or the end; after a pair, text); timestamps never decrease and a segment is never empty;
// the first token is a timestamp no later than the initial-timestamp limit; and when the
// probability mass of all timestamps beats every single text token, a timestamp it is.
// One workgroup reads the generated tokens straight from the history buffer, so decoding
// stays on the GPU. `main` also leaves the log-sum-exp of the processed logits, from which
// `score` turns the sampled token into its log-probability (for the fallback decision).
//
// Defines: WG (a power of two).

struct Params {
    vocab: u32,
    // The end-of-text id; every text token is below it.
    eot: u32,
    // First timestamp id, or 0 when timestamps are off.
    ts_begin: u32,
    no_timestamps: u32,
    // History index of the first generated token.
    begin_index: u32,
    // Largest first timestamp (index from ts_begin), or 0xffffffff for no limit.
    max_initial: u32,
    n_suppress: u32,
    n_begin_suppress: u32,
    // The sampler's temperature (1 when greedy): it divides the logits in place.
    temperature: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read_write> logits: array<f32>;
@group(0) @binding(3) var<storage, read> history: array<u32>;
// The suppressed ids, then the ids suppressed at the first position.
@group(0) @binding(4) var<storage, read> suppress: array<u32>;
// [0]: log-sum-exp of the processed logits of the last step.
@group(0) @binding(5) var<storage, read_write> stats: array<f32>;
// Log-probability of each sampled token, by history index.
@group(0) @binding(6) var<storage, read_write> scores: array<f32>;

const NEG_BIG: f32 = -3.0e38;

var<workgroup> red: array<f32, {{WG}}>;
var<workgroup> red2: array<f32, {{WG}}>;
// (last was a timestamp, penultimate was a timestamp, lowest allowed timestamp id)
var<workgroup> state: vec3<u32>;

fn wg_max(tid: u32, v: f32) -> f32 {
    red[tid] = v;
    workgroupBarrier();
    for (var s = {{WG}}u / 2u; s > 0u; s = s >> 1u) {
        if (tid < s) {
            red[tid] = max(red[tid], red[tid + s]);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

// Log-sum-exp of the logits in [lo, hi) across the workgroup.
fn wg_lse(tid: u32, lo: u32, hi: u32) -> f32 {
    var m = NEG_BIG;
    for (var v = lo + tid; v < hi; v += {{WG}}u) {
        m = max(m, logits[v]);
    }
    let top = wg_max(tid, m);
    var s = 0.0;
    for (var v = lo + tid; v < hi; v += {{WG}}u) {
        s += exp(logits[v] - top);
    }
    red2[tid] = s;
    workgroupBarrier();
    for (var k = {{WG}}u / 2u; k > 0u; k = k >> 1u) {
        if (tid < k) {
            red2[tid] += red2[tid + k];
        }
        workgroupBarrier();
    }
    let total = red2[0];
    workgroupBarrier();
    return top + log(total);
}

fn sync() {
    storageBarrier();
    workgroupBarrier();
}

@compute @workgroup_size({{WG}})
fn main(@builtin(local_invocation_index) tid: u32) {
    let first = step.seq_len == p.begin_index;
    for (var i = tid; i < p.n_suppress; i += {{WG}}u) {
        let id = suppress[i];
        if (id < p.vocab) {
            logits[id] = NEG_BIG;
        }
    }
    if (first) {
        for (var i = tid; i < p.n_begin_suppress; i += {{WG}}u) {
            let id = suppress[p.n_suppress + i];
            if (id < p.vocab) {
                logits[id] = NEG_BIG;
            }
        }
    }
    if (p.ts_begin > 0u) {
        if (tid == 0u) {
            logits[p.no_timestamps] = NEG_BIG;
            let n = step.seq_len - p.begin_index;
            let last = n >= 1u && history[step.seq_len - 1u] >= p.ts_begin;
            let penultimate = n < 2u || history[step.seq_len - 2u] >= p.ts_begin;
            var lowest = p.ts_begin;
            for (var i = step.seq_len; i > p.begin_index; i--) {
                let tok = history[i - 1u];
                if (tok >= p.ts_begin) {
                    // The closing timestamp of a pair may repeat the opening one; any other
                    // must move forward.
                    lowest = select(tok + 1u, tok, last && !penultimate);
                    break;
                }
            }
            state = vec3<u32>(u32(last), u32(penultimate), lowest);
        }
        sync();
        let last = state.x != 0u;
        let penultimate = state.y != 0u;
        let lowest = state.z;
        var latest = p.vocab;
        if (first && p.max_initial != 0xffffffffu) {
            latest = min(p.vocab, p.ts_begin + p.max_initial + 1u);
        }
        for (var v = tid; v < p.vocab; v += {{WG}}u) {
            let is_ts = v >= p.ts_begin;
            var masked = false;
            if (last && penultimate && is_ts) {
                masked = true;
            }
            if (last && !penultimate && v < p.eot) {
                masked = true;
            }
            if (is_ts && v < lowest) {
                masked = true;
            }
            if (first && (!is_ts || v >= latest)) {
                masked = true;
            }
            if (masked) {
                logits[v] = NEG_BIG;
            }
        }
        sync();
        // Timestamp mass against the best text token, both relative to the same total, so
        // the normaliser cancels.
        let ts_lse = wg_lse(tid, p.ts_begin, p.vocab);
        var m = NEG_BIG;
        for (var v = tid; v < p.ts_begin; v += {{WG}}u) {
            m = max(m, logits[v]);
        }
        let best_text = wg_max(tid, m);
        if (ts_lse > best_text && ts_lse > NEG_BIG * 0.5) {
            for (var v = tid; v < p.ts_begin; v += {{WG}}u) {
                logits[v] = NEG_BIG;
            }
        }
        sync();
    } else {
        sync();
    }
    let lse = wg_lse(tid, 0u, p.vocab);
    if (tid == 0u) {
        stats[0] = lse;
    }
}

// After the sampler: the log-probability of the token it wrote, from the processed logits
// (which the sampler divided by the temperature in place).
@compute @workgroup_size(1)
fn score() {
    let token = history[step.seq_len];
    scores[step.seq_len] = logits[token] * p.temperature - stats[0];
}
