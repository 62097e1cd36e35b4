// Splits the fused QKV product of the step's tokens: rotates Q and K with RoPE (HF
// rotate-half layout over the first rotary_dim dims: dim i pairs with i + rotary_dim/2; the
// dims past rotary_dim pass through) unless NO_ROPE, writes Q for attention, and stores K and
// V into this layer's cache at their positions (row pos mod capacity: a rolling cache wraps). Each invocation handles four dims —
// (2j, 2j+1) and their rotation partners, or four pass-through dims — so f16 caches are
// written as whole packed u32 words.
//
// With Q8 the cache holds q8_0 blocks (see attention.wgsl): `main` then writes Q only, and
// `store_q8` quantizes K and V, one invocation per 32-dim block, after rotating its dims.
//
// A QKV row holds the query heads, then the key heads, then the value heads; with q_step 2
// each query head is followed by a gate head of the same width (Qwen3.5's query product
// interleaves them), which this pass leaves alone.
//
// Defines: F16 (f16 cache), Q8, NO_ROPE (learned positions, e.g. GPT-2).

struct Params {
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    capacity: u32,
    rotary_dim: u32,
    // Q8: word offset of the block scales in each cache buffer.
    scale_base: u32,
    // Head slots a query head takes in a QKV row: 1, or 2 with gate heads interleaved.
    q_step: u32,
    _pad: u32,
}

// The head slots of a QKV row.
fn row_slots() -> u32 {
    return p.heads * p.q_step + 2u * p.kv_heads;
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read> qkv: array<f32>;
@group(0) @binding(3) var<storage, read_write> q: array<f32>;
#if Q8
@group(0) @binding(4) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(5) var<storage, read_write> v_cache: array<u32>;
#else
#if F16
@group(0) @binding(4) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(5) var<storage, read_write> v_cache: array<u32>;
#else
@group(0) @binding(4) var<storage, read_write> k_cache: array<f32>;
@group(0) @binding(5) var<storage, read_write> v_cache: array<f32>;
#endif
#endif
#if !NO_ROPE
// cos and sin of position × frequency, [position][head_dim / 2].
@group(0) @binding(6) var<storage, read> rope_cos: array<f32>;
@group(0) @binding(7) var<storage, read> rope_sin: array<f32>;
#endif

fn store(is_k: bool, index: u32, a: f32, b: f32) {
#if Q8
    // K and V go through store_q8.
    return;
#else
#if F16
    let word = pack2x16float(vec2<f32>(a, b));
    if (is_k) {
        k_cache[index / 2u] = word;
    } else {
        v_cache[index / 2u] = word;
    }
#else
    if (is_k) {
        k_cache[index] = a;
        k_cache[index + 1u] = b;
    } else {
        v_cache[index] = a;
        v_cache[index + 1u] = b;
    }
#endif
#endif
}

// Workgroups of 256: launched as four times as many workgroups of 64, streaming kernels ran at
// well under half the memory rate of an H200.
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = gid.y * nwg.x * 256u + gid.x;
    let quads = p.head_dim / 4u;
    let slots = p.heads + 2u * p.kv_heads;
    if (id >= step.n_tokens * slots * quads) {
        return;
    }
    let j = id % quads;
    let slot = (id / quads) % slots;
    let t = id / (quads * slots);
    let half_dim = p.rotary_dim / 2u;
    let pos = token_pos(t);
    // Query head `slot` (or key/value head slot − heads) in the row, past any gate heads.
    let src_slot = select(slot + p.heads * (p.q_step - 1u), slot * p.q_step, slot < p.heads);
    let src = (t * row_slots() + src_slot) * p.head_dim;
    let rotates = 4u * j < p.rotary_dim;
    // Dims a, a + 1 and b, b + 1: a rotation pair, or four dims past the rotary ones.
    let d = select(4u * j, 2u * j, rotates);
    let da = d;
    let db = select(d + 2u, d + half_dim, rotates);
    var a0 = qkv[src + da];
    var a1 = qkv[src + da + 1u];
    var b0 = qkv[src + db];
    var b1 = qkv[src + db + 1u];
#if !NO_ROPE
    if (rotates && slot < p.heads + p.kv_heads) {
        let at = (pos + step.rope_row) * half_dim + d;
        let c0 = rope_cos[at];
        let s0 = rope_sin[at];
        let c1 = rope_cos[at + 1u];
        let s1 = rope_sin[at + 1u];
        let ra0 = a0 * c0 - b0 * s0;
        let rb0 = b0 * c0 + a0 * s0;
        let ra1 = a1 * c1 - b1 * s1;
        let rb1 = b1 * c1 + a1 * s1;
        a0 = ra0;
        b0 = rb0;
        a1 = ra1;
        b1 = rb1;
    }
#endif
    if (slot < p.heads) {
        let dst = (t * p.heads + slot) * p.head_dim;
        q[dst + da] = a0;
        q[dst + da + 1u] = a1;
        q[dst + db] = b0;
        q[dst + db + 1u] = b1;
        return;
    }
    let is_k = slot < p.heads + p.kv_heads;
    let kv_head = select(slot - p.heads - p.kv_heads, slot - p.heads, is_k);
    let dst = ((token_slot(t) * p.kv_heads + kv_head) * p.capacity + pos % p.capacity) * p.head_dim;
    store(is_k, dst + da, a0, a1);
    store(is_k, dst + db, b0, b1);
}

