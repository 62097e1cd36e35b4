//! A prompt chunk's matrix products: tiles over the whole chunk, or, for a handful of tokens,
//! products that stream the weights once in their own format.

use super::build;
use crate::Error;
use crate::gpu::{Gpu, Recorder, StorageBuffer, UniformBuffer};
use crate::ops::{
    Dequantize, FEW_ROWS, FewRows, FewRowsInt8, Int8Rows, MatMul, MatMulOptions, Matrix,
};

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
    /// For batched decode steps, and prompts of up to [`FEW_ROWS`] rows, over a format with
    /// int8 products: those products.
    int8: Option<FewRowsInt8>,
    /// For batched decode steps, where `product` reads expanded or copied weights: the
    /// tiles over the blocks as stored, which a step of a few dozen rows cannot repay the
    /// expansion for.
    direct: Option<MatMul>,
    /// Batched steps never change kernels with their number of rows.
    invariant: bool,
}

/// What a model that runs batched decode steps gives its prompt products for those steps.
#[derive(Clone, Copy)]
pub(super) struct BatchSetup<'a> {
    /// Where a step's rows go quantized to int8.
    pub(super) rows: &'a Int8Rows,
    /// The rows' rounding remainders in a second level (LM heads).
    pub(super) fine: bool,
    /// The model runs batched decode steps (it has several slots).
    pub(super) steps: bool,
    /// Never change kernels with the number of rows (`ModelOptions::batch_invariant`).
    pub(super) invariant: bool,
}

/// Which products batched decode steps (and prompts of a few rows) take where they have a
/// choice. By default the int8 few-row products up to [`INT8_ROWS`] rows for formats with them,
/// else the float few-row products up to [`FEW_ROWS`] rows, else the tiles; a batch-invariant
/// model keeps the int8 products, or else the float ones in chunks, at any number of rows.
/// `BACKPACK_BATCH_PRODUCTS` (`int8`: the int8 products at any number of rows, `float`: none,
/// `tiles`: the tiles wherever the model is not batch-invariant) is for measuring.
#[derive(Clone, Copy, PartialEq)]
enum BatchKernels {
    Auto,
    Int8,
    Float,
    Tiles,
}

/// Read once: every product of every step asks.
fn batch_kernels() -> BatchKernels {
    static CHOICE: std::sync::LazyLock<BatchKernels> =
        std::sync::LazyLock::new(
            || match std::env::var("BACKPACK_BATCH_PRODUCTS").as_deref() {
                Ok("int8") => BatchKernels::Int8,
                Ok("tiles") => BatchKernels::Tiles,
                Ok("float") => BatchKernels::Float,
                _ => BatchKernels::Auto,
            },
        );
    *CHOICE
}

/// The most rows the int8 few-row products take by default. Batched decode steps on an H200
/// (`tests/reference/bench_batch_products.sh`, Q4_K, with each weight unit decoded once for
/// all rows of x), int8 against the default before (float few-row products past four rows,
/// tiles past eight): Llama-3.1-8B's shape 10.78 against 17.72 ms at eight rows, 15.57
/// against 24.90 at sixteen, 25.59 against 25.81 at thirty-two; SmolLM2-1.7B's 5.69 against
/// 5.94, 7.82 against 8.28, and 11.76 against 8.81 at thirty-two, where the tiles take over.
const INT8_ROWS: u32 = 16;

/// Whether a prompt (or verification) of `rows` rows takes the int8 few-row products where
/// they exist.
pub(super) fn prompt_takes_int8(rows: u32) -> bool {
    rows <= FEW_ROWS
        && match batch_kernels() {
            BatchKernels::Int8 => true,
            BatchKernels::Auto => rows <= INT8_ROWS,
            BatchKernels::Float | BatchKernels::Tiles => false,
        }
}

