// Diffusion-transformer plumbing (Z-Image): latents to patch tokens and back, row norms
// modulated by the timestep, gated residual adds, RMSNorm and RoPE over attention heads, and
// rows filled with a learned padding token. Rows are `cols` floats; statistics in f32.

struct Params {
    rows: u32,
    cols: u32,
    // patchify / unpatchify: the latent's width in pixels; fill_rows: the first row filled;
    // head_rope: the head size.
    extra: u32,
    eps: f32,
    // mod_norm / gated_add: where the modulation vector starts in `m`; patch: channels.
    offset: u32,
    // patchify / unpatchify: the patch side; head_rope: query (and key) heads.
    side: u32,
    // mod_norm with SHIFT: where the shift vector starts in `m`.
    shift: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> weight: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> m: array<f32>;
// f16 values two to a word: mod_norm's rows with HALF_OUT (for a product that reads its X
// so), head_rope's QKV rows with F16 (as a product with half_out writes them).
@group(0) @binding(5) var<storage, read_write> y16: array<u32>;
// fill_tail: the rows in use, as the call's caption sets them.
@group(0) @binding(6) var<storage, read> used: array<u32>;
#if QUADS
// scaled_add and join_half_rows four values (or words) an invocation: the same buffers as
// vec4 words, one 16-byte access where four 4-byte ones were (FLUX.2 at 1024² on an H200:
// scaled_add's 40 calls a step took 4.2 ms and join_half_rows' 20 calls 5.4 ms a word at a
// time).
@group(0) @binding(7) var<storage, read> x4: array<vec4<f32>>;
@group(0) @binding(8) var<storage, read_write> y4: array<vec4<f32>>;
@group(0) @binding(9) var<storage, read_write> y16_4: array<vec4<u32>>;
@group(0) @binding(10) var<storage, read> used4: array<vec4<u32>>;
#endif

fn linear_id(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.y * nwg.x * 64u + gid.x;
}

// Where token `t`'s feature `j` (ordered patch row, patch column, channel) sits in a
// channel-last latent `extra` pixels wide.
fn latent_index(t: u32, j: u32) -> u32 {
    let c = p.offset;
    let side = p.side;
    let tokens_wide = p.extra / side;
    let ty = t / tokens_wide;
    let tx = t % tokens_wide;
    let ch = j % c;
    let inner = j / c;
    let py = inner / side;
    let px = inner % side;
    return ((ty * side + py) * p.extra + tx * side + px) * c + ch;
}

// y[t][j] = x at the latent pixel and channel feature j of token t reads (rows = tokens,
// cols = patch²·channels).
@compute @workgroup_size(64)
fn patchify(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = linear_id(gid, nwg);
    if (id >= p.rows * p.cols) {
        return;
    }
    y[id] = x[latent_index(id / p.cols, id % p.cols)];
}

// The inverse: token features back to the channel-last latent.
@compute @workgroup_size(64)
fn unpatchify(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = linear_id(gid, nwg);
    if (id >= p.rows * p.cols) {
        return;
    }
    y[latent_index(id / p.cols, id % p.cols)] = x[id];
}

// Rows `extra`.. `extra + rows` of y take the vector `weight` (a padding token).
@compute @workgroup_size(64)
fn fill_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = linear_id(gid, nwg);
    if (id >= p.rows * p.cols) {
        return;
    }
    y[p.extra * p.cols + id] = weight[id % p.cols];
}

// Rows from used[0] on of y's first `rows` (`cols` wide) take the vector `weight`: the
// padding token after a caption whose length is known only when the plan runs.
@compute @workgroup_size(64)
fn fill_tail(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = linear_id(gid, nwg);
    if (id >= p.rows * p.cols || id / p.cols < used[0]) {
        return;
    }
    y[id] = weight[id % p.cols];
}

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

fn row_of(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.y * nwg.x + wid.x;
}

// The RMS (or, with LAYER, mean-free) statistics of x's row: (mean, 1/σ).
fn row_stats(base: u32, tid: u32) -> vec2<f32> {
#if LAYER
    var s = 0.0;
    for (var k = tid; k < p.cols; k += 256u) {
        s += x[base + k];
    }
    let mean = total(tid, s) / f32(p.cols);
#else
    let mean = 0.0;
#endif
    var sq = 0.0;
    for (var k = tid; k < p.cols; k += 256u) {
        let d = x[base + k] - mean;
        sq += d * d;
    }
    return vec2<f32>(mean, inverseSqrt(total(tid, sq) / f32(p.cols) + p.eps));
}

