// SwiGLU for prompts: h[t][i] = silu(gate[t][i]) * up[t][i], where each row of the fused
// gate/up product holds the gate block then the up block. With GEGLU (diffusers' feed-forward):
// h[t][i] = up[t][i] * gelu(gate[t][i]) with the up block first. With GATE_TANH (Gemma):
// gelu_tanh of the gate block, which comes first (`gated`, glu_forms.wgsl).
//
// With V4 (the width a multiple of 4) each invocation takes four values through vec4 views:
// a streaming kernel needs that many bytes in flight per invocation to approach the memory's
// rate (one f32 each read about a quarter of it on an H200).

struct Params {
    width: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> step: Step;
#if V4
@group(0) @binding(2) var<storage, read> gate_up: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> h: array<vec4<f32>>;
#else
@group(0) @binding(2) var<storage, read> gate_up: array<f32>;
@group(0) @binding(3) var<storage, read_write> h: array<f32>;
#endif

#if V4
const LANES: u32 = 4u;
#else
const LANES: u32 = 1u;
#endif

#if V4
fn gated_at(a: vec4<f32>, b: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(gated(a.x, b.x), gated(a.y, b.y), gated(a.z, b.z), gated(a.w, b.w));
}
#else
fn gated_at(a: f32, b: f32) -> f32 {
    return gated(a, b);
}
#endif

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = gid.y * nwg.x * 256u + gid.x;
    // In units of LANES values.
    let width = p.width / LANES;
    if (id >= step.n_tokens * width) {
        return;
    }
    let t = id / width;
    let i = id % width;
    h[id] = gated_at(gate_up[2u * t * width + i], gate_up[(2u * t + 1u) * width + i]);
}
