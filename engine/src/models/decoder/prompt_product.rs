//! A prompt chunk's matrix products: tiles over the whole chunk, or, for a handful of tokens,
//! products that stream the weights once in their own format.

use super::build;
use crate::Error;
use crate::gpu::{Gpu, Recorder, StorageBuffer, UniformBuffer};
use crate::ops::{Dequantize, FEW_ROWS, FewRows, MatMul, MatMulOptions, Matrix};

/// Where a prompt product finds block-quantized weights in f16, if not in their blocks.
#[derive(Clone, Copy)]
pub(super) enum PromptWeights<'a> {
    /// Expanded into this shared scratch before each product.
    Scratch(&'a StorageBuffer),
    /// Expanded once, at load, into a copy of their own.
    Copies,
    /// Multiplied in their blocks.
    Blocks,
}

/// A prompt product; block-quantized weights are first expanded into the shared f16 scratch,
/// or read from their f16 copy. A prompt of a few tokens (a speculative verification, a
/// prompt rejoining the cache) streams the weights in their own format instead.
pub(super) struct PromptProduct {
    expand: Option<Dequantize>,
    product: MatMul,
    few: Option<FewRows>,
}

impl PromptProduct {
    pub(super) fn new(
        gpu: &Gpu,
        weights: PromptWeights<'_>,
        w: &Matrix,
        x: &StorageBuffer,
        y: &StorageBuffer,
        step: &UniformBuffer,
        opts: MatMulOptions<'_>,
    ) -> Result<Self, Error> {
        let few = FewRows::new(gpu, w, x, y, step, &opts)?;
        if let (PromptWeights::Copies, Some(_)) = (weights, w.quant) {
            let copy = gpu.storage("prompt weights (f16 copy)", Dequantize::scratch_bytes(w))?;
            let (expand, dense) = Dequantize::new(gpu, w, &copy)?;
            // Submitted now; loading ends by waiting for the GPU (`finish_uploads`).
            let mut rec = Recorder::new(gpu);
            expand.encode(&mut rec);
            rec.submit();
            return Ok(Self {
                expand: None,
                product: MatMul::new(gpu, &dense, x, y, step, opts)?,
                few,
            });
        }
        if let PromptWeights::Scratch(scratch) = weights
            && build::expands_for_prompts(gpu, w)
        {
            let (expand, dense) = Dequantize::new(gpu, w, scratch)?;
            return Ok(Self {
                expand: Some(expand),
                product: MatMul::new(gpu, &dense, x, y, step, opts)?,
                few,
            });
        }
        Ok(Self {
            expand: None,
            product: MatMul::new(gpu, w, x, y, step, opts)?,
            few,
        })
    }

    pub(super) fn encode(&self, rec: &mut Recorder<'_>, n_tokens: u32) {
        if let (Some(few), true) = (&self.few, n_tokens <= FEW_ROWS) {
            few.encode(rec);
            return;
        }
        if let Some(expand) = &self.expand {
            expand.encode(rec);
        }
        self.product.encode(rec, n_tokens);
    }
}
