use bytemuck::{Pod, Zeroable};

use super::{WeightDType, bind, flag};
use crate::gpu::{Gpu, GpuError, Kernel, Recorder, StorageBuffer, UniformBuffer};

const SOURCE: &str = include_str!("../../../shaders/attention.wgsl");
const WG: u32 = 256;
/// Largest head dimension the kernel's workgroup arrays hold.
pub const MAX_HEAD_DIM: u32 = 256;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    capacity: u32,
    scale: f32,
    _pad: [u32; 3],
}

/// Causal grouped-query attention of the step's queries over the cache.
pub struct Attention {
    kernel: Kernel,
    bind_group: wgpu::BindGroup,
    heads: u32,
    _params: UniformBuffer,
}

impl Attention {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gpu: &Gpu,
        heads: u32,
        kv_heads: u32,
        head_dim: u32,
        capacity: u32,
        cache_dtype: WeightDType,
        q: &StorageBuffer,
        k_cache: &StorageBuffer,
        v_cache: &StorageBuffer,
        out: &StorageBuffer,
        step: &UniformBuffer,
    ) -> Result<Self, GpuError> {
        if head_dim > MAX_HEAD_DIM || !head_dim.is_multiple_of(4) || head_dim == 0 {
            return Err(GpuError::Device(format!(
                "head_dim {head_dim} is unsupported (a multiple of 4, at most {MAX_HEAD_DIM})"
            )));
        }
        if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(GpuError::Device(format!(
                "{heads} attention heads cannot share {kv_heads} key/value heads"
            )));
        }
        let kernel = gpu.kernel(
            "attention",
            SOURCE,
            "main",
            &[
                ("WG", WG.to_string()),
                ("HD", head_dim.to_string()),
                flag("F16", cache_dtype == WeightDType::F16),
            ],
        )?;
        let params = gpu.uniform(
            "attention params",
            &Params {
                heads,
                kv_heads,
                head_dim,
                capacity,
                scale: 1.0 / (head_dim as f32).sqrt(),
                _pad: [0; 3],
            },
        );
        let bind_group = bind(
            gpu,
            &kernel,
            &[
                (0, &params.buffer),
                (1, &step.buffer),
                (2, &q.buffer),
                (3, &k_cache.buffer),
                (4, &v_cache.buffer),
                (5, &out.buffer),
            ],
        );
        Ok(Self {
            kernel,
            bind_group,
            heads,
            _params: params,
        })
    }

    pub fn encode(&self, rec: &mut Recorder<'_>, n_tokens: u32) {
        rec.dispatch_xyz(&self.kernel, &self.bind_group, [self.heads, n_tokens, 1]);
    }
}
