//! Kernels: one Rust owner per WGSL family in `shaders/`. Each op compiles (or fetches from the
//! cache) its specialised pipeline, binds its buffers once, and records dispatches.

mod attention;
mod attention_coop;
mod attention_cpu;
mod conv;
mod coop_tile;
mod delta_chunk;
mod delta_net;
mod denoise;
mod dequant;
mod dit;
mod elementwise;
mod few_rows;
mod few_rows_int8;
mod fill;
mod group_norm;
mod matmul;
mod matvec;
mod matvec_layout;
mod matvec_plan;
mod moe;
mod norm;
mod norm_int8;
mod pass;
mod pixels;
mod quant_source;
mod reduce;
mod rope;
mod sample;
mod speech_logits;

pub use attention::{
    Attention, AttentionKernel, CacheShape, FullAttention, FullLayout, HeadNormGains, KvDType,
    MAX_SPLITS, MIN_SPLIT, RUNS_MOST_ROWS, splits_for,
};
pub use conv::{Conv1dShape, Conv2dShape, Im2Col};
pub(crate) use coop_tile::COOP_MIN_WORKGROUP_BYTES;
pub use coop_tile::CoopTile;
pub use delta_chunk::{DELTA_CHUNK, DeltaScratch};
pub use delta_net::{
    DELTA_CHUNKED_FROM, DeltaNet, DeltaNetIo, DeltaNetShape, DeltaNetState, DeltaNetWeights,
    DeltaRows, MAX_DELTA_HEAD_DIM,
};
pub use denoise::{Denoise, DenoiseBuffers, DenoiseParams, Preview, PreviewSource};
pub use dequant::Dequantize;
pub use dit::{
    PatchShape, RowNorm, RowNormForm, Slice, bn_unpack, fill_rows, fill_tail, gated_add, head_rope,
    join_half_rows, mod_norm, patchify, scaled_add, unpatchify,
};
pub use elementwise::{Embed, Glu, GluKind, OutputGate};
pub use few_rows::{FEW_ROWS, FewRows};
pub use few_rows_int8::{FewRowsInt8, Int8Input, Int8Rows};
pub use fill::{fill_random, fill_value};
pub use group_norm::{GroupNorm, GroupNormShape, NormActivation};
pub use matmul::{LONG_PROMPT_ROWS, MatMul, MatMulOptions, k_slices};
pub use matvec::{
    ExpertSlots, Int8Handoff, MatVec, MatVecOptions, SlotRouting, SplitAttention, TokenRouting,
    int8_rounded_input,
};
pub use matvec_layout::MatVecLayout;
pub use moe::{
    DecodeNorm, ExpertDecode, ExpertWeights, Experts, GateUpRows, MoeBuffers, moe_buffer_bytes,
};
pub use norm::{HeadNorm, Norm, NormForm, NormKind};
pub use norm_int8::NormInt8;
pub use pass::{KernelSpec, Pass};
pub use pixels::{affine, concat, silu, slice_channels, softmax_rows, tanh_clamp, transpose};
pub use reduce::SumReduce;

pub use rope::{RopeKv, RopeTable};
pub use sample::{BatchSample, Sample, SamplerParams};
pub use speech_logits::{SpeechLogits, SpeechRules, SpeechTokenIds};

use bytemuck::{Pod, Zeroable};

use crate::gpu::{Gpu, GpuError, Kernel, StorageBuffer};
use crate::load::GgmlType;
use crate::load::quant::repack_for_gpu;

/// Per-submission position state shared by every kernel of a forward pass: the absolute
/// position of the first token, how many tokens this step processes, and the sequence length
/// after it (where the sampler writes the next token); the sequence's cache slot with where
/// its token history and seen-token set start (see `token_pos` and friends in common.wgsl).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct StepParams {
    pub pos0: u32,
    pub n_tokens: u32,
    pub seq_len: u32,
    /// Row offset into the RoPE table (see [`RopeTable::longrope`]).
    pub rope_row: u32,
    pub slot: u32,
    pub history_base: u32,
    pub seen_base: u32,
    _pad: u32,
}

/// Rows one batched decode step can take (sequences decoding together).
pub const MAX_BATCH_ROWS: u32 = 64;

/// A batched decode step's rows, each a token of its own sequence: its position, cache slot,
/// and where its history and seen-token set start (`batch` in common.wgsl, bound by the
/// kernels built with BATCH).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BatchRows {
    pub rows: [[u32; 4]; MAX_BATCH_ROWS as usize],
}

