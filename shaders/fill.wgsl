// Fills a weight buffer on the GPU: uniform random values in [-scale, scale) from a
// counter-based hash of (seed, index), or a constant. Used to build benchmark models of real
// shapes without moving gigabytes from the host.
//
// Defines: F16 (two packed halves per u32 word).

struct Params {
    words: u32,
    seed: u32,
    scale: f32,
    constant: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;

fn hash(v: u32) -> u32 {
    var h = v * 747796405u + 2891336453u;
    h = ((h >> ((h >> 28u) + 4u)) ^ h) * 277803737u;
    return (h >> 22u) ^ h;
}

fn value(index: u32) -> f32 {
    if (p.constant != 0u) {
        return p.scale;
    }
    let r = hash(index ^ hash(p.seed));
    return (f32(r >> 8u) / 16777216.0 * 2.0 - 1.0) * p.scale;
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let id = gid.y * nwg.x * 64u + gid.x;
    if (id >= p.words) {
        return;
    }
#if F16
    out[id] = pack2x16float(vec2<f32>(value(2u * id), value(2u * id + 1u)));
#else
    out[id] = bitcast<u32>(value(id));
#endif
}
