// Writes an image being generated into an RGBA texture the Image panel draws, straight from
// the GPU buffers: either a latent x[pixel][channels] through a channels→3 linear map (a fast
// approximation of the VAE), or decoded pixels x[pixel][3] in −1..1.
// Defines: LATENT.

struct Params {
    width: u32,
    height: u32,
    // The latent's channels (LATENT).
    channels: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var out: texture_storage_2d<rgba8unorm, write>;
#if LATENT
// The map's rows (one per channel, RGB in xyz), then the bias.
@group(0) @binding(3) var<storage, read> map: array<vec4<f32>>;
#endif

@compute @workgroup_size(8, 8)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x >= p.width || gid.y >= p.height) {
        return;
    }
    let i = gid.y * p.width + gid.x;
#if LATENT
    var rgb = map[p.channels].xyz;
    for (var c = 0u; c < p.channels; c++) {
        rgb += x[p.channels * i + c] * map[c].xyz;
    }
#else
    let rgb = vec3<f32>(x[3u * i], x[3u * i + 1u], x[3u * i + 2u]);
#endif
    let v = clamp(rgb * 0.5 + 0.5, vec3<f32>(0.0), vec3<f32>(1.0));
    textureStore(out, vec2<i32>(gid.xy), vec4<f32>(v, 1.0));
}
