// Plumbing for channel-last images x[pixel][channel] and row-major matrices: SiLU, channel
// concatenation (the UNet's skip connections), transposition, and row softmax (the VAE's
// single-head attention, which is too wide for the fused attention kernel).

struct Params {
    rows: u32,
    cols: u32,
    // concat: the first input's channels; transpose: the output's row stride; slice: the
    // input's row length.
    extra: u32,
    scale: f32,
    // slice: the first channel taken.
    offset: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

fn linear_id(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.y * nwg.x * 64u + gid.x;
}

// y = a·σ(a) over rows·cols values.
@compute @workgroup_size(64)
fn silu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = linear_id(gid, nwg);
    if (id < p.rows * p.cols) {
        let v = a[id];
        y[id] = v / (1.0 + exp(-v));
    }
}

// y[r] = a[r] ++ b[r]: a has `extra` channels, b the rest of `cols`.
@compute @workgroup_size(64)
fn concat(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = linear_id(gid, nwg);
    if (id >= p.rows * p.cols) {
        return;
    }
    let r = id / p.cols;
    let c = id % p.cols;
    if (c < p.extra) {
        y[id] = a[r * p.extra + c];
    } else {
        y[id] = b[r * (p.cols - p.extra) + c - p.extra];
    }
}

// y[c][r] = a[r][c], output rows `extra` apart (padded for matrix reads).
@compute @workgroup_size(64)
fn transpose(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = linear_id(gid, nwg);
    if (id >= p.rows * p.cols) {
        return;
    }
    let r = id / p.cols;
    let c = id % p.cols;
    y[c * p.extra + r] = a[id];
}

const WG: u32 = 256u;
var<workgroup> red: array<f32, WG>;

fn reduce_max(tid: u32, v: f32) -> f32 {
    red[tid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (tid < s) {
            red[tid] = max(red[tid], red[tid + s]);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn reduce_sum(tid: u32, v: f32) -> f32 {
    red[tid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (tid < s) {
            red[tid] += red[tid + s];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

// In place: y[r] = softmax(scale · y[r]) for each of `rows` rows of `cols`, one workgroup
// per row.
@compute @workgroup_size(256)
fn softmax(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = wid.y * nwg.x + wid.x;
    if (r >= p.rows) {
        return;
    }
    let base = r * p.cols;
    var m = -3.0e38;
    for (var c = tid; c < p.cols; c += WG) {
        m = max(m, y[base + c] * p.scale);
    }
    m = reduce_max(tid, m);
    var s = 0.0;
    for (var c = tid; c < p.cols; c += WG) {
        let e = exp(y[base + c] * p.scale - m);
        y[base + c] = e;
        s += e;
    }
    s = reduce_sum(tid, s);
    let inv = 1.0 / s;
    for (var c = tid; c < p.cols; c += WG) {
        y[base + c] *= inv;
    }
}

// y = a·scale + offset (offset's bits in `extra`): a latent into or out of the VAE's scale.
@compute @workgroup_size(64)
fn affine(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = linear_id(gid, nwg);
    if (id < p.rows * p.cols) {
        y[id] = a[id] * p.scale + bitcast<f32>(p.extra);
    }
}

// y[r] = channels offset..offset+cols of a[r], whose rows hold `extra` channels.
@compute @workgroup_size(64)
fn slice(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = linear_id(gid, nwg);
    if (id < p.rows * p.cols) {
        y[id] = a[(id / p.cols) * p.extra + p.offset + id % p.cols];
    }
}

// y = tanh(a / scale) · scale: a soft clamp to ±scale.
@compute @workgroup_size(64)
fn tanh_clamp(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = linear_id(gid, nwg);
    if (id < p.rows * p.cols) {
        y[id] = tanh(clamp(a[id] / p.scale, -15.0, 15.0)) * p.scale;
    }
}
