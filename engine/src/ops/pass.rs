//! One dispatch of a kernel with its buffers bound once and a fixed grid: the form of the
//! image models' small kernels (normalisation, plumbing, the denoising update), which run at
//! one shape per plan.

use bytemuck::Pod;

use super::bind;
use crate::gpu::{Gpu, GpuError, Kernel, Recorder, StorageBuffer, UniformBuffer};

pub struct Pass {
    kernel: Kernel,
    bind_group: wgpu::BindGroup,
    grid: [u32; 3],
    params: UniformBuffer,
}

/// A kernel to specialise: its shader family, source, entry point and defines.
pub struct KernelSpec<'a> {
    pub family: &'static str,
    pub source: &'static str,
    pub entry: &'static str,
    pub defines: &'a [(&'static str, String)],
}

impl Pass {
    /// `params` is bound at binding 0, `buffers` at their bindings.
    pub fn new<T: Pod>(
        gpu: &Gpu,
        spec: KernelSpec<'_>,
        params: &T,
        buffers: &[(u32, &StorageBuffer)],
        grid: [u32; 3],
    ) -> Result<Self, GpuError> {
        let kernel = gpu.kernel(spec.family, spec.source, spec.entry, spec.defines)?;
        let params = gpu.uniform(spec.family, params);
        let mut entries = vec![(0, &params.buffer)];
        entries.extend(buffers.iter().map(|(b, buf)| (*b, &buf.buffer)));
        let bind_group = bind(gpu, &kernel, &entries);
        Ok(Self {
            kernel,
            bind_group,
            grid,
            params,
        })
    }

    /// A 1-D grid of 64-wide workgroups covering `n` invocations (folded like
    /// [`Recorder::dispatch`]).
    pub fn grid_of_64(n: u32) -> [u32; 3] {
        let [x, y] = crate::gpu::fold_grid(n.div_ceil(64));
        [x, y, 1]
    }

    pub fn encode(&self, rec: &mut Recorder<'_>) {
        rec.dispatch_xyz(&self.kernel, &self.bind_group, self.grid);
    }

    /// Rewrites the uniform parameters (per-step values).
    pub fn set<T: Pod>(&self, gpu: &Gpu, params: &T) {
        self.params.write(gpu, params);
    }
}
