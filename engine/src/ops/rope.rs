use bytemuck::{Pod, Zeroable};

use super::{CacheShape, KvDType, bind, flag, groups_of_64};
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
    scale_base: u32,
    /// Head slots a query head takes in a QKV row (2: a gate head follows each).
    q_step: u32,
    _pad: u32,
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

    /// A table whose cos and sin are scaled by `attention_factor` (YaRN), as transformers
    /// scales them.
    pub fn scaled(
        gpu: &Gpu,
        inv_freq: &[f32],
        positions: u32,
        attention_factor: f32,
    ) -> Result<Self, GpuError> {
        if attention_factor == 1.0 {
            return Self::new(gpu, inv_freq, positions);
        }
        let (mut cos, mut sin) = Self::host(inv_freq, positions);
        for v in cos.iter_mut().chain(sin.iter_mut()) {
            *v *= attention_factor;
        }
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
    /// Q8_0 caches: the pass that quantizes K and V blocks (`main` then writes Q only).
    store_q8: Option<(Kernel, wgpu::BindGroup)>,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
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
        Self::build(gpu, shape, table, [qkv, q, k_cache, v_cache], step, None)
    }

    /// As [`RopeKv::new`] for a batched decode step: row t is a token of the sequence in
    /// slot `rows[t].y` of the step's [`super::BatchRows`] `rows`, at position `rows[t].x`.
    pub fn batched(
        gpu: &Gpu,
        shape: CacheShape,
        table: Option<&RopeTable>,
        [qkv, q, k_cache, v_cache]: [&StorageBuffer; 4],
        step: &UniformBuffer,
        rows: &UniformBuffer,
    ) -> Result<Self, GpuError> {
        Self::build(
            gpu,
            shape,
            table,
            [qkv, q, k_cache, v_cache],
            step,
            Some(rows),
        )
    }

    fn build(
        gpu: &Gpu,
        shape: CacheShape,
        table: Option<&RopeTable>,
        [qkv, q, k_cache, v_cache]: [&StorageBuffer; 4],
        step: &UniformBuffer,
        batch: Option<&UniformBuffer>,
    ) -> Result<Self, GpuError> {
        let CacheShape {
            heads,
            kv_heads,
            head_dim,
            rows: capacity,
            dtype: cache_dtype,
            ..
        } = shape;
        shape.check()?;
        check_rotary(table, head_dim)?;
        let q8 = cache_dtype == KvDType::Q8_0;
        let defines = [
            flag("F16", cache_dtype == KvDType::F16),
            flag("Q8", q8),
            flag("NO_ROPE", table.is_none()),
            flag("BATCH", batch.is_some()),
        ];
        let kernel = gpu.kernel("rope_kv", SOURCE, "main", &defines)?;
        let params = gpu.uniform(
            "rope params",
            &Params {
                heads,
                kv_heads,
                head_dim,
                capacity,
                rotary_dim: table.map_or(head_dim, |t| t.rotary_dim),
                scale_base: shape.scale_base(),
                q_step: if shape.gated_queries { 2 } else { 1 },
                _pad: 0,
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
        if let Some(rows) = batch {
            entries.push((super::BATCH_ROWS_BINDING, &rows.buffer));
        }
        // With q8_0, `main` leaves the caches (bindings 4, 5) to `store_q8`, which reads no
        // q (3); the automatic layouts drop what an entry point does not use.
        let without = |skip: &[u32]| -> Vec<(u32, &wgpu::Buffer)> {
            entries
                .iter()
                .copied()
                .filter(|(b, _)| !skip.contains(b))
                .collect()
        };
        let bind_group = bind(gpu, &kernel, &without(if q8 { &[4, 5] } else { &[] }));
        let store_q8 = if q8 {
            let k = gpu.kernel("rope_kv", SOURCE, "store_q8", &defines)?;
            let group = bind(gpu, &k, &without(&[3]));
            Some((k, group))
        } else {
            None
        };
        Ok(Self {
            kernel,
            bind_group,
            store_q8,
            heads,
            kv_heads,
            head_dim,
            _params: params,
        })
    }

    pub fn encode(&self, rec: &mut Recorder<'_>, n_tokens: u32) {
        let slots = self.heads + 2 * self.kv_heads;
        rec.dispatch(
            &self.kernel,
            &self.bind_group,
            (n_tokens * slots * self.head_dim / 4).div_ceil(256),
        );
        if let Some((q8, group)) = &self.store_q8 {
            let blocks = 2 * self.kv_heads * self.head_dim / 32;
            rec.dispatch(q8, group, groups_of_64(n_tokens * blocks));
        }
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
