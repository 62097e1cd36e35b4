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
    /// For batched decode steps, where `product` reads expanded or copied weights: the
    /// tiles over the blocks as stored, which a step of a few dozen rows cannot repay the
    /// expansion for.
    direct: Option<MatMul>,
}

/// Which product a batched decode step of block-quantized weights takes: the few-row kernel
/// up to [`FEW_ROWS`] rows (`BACKPACK_BATCH_PRODUCTS=tiles` sends every step to the tiles).
fn batch_takes_few_rows(n_tokens: u32) -> bool {
    n_tokens <= FEW_ROWS
        && !matches!(
            std::env::var("BACKPACK_BATCH_PRODUCTS").as_deref(),
            Ok("tiles")
        )
}

impl PromptProduct {
    /// `batches`: the model runs batched decode steps, which get the tiles over `w`'s blocks
    /// where prompts expand them.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        gpu: &Gpu,
        weights: PromptWeights<'_>,
        w: &Matrix,
        x: &StorageBuffer,
        y: &StorageBuffer,
        step: &UniformBuffer,
        opts: MatMulOptions<'_>,
        batches: bool,
    ) -> Result<Self, Error> {
        let few = FewRows::new(gpu, w, x, y, step, &opts)?;
        let direct = if batches && w.quant.is_some() {
            Some(MatMul::new(gpu, w, x, y, step, opts)?)
        } else {
            None
        };
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
                direct,
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
                direct,
            });
        }
        Ok(Self {
            expand: None,
            product: MatMul::new(gpu, w, x, y, step, opts)?,
            few,
            // `product` already reads the blocks.
            direct: None,
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

    /// Records the product for a batched decode step of `n_tokens` rows.
    pub(super) fn encode_batch(&self, rec: &mut Recorder<'_>, n_tokens: u32) {
        if let (Some(few), true) = (&self.few, batch_takes_few_rows(n_tokens)) {
            few.encode(rec);
            return;
        }
        if let Some(direct) = &self.direct {
            direct.encode(rec, n_tokens);
            return;
        }
        if let Some(expand) = &self.expand {
            expand.encode(rec);
        }
        self.product.encode(rec, n_tokens);
    }
}
