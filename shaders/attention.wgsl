// Causal attention over the KV cache for the step's tokens, with grouped-query heads.
// One workgroup per (head, token): keys are processed in chunks of WG positions with an
// online softmax (running max and sum), so any context length fits in fixed workgroup memory.
//
// Defines: WG, HD_MAX (largest head_dim supported), F16 (f16 cache).

struct Params {
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    capacity: u32,
    scale: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

struct Step {
    pos0: u32,
    n_tokens: u32,
    seq_len: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read> q: array<f32>;
#if F16
@group(0) @binding(3) var<storage, read> k_cache: array<u32>;
@group(0) @binding(4) var<storage, read> v_cache: array<u32>;
#else
@group(0) @binding(3) var<storage, read> k_cache: array<f32>;
@group(0) @binding(4) var<storage, read> v_cache: array<f32>;
#endif
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

var<workgroup> qs: array<f32, {{HD_MAX}}>;
var<workgroup> acc: array<f32, {{HD_MAX}}>;
var<workgroup> probs: array<f32, {{WG}}>;
var<workgroup> red: array<f32, {{WG}}>;

// A finite stand-in for -inf: exp() of it minus any real score is exactly zero.
const NEG_BIG: f32 = -3.0e38;

fn load_pair(is_k: bool, index: u32) -> vec2<f32> {
#if F16
    if (is_k) {
        return unpack2x16float(k_cache[index / 2u]);
    }
    return unpack2x16float(v_cache[index / 2u]);
#else
    if (is_k) {
        return vec2<f32>(k_cache[index], k_cache[index + 1u]);
    }
    return vec2<f32>(v_cache[index], v_cache[index + 1u]);
#endif
}

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

fn wg_sum(tid: u32, v: f32) -> f32 {
    red[tid] = v;
    workgroupBarrier();
    for (var s = {{WG}}u / 2u; s > 0u; s = s >> 1u) {
        if (tid < s) {
            red[tid] += red[tid + s];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size({{WG}})
fn main(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let head = wid.x;
    let t = wid.y;
    let hd = p.head_dim;
    let kv_head = head / (p.heads / p.kv_heads);
    let n_keys = step.pos0 + t + 1u;
    let q_base = (t * p.heads + head) * hd;
    for (var d = tid; d < hd; d += {{WG}}u) {
        qs[d] = q[q_base + d];
        acc[d] = 0.0;
    }
    workgroupBarrier();
    let cache_base = kv_head * p.capacity * hd;
    var running_max = NEG_BIG;
    var running_sum = 0.0;
    for (var c0 = 0u; c0 < n_keys; c0 += {{WG}}u) {
        let j = c0 + tid;
        var score = NEG_BIG;
        if (j < n_keys) {
            var s = 0.0;
            let row = cache_base + j * hd;
            for (var d = 0u; d < hd; d += 2u) {
                let kv = load_pair(true, row + d);
                s += qs[d] * kv.x + qs[d + 1u] * kv.y;
            }
            score = s * p.scale;
        }
        let chunk_max = wg_max(tid, score);
        let new_max = max(running_max, chunk_max);
        let correction = exp(running_max - new_max);
        let prob = select(0.0, exp(score - new_max), j < n_keys);
        probs[tid] = prob;
        let chunk_sum = wg_sum(tid, prob);
        running_sum = running_sum * correction + chunk_sum;
        let chunk_len = min({{WG}}u, n_keys - c0);
        for (var d2 = tid; d2 < hd / 2u; d2 += {{WG}}u) {
            let d = 2u * d2;
            var a = vec2<f32>(acc[d], acc[d + 1u]) * correction;
            for (var jj = 0u; jj < chunk_len; jj++) {
                a += probs[jj] * load_pair(false, cache_base + (c0 + jj) * hd + d);
            }
            acc[d] = a.x;
            acc[d + 1u] = a.y;
        }
        running_max = new_max;
        workgroupBarrier();
    }
    let inv = 1.0 / running_sum;
    for (var d = tid; d < hd; d += {{WG}}u) {
        out[q_base + d] = acc[d] * inv;
    }
}
