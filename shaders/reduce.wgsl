// Sum of a vec4<f32> buffer: each workgroup accumulates a grid-stride share with several
// loads in flight and writes one partial sum. Its main use is measuring how fast the GPU
// streams memory (`backpack bench --bandwidth`), the yardstick for the decode kernels.

struct Params {
    words: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> input: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> partials: array<f32>;

var<workgroup> red: array<f32, 256>;

@compute @workgroup_size(256)
fn main(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let group = wid.y * nwg.x + wid.x;
    let stride = nwg.x * nwg.y * 256u;
    var acc = vec4<f32>(0.0);
    var i = group * 256u + tid;
    // Four independent loads per iteration.
    for (; i + 3u * stride < p.words; i += 4u * stride) {
        acc += input[i] + input[i + stride] + input[i + 2u * stride] + input[i + 3u * stride];
    }
    for (; i < p.words; i += stride) {
        acc += input[i];
    }
    red[tid] = acc.x + acc.y + acc.z + acc.w;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s >> 1u) {
        if (tid < s) {
            red[tid] += red[tid + s];
        }
        workgroupBarrier();
    }
    if (tid == 0u) {
        partials[group] = red[0];
    }
}
