// GroupNorm over a channel-last image x[pixel][channel] (the UNet's and VAE's normalisation),
// in three passes so that a large image keeps the whole GPU busy:
//   stats:    workgroup (group, chunk) reduces its run of pixels to (count, mean, M2) with
//             Welford's update, merged across the workgroup with Chan's formula;
//   finalize: one invocation per group merges its chunks into (mean, 1/σ);
//   apply:    y = (x − mean)/σ · γ + β per element, optionally followed by SiLU or ReLU;
//   fold:     instead of finalize and apply, one invocation per channel merges its group's
//             chunks and writes the channel's affine map, y[c] = γ/σ and y[C + c] = β −
//             mean·γ/σ, for a convolution that applies it (and the activation) as it loads
//             its input (matmul_coop.wgsl NORM_IN).
// Defines: SILU, RELU.

struct Params {
    pixels: u32,
    channels: u32,
    groups: u32,
    chunks: u32,
    eps: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
// [group][chunk] (count, mean, M2) partials.
@group(0) @binding(2) var<storage, read_write> partials: array<vec4<f32>>;
// [group] (mean, 1/σ).
@group(0) @binding(3) var<storage, read_write> stats: array<vec2<f32>>;
@group(0) @binding(4) var<storage, read> gamma: array<f32>;
@group(0) @binding(5) var<storage, read> beta: array<f32>;
@group(0) @binding(6) var<storage, read_write> y: array<f32>;

const WG: u32 = 256u;
var<workgroup> shared_stats: array<vec3<f32>, WG>;

fn merge(a: vec3<f32>, b: vec3<f32>) -> vec3<f32> {
    let n = a.x + b.x;
    if (n == 0.0) {
        return vec3<f32>(0.0);
    }
    let delta = b.y - a.y;
    let mean = a.y + delta * b.x / n;
    let m2 = a.z + b.z + delta * delta * a.x * b.x / n;
    return vec3<f32>(n, mean, m2);
}

@compute @workgroup_size(256)
fn stats_pass(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let g = wid.x;
    let chunk = wid.y;
    let cpg = p.channels / p.groups;
    let per_chunk = (p.pixels + p.chunks - 1u) / p.chunks;
    let first = min(chunk * per_chunk, p.pixels);
    let last = min(first + per_chunk, p.pixels);
    let count = (last - first) * cpg;
    var acc = vec3<f32>(0.0);
    for (var e = tid; e < count; e += WG) {
        let v = x[(first + e / cpg) * p.channels + g * cpg + e % cpg];
        acc.x += 1.0;
        let delta = v - acc.y;
        acc.y += delta / acc.x;
        acc.z += delta * (v - acc.y);
    }
    shared_stats[tid] = acc;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (tid < s) {
            shared_stats[tid] = merge(shared_stats[tid], shared_stats[tid + s]);
        }
        workgroupBarrier();
    }
    if (tid == 0u) {
        let r = shared_stats[0];
        partials[g * p.chunks + chunk] = vec4<f32>(r, 0.0);
    }
}

@compute @workgroup_size(64)
fn finalize(@builtin(global_invocation_id) gid: vec3<u32>) {
    let g = gid.x;
    if (g >= p.groups) {
        return;
    }
    stats[g] = group_stats(g);
}

// The group's (mean, 1/σ) from its chunks.
fn group_stats(g: u32) -> vec2<f32> {
    var acc = vec3<f32>(0.0);
    for (var c = 0u; c < p.chunks; c++) {
        acc = merge(acc, partials[g * p.chunks + c].xyz);
    }
    let variance = acc.z / max(acc.x, 1.0);
    return vec2<f32>(acc.y, inverseSqrt(variance + p.eps));
}

@compute @workgroup_size(64)
fn fold(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    if (c >= p.channels) {
        return;
    }
    let s = group_stats(c / (p.channels / p.groups));
    let scale = s.y * gamma[c];
    y[c] = scale;
    y[p.channels + c] = beta[c] - s.x * scale;
}

@compute @workgroup_size(64)
fn apply(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = gid.y * nwg.x * 64u + gid.x;
    if (id >= p.pixels * p.channels) {
        return;
    }
    let c = id % p.channels;
    let s = stats[c / (p.channels / p.groups)];
    var v = (x[id] - s.x) * s.y * gamma[c] + beta[c];
#if SILU
    v = v / (1.0 + exp(-v));
#endif
#if RELU
    v = max(v, 0.0);
#endif
    y[id] = v;
}
