//! The denoising loop's elementwise kernels (shaders/denoise.wgsl) and the live preview
//! (shaders/preview.wgsl).

use bytemuck::{Pod, Zeroable};

use super::flag;
use super::pass::{KernelSpec, Pass};
use crate::gpu::{Gpu, GpuError, Recorder, StorageBuffer};

const SOURCE: &str = include_str!("../../../shaders/denoise.wgsl");
const PREVIEW_SOURCE: &str = include_str!("../../../shaders/preview.wgsl");

/// One step's scalars; mirrors `Params` in denoise.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct DenoiseParams {
    pub n: u32,
    pub width: u32,
    pub channels: u32,
    pub _pad: u32,
    pub c_in: f32,
    pub guidance: f32,
    pub p: f32,
    pub q: f32,
    pub a: f32,
    pub b: f32,
    pub c: f32,
    pub d: f32,
}

/// The buffers the loop works on, all `n` floats.
pub struct DenoiseBuffers<'a> {
    pub latents: &'a StorageBuffer,
    /// The UNet's output (the conditional one under guidance; the guided one after).
    pub model_out: &'a StorageBuffer,
    /// The unconditional output under guidance.
    pub uncond: &'a StorageBuffer,
    /// The UNet's input.
    pub model_in: &'a StorageBuffer,
    /// The step's denoised estimate (what previews show).
    pub denoised: &'a StorageBuffer,
    pub prev_denoised: &'a StorageBuffer,
    pub noise: &'a StorageBuffer,
}

pub struct Denoise {
    pub guide: Pass,
    pub scale: Pass,
    pub step: Pass,
}

impl Denoise {
    pub fn new(gpu: &Gpu, n: u32, bufs: &DenoiseBuffers<'_>) -> Result<Self, GpuError> {
        let params = DenoiseParams {
            n,
            ..Default::default()
        };
        let spec = |entry| KernelSpec {
            family: "denoise",
            source: SOURCE,
            entry,
            defines: &[],
        };
        let grid = Pass::grid_of_64(n);
        let guide = Pass::new(
            gpu,
            spec("guide"),
            &params,
            &[(2, bufs.model_out), (3, bufs.uncond)],
            grid,
        )?;
        let scale = Pass::new(
            gpu,
            spec("scale"),
            &params,
            &[(1, bufs.latents), (3, bufs.model_in)],
            grid,
        )?;
        let step = Pass::new(
            gpu,
            spec("step"),
            &params,
            &[
                (1, bufs.latents),
                (2, bufs.model_out),
                (3, bufs.denoised),
                (4, bufs.prev_denoised),
                (5, bufs.noise),
            ],
            grid,
        )?;
        Ok(Self { guide, scale, step })
    }

    /// Writes this step's scalars to every pass (before recording them).
    pub fn set(&self, gpu: &Gpu, params: &DenoiseParams) {
        self.guide.set(gpu, params);
        self.scale.set(gpu, params);
        self.step.set(gpu, params);
    }
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct PreviewParams {
    width: u32,
    height: u32,
    channels: u32,
    _pad: u32,
}

/// Draws a channel-last image into an `Rgba8Unorm` texture with `STORAGE_BINDING` usage.
pub struct Preview {
    kernel: crate::gpu::Kernel,
    bind_group: wgpu::BindGroup,
    grid: [u32; 3],
    _params: crate::gpu::UniformBuffer,
    _map: Option<StorageBuffer>,
}

/// How a preview reads its source buffer.
pub enum PreviewSource<'a> {
    /// A latent `[pixel][channels]` through the linear map `rgb = Σ lᵢ·rows[i] + bias`, one
    /// row per channel.
    Latent {
        rows: &'a [[f32; 3]],
        bias: [f32; 3],
    },
    /// Decoded pixels `[pixel][3]` in −1..1.
    Pixels,
}

impl Preview {
    pub fn new(
        gpu: &Gpu,
        source: &PreviewSource<'_>,
        x: &StorageBuffer,
        texture: &wgpu::TextureView,
        width: u32,
        height: u32,
    ) -> Result<Self, GpuError> {
        let map = match source {
            PreviewSource::Latent { rows, bias } => {
                let table: Vec<f32> = rows
                    .iter()
                    .chain(std::iter::once(bias))
                    .flat_map(|r| [r[0], r[1], r[2], 0.0])
                    .collect();
                Some((gpu.storage_from("preview map", &table)?, rows.len() as u32))
            }
            PreviewSource::Pixels => None,
        };
        let latent = map.is_some();
        let kernel = gpu.kernel("preview", PREVIEW_SOURCE, "main", &[flag("LATENT", latent)])?;
        let params = gpu.uniform(
            "preview params",
            &PreviewParams {
                width,
                height,
                channels: map.as_ref().map_or(0, |(_, c)| *c),
                _pad: 0,
            },
        );
        let mut entries = vec![
            wgpu::BindGroupEntry {
                binding: 0,
                resource: params.buffer.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 1,
                resource: x.buffer.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 2,
                resource: wgpu::BindingResource::TextureView(texture),
            },
        ];
        if let Some((table, _)) = &map {
            entries.push(wgpu::BindGroupEntry {
                binding: 3,
                resource: table.buffer.as_entire_binding(),
            });
        }
        let bind_group = gpu.device().create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("preview"),
            layout: &kernel.layout,
            entries: &entries,
        });
        Ok(Self {
            kernel,
            bind_group,
            grid: [width.div_ceil(8), height.div_ceil(8), 1],
            _params: params,
            _map: map.map(|(table, _)| table),
        })
    }

    pub fn encode(&self, rec: &mut Recorder<'_>) {
        rec.dispatch_xyz(&self.kernel, &self.bind_group, self.grid);
    }
}
