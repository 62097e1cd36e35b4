// Row normalisation for prompts: RMSNorm, or LayerNorm with LAYER defined. One workgroup per
// row of the step's n_tokens rows; statistics in f32. With RESIDUAL (RMSNorm only), the
// normalised row is added to y instead of replacing it (Gemma's norms on the attention and MLP
// outputs, before the residual add).
//
// With HEADS, RMSNorm in place over the query and key heads of fused QKV rows (Qwen3's q_norm
// and k_norm, before RoPE): workgroup (h, t) normalises head h of token t's row of
// heads + 2·kv_heads head vectors, query heads with `weight`, key heads with `k_weight`;
// value heads are left alone.
//
// With HALF_OUT, y takes f16 values, two to a word (for a product that reads its X so).
//
// With LANE_ROWS (CPU adapters), each invocation normalises whole rows on its own: there an
// invocation is one SIMD lane of a CPU thread, and the barriers of a workgroup reduction cost
// far more than reading the row lane by lane (lavapipe: Whisper tiny.en's encoder LayerNorm,
// 1500 rows of 384, took 65 ms on workgroups of 256).

struct Params {
    k: u32,
    eps: f32,
    heads: u32,
    kv_heads: u32,
    // HEADS: head slots a query head takes in a row (2: a gate head follows each, untouched).
    q_step: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> step: Step;
#if !HEADS
@group(0) @binding(2) var<storage, read> x: array<f32>;
#endif
#if HALF_OUT
// f16 outputs, two to a word (for a product that reads its X so); never with RESIDUAL or
// HEADS, over an even width.
@group(0) @binding(3) var<storage, read_write> y: array<u32>;
#else
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
#endif
@group(0) @binding(4) var<storage, read> weight: array<f32>;
#if LAYER
@group(0) @binding(5) var<storage, read> bias: array<f32>;
#endif
#if HEADS
@group(0) @binding(6) var<storage, read> k_weight: array<f32>;
#endif

#if LANE_ROWS
// A row's elements this invocation reads: all of them, one after another.
const FIRST_STRIDE = vec2<u32>(0u, 1u);

fn total(tid: u32, v: f32) -> f32 {
    return v;
}
#else
const FIRST_STRIDE = vec2<u32>(1u, 256u);

var<workgroup> red: array<f32, 256>;

fn total(tid: u32, v: f32) -> f32 {
    red[tid] = v;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s >> 1u) {
        if (tid < s) {
            red[tid] += red[tid + s];
        }
        workgroupBarrier();
    }
    let sum = red[0];
    workgroupBarrier();
    return sum;
}
#endif

#if HEADS
// (No LANE_ROWS form: the engine runs these head norms on workgroups everywhere.)
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let head = wid.x;
    let t = wid.y;
    if (t >= step.n_tokens) {
        return;
    }
    let row_slots = p.heads * p.q_step + 2u * p.kv_heads;
    let slot = select(head + p.heads * (p.q_step - 1u), head * p.q_step, head < p.heads);
    let base = (t * row_slots + slot) * p.k;
    var sq = 0.0;
    for (var k = tid; k < p.k; k += 256u) {
        let v = y[base + k];
        sq += v * v;
    }
    // Every invocation has read its elements before any is rewritten (total synchronises).
    let inv = inverseSqrt(total(tid, sq) / f32(p.k) + p.eps);
    let is_q = head < p.heads;
    for (var k = tid; k < p.k; k += 256u) {
        y[base + k] = y[base + k] * inv * select(k_weight[k], weight[k], is_q);
    }
}
#else
#if HALF_OUT
// Writes outputs `at` and `at` + 1 (`at` even) as one f16 pair.
fn store_pair(at: u32, a: f32, b: f32) {
    y[at / 2u] = pack2x16float(clamp(vec2<f32>(a, b), vec2<f32>(-65504.0), vec2<f32>(65504.0)));
}
#endif

// Normalises `row` of the step; `tid` is this invocation's place among those sharing the row.
fn normalize_row(row: u32, tid: u32) {
    let base = row * p.k;
    let first = tid * FIRST_STRIDE.x;
    let stride = FIRST_STRIDE.y;
#if LAYER
    var s = 0.0;
    for (var k = first; k < p.k; k += stride) {
        s += x[base + k];
    }
    let mean = total(tid, s) / f32(p.k);
    var sq = 0.0;
    for (var k = first; k < p.k; k += stride) {
        let d = x[base + k] - mean;
        sq += d * d;
    }
    let inv = inverseSqrt(total(tid, sq) / f32(p.k) + p.eps);
#if HALF_OUT
    for (var k = 2u * first; k < p.k; k += 2u * stride) {
        store_pair(base + k, (x[base + k] - mean) * inv * weight[k] + bias[k],
                   (x[base + k + 1u] - mean) * inv * weight[k + 1u] + bias[k + 1u]);
    }
#else
    for (var k = first; k < p.k; k += stride) {
        y[base + k] = (x[base + k] - mean) * inv * weight[k] + bias[k];
    }
#endif
#else
    var sq = 0.0;
    for (var k = first; k < p.k; k += stride) {
        let v = x[base + k];
        sq += v * v;
    }
    let inv = inverseSqrt(total(tid, sq) / f32(p.k) + p.eps);
#if HALF_OUT
    for (var k = 2u * first; k < p.k; k += 2u * stride) {
        store_pair(base + k, x[base + k] * inv * weight[k], x[base + k + 1u] * inv * weight[k + 1u]);
    }
#else
    for (var k = first; k < p.k; k += stride) {
#if RESIDUAL
        y[base + k] += x[base + k] * inv * weight[k];
#else
        y[base + k] = x[base + k] * inv * weight[k];
#endif
    }
#endif
#endif
}

#if LANE_ROWS
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x < step.n_tokens) {
        normalize_row(gid.x, 0u);
    }
}
#else
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    if (wid.x < step.n_tokens) {
        normalize_row(wid.x, tid);
    }
}
#endif
#endif
