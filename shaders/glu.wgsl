// SwiGLU for prompts: h[t][i] = silu(gate[t][i]) * up[t][i], where each row of the fused
// gate/up product holds the gate block then the up block. With GEGLU (diffusers' feed-forward):
// h[t][i] = up[t][i] * gelu(gate[t][i]) with the up block first. With GATE_TANH (Gemma):
// gelu_tanh of the gate block, which comes first.

struct Params {
    width: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read> gate_up: array<f32>;
@group(0) @binding(3) var<storage, read_write> h: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = gid.y * nwg.x * 64u + gid.x;
    if (id >= step.n_tokens * p.width) {
        return;
    }
    let t = id / p.width;
    let i = id % p.width;
#if GEGLU
    // GEGLU (diffusers' feed-forward): the value block first, then the gate, exact GELU.
    let u = gate_up[t * 2u * p.width + i];
    let g = gate_up[t * 2u * p.width + p.width + i];
    h[id] = gelu_erf(g) * u;
#else
#if GATE_TANH
    let g = gate_up[t * 2u * p.width + i];
    let u = gate_up[t * 2u * p.width + p.width + i];
    h[id] = gelu_tanh(g) * u;
#else
    let g = gate_up[t * 2u * p.width + i];
    let u = gate_up[t * 2u * p.width + p.width + i];
    h[id] = g / (1.0 + exp(-g)) * u;
#endif
#endif
}
