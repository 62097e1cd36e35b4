// Writes an image being generated into an RGBA texture the Image panel draws, straight from
// the GPU buffers: either a latent x[pixel][4] through a 4→3 linear map (a fast approximation
// of the VAE), or decoded pixels x[pixel][3] in −1..1.
// Defines: LATENT.

struct Params {
    width: u32,
    height: u32,
    _pad0: u32,
    _pad1: u32,
    // Columns of the 4→3 map, then the bias (LATENT).
    m0: vec4<f32>,
    m1: vec4<f32>,
    m2: vec4<f32>,
    m3: vec4<f32>,
    bias: vec4<f32>,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var out: texture_storage_2d<rgba8unorm, write>;

@compute @workgroup_size(8, 8)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x >= p.width || gid.y >= p.height) {
        return;
    }
    let i = gid.y * p.width + gid.x;
#if LATENT
    let l = vec4<f32>(x[4u * i], x[4u * i + 1u], x[4u * i + 2u], x[4u * i + 3u]);
    let rgb = (l.x * p.m0 + l.y * p.m1 + l.z * p.m2 + l.w * p.m3 + p.bias).xyz;
#else
    let rgb = vec3<f32>(x[3u * i], x[3u * i + 1u], x[3u * i + 2u]);
#endif
    let v = clamp(rgb * 0.5 + 0.5, vec3<f32>(0.0), vec3<f32>(1.0));
    textureStore(out, vec2<i32>(gid.xy), vec4<f32>(v, 1.0));
}
