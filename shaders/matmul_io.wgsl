// What every prompt-product kernel shares (matmul.wgsl's SIMT tiles and matmul_coop.wgsl's
// tensor-core tiles): parameters, bindings, the convolution description, the epilogue and the
// pass that sums k slices.
//
// Defines: F16, BIAS, GELU (tanh form), GELU_ERF, QUICK_GELU, RESIDUAL (Y += ...), RELU (after
// the residual), SPLIT_K (with REDUCE_V4 where Y's rows are whole vec4 words), CONV, QUANT
// (weights bound by quant.wgsl), XV (X bound as vec4 words), GLU (the tensor-core tiles only:
// W is a fused gate/up matrix of n = 2·width rows, and Y holds the `width` gated outputs;
// GEGLU and GATE_TANH pick the form as in glu.wgsl; no residual, GELU or RELU), HALF_OUT (the
// tensor-core tiles only: Y holds f16 values, two to a word), HALF_IN (the tensor-core tiles
// only: X holds f16 values, eight to a 16-byte word).

struct Params {
    n: u32,
    k: u32,
    row_vecs: u32,
    // The most k slices of the split product.
    slices: u32,
    // Quantized weights: word offset of the block scales (see quant.wgsl).
    q_scales: u32,
    // Output tiles along n, rows of a tile, and the workgroups a split aims for: `reduce`
    // finds how many slices the product's dispatch had (MatMul::slices_for).
    col_tiles: u32,
    tile_rows: u32,
    target_workgroups: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> step: Step;
#if HALF_IN
// X as f16 values, eight to a 16-byte word (the tensor-core tiles, where k is a multiple of 8
// and X no convolution's input).
@group(0) @binding(2) var<storage, read> xh: array<vec4<u32>>;
#else
#if XV
// X as vec4 words (the tensor-core tiles, where k is a multiple of 4, or X a convolution's
// input of channels a multiple of 8): eight values in two 16-byte loads.
@group(0) @binding(2) var<storage, read> xv: array<vec4<f32>>;
#else
@group(0) @binding(2) var<storage, read> x: array<f32>;
#endif
#endif
#if !QUANT
#if F16
@group(0) @binding(3) var<storage, read> w: array<vec4<u32>>;
#else
@group(0) @binding(3) var<storage, read> w: array<vec4<f32>>;
#endif
#endif
#if HALF_OUT
// f16 outputs, two to a word (the tensor-core tiles only; no residual, gating or k split).
@group(0) @binding(4) var<storage, read_write> y: array<u32>;
#else
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
#endif
#if BIAS
@group(0) @binding(5) var<storage, read> bias: array<f32>;
#endif
#if SPLIT_K
// [slice][m][n] partial sums.
@group(0) @binding(6) var<storage, read_write> scratch: array<f32>;
#if REDUCE_V4
// The same as vec4 words, for `reduce` where n is a multiple of 4.
@group(0) @binding(12) var<storage, read> scratch4: array<vec4<f32>>;
#endif
#endif

#if CONV
// A 2-D convolution as an implicit product: row = output pixel, k = (tap y, tap x, input
// channel) over a channel-last input, so no im2col matrix is ever written.
struct Conv {
    in_h: u32,
    in_w: u32,
    cin: u32,
    out_w: u32,
    ksize: u32,
    stride: u32,
    pad: u32,
    // 1: the input is read as if upsampled 2× (nearest), fusing the UNet's upsampler.
    up: u32,
}
@group(0) @binding(7) var<uniform> cv: Conv;
#if NORM_IN
// A GroupNorm folded into the input (group_norm.wgsl `fold`): each channel's scale, then each
// channel's shift, as vec4 words; the input is loaded as SiLU(x·scale + shift).
@group(0) @binding(14) var<storage, read> conv_norm: array<vec4<f32>>;
#endif

#endif

// For a convolution: the top-left input pixel of output row `row`.
fn corner(row: u32) -> vec2<i32> {
#if CONV
    return vec2<i32>(
        i32((row / cv.out_w) * cv.stride) - i32(cv.pad),
        i32((row % cv.out_w) * cv.stride) - i32(cv.pad));
#else
    return vec2<i32>(0);
#endif
}

fn epilogue(sum: f32, row: u32, col: u32) -> f32 {
    var v = sum;
#if BIAS
    v += bias[col];
#endif
#if GELU
    v = gelu_tanh(v);
#endif
#if GELU_ERF
    v = gelu_erf(v);
#endif
#if QUICK_GELU
    // CLIP's x·σ(1.702x).
    v = v / (1.0 + exp(-1.702 * v));
#endif
#if RESIDUAL
    v += y[row * p.n + col];
#endif
#if RELU
    // After the residual: TAESD's blocks apply it to the sum.
    v = max(v, 0.0);
#endif
    return v;
}

#if GLU
// Output `col` of a row from the sums of weight rows `col` and width + `col` (`gated`:
// glu_forms.wgsl).
fn glu_epilogue(first: f32, second: f32, col: u32) -> f32 {
    var a = first;
    var b = second;
#if BIAS
    a += bias[col];
    b += bias[p.n / 2u + col];
#endif
    return gated(a, b);
}
#endif

#if SPLIT_K
// The k slices the product's dispatch had (MatMul::slices_for).
fn dispatched_slices() -> u32 {
    let tiles = max(p.col_tiles * ((step.n_tokens + p.tile_rows - 1u) / p.tile_rows), 1u);
    return clamp((p.target_workgroups + tiles - 1u) / tiles, 1u, p.slices);
}

#if GLU
#if REDUCE_V4
// Sums the k slices of both blocks' outputs and gates them, four outputs of a row per
// invocation (as below). Scratch rows hold all n = 2·width sums, each block's in weight order.
@compute @workgroup_size(256)
fn reduce(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = gid.y * nwg.x * 256u + gid.x;
    let width = p.n / 2u;
    if (id >= step.n_tokens * width / 4u) {
        return;
    }
    let slices = dispatched_slices();
    let row = (4u * id) / width;
    let col = (4u * id) % width;
    let slice_words = step.n_tokens * p.n / 4u;
    let first = (row * p.n + col) / 4u;
    let second = first + width / 4u;
    var a = vec4<f32>(0.0);
    var b = vec4<f32>(0.0);
    for (var z = 0u; z < slices; z++) {
        a += scratch4[z * slice_words + first];
        b += scratch4[z * slice_words + second];
    }
    for (var c = 0u; c < 4u; c++) {
        y[4u * id + c] = glu_epilogue(a[c], b[c], col + c);
    }
}
#else
// Sums the k slices of both blocks' outputs and gates them, one output an invocation.
@compute @workgroup_size(64)
fn reduce(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = gid.y * nwg.x * 64u + gid.x;
    let width = p.n / 2u;
    if (id >= step.n_tokens * width) {
        return;
    }
    let slices = dispatched_slices();
    let row = id / width;
    let col = id % width;
    let total = step.n_tokens * p.n;
    var a = 0.0;
    var b = 0.0;
    for (var z = 0u; z < slices; z++) {
        a += scratch[z * total + row * p.n + col];
        b += scratch[z * total + row * p.n + width + col];
    }
    y[id] = glu_epilogue(a, b, col);
}
#endif
#else
#if REDUCE_V4
// Sums the k slices of each output and applies the epilogue, four outputs of a row per
// invocation: each then has 16 bytes a slice in flight, which a streaming pass needs to
// approach the memory's rate (one f32 each read about a quarter of it on an H200).
@compute @workgroup_size(256)
fn reduce(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = gid.y * nwg.x * 256u + gid.x;
    let words = step.n_tokens * p.n / 4u;
    if (id >= words) {
        return;
    }
    let slices = dispatched_slices();
    var sum = vec4<f32>(0.0);
    for (var z = 0u; z < slices; z++) {
        sum += scratch4[z * words + id];
    }
    let row = (4u * id) / p.n;
    let col = (4u * id) % p.n;
    for (var c = 0u; c < 4u; c++) {
        y[4u * id + c] = epilogue(sum[c], row, col + c);
    }
}
#else
// Sums the k slices of each output and applies the epilogue.
@compute @workgroup_size(64)
fn reduce(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = gid.y * nwg.x * 64u + gid.x;
    let total = step.n_tokens * p.n;
    if (id >= total) {
        return;
    }
    let slices = dispatched_slices();
    var sum = 0.0;
    for (var z = 0u; z < slices; z++) {
        sum += scratch[z * total + id];
    }
    y[id] = epilogue(sum, id / p.n, id % p.n);
}
#endif
#endif
#endif
