use bytemuck::{Pod, Zeroable};

use super::bind;
use crate::gpu::{Gpu, GpuError, Kernel, Recorder, StorageBuffer, UniformBuffer};

const SOURCE: &str = include_str!("../../../shaders/reduce.wgsl");

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    words: u32,
    _pad: [u32; 3],
}

/// Sums a buffer of f32 (length a multiple of 4) into one partial per workgroup.
pub struct SumReduce {
    kernel: Kernel,
    bind_group: wgpu::BindGroup,
    workgroups: u32,
    _params: UniformBuffer,
}

impl SumReduce {
    /// `partials` must hold `workgroups` f32.
    pub fn new(
        gpu: &Gpu,
        input: &StorageBuffer,
        partials: &StorageBuffer,
        workgroups: u32,
    ) -> Result<Self, GpuError> {
        let kernel = gpu.kernel("reduce", SOURCE, "main", &[])?;
        let params = gpu.uniform(
            "reduce params",
            &Params {
                words: (input.size / 16) as u32,
                _pad: [0; 3],
            },
        );
        let bind_group = bind(
            gpu,
            &kernel,
            &[
                (0, &params.buffer),
                (1, &input.buffer),
                (2, &partials.buffer),
            ],
        );
        Ok(Self {
            kernel,
            bind_group,
            workgroups,
            _params: params,
        })
    }

    pub fn encode(&self, rec: &mut Recorder<'_>) {
        rec.dispatch(&self.kernel, &self.bind_group, self.workgroups);
    }
}