/// The binding every batched kernel takes [`BatchRows`] at.
pub(crate) const BATCH_ROWS_BINDING: u32 = 20;

impl StepParams {
    pub fn new(pos0: u32, n_tokens: u32) -> Self {
        Self {
            pos0,
            n_tokens,
            seq_len: pos0 + n_tokens,
            ..Zeroable::zeroed()
        }
    }

    /// The same step reading the RoPE table from row `row` on.
    pub fn with_rope_row(self, row: u32) -> Self {
        Self {
            rope_row: row,
            ..self
        }
    }

    /// The same step on the sequence in cache slot `slot`, whose history and seen-token set
    /// start at those words.
    pub fn in_slot(self, slot: u32, history_base: u32, seen_base: u32) -> Self {
        Self {
            slot,
            history_base,
            seen_base,
            ..self
        }
    }
}

/// The GELU forms models use: the tanh approximation (GPT-2's `gelu_new`), the exact erf form
/// (PyTorch's `gelu`) and CLIP's sigmoid approximation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gelu {
    Tanh,
    Erf,
    /// CLIP's `quick_gelu`, x·σ(1.702x) (matrix products only).
    Quick,
}

pub(crate) fn gelu_flags(gelu: Option<Gelu>) -> [(&'static str, String); 3] {
    [
        flag("GELU", gelu == Some(Gelu::Tanh)),
        flag("GELU_ERF", gelu == Some(Gelu::Erf)),
        flag("QUICK_GELU", gelu == Some(Gelu::Quick)),
    ]
}

/// How weights (and the KV cache) are stored on the GPU. Arithmetic is f32 either way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightDType {
    F32,
    F16,
}

impl WeightDType {
    pub fn bytes(self) -> u64 {
        match self {
            Self::F32 => 4,
            Self::F16 => 2,
        }
    }

    /// Elements per 16-byte vec4 word in the kernels.
    pub fn per_vec4(self) -> u32 {
        match self {
            Self::F32 => 4,
            Self::F16 => 8,
        }
    }

    pub(crate) fn defines(self) -> Vec<(&'static str, String)> {
        vec![
            ("F16", u32::from(self == Self::F16).to_string()),
            ("EPV", self.per_vec4().to_string()),
        ]
    }
}

/// Row padding shared by every weight matrix: whole 16-byte words for both dtypes, so kernels
/// read vec4 words with no tail handling in the weights.
pub const ROW_ALIGN: usize = 8;

/// A weight matrix `[rows][cols]` on the GPU: dense rows padded to [`ROW_ALIGN`] elements, or
/// GGML blocks in the layout of shaders/quant.wgsl.
pub struct Matrix {
    pub buffer: StorageBuffer,
    pub rows: u32,
    pub cols: u32,
    pub dtype: WeightDType,
    /// Quantized: the block format and the word offset of the block scales.
    pub quant: Option<(GgmlType, u32)>,
}

impl Matrix {
    pub fn padded_cols(cols: u32) -> u32 {
        cols.div_ceil(ROW_ALIGN as u32) * ROW_ALIGN as u32
    }

    pub fn row_stride(&self) -> u32 {
        Self::padded_cols(self.cols)
    }

    /// Row stride in vec4 words.
    pub fn row_vecs(&self) -> u32 {
        self.row_stride() / self.dtype.per_vec4()
    }

    pub fn byte_size(rows: u32, cols: u32, dtype: WeightDType) -> u64 {
        u64::from(rows) * u64::from(Self::padded_cols(cols)) * dtype.bytes()
    }

    /// Uploads f32 host data `[rows][cols]`, converting and padding rows.
    pub fn from_f32(
        gpu: &Gpu,
        label: &str,
        data: &[f32],
        rows: u32,
        cols: u32,
        dtype: WeightDType,
    ) -> Result<Self, GpuError> {
        let stride = Self::padded_cols(cols) as usize;
        let chunks = data.chunks(cols.max(1) as usize).map(|row| {
            let mut bytes = Vec::with_capacity(stride * dtype.bytes() as usize);
            encode_row(row, stride, dtype, &mut bytes);
            bytes
        });
        let buffer = gpu.storage_from_chunks(label, Self::byte_size(rows, cols, dtype), chunks)?;
        Ok(Self {
            buffer,
            rows,
            cols,
            dtype,
            quant: None,
        })
    }

