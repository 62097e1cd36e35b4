use bytemuck::{Pod, Zeroable};

use super::{CacheShape, WeightDType, bind, flag, groups_of_64};
use crate::gpu::{Gpu, GpuError, Kernel, Recorder, StorageBuffer, UniformBuffer};

const SOURCE: &str = include_str!("../../../shaders/rope_kv.wgsl");

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    capacity: u32,
    rotary_dim: u32,
    _pad: [u32; 3],
}

/// cos/sin of position × inverse frequency for every cached position, computed on the host the
/// way transformers does (f32 product, then cos/sin): large angles lose nothing to GPU
/// approximations of sin and cos.
pub struct RopeTable {
    pub cos: StorageBuffer,
    pub sin: StorageBuffer,
    /// Leading dims of each head that rotate (two per frequency); the rest pass through
    /// (partial rotary, e.g. Phi-4-mini).
    pub rotary_dim: u32,
}

impl RopeTable {
    pub fn new(gpu: &Gpu, inv_freq: &[f32], positions: u32) -> Result<Self, GpuError> {
        let (cos, sin) = Self::host(inv_freq, positions);
        Ok(Self {
            cos: gpu.storage_from("rope cos", &cos)?,
            sin: gpu.storage_from("rope sin", &sin)?,
            rotary_dim: 2 * inv_freq.len() as u32,
        })
    }

    /// Phi-3.5 / Phi-4-mini's longrope: rows `0..positions` rotate by the short factors' inverse
    /// frequencies, rows `positions..2·positions` by the long ones (a step reads them with
    /// `rope_row = positions`), all scaled by `attention_factor` as transformers scales cos and
    /// sin.
    pub fn longrope(
        gpu: &Gpu,
        short: &[f32],
        long: &[f32],
        positions: u32,
        attention_factor: f32,
    ) -> Result<Self, GpuError> {
        if short.len() != long.len() {
            return Err(GpuError::Device(format!(
                "longrope has {} short and {} long factors",
                short.len(),
                long.len()
            )));
        }
        let (mut cos, mut sin) = Self::host(short, positions);
        let (long_cos, long_sin) = Self::host(long, positions);
        cos.extend(long_cos);
        sin.extend(long_sin);
        for v in cos.iter_mut().chain(sin.iter_mut()) {
            *v *= attention_factor;
        }
        Ok(Self {
            cos: gpu.storage_from("rope cos", &cos)?,
            sin: gpu.storage_from("rope sin", &sin)?,
            rotary_dim: 2 * short.len() as u32,
        })
    }

    pub fn host(inv_freq: &[f32], positions: u32) -> (Vec<f32>, Vec<f32>) {
        let n = positions as usize * inv_freq.len();
        let mut cos = Vec::with_capacity(n);
        let mut sin = Vec::with_capacity(n);
        for pos in 0..positions {
            for &f in inv_freq {
                let angle = pos as f32 * f;
                cos.push(f64::from(angle).cos() as f32);
                sin.push(f64::from(angle).sin() as f32);
            }
        }
        (cos, sin)
    }
}

/// RoPE on Q and K of the fused QKV output, Q to the attention input, K/V into the cache.
pub struct RopeKv {
    kernel: Kernel,
    bind_group: wgpu::BindGroup,
    slots: u32,
    quads: u32,
    _params: UniformBuffer,
}

impl RopeKv {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gpu: &Gpu,
        shape: CacheShape,
        table: Option<&RopeTable>,
        qkv: &StorageBuffer,
        q: &StorageBuffer,
        k_cache: &StorageBuffer,
        v_cache: &StorageBuffer,
        step: &UniformBuffer,
    ) -> Result<Self, GpuError> {
        let CacheShape {
            heads,
            kv_heads,
            head_dim,
            rows: capacity,
            dtype: cache_dtype,
            ..
        } = shape;
        if !head_dim.is_multiple_of(4) {
            return Err(GpuError::Device(format!(
                "head_dim {head_dim} is not a multiple of 4"
            )));
        }
        check_rotary(table, head_dim)?;
        let kernel = gpu.kernel(
            "rope_kv",
            SOURCE,
            "main",
            &[
                flag("F16", cache_dtype == WeightDType::F16),
                flag("NO_ROPE", table.is_none()),
            ],
        )?;
        let params = gpu.uniform(
            "rope params",
            &Params {
                heads,
                kv_heads,
                head_dim,
                capacity,
                rotary_dim: table.map_or(head_dim, |t| t.rotary_dim),
                _pad: [0; 3],
            },
        );
        let mut entries = vec![
            (0, &params.buffer),
            (1, &step.buffer),
            (2, &qkv.buffer),
            (3, &q.buffer),
            (4, &k_cache.buffer),
            (5, &v_cache.buffer),
        ];
        if let Some(t) = table {
            entries.push((6, &t.cos.buffer));
            entries.push((7, &t.sin.buffer));
        }
        let bind_group = bind(gpu, &kernel, &entries);
        Ok(Self {
            kernel,
            bind_group,
            slots: heads + 2 * kv_heads,
            quads: head_dim / 4,
            _params: params,
        })
    }

    pub fn encode(&self, rec: &mut Recorder<'_>, n_tokens: u32) {
        rec.dispatch(
            &self.kernel,
            &self.bind_group,
            groups_of_64(n_tokens * self.slots * self.quads),
        );
    }
}

/// The rotating dims must be whole groups of four within the head (each kernel invocation
/// rotates two dims and their two partners).
pub(crate) fn check_rotary(table: Option<&RopeTable>, head_dim: u32) -> Result<(), GpuError> {
    match table {
        Some(t)
            if t.rotary_dim == 0 || !t.rotary_dim.is_multiple_of(4) || t.rotary_dim > head_dim =>
        {
            Err(GpuError::Device(format!(
                "rotary dims {} do not fit heads of {head_dim} in groups of four",
                t.rotary_dim
            )))
        }
        _ => Ok(()),
    }
}