#if Q8
// Element d of head vector `src` for position pos, rotated like `main` rotates it.
fn rotated(src: u32, d: u32, pos: u32) -> f32 {
#if NO_ROPE
    return qkv[src + d];
#else
    let half_dim = p.rotary_dim / 2u;
    if (d >= p.rotary_dim) {
        return qkv[src + d];
    }
    let row = (pos + step.rope_row) * half_dim;
    if (d < half_dim) {
        return qkv[src + d] * rope_cos[row + d] - qkv[src + d + half_dim] * rope_sin[row + d];
    }
    let i = d - half_dim;
    return qkv[src + d] * rope_cos[row + i] + qkv[src + i] * rope_sin[row + i];
#endif
}

@compute @workgroup_size(64)
fn store_q8(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = gid.y * nwg.x * 64u + gid.x;
    let blocks = p.head_dim / 32u;
    if (id >= step.n_tokens * 2u * p.kv_heads * blocks) {
        return;
    }
    let b = id % blocks;
    let slot = (id / blocks) % (2u * p.kv_heads);
    let t = id / (blocks * 2u * p.kv_heads);
    let pos = token_pos(t);
    let src = (t * row_slots() + p.heads * p.q_step + slot) * p.head_dim;
    let is_k = slot < p.kv_heads;
    let kv_head = select(slot - p.kv_heads, slot, is_k);
    var vals: array<f32, 32>;
    var amax = 0.0;
    for (var i = 0u; i < 32u; i++) {
        let d = 32u * b + i;
        var v = qkv[src + d];
        if (is_k) {
            v = rotated(src, d, pos);
        }
        vals[i] = v;
        amax = max(amax, abs(v));
    }
    let scale = amax / 127.0;
    let inv = select(0.0, 1.0 / scale, scale > 0.0);
    // Words of this row: ((slot · kv_heads + kv_head) · capacity + row) · head_dim / 4.
    let cache_head = token_slot(t) * p.kv_heads + kv_head;
    let word0 = ((cache_head * p.capacity + pos % p.capacity) * p.head_dim + 32u * b) / 4u;
    for (var w = 0u; w < 8u; w++) {
        var packed = 0u;
        for (var j = 0u; j < 4u; j++) {
            let q = i32(round(clamp(vals[4u * w + j] * inv, -127.0, 127.0)));
            packed |= (bitcast<u32>(q) & 255u) << (8u * j);
        }
        if (is_k) {
            k_cache[word0 + w] = packed;
        } else {
            v_cache[word0 + w] = packed;
        }
    }
    if (is_k) {
        k_cache[p.scale_base + word0 / 8u] = bitcast<u32>(scale);
    } else {
        v_cache[p.scale_base + word0 / 8u] = bitcast<u32>(scale);
    }
}
#endif
