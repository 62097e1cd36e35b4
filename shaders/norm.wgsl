// Row normalisation for prompts: RMSNorm, or LayerNorm with LAYER defined. One workgroup per
// row of the step's n_tokens rows; statistics in f32. With RESIDUAL (RMSNorm only), the
// normalised row is added to y instead of replacing it (Gemma's norms on the attention and MLP
// outputs, before the residual add).
//
// With HEADS, RMSNorm in place over the query and key heads of fused QKV rows (Qwen3's q_norm
// and k_norm, before RoPE): workgroup (h, t) normalises head h of token t's row of
// heads + 2·kv_heads head vectors, query heads with `weight`, key heads with `k_weight`;
// value heads are left alone.

struct Params {
    k: u32,
    eps: f32,
    heads: u32,
    kv_heads: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> step: Step;
#if !HEADS
@group(0) @binding(2) var<storage, read> x: array<f32>;
#endif
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> weight: array<f32>;
#if LAYER
@group(0) @binding(5) var<storage, read> bias: array<f32>;
#endif
#if HEADS
@group(0) @binding(6) var<storage, read> k_weight: array<f32>;
#endif

var<workgroup> red: array<f32, 256>;

fn wg_sum(tid: u32, v: f32) -> f32 {
    red[tid] = v;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s >> 1u) {
        if (tid < s) {
            red[tid] += red[tid + s];
        }
        workgroupBarrier();
    }
    let total = red[0];
    workgroupBarrier();
    return total;
}

#if HEADS
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let head = wid.x;
    let t = wid.y;
    if (t >= step.n_tokens) {
        return;
    }
    let base = (t * (p.heads + 2u * p.kv_heads) + head) * p.k;
    var sq = 0.0;
    for (var k = tid; k < p.k; k += 256u) {
        let v = y[base + k];
        sq += v * v;
    }
    // Every invocation has read its elements before any is rewritten (wg_sum synchronises).
    let inv = inverseSqrt(wg_sum(tid, sq) / f32(p.k) + p.eps);
    let is_q = head < p.heads;
    for (var k = tid; k < p.k; k += 256u) {
        y[base + k] = y[base + k] * inv * select(k_weight[k], weight[k], is_q);
    }
}
#else
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let row = wid.x;
    if (row >= step.n_tokens) {
        return;
    }
    let base = row * p.k;
#if LAYER
    var s = 0.0;
    for (var k = tid; k < p.k; k += 256u) {
        s += x[base + k];
    }
    let mean = wg_sum(tid, s) / f32(p.k);
    var sq = 0.0;
    for (var k = tid; k < p.k; k += 256u) {
        let d = x[base + k] - mean;
        sq += d * d;
    }
    let inv = inverseSqrt(wg_sum(tid, sq) / f32(p.k) + p.eps);
    for (var k = tid; k < p.k; k += 256u) {
        y[base + k] = (x[base + k] - mean) * inv * weight[k] + bias[k];
    }
#else
    var sq = 0.0;
    for (var k = tid; k < p.k; k += 256u) {
        let v = x[base + k];
        sq += v * v;
    }
    let inv = inverseSqrt(wg_sum(tid, sq) / f32(p.k) + p.eps);
    for (var k = tid; k < p.k; k += 256u) {
#if RESIDUAL
        y[base + k] += x[base + k] * inv * weight[k];
#else
        y[base + k] = x[base + k] * inv * weight[k];
#endif
    }
#endif
}
#endif
