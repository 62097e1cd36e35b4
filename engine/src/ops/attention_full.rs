//! Attention where every query sees every key (no mask), or a text encoder's causal mask over
//! its own tokens: an encoder's self-attention over its fused QKV rows, or a decoder's
//! cross-attention over an encoder's keys and values (shaders/attention.wgsl FULL).

use bytemuck::{Pod, Zeroable};

use super::{
    AttentionKernel, MAX_HEAD_DIM, MAX_SPLITS, MIN_SPLIT, SOURCE, TILED_FROM, WG, attention_coop,
    tiles_for,
};
use crate::gpu::{Gpu, GpuError, Kernel, Recorder, StorageBuffer, UniformBuffer};
use crate::ops::attention_cpu::CpuAttention;
use crate::ops::{bind, flag};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct FullParams {
    heads: u32,
    kv_heads: u32,
    keys: u32,
    q_stride: u32,
    scale: f32,
    kv_stride: u32,
    k_off: u32,
    _pad: u32,
}

/// Where a non-causal attention finds its operands, in floats: query rows of `q_stride`
/// (heads side by side from 0), and key/value rows of `kv_stride` with the keys of all KV
/// heads at `k_off` and their values right after them.
#[derive(Clone, Copy, Debug)]
pub struct FullLayout {
    pub heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub keys: u32,
    pub q_stride: u32,
    pub kv_stride: u32,
    pub k_off: u32,
    /// q, kv and the output hold f16 values two to a word, as a product with `half_out`
    /// writes them and one with `half_in` reads them (offsets and strides still count values).
    /// CPU adapters run the GPU kernels for them rather than their own three passes.
    pub f16: bool,
}

/// Attention where every query sees every key (no mask): an encoder's self-attention over
/// its fused QKV rows, or a decoder's cross-attention over an encoder's keys and values.
/// The output is `[query][heads·head_dim]`.
pub struct FullAttention {
    kernel: Kernel,
    bind_group: wgpu::BindGroup,
    /// The query-block kernel, for more than a few queries.
    tiled: (Kernel, wgpu::BindGroup),
    /// The tensor-core kernel, where the adapter and head size take it (no mask).
    flash: Option<(Kernel, wgpu::BindGroup)>,
    /// Its wide form, for 128 or more queries over f16 rows.
    flash_wide: Option<(Kernel, wgpu::BindGroup)>,
    /// What CPU adapters run instead of the query-block kernel.
    cpu: Option<CpuAttention>,
    heads: u32,
    head_dim: u32,
    causal: bool,
    _params: UniformBuffer,
}

/// The fewest workgroups the wide tensor-core form may make: below, twice the workgroups of
/// 64 queries fill the GPU better. On an H200 the wide form took Z-Image's attention (30
/// heads, 4,160 tokens: 990 workgroups) from 113 to 67 ms a step; on Whisper's encoders it
/// took medium's (192) from 14.3–14.5 to 15.1–15.2 ms and small's (144) from 6.5 to 7.6, and
/// left large-v3-turbo's (240) level (its attention 5.5 → 5.0 ms), so they keep 64 queries.
const WIDE_FROM_WORKGROUPS: u32 = 256;

impl FullAttention {
    /// `step` gives the number of queries (its n_tokens) to the tiled kernel.
    pub fn new(
        gpu: &Gpu,
        layout: FullLayout,
        q: &StorageBuffer,
        kv: &StorageBuffer,
        out: &StorageBuffer,
        step: &UniformBuffer,
    ) -> Result<Self, GpuError> {
        Self::with_mask(gpu, layout, q, kv, out, step, false)
    }

