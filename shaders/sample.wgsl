// Picks the next token on the GPU from the logits of the last position, in the order HF
// transformers applies its processors: repetition penalty (over every token seen in prompt and
// output), then greedy argmax, or temperature, top-k, top-p and a seeded draw. Thresholds are
// found by bisection over an order-preserving integer key of the f32 logits, so no sort is
// needed. One workgroup; the chosen id is appended to the history buffer, where the next
// step's embedding reads it, and marked as seen.
//
// Defines: WG.

struct Params {
    vocab: u32,
    top_k: u32,
    seed: u32,
    greedy: u32,
    temperature: f32,
    top_p: f32,
    repeat_penalty: f32,
    _pad: u32,
}

struct Step {
    pos0: u32,
    n_tokens: u32,
    seq_len: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read_write> logits: array<f32>;
@group(0) @binding(3) var<storage, read_write> history: array<u32>;
@group(0) @binding(4) var<storage, read_write> seen: array<atomic<u32>>;

var<workgroup> red_f: array<f32, {{WG}}>;
var<workgroup> red_u: array<u32, {{WG}}>;
var<workgroup> chosen_chunk: u32;
var<workgroup> chosen_offset: f32;
var<workgroup> chosen_token: u32;

const NEG_BIG: f32 = -3.0e38;

// Monotone map from f32 to u32: a < b  <=>  key(a) < key(b).
fn key(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    return select(b | 0x80000000u, ~b, (b >> 31u) == 1u);
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

// Probability mass (unnormalised, relative to the max) of logits whose key is >= threshold.
fn mass_above(tid: u32, threshold: u32, top: f32) -> f32 {
    var m = 0.0;
    for (var v = tid; v < p.vocab; v += {{WG}}u) {
        let l = logits[v];
        if (key(l) >= threshold) {
            m += exp(l - top);
        }
    }
    return sum_f(tid, m);
}

@compute @workgroup_size({{WG}})
fn main(@builtin(local_invocation_index) tid: u32) {
    let vocab = p.vocab;
    var local_max = NEG_BIG;
    var best = 0u;
    if (p.greedy != 0u && p.repeat_penalty == 1.0) {
        // Plain argmax, the common case: read only, four independent loads in flight.
        let stride = 4u * {{WG}}u;
        for (var base = tid; base < vocab; base += stride) {
            var vals: array<f32, 4>;
            for (var u = 0u; u < 4u; u++) {
                let v = base + u * {{WG}}u;
                vals[u] = select(NEG_BIG, logits[min(v, vocab - 1u)], v < vocab);
            }
            for (var u = 0u; u < 4u; u++) {
                // Strictly greater, in increasing index order per invocation: the lowest
                // index wins a tie, as torch.argmax does.
                let v = base + u * {{WG}}u;
                if (vals[u] > local_max) {
                    local_max = vals[u];
                    best = v;
                }
            }
        }
    } else {
        for (var v = tid; v < vocab; v += {{WG}}u) {
            var l = logits[v];
            if (p.repeat_penalty != 1.0) {
                let bits = atomicLoad(&seen[v / 32u]);
                if ((bits & (1u << (v % 32u))) != 0u) {
                    l = select(l * p.repeat_penalty, l / p.repeat_penalty, l > 0.0);
                }
            }
            if (p.greedy == 0u) {
                l = l / p.temperature;
            }
            logits[v] = l;
            if (l > local_max) {
                local_max = l;
                best = v;
            }
        }
    }
    if (p.greedy != 0u) {
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
    } else {
        let top = max_f(tid, local_max);
        // Top-k: the largest key with at least k logits at or above it.
        var kth = 0u;
        if (p.top_k > 0u && p.top_k < vocab) {
            for (var i = 0u; i < 32u; i++) {
                let candidate = kth | (1u << (31u - i));
                var count = 0u;
                for (var v = tid; v < vocab; v += {{WG}}u) {
                    count += select(0u, 1u, key(logits[v]) >= candidate);
                }
                if (sum_u(tid, count) >= p.top_k) {
                    kth = candidate;
                }
            }
        }
        // Top-p: the largest key whose tokens at or above it hold at least top_p of the
        // top-k mass (the smallest such set of most likely tokens).
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
        let r = hash(hash(p.seed) ^ (step.seq_len * 0x9E3779B9u));
        let wanted_mass = f32(r >> 8u) / 16777216.0 * total;
        // Inverse CDF in token-id order: contiguous chunks per invocation, a scan over the
        // chunk sums, then one invocation walks its chunk.
        let chunk = (vocab + {{WG}}u - 1u) / {{WG}}u;
        let lo = min(tid * chunk, vocab);
        let hi = min(lo + chunk, vocab);
        var m = 0.0;
        for (var v = lo; v < hi; v++) {
            let l = logits[v];
            if (key(l) >= cut) {
                m += exp(l - top);
            }
        }
        red_f[tid] = m;
        workgroupBarrier();
        if (tid == 0u) {
            var acc = 0.0;
            var pick = 0u;
            var offset = 0.0;
            var found = false;
            for (var c = 0u; c < {{WG}}u; c++) {
                let cm = red_f[c];
                if (cm > 0.0) {
                    pick = c;
                    offset = acc;
                    if (acc + cm > wanted_mass) {
                        found = true;
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
            var last = lo;
            var picked = false;
            for (var v = lo; v < hi; v++) {
                let l = logits[v];
                if (key(l) >= cut) {
                    acc += exp(l - top);
                    last = v;
                    if (acc > wanted_mass) {
                        chosen_token = v;
                        picked = true;
                        break;
                    }
                }
            }
            if (!picked) {
                chosen_token = last;
            }
        }
    }
    workgroupBarrier();
    if (tid == 0u) {
        let token = chosen_token;
        history[step.seq_len] = token;
        atomicOr(&seen[token / 32u], 1u << (token % 32u));
    }
}
