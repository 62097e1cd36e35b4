// The denoising loop's elementwise work on a latent x[pixel][channel]:
//   guide:   classifier-free guidance, out = uncond + g·(cond − uncond);
//   scale:   the UNet input, model_in = c_in · x;
//   step:    the scheduler update in coefficient form (see scheduler.rs):
//              denoised = p·x + q·out
//              x ← a·x + b·denoised + c·prev_denoised + d·noise
//   preview: the denoised latent as RGB through a 4→3 linear map into a texture, so the
//            Image panel shows each step without a readback.

struct Params {
    n: u32,
    width: u32,
    channels: u32,
    _pad: u32,
    c_in: f32,
    guidance: f32,
    p: f32,
    q: f32,
    a: f32,
    b: f32,
    c: f32,
    d: f32,
}

@group(0) @binding(0) var<uniform> u: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> model_out: array<f32>;
@group(0) @binding(3) var<storage, read_write> other: array<f32>;
@group(0) @binding(4) var<storage, read_write> prev_denoised: array<f32>;
@group(0) @binding(5) var<storage, read> noise: array<f32>;

fn linear_id(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.y * nwg.x * 64u + gid.x;
}

// model_out holds the conditional output, other the unconditional one.
@compute @workgroup_size(64)
fn guide(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_id(gid, nwg);
    if (i < u.n) {
        model_out[i] = other[i] + u.guidance * (model_out[i] - other[i]);
    }
}

// other ← c_in · x.
@compute @workgroup_size(64)
fn scale(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_id(gid, nwg);
    if (i < u.n) {
        other[i] = u.c_in * x[i];
    }
}

// The denoised estimate lands in `other` (for the preview) and in prev_denoised.
@compute @workgroup_size(64)
fn step(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_id(gid, nwg);
    if (i < u.n) {
        let xi = x[i];
        let den = u.p * xi + u.q * model_out[i];
        x[i] = u.a * xi + u.b * den + u.c * prev_denoised[i] + u.d * noise[i];
        prev_denoised[i] = den;
        other[i] = den;
    }
}