    /// As [`FullAttention::new`]; with `causal`, query `t` sees keys `0..=t` only (a text
    /// encoder's self-attention over a padded prompt).
    pub fn with_mask(
        gpu: &Gpu,
        layout: FullLayout,
        q: &StorageBuffer,
        kv: &StorageBuffer,
        out: &StorageBuffer,
        step: &UniformBuffer,
        causal: bool,
    ) -> Result<Self, GpuError> {
        let FullLayout {
            heads,
            kv_heads,
            head_dim,
            ..
        } = layout;
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
        let aligned = [layout.q_stride, layout.kv_stride, layout.k_off];
        if aligned.iter().any(|v| !v.is_multiple_of(4)) || layout.keys == 0 {
            return Err(GpuError::Device(format!(
                "attention layout {layout:?} is not in whole vec4 words"
            )));
        }
        let (bq, bk) = tiles_for(head_dim);
        let defines = [
            ("WG", WG.to_string()),
            ("HD", head_dim.to_string()),
            flag("FULL", true),
            flag("TILED", true),
            ("MIN_SPLIT", MIN_SPLIT.to_string()),
            ("MAX_SPLITS", MAX_SPLITS.to_string()),
            ("BQ", bq.to_string()),
            ("BK", bk.to_string()),
            flag("CAUSAL", causal),
            flag("HALVES", layout.f16),
        ];
        let kernel = gpu.kernel("attention", SOURCE, "main", &defines)?;
        let tiled = gpu.kernel("attention", SOURCE, "tiled", &defines)?;
        let params = gpu.uniform(
            "full attention params",
            &FullParams {
                heads,
                kv_heads,
                keys: layout.keys,
                q_stride: layout.q_stride,
                scale: 1.0 / (head_dim as f32).sqrt(),
                kv_stride: layout.kv_stride,
                k_off: layout.k_off,
                _pad: 0,
            },
        );
        // Binding 1 (the step) is declared by the shader family but unused here; the
        // automatic layout drops it.
        let bind_group = bind(
            gpu,
            &kernel,
            &[
                (0, &params.buffer),
                (2, &q.buffer),
                (3, &kv.buffer),
                (5, &out.buffer),
            ],
        );
        let tiled_group = bind(
            gpu,
            &tiled,
            &[
                (0, &params.buffer),
                (1, &step.buffer),
                (2, &q.buffer),
                (3, &kv.buffer),
                (5, &out.buffer),
            ],
        );
        // The tensor-core kernel and its bindings; the wide form binds the queries as f16
        // values at 12.
        let flash_kernel = |wide: bool| -> Result<(Kernel, wgpu::BindGroup), GpuError> {
            let kernel = attention_coop::kernel(gpu, &defines, head_dim, wide)?;
            let q_binding = if wide { 12 } else { 2 };
            let entries = [
                (0, &params.buffer),
                (1, &step.buffer),
                (q_binding, &q.buffer),
                (3, &kv.buffer),
                (5, &out.buffer),
            ];
            let group = bind(gpu, &kernel, &entries);
            Ok((kernel, group))
        };
        let flash = if !causal && attention_coop::fits(gpu, head_dim) {
            Some(flash_kernel(false)?)
        } else {
            None
        };
        // The wide form reads the f16 queries straight into fragments: rows of whole 16-byte
        // words, as cooperative-matrix loads want them aligned.
        let flash_wide = if flash.is_some()
            && layout.f16
            && layout.q_stride.is_multiple_of(8)
            && attention_coop::fits_wide(gpu, head_dim)
        {
            Some(flash_kernel(true)?)
        } else {
            None
        };
        let cpu = if layout.f16 {
            None
        } else {
            CpuAttention::new(gpu, &layout, (q, kv, out, step), causal)?
        };
        Ok(Self {
            kernel,
            bind_group,
            tiled: (tiled, tiled_group),
            flash,
            flash_wide,
            cpu,
            heads,
            head_dim,
            causal,
            _params: params,
        })
    }

    /// Records attention for `n_queries` query rows (which must match the step's n_tokens).
    pub fn encode(&self, rec: &mut Recorder<'_>, n_queries: u32) {
        let kernel = if n_queries < TILED_FROM {
            AttentionKernel::PerQuery
        } else if self.cpu.is_some() {
            AttentionKernel::Cpu
        } else if self.causal {
            // The query-block kernel has no mask; causal attention is for short prompts anyway.
            AttentionKernel::PerQuery
        } else if self.flash_wide.is_some()
            && n_queries >= attention_coop::queries(true)
            && self.heads * n_queries.div_ceil(attention_coop::queries(true))
                >= WIDE_FROM_WORKGROUPS
        {
            AttentionKernel::WideTensorCores
        } else if self.flash.is_some() {
            AttentionKernel::TensorCores
        } else {
            AttentionKernel::QueryBlocks
        };
        self.encode_with(rec, n_queries, kernel);
    }

    fn block_queries(&self) -> u32 {
        tiles_for(self.head_dim).0
    }

    /// The kernels this attention can run on its adapter (tests cover each).
    pub fn kernels(&self) -> Vec<AttentionKernel> {
        let mut kernels = vec![AttentionKernel::PerQuery];
        if !self.causal {
            kernels.push(AttentionKernel::QueryBlocks);
        }
        if self.cpu.is_some() {
            kernels.push(AttentionKernel::Cpu);
        }
        if self.flash.is_some() {
            kernels.push(AttentionKernel::TensorCores);
        }
        if self.flash_wide.is_some() {
            kernels.push(AttentionKernel::WideTensorCores);
        }
        kernels
    }

    /// As [`FullAttention::encode`] with the kernel chosen (one of [`FullAttention::kernels`]).
    /// The wide form needs a whole block of queries (its last block overlaps the one before);
    /// with fewer, the per-query kernel runs.
    pub fn encode_with(&self, rec: &mut Recorder<'_>, n_queries: u32, kernel: AttentionKernel) {
        let wide_rows = attention_coop::queries(true);
        if let (AttentionKernel::WideTensorCores, Some((wide, group))) = (kernel, &self.flash_wide)
            && n_queries >= wide_rows
        {
            let blocks = n_queries.div_ceil(wide_rows);
            rec.dispatch_xyz(wide, group, [self.heads, blocks, 1]);
            return;
        }
        match (kernel, &self.cpu, &self.flash) {
            (AttentionKernel::Cpu, Some(cpu), _) => cpu.encode(rec, n_queries),
            (AttentionKernel::TensorCores, _, Some((flash, group))) if !self.causal => {
                let blocks = n_queries.div_ceil(attention_coop::queries(false));
                rec.dispatch_xyz(flash, group, [self.heads, blocks, 1]);
            }
            (AttentionKernel::QueryBlocks | AttentionKernel::Cpu, _, _) if !self.causal => {
                let blocks = n_queries.div_ceil(self.block_queries());
                rec.dispatch_xyz(&self.tiled.0, &self.tiled.1, [self.heads, blocks, 1]);
            }
            _ => rec.dispatch_xyz(&self.kernel, &self.bind_group, [self.heads, n_queries, 1]),
        }
    }
}