impl PromptProduct {
    /// `batch`: the model runs batched decode steps or speculates, and its steps and prompts
    /// of a few rows get the int8 products where `w`'s format has them; batched steps of more
    /// rows get the tiles over `w`'s blocks where prompts expand them.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        gpu: &Gpu,
        weights: PromptWeights<'_>,
        w: &Matrix,
        x: &StorageBuffer,
        y: &StorageBuffer,
        step: &UniformBuffer,
        opts: MatMulOptions<'_>,
        batch: Option<BatchSetup<'_>>,
    ) -> Result<Self, Error> {
        let few = FewRows::new(gpu, w, x, y, step, &opts)?;
        let batches = batch.is_some_and(|b| b.steps);
        let invariant = batch.is_some_and(|b| b.steps && b.invariant);
        let int8 = match batch {
            Some(b) => FewRowsInt8::new(gpu, w, x, y, step, &opts, b.rows, b.fine)?
                .map(|p| if invariant { p.invariant() } else { p }),
            None => None,
        };
        let direct = if batches && w.quant.is_some() && !matches!(weights, PromptWeights::Blocks) {
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
                int8,
                direct,
                invariant,
            });
        }
        if let PromptWeights::Scratch(scratch) = weights
            && build::expands_for_prompts(w)
        {
            let (expand, dense) = Dequantize::new(gpu, w, scratch)?;
            return Ok(Self {
                expand: Some(expand),
                product: MatMul::new(gpu, &dense, x, y, step, opts)?,
                few,
                int8,
                direct,
                invariant,
            });
        }
        Ok(Self {
            expand: None,
            product: MatMul::new(gpu, w, x, y, step, opts)?,
            few,
            int8,
            // `product` already reads the blocks.
            direct: None,
            invariant,
        })
    }

    pub(super) fn encode(&self, rec: &mut Recorder<'_>, n_tokens: u32) {
        if let Some(int8) = self.int8_taken(n_tokens, false) {
            int8.encode(rec, n_tokens);
            return;
        }
        if let (Some(few), true) = (&self.few, n_tokens <= FEW_ROWS) {
            few.encode(rec);
            return;
        }
        if let Some(expand) = &self.expand {
            expand.encode(rec);
        }
        self.product.encode(rec, n_tokens);
    }

    /// The int8 few-row products, where the weights' format has them and the model runs
    /// batched steps or verifications.
    pub(super) fn int8(&self) -> Option<&FewRowsInt8> {
        self.int8.as_ref()
    }

    /// The int8 products, where they take `n_tokens` rows: of a prompt, or of a batched decode
    /// step (`batched`).
    pub(super) fn int8_taken(&self, n_tokens: u32, batched: bool) -> Option<&FewRowsInt8> {
        if batched {
            self.int8_for(n_tokens, batch_kernels())
        } else {
            self.int8
                .as_ref()
                .filter(|p| prompt_takes_int8(n_tokens) && p.takes(n_tokens))
        }
    }

    /// The int8 products, where they take a batched step of `n_tokens` rows under `choice`.
    fn int8_for(&self, n_tokens: u32, choice: BatchKernels) -> Option<&FewRowsInt8> {
        let wanted = match choice {
            BatchKernels::Int8 => true,
            BatchKernels::Auto => self.invariant || n_tokens <= INT8_ROWS,
            BatchKernels::Float | BatchKernels::Tiles => false,
        };
        self.int8.as_ref().filter(|p| wanted && p.takes(n_tokens))
    }

    /// Records the product for a batched decode step of `n_tokens` rows.
    pub(super) fn encode_batch(&self, rec: &mut Recorder<'_>, n_tokens: u32) {
        let choice = batch_kernels();
        if let Some(int8) = self.int8_for(n_tokens, choice) {
            int8.encode(rec, n_tokens);
            return;
        }
        if let Some(few) = &self.few
            && (self.invariant || (n_tokens <= FEW_ROWS && choice != BatchKernels::Tiles))
        {
            few.encode_rows(rec, n_tokens);
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
