//! The product of a few rows of x, streaming W once in its own format (see few_rows.wgsl).

use std::sync::LazyLock;

use super::matmul::{Params, product_source};
use super::{MatMulOptions, Matrix, bind, flag, gelu_flags};
use crate::gpu::{Gpu, GpuError, Kernel, Recorder, StorageBuffer, UniformBuffer};

/// The most rows the few-row product takes (a speculative verification of up to seven drafts).
pub const FEW_ROWS: u32 = 8;

/// Weight rows one workgroup streams (few_rows.wgsl's four).
const WEIGHT_ROWS: u32 = 4;

/// Lanes of a workgroup: they split k. (256 with subgroups was slower on an H200: batched
/// decode steps of SmolLM2-1.7B in Q4_K took 4.72 against 4.16 ms at one row, 6.01 against
/// 5.51 ms at eight; Llama-3.1-8B 12.60 against 10.28 ms and 17.05 against 15.80 ms.)
const LANES: u32 = 64;

/// What the float and int8 few-row products share around their loops over k.
pub(super) const SUMS: &str = include_str!("../../../shaders/few_rows_sums.wgsl");

pub(super) static SOURCE: LazyLock<String> = LazyLock::new(|| {
    product_source(&format!(
        "{SUMS}\n{}",
        include_str!("../../../shaders/few_rows.wgsl")
    ))
});

/// `Y = epilogue(X·Wᵀ)` for rows of X, [`FEW_ROWS`] at a time, reading W once in its own format
/// (dense or block-quantized, never expanded first): the prompt path's product when a prompt
/// is a handful of tokens. Takes matmul_io.wgsl's epilogues: bias, GELU forms, residual, ReLU
/// and a fused gate/up product's gating.
pub struct FewRows {
    kernel: Kernel,
    bind_group: wgpu::BindGroup,
    groups: u32,
    _params: UniformBuffer,
}

impl FewRows {
    /// The few-row form of the product `opts` describe, or None where the kernel does not
    /// take its shape (k not a multiple of 8, a convolution, f16 inputs or outputs).
    pub fn new(
        gpu: &Gpu,
        w: &Matrix,
        x: &StorageBuffer,
        y: &StorageBuffer,
        step: &UniformBuffer,
        opts: &MatMulOptions<'_>,
    ) -> Result<Option<Self>, GpuError> {
        if !w.cols.is_multiple_of(8) || opts.conv.is_some() || opts.half_in || opts.half_out {
            return Ok(None);
        }
        if opts.glu.is_some() && !w.rows.is_multiple_of(2) {
            return Err(GpuError::Device(format!(
                "a gated product needs gate and up halves: {} rows",
                w.rows
            )));
        }
        let mut defines = w.defines();
        defines.extend(gelu_flags(opts.gelu));
        defines.extend([
            flag("BIAS", opts.bias.is_some()),
            flag("RESIDUAL", opts.residual),
            flag("RELU", opts.relu),
            flag("GLU", opts.glu.is_some()),
            flag("XV", true),
            ("WG", LANES.to_string()),
            ("XROWS", FEW_ROWS.to_string()),
            ("WGROUPS", "1".into()),
            flag("SUBGROUP", gpu.caps().subgroups),
        ]);
        if let Some(kind) = opts.glu {
            defines.extend(kind.defines());
        }
        let (family, source) = match w.quant {
            Some(_) => ("few_rows_q", super::quant_source::QUANT_FEW_ROWS.as_str()),
            None => ("few_rows", SOURCE.as_str()),
        };
        let kernel = gpu.kernel(family, source, "main", &defines)?;
        let params = params(gpu, w, "few-row product params");
        let mut entries = vec![
            (0, &params.buffer),
            (1, &step.buffer),
            (2, &x.buffer),
            (3, &w.buffer.buffer),
            (4, &y.buffer),
        ];
        if let Some(b) = opts.bias {
            entries.push((5, &b.buffer));
        }
        let bind_group = bind(gpu, &kernel, &entries);
        Ok(Some(Self {
            kernel,
            bind_group,
            groups: weight_groups(w, opts),
            _params: params,
        }))
    }

    /// Records the product over the step's rows (at most [`FEW_ROWS`]).
    pub fn encode(&self, rec: &mut Recorder<'_>) {
        self.encode_rows(rec, 1);
    }

    /// Records the product over a step of `rows` rows (as many as the step uniform says), in
    /// chunks of [`FEW_ROWS`]: every output is summed alike whatever the number of rows.
    pub fn encode_rows(&self, rec: &mut Recorder<'_>, rows: u32) {
        let chunks = rows.div_ceil(FEW_ROWS).max(1);
        rec.dispatch(&self.kernel, &self.bind_group, self.groups * chunks);
    }
}

/// The parameters both few-row products bind (few_rows_sums.wgsl reads n, k and the scales).
pub(super) fn params(gpu: &Gpu, w: &Matrix, label: &str) -> UniformBuffer {
    gpu.uniform(
        label,
        &Params {
            n: w.rows,
            k: w.cols,
            row_vecs: w.row_vecs(),
            slices: 1,
            q_scales: w.q_scales(),
            col_tiles: 0,
            tile_rows: 0,
            target_workgroups: 0,
        },
    )
}

/// Workgroups over W's rows, four weight rows each: a gated one takes two outputs (their gate
/// and up rows).
pub(super) fn weight_groups(w: &Matrix, opts: &MatMulOptions<'_>) -> u32 {
    match opts.glu {
        Some(_) => (w.rows / 2).div_ceil(WEIGHT_ROWS / 2),
        None => w.rows.div_ceil(WEIGHT_ROWS),
    }
}