// norm(x[r])[k] (· weight with WEIGHT) (· (1 + m[offset + k]) with MODULATE).
fn mod_norm_value(base: u32, k: u32, stats: vec2<f32>) -> f32 {
    var v = (x[base + k] - stats.x) * stats.y;
#if WEIGHT
    v *= weight[k];
#endif
#if MODULATE
    v *= 1.0 + m[p.offset + k];
#endif
#if SHIFT
    v += m[p.shift + k];
#endif
    return v;
}

// y[r] = norm(x[r]) (· weight with WEIGHT) (· (1 + m[offset..]) with MODULATE) (+ m[shift..]
// with SHIFT): RMSNorm, or
// LayerNorm without affine terms with LAYER; with HALF_OUT into y16 as f16 pairs (an even
// width). One workgroup per row.
@compute @workgroup_size(256)
fn mod_norm(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>,
            @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = row_of(wid, nwg);
    if (row >= p.rows) {
        return;
    }
    let base = row * p.cols;
    let stats = row_stats(base, tid);
#if HALF_OUT
    for (var k = 2u * tid; k < p.cols; k += 512u) {
        let pair = vec2<f32>(mod_norm_value(base, k, stats), mod_norm_value(base, k + 1u, stats));
        y16[(base + k) / 2u] = pack2x16float(clamp(pair, vec2<f32>(-65504.0), vec2<f32>(65504.0)));
    }
#else
    for (var k = tid; k < p.cols; k += 256u) {
        y[base + k] = mod_norm_value(base, k, stats);
    }
#endif
}

// y[r] += (tanh(m[offset..]) with MODULATE, else 1) · RMSNorm(x[r]) · weight: a branch's
// output normed and gated into the residual stream. One workgroup per row.
@compute @workgroup_size(256)
fn gated_add(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>,
             @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = row_of(wid, nwg);
    if (row >= p.rows) {
        return;
    }
    let base = row * p.cols;
    let stats = row_stats(base, tid);
    for (var k = tid; k < p.cols; k += 256u) {
        var v = x[base + k] * stats.y * weight[k];
#if MODULATE
        v *= tanh(m[p.offset + k]);
#endif
        y[base + k] += v;
    }
}

// Element `k` of the head starting at `base` in the QKV rows (f16 pairs in y16 with F16).
fn qkv_pair(base: u32, k: u32) -> vec2<f32> {
#if F16
    return unpack2x16float(y16[(base + k) / 2u]);
#else
    return vec2<f32>(y[base + k], y[base + k + 1u]);
#endif
}

fn store_qkv_pair(base: u32, k: u32, v: vec2<f32>) {
#if F16
    y16[(base + k) / 2u] = pack2x16float(clamp(v, vec2<f32>(-65504.0), vec2<f32>(65504.0)));
#else
    y[base + k] = v.x;
    y[base + k + 1u] = v.y;
#endif
}

// In place over fused QKV rows (query heads, key heads, value heads, `extra` floats each; f16
// pairs with F16): RMSNorm of each query head (weight) and key head (m), then each pair
// (2i, 2i+1) rotated by the token's angle i: x = (cos, sin) pairs, [rows][extra / 2][2].
// A workgroup takes HEAD_ITEMS (token, head) items, HEAD_LANES lanes each striding over the
// head's pairs, their squares summed in workgroup memory per item. (A workgroup per item left
// three quarters of 256 lanes idle on heads of 128 and reduced over all 256: on an H200,
// Z-Image's 34 calls a step took 10.6 ms.) Workgroups: items over x and y (folded).
const HEAD_LANES: u32 = 32u;
const HEAD_ITEMS: u32 = 256u / HEAD_LANES;