    /// Uploads GGML blocks of `ty` (`[rows][cols]`, rows in order), repacked for the kernels.
    pub fn from_blocks(
        gpu: &Gpu,
        label: &str,
        ty: GgmlType,
        blocks: &[u8],
        rows: u32,
        cols: u32,
    ) -> Result<Self, GpuError> {
        Self::from_blocks_reordered(gpu, label, ty, blocks, rows, cols, |i| i)
    }

    /// As [`Matrix::from_blocks`], taking row `i` from source row `src_row(i)`.
    pub fn from_blocks_reordered(
        gpu: &Gpu,
        label: &str,
        ty: GgmlType,
        blocks: &[u8],
        rows: u32,
        cols: u32,
        src_row: impl Fn(usize) -> usize,
    ) -> Result<Self, GpuError> {
        let (bytes, scales) = repack_for_gpu(ty, blocks, rows as usize, cols as usize, src_row)
            .ok_or_else(|| {
                GpuError::Device(format!("{label}: {} is not a block format", ty.name()))
            })?;
        let buffer = gpu.storage_from(label, &bytes)?;
        Ok(Self {
            buffer,
            rows,
            cols,
            dtype: WeightDType::F32,
            quant: Some((ty, scales)),
        })
    }

    /// Defines of the kernels reading this matrix.
    pub(crate) fn defines(&self) -> Vec<(&'static str, String)> {
        match self.quant {
            None => self.dtype.defines(),
            Some((ty, _)) => quant_defines(ty, self.cols),
        }
    }

    /// Word offset of the block scales (quantized matrices; 0 otherwise).
    pub fn q_scales(&self) -> u32 {
        self.quant.map_or(0, |q| q.1)
    }
}

/// What quant.wgsl needs to know of blocks in format `ty` with rows of `cols` values.
pub(crate) fn quant_defines(ty: GgmlType, cols: u32) -> Vec<(&'static str, String)> {
    vec![
        ("QUANT", "1".into()),
        (ty.name(), "1".into()),
        // Families that share one decoding template in quant.wgsl.
        (
            "Q5",
            u32::from(matches!(ty, GgmlType::Q5_0 | GgmlType::Q5_1)).to_string(),
        ),
        (
            "KQ",
            u32::from(matches!(ty, GgmlType::Q4K | GgmlType::Q5K)).to_string(),
        ),
        ("SUBS", (cols / 32).to_string()),
        ("F16", "0".into()),
        ("EPV", "4".into()),
    ]
}

/// Appends one row in `dtype`, zero-padded to `stride` elements.
pub fn encode_row(row: &[f32], stride: usize, dtype: WeightDType, out: &mut Vec<u8>) {
    match dtype {
        WeightDType::F32 => {
            for &v in row {
                out.extend_from_slice(&v.to_le_bytes());
            }
            out.resize(out.len() + (stride - row.len()) * 4, 0);
        }
        WeightDType::F16 => {
            // Saturate rather than turn the rare weight beyond f16's range into infinity.
            for &v in row {
                let v = v.clamp(-65504.0, 65504.0);
                out.extend_from_slice(&half::f16::from_f32(v).to_le_bytes());
            }
            out.resize(out.len() + (stride - row.len()) * 2, 0);
        }
    }
}

/// Creates a bind group for `kernel` from (binding, buffer) pairs.
pub(crate) fn bind(
    gpu: &Gpu,
    kernel: &Kernel,
    entries: &[(u32, &wgpu::Buffer)],
) -> wgpu::BindGroup {
    let entries: Vec<wgpu::BindGroupEntry<'_>> = entries
        .iter()
        .map(|(binding, buffer)| wgpu::BindGroupEntry {
            binding: *binding,
            resource: buffer.as_entire_binding(),
        })
        .collect();
    gpu.device().create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some(&kernel.label),
        layout: &kernel.layout,
        entries: &entries,
    })
}

/// Whether the adapter runs the CPU kernels (matmul_cpu.wgsl, attention_cpu.wgsl): a CPU
/// adapter whose subgroups are the 8 lanes they are written for (llvmpipe on AVX2 machines).
pub(crate) fn cpu_tiles(gpu: &Gpu) -> bool {
    let caps = gpu.caps();
    gpu.is_software()
        && caps.subgroups
        && caps.subgroup_min_size == 8
        && caps.subgroup_max_size == 8
}

pub(crate) fn flag(name: &'static str, on: bool) -> (&'static str, String) {
    (name, u32::from(on).to_string())
}

/// Workgroups for `n` invocations of a 64-wide 1-D kernel.
pub(crate) fn groups_of_64(n: u32) -> u32 {
    n.div_ceil(64)
}
