use bytemuck::{Pod, Zeroable};

use super::{WeightDType, bind, flag, groups_of_64};
use crate::gpu::{Gpu, GpuError, Recorder, StorageBuffer};

const SOURCE: &str = include_str!("../../../shaders/fill.wgsl");

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    words: u32,
    seed: u32,
    scale: f32,
    constant: u32,
}

/// Fills `buffer` on the GPU with uniform values in [-scale, scale) derived from `seed`, or
/// with `scale` everywhere when `constant` is set.
pub fn fill_random(
    gpu: &Gpu,
    buffer: &StorageBuffer,
    dtype: WeightDType,
    seed: u32,
    scale: f32,
    constant: bool,
) -> Result<(), GpuError> {
    let kernel = gpu.kernel(
        "fill",
        SOURCE,
        "main",
        &[flag("F16", dtype == WeightDType::F16)],
    )?;
    let words = (buffer.size / 4) as u32;
    let params = gpu.uniform(
        "fill params",
        &Params {
            words,
            seed,
            scale,
            constant: u32::from(constant),
        },
    );
    let bind_group = bind(gpu, &kernel, &[(0, &params.buffer), (1, &buffer.buffer)]);
    let mut rec = Recorder::new(gpu);
    rec.dispatch(&kernel, &bind_group, groups_of_64(words));
    rec.submit();
    Ok(())
}

/// The value the fill kernel writes at `index` (for checking it on the host).
pub fn fill_value(seed: u32, index: u32, scale: f32) -> f32 {
    fn hash(v: u32) -> u32 {
        let h = v.wrapping_mul(747_796_405).wrapping_add(2_891_336_453);
        let h = ((h >> ((h >> 28) + 4)) ^ h).wrapping_mul(277_803_737);
        (h >> 22) ^ h
    }
    let r = hash(index ^ hash(seed));
    ((r >> 8) as f32 / 16_777_216.0 * 2.0 - 1.0) * scale
}