@compute @workgroup_size(256)
fn head_rope(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>,
             @builtin(num_workgroups) nwg: vec3<u32>) {
    let item = (wid.y * nwg.x + wid.x) * HEAD_ITEMS + tid / HEAD_LANES;
    let lane = tid % HEAD_LANES;
    // Items past the last still reach every barrier, reading and writing nothing.
    let live = item < p.rows * 2u * p.side;
    let t = item / (2u * p.side);
    let head = item % (2u * p.side);
    let hd = p.extra;
    let base = (t * 3u * p.side + head) * hd;
    var sq = 0.0;
    if (live) {
        for (var i = lane; i < hd / 2u; i += HEAD_LANES) {
            let v = qkv_pair(base, 2u * i);
            sq += dot(v, v);
        }
    }
    red[tid] = sq;
    workgroupBarrier();
    for (var s = HEAD_LANES / 2u; s > 0u; s = s >> 1u) {
        if (lane < s) {
            red[tid] += red[tid + s];
        }
        workgroupBarrier();
    }
    if (!live) {
        return;
    }
    let inv = inverseSqrt(red[tid - lane] / f32(hd) + p.eps);
    let is_q = head < p.side;
    for (var i = lane; i < hd / 2u; i += HEAD_LANES) {
        let k = 2u * i;
        let v = qkv_pair(base, k) * inv;
        let a = v.x * select(m[k], weight[k], is_q);
        let b = v.y * select(m[k + 1u], weight[k + 1u], is_q);
        let at = (t * (hd / 2u) + i) * 2u;
        let c = x[at];
        let s = x[at + 1u];
        store_qkv_pair(base, k, vec2<f32>(a * c - b * s, a * s + b * c));
    }
}

// y[r][k] += m[offset + k] · x[r][k]: a branch's output gated into the residual stream by the
// timestep's modulation (FLUX.2). rows × cols elements, 64 a workgroup.
@compute @workgroup_size(64)
fn scaled_add(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = linear_id(gid, nwg);
#if QUADS
    // Four values of a row (cols a multiple of 4).
    if (id >= p.rows * p.cols / 4u) {
        return;
    }
    let g = p.offset + 4u * id % p.cols;
    y4[id] += vec4<f32>(m[g], m[g + 1u], m[g + 2u], m[g + 3u]) * x4[id];
#else
    if (id >= p.rows * p.cols) {
        return;
    }
    y[id] += m[p.offset + id % p.cols] * x[id];
#endif
}

// FLUX.2's packed latent back to the VAE's: tokens `[rows][cols]` of an `extra`-token-wide
// grid, feature j = channel·4 + dy·2 + dx, each de-normalised by the VAE's batch-norm
// statistics (weight: σ per feature, then the means), into a channel-last latent twice as wide
// and high with cols / 4 channels.
@compute @workgroup_size(64)
fn bn_unpack(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = linear_id(gid, nwg);
    if (id >= p.rows * p.cols) {
        return;
    }
    let t = id / p.cols;
    let j = id % p.cols;
    let channels = p.cols / 4u;
    let c = j / 4u;
    let dy = (j % 4u) / 2u;
    let dx = j % 2u;
    let ty = t / p.extra;
    let tx = t % p.extra;
    let at = ((2u * ty + dy) * (2u * p.extra) + 2u * tx + dx) * channels + c;
    y[at] = x[id] * weight[j] + weight[p.cols + j];
}

// Rows joined as f16 pairs: each output row (cols words) is `extra` words of f16 pairs from
// `used` (an attention output written as f16), then `offset` f32 values from x packed into
// pairs (a feed-forward's output). FLUX.2's single-stream blocks project both through one
// matrix.
@compute @workgroup_size(64)
fn join_half_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = linear_id(gid, nwg);
#if QUADS
    // Four words of a row (extra a multiple of 4, offset of 8).
    if (id >= p.rows * p.cols / 4u) {
        return;
    }
    let r = id / (p.cols / 4u);
    let w = id % (p.cols / 4u);
    if (w < p.extra / 4u) {
        y16_4[id] = used4[r * (p.extra / 4u) + w];
        return;
    }
    let k = (r * p.offset + 8u * (w - p.extra / 4u)) / 4u;
    let lo = clamp(x4[k], vec4<f32>(-65504.0), vec4<f32>(65504.0));
    let hi = clamp(x4[k + 1u], vec4<f32>(-65504.0), vec4<f32>(65504.0));
    y16_4[id] = vec4<u32>(pack2x16float(lo.xy), pack2x16float(lo.zw), pack2x16float(hi.xy),
                          pack2x16float(hi.zw));
#else
    if (id >= p.rows * p.cols) {
        return;
    }
    let r = id / p.cols;
    let w = id % p.cols;
    if (w < p.extra) {
        y16[id] = used[r * p.extra + w];
        return;
    }
    let k = r * p.offset + 2u * (w - p.extra);
    let pair = vec2<f32>(x[k], x[k + 1u]);
    y16[id] = pack2x16float(clamp(pair, vec2<f32>(-65504.0), vec2<f32>(65504.0)));
#endif
}
