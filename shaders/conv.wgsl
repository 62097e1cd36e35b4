// 1-D convolution input unrolled into rows (im2col), so that the convolution becomes one
// matrix product with the weight `[out][in·K]` (PyTorch's Conv1d layout flattened): row t of
// the output holds, for every input channel c and tap k, the input at position
// t·stride + k − pad, or zero outside the signal. Whisper's encoder stem (two K=3, pad=1
// convolutions, the second with stride 2) runs this way on the tiled product kernel.
//
// Defines: CHANNEL_MAJOR (input is [channel][position], like a log-mel spectrogram; otherwise
// [position][channel], like the output of a previous product), TAPS (kernel width).

struct Params {
    channels: u32,
    in_len: u32,
    out_len: u32,
    stride: u32,
    pad: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> cols: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = gid.y * nwg.x * 64u + gid.x;
    let width = p.channels * {{TAPS}}u;
    if (id >= p.out_len * width) {
        return;
    }
    let t = id / width;
    let c = (id % width) / {{TAPS}}u;
    let k = id % {{TAPS}}u;
    // Unsigned arithmetic: positions left of the signal wrap to huge values and fail the test.
    let pos = t * p.stride + k - p.pad;
    var v = 0.0;
    if (t * p.stride + k >= p.pad && pos < p.in_len) {
#if CHANNEL_MAJOR
        v = src[c * p.in_len + pos];
#else
        v = src[pos * p.channels + c];
#endif
    }
    cols[id] = v;
}
