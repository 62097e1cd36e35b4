//! The decoder-only transformer on the GPU, shared by every supported family: a family is a
//! description of its weight names (`family.rs`, one file each), the rest (norms, positions,
//! biases, MLP, RoPE) comes from the config. `build/` makes the kernels. Weights are uploaded once;
//! activations, the KV cache and the token history live in buffers made at load time, so a
//! decoded token allocates nothing and reads back only its id.
//!
//! Decode, per layer (5 dispatches): norm+QKV product; attention (RoPE, cache store and the
//! keys split over workgroups); output product merging the attention runs + residual;
//! norm+gate/up product+SwiGLU (or +GELU); down product+residual. Then norm+LM head and the
//! sampler: 5·layers + 3 dispatches and one submit per token. (Where the output product
//! cannot stage its input, attention runs whole after a separate RoPE pass: 6 per layer;
//! Qwen3's query/key head norms add one per layer.) A sparse layer's MLP is a norm, the
//! router's product and the four expert kernels of `ops::Experts` (routing and grouping,
//! gate/up, down, weighted sum): the chosen experts' ids never leave the GPU. A Gated DeltaNet
//! layer (Qwen3.5) replaces attention by `ops::DeltaNet` (convolution, recurrence and gated
//! norm) between the same input and output products. `layer.rs` holds a layer's kernels and
//! their order; `inspect.rs` what tests and tools read besides tokens (logits at every
//! position, hidden states, profiles).

use crate::Error;
use crate::gpu::{Gpu, Recorder, StorageBuffer, UniformBuffer};
use crate::load::DecoderSpec;
use crate::ops::{
    DeltaScratch, Embed, Int8Handoff, Int8Rows, KvDType, LONG_PROMPT_ROWS, MatVec, Matrix,
    MoeBuffers, Norm, NormKind, Sample, SamplerParams, StepParams, WeightDType,
};

mod batch;
mod build;
mod experts;
mod family;
mod gemma3;
mod gpt2;
mod gpt_oss;
mod inspect;
mod layer;
mod llama;
mod phi3;
mod prompt_product;
mod qwen3;
mod qwen35;
mod shared_prefix;
mod verify;

use batch::{BatchKernels, SlotState};
pub use batch::{BatchRow, UNREPORTED_MEMORY_SLOTS};
use layer::{Layer, LayerMlp, Mixer, SharedExpert};
use prompt_product::{BatchSetup, PromptProduct, PromptWeights};
pub use shared_prefix::MIN_SHARED_TOKENS;
pub use verify::MAX_VERIFY_ROWS;

#[derive(Clone, Debug)]
pub struct ModelOptions {
    pub dtype: WeightDType,
    /// How the KV cache stores keys and values (None: as `dtype`).
    pub kv_cache: Option<KvDType>,
    /// Context length to allocate the KV cache for (capped by the model's own limit).
    pub context: Option<u32>,
    /// Prompt tokens one forward pass takes (at most the context). None chooses:
    /// [`DEFAULT_PREFILL_CHUNK`], halved down to [`SMALL_PREFILL_CHUNK`] while a chunk would not
    /// fit the GPU's free memory beside the weights, and the small chunk where the GPU reports
    /// no free memory.
    pub prefill_chunk: Option<u32>,
    /// Quantize matrices to this block format while loading (Q8_0, Q4_0 or Q4_K); None keeps
    /// `dtype`.
    pub quantize: Option<crate::load::GgmlType>,
    /// Keep GGUF block-quantized weights in their format (fused dequantizing kernels) rather
    /// than expanding them to `dtype`.
    pub quantized: bool,
    /// Submit the next decode step before reading the current one (faster). Off makes every
    /// step finish before `decode` returns, so per-step state such as logits can be read.
    pub lookahead: bool,
    /// Keep an f16 copy of every block-quantized matrix for prompt products instead of
    /// expanding each into a shared scratch before its product: prompts run about 10 %
    /// faster on tensor cores, for 2 bytes per weight more GPU memory.
    pub f16_prompt_weights: bool,
    /// A prompt that starts with the tokens the cache holds from the last one (and its answer)
    /// runs only the rest. Models whose recurrent state cannot rewind (Gated DeltaNet) and
    /// longrope models run every prompt whole.
    pub prefix_cache: bool,
    /// Speculative decoding for text models (see [`crate::models::speculate`]); None decodes
    /// a token per step.
    pub speculate: Option<crate::models::speculate::Speculation>,
    /// Sequences kept at once, each with a KV cache of `context` positions, that a batched
    /// decode step advances together (a server's parallel slots). Models whose state cannot
    /// be indexed by slot (Gated DeltaNet, longrope) keep one.
    pub slots: u32,
    /// `slots` is the most to keep: fewer where the GPU's free memory, once the weights are
    /// uploaded, would not hold their caches (drivers that report it: Vulkan's memory
    /// budget), or one buffer binding would not hold a layer's; at most
    /// [`UNREPORTED_MEMORY_SLOTS`] where the driver reports nothing.
    pub fit_slots: bool,
    /// Batched decode steps give every answer the tokens it gets alone, whatever else shares
    /// its steps: a lone answer takes the batched step too (not the faster single-sequence
    /// path), the batched products never change kernels with the number of rows (int8
    /// few-row products for formats with them, else float few-row products in chunks of
    /// eight, never tiles), and every prompt runs whole (no cached prefix, after which the
    /// rest of a prompt would be a product of other shape). Slower at one answer, at many
    /// for formats without int8 products, and for prompts that share a prefix.
    pub batch_invariant: bool,
}

impl Default for ModelOptions {
    fn default() -> Self {
        Self {
            dtype: WeightDType::F16,
            kv_cache: None,
            context: None,
            prefill_chunk: None,
            quantize: None,
            quantized: true,
            lookahead: true,
            f16_prompt_weights: false,
            prefix_cache: true,
            speculate: None,
            slots: 1,
            fit_slots: false,
            batch_invariant: false,
        }
    }
}

const DEFAULT_CONTEXT: u32 = 4096;

/// The prompt chunk asked for by default. Longer chunks fill the GPU with fewer, larger
/// products and split fewer of them along k: on an H200, 4,000-token prompts at 2,048 a chunk
/// against 512 prefilled Llama-3.1-8B's shape 9,074 against 7,224 tok/s, Qwen3-1.7B's 32,254
/// against 26,423, Qwen3.5-9B's 6,956 against 6,234 (`backpack bench --prompt-chunk`).
pub const DEFAULT_PREFILL_CHUNK: u32 = 2048;

/// The prompt chunk kept where the GPU's free memory is short or unknown.
pub const SMALL_PREFILL_CHUNK: u32 = 512;

/// Decode steps kept submitted ahead of the one being read: the GPU starts the next token
/// while the host reads the last and records the one after, hiding submit and readback
/// latency. The step after the last wanted token is computed and discarded.
const PIPELINE_DEPTH: usize = 2;

struct InFlight {
    slot: usize,
    submission: wgpu::SubmissionIndex,
}

/// Buffers shared by all layers, sized for one prompt chunk.
struct Activations {
    x: StorageBuffer,
    xn: StorageBuffer,
    qkv: StorageBuffer,
    q: StorageBuffer,
    attn: StorageBuffer,
    gate_up: Option<StorageBuffer>,
    /// The attention or MLP output before its post-norm (families with post-norms).
    branch: Option<StorageBuffer>,
    h: StorageBuffer,
    /// Routing state of sparse layers (models with experts).
    moe: Option<MoeBuffers>,
    /// The shared expert's gate logit per token (models with one).
    shared_gate: Option<StorageBuffer>,
    /// The chunked prompt products of Gated DeltaNet layers (models with them).
    delta: Option<DeltaScratch>,
    /// Rows of Gated DeltaNet layers' input products after the first, where a file stores the
    /// projections in formats that do not stack (empty without such layers).
    delta_in: Vec<StorageBuffer>,
    logits: StorageBuffer,
    history: StorageBuffer,
    seen: StorageBuffer,
    split_partials: StorageBuffer,
    split_stats: StorageBuffer,
    /// Rows the decode products hand each other as int8 blocks (see `Handoffs`).
    handoffs: Option<Handoffs>,
    /// The rows of a batched decode step (models with several cache slots).
    batch_rows: Option<UniformBuffer>,
    /// The rows of a batched step, or of a prompt of a few rows, as the int8 products take
    /// them (models with several slots, or that speculate).
    batch_int8: Option<Int8Rows>,
}

/// The rows decode products hand off as int8 blocks (see [`crate::ops::Int8Handoff`] and
/// `LayerContext::decode_products`): the residual stream, from the output and down products to
/// the normed products after them, and the MLP's hidden row, from the up product to the down
/// product.
struct Handoffs {
    residual: Int8Handoff,
    hidden: Int8Handoff,
}

/// A model resident on the GPU with its KV cache and sampling state.
pub struct DecoderModel {
    gpu: Gpu,
    spec: DecoderSpec,
    dtype: WeightDType,
    capacity: u32,
    chunk: u32,
    step: UniformBuffer,
    embed: Embed,
    layers: Vec<Layer>,
    lm_head_mv: MatVec,
    lm_head: Matrix,
    final_norm: (StorageBuffer, Option<StorageBuffer>),
    sample: Sample,
    acts: Activations,
    /// One readback slot per step that can be in flight.
    staging: [wgpu::Buffer; PIPELINE_DEPTH],
    /// Submitted steps whose token has not been read yet, oldest first.
    in_flight: std::collections::VecDeque<InFlight>,
    /// Tokens in the cache whose output has been returned.
    seq_len: u32,
    /// Tokens in the cache once every submitted step has run.
    submitted_len: u32,
    depth: usize,
    weight_bytes: u64,
    /// The KV cache and the recurrent states.
    cache_bytes: u64,
    /// The part of `cache_bytes` that Gated DeltaNet layers keep whatever the context.
    state_bytes: u64,
    decode_dispatches: u32,
    /// Decoding uses split attention (merged by the output product).
    split_attention: bool,
    /// Host time spent recording the last decode step's commands.
    last_encode: std::time::Duration,
    /// Host time spent recording and submitting the last prompt's forward pass.
    last_prompt_encode: std::time::Duration,
    /// Longrope: forward passes reaching past this many positions read the long half of the
    /// RoPE table.
    long_rope_after: Option<u32>,
    /// Tokens of the current sequence's prompt.
    prompt_len: u32,
    /// A grammar's mask is set: each step waits for the mask its token needs, so none is
    /// submitted ahead.
    masked: bool,
    /// The prompt cache: tokens whose keys and values sit in the cache at their positions (the
    /// last prompt and the answer tokens fed after it). A prompt that starts with them runs
    /// only the rest (an agent's conversation, a shared system prompt or tool list).
    reusable: Vec<u32>,
    /// The last token returned, not known to have been fed yet.
    pending: Option<u32>,
    /// One past the highest position written since the last prompt from position 0 (a
    /// sliding-window layer's rolling cache may have lost older positions to it).
    written_end: u32,
    /// Prompts may reuse the cached prefix (off for models whose state cannot rewind).
    prefix_reuse: bool,
    /// Prompt tokens the last prefill took from the cache.
    last_prompt_reused: u32,
    /// Decode steps wait for the one before (a speculating caller verifies in between).
    lookahead_paused: bool,
    /// The final norm and LM head over a verification's rows (built at the first).
    verify_head: Option<verify::VerifyHead>,
    /// The pending token and drafts of the last verification, until committed.
    verifying: Vec<u32>,
    /// The sampler applies a repetition penalty (which reads the seen-token set).
    penalized: bool,
    /// The current sequence's sampling settings.
    sampler: SamplerParams,
    /// The cache slot the single-sequence calls (prefill, decode, verify) work on.
    slot: u32,
    /// Every slot's sequence; the current one's entry is stale while it is current (its
    /// state lives in the fields above).
    slot_states: Vec<SlotState>,
    /// The batched decode step's own kernels (models with several slots).
    batch: Option<BatchKernels>,
    /// Each attention layer's KV cache, for prefixes shared between slots (models with
    /// several slots).
    kv_caches: Vec<shared_prefix::SlotCaches>,
    /// See [`ModelOptions::batch_invariant`].
    batch_invariant: bool,
}

impl DecoderModel {
    pub fn spec(&self) -> &DecoderSpec {
        &self.spec
    }

    pub fn dtype(&self) -> WeightDType {
        self.dtype
    }

    /// Context length the KV cache holds.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Tokens currently in the KV cache.
    pub fn seq_len(&self) -> u32 {
        self.seq_len
    }

    pub fn weight_bytes(&self) -> u64 {
        self.weight_bytes
    }

    /// What the sequence's cache occupies: KV cache and recurrent states.
    pub fn cache_bytes(&self) -> u64 {
        self.cache_bytes
    }

    /// The recurrent states of Gated DeltaNet layers (part of [`Self::cache_bytes`]): the same
    /// at any context length.
    pub fn state_bytes(&self) -> u64 {
        self.state_bytes
    }

    /// Weight bytes a decoded token reads: all of them, less the experts it does not pick
    /// (mixture-of-experts layers).
    pub fn decode_read_bytes(&self) -> u64 {
        let unread: u64 = self.layers.iter().map(|l| l.unread_expert_bytes()).sum();
        self.weight_bytes.saturating_sub(unread)
    }

    /// Kernel dispatches recorded for one decoded token.
    pub fn dispatches_per_token(&self) -> u32 {
        self.decode_dispatches
    }

    /// Host time spent recording the last decoded token's commands.
    pub fn last_encode_time(&self) -> std::time::Duration {
        self.last_encode
    }

    /// Host time spent recording and submitting the last prompt's forward pass (submitted in
    /// parts: the GPU runs its first layers meanwhile).
    pub fn last_prompt_encode_time(&self) -> std::time::Duration {
        self.last_prompt_encode
    }

    pub fn set_sampler(&mut self, params: &SamplerParams) {
        self.sample.set(&self.gpu, params);
        self.masked = false;
        self.penalized = params.repeat_penalty != 1.0;
        self.sampler = *params;
    }

    /// Restricts the next sampled token to those `mask` allows (one bit per token), or lifts
    /// the restriction. While a mask is set, decoding runs one step at a time: call this before
    /// each [`DecoderModel::decode`] (and before [`DecoderModel::prefill`] for the first token).
    pub fn set_mask(&mut self, mask: Option<&[u32]>) -> Result<(), Error> {
        // Steps already submitted were sampled without this mask: a masked answer never has
        // any (each step is read before the next mask), so only a previous answer's are
        // forgotten here.
        self.drain()?;
        self.sample.set_mask(&self.gpu, mask);
        self.masked = mask.is_some();
        Ok(())
    }

    /// The step uniform for `n` tokens from `pos0` in a forward pass over `forward_len`
    /// positions (the whole prompt, or the sequence so far when decoding): longrope switches
    /// tables by that length, as transformers does per forward.
    fn step_params(&self, pos0: u32, n: u32, forward_len: u32) -> StepParams {
        let step = StepParams::new(pos0, n).in_slot(
            self.slot,
            self.history_base(self.slot),
            self.seen_base(self.slot),
        );
        match self.long_rope_after {
            Some(original) if forward_len > original => step.with_rope_row(self.capacity),
            _ => step,
        }
    }

    fn count_decode_dispatches(&self) -> u32 {
        let mut rec = Recorder::new(&self.gpu);
        self.encode_decode(&mut rec, 0);
        // Encoded but never submitted: only the count is wanted.
        rec.dispatches()
    }

    /// Records the decode step that feeds the token at `pos`.
    fn encode_decode(&self, rec: &mut Recorder<'_>, pos: u32) {
        self.encode_decode_logits(rec, pos);
        self.sample.encode(rec);
    }

    /// The decode step up to its logits.
    fn encode_decode_logits(&self, rec: &mut Recorder<'_>, pos: u32) {
        self.embed.encode(rec, 1);
        for l in &self.layers {
            l.encode_decode(rec, pos, self.split_attention);
        }
        self.lm_head_mv.encode(rec);
    }

    /// Records the layers for the `n` prompt tokens starting at `pos0`.
    fn encode_prefill_layers(&self, rec: &mut Recorder<'_>, pos0: u32, n: u32) {
        self.encode_prefill_depth(rec, pos0, n, self.layers.len());
    }

    /// The embedding and the first `depth` layers over the step's tokens.
    fn encode_prefill_depth(&self, rec: &mut Recorder<'_>, pos0: u32, n: u32, depth: usize) {
        // A forward pass from the first position starts the recurrent states afresh.
        if pos0 == 0 {
            for l in &self.layers {
                l.clear_state(rec);
            }
        }
        self.embed.encode(rec, n);
        for l in &self.layers[..depth.min(self.layers.len())] {
            l.encode_prompt(rec, pos0, n);
        }
    }

    fn check_prompt(&self, ids: &[u32]) -> Result<(), Error> {
        if ids.is_empty() {
            return Err(Error::Invalid("the prompt has no tokens".into()));
        }
        if ids.len() as u64 > u64::from(self.capacity) {
            return Err(Error::PromptTooLong {
                tokens: ids.len(),
                capacity: self.capacity,
            });
        }
        if let Some(&bad) = ids.iter().find(|&&id| id >= self.spec.vocab) {
            return Err(Error::Invalid(format!(
                "token id {bad} is outside the vocabulary of {} tokens",
                self.spec.vocab
            )));
        }
        Ok(())
    }

    /// Runs the prompt through the model (all tokens of a chunk at once) and samples the first
    /// new token, which is returned. Starts a new sequence.
    pub fn prefill(&mut self, ids: &[u32]) -> Result<u32, Error> {
        self.check_prompt(ids)?;
        self.drain()?;
        self.seq_len = 0;
        let gpu = self.gpu.clone();
        gpu.queue().write_buffer(
            &self.acts.history.buffer,
            self.history_offset(0),
            bytemuck::cast_slice(ids),
        );
        let total = ids.len() as u32;
        let reuse = self.reusable_prefix(ids);
        if reuse > 0 {
            // The repetition penalty's seen set: the reused tokens', then the rest as embedded.
            let mut seen = vec![0u32; self.spec.vocab.div_ceil(32) as usize];
            for &id in &ids[..reuse as usize] {
                seen[(id / 32) as usize] |= 1 << (id % 32);
            }
            gpu.queue().write_buffer(
                &self.acts.seen.buffer,
                self.seen_offset(),
                bytemuck::cast_slice(&seen),
            );
        } else {
            self.written_end = 0;
        }
        self.prompt_len = total;
        self.last_prompt_reused = reuse;
        self.submit_forward(reuse, total, 0, reuse == 0);
        self.seq_len = total;
        self.submitted_len = total;
        self.reusable = ids.to_vec();
        self.pending = None;
        let token = self.read_oldest()?;
        self.pending = Some(token);
        Ok(token)
    }

    /// Whether a prompt reuses the rows of a prompt it starts with (so that a prompt can be
    /// run in parts): not with `--batch-invariant`, nor past a long-context RoPE switch.
    pub fn reuses_prompts(&self) -> bool {
        self.prefix_reuse && self.long_rope_after.is_none()
    }

    /// Prompt tokens a prefill submits at a time.
    pub fn prompt_chunk(&self) -> u32 {
        self.chunk
    }

    /// Tokens of the last prompt the cache still holds, that `ids` starts with, and that a
    /// prompt from there may reuse (at least one token is always run, for its logits).
    fn reusable_prefix(&self, ids: &[u32]) -> u32 {
        if !self.reuses_prompts() {
            return 0;
        }
        let common = self
            .reusable
            .iter()
            .zip(ids)
            .take_while(|(a, b)| a == b)
            .count()
            .min(ids.len() - 1) as u32;
        // A rolling sliding-window cache holds `chunk` positions past its window: later
        // writes beyond that have overwritten what queries from `common` still need.
        if self.spec.window.is_some() && self.written_end > common + self.chunk {
            return 0;
        }
        common
    }

    /// Prompt tokens the last prefill took from the cache instead of running.
    pub fn last_prompt_reused(&self) -> u32 {
        self.last_prompt_reused
    }

    /// Forgets the prompt cache (the cache's contents were written by another path).
    fn forget_prefix(&mut self) {
        self.reusable.clear();
        self.pending = None;
    }

    /// Runs a short prompt and a decode step through every kernel once, then forgets them: what
    /// a driver leaves to a pipeline's first use, and the first reads of the weights, then
    /// happen while loading instead of in the first prompt (llama.cpp's server also warms up
    /// at load). The sequence is left empty.
    pub fn warm_up(&mut self) -> Result<(), Error> {
        let longest = self.chunk.min(self.capacity.saturating_sub(2)).max(1);
        // Long prompts may take tiles of their own (`LONG_PROMPT_ROWS`): warm those too.
        if longest >= LONG_PROMPT_ROWS {
            self.prefill(&vec![0; LONG_PROMPT_ROWS as usize])?;
        }
        self.prefill(&vec![0; longest.min(WARM_UP_TOKENS) as usize])?;
        if self.seq_len < self.capacity {
            self.decode()?;
        }
        self.drain()?;
        self.seq_len = 0;
        self.submitted_len = 0;
        self.forget_prefix();
        self.prompt_len = 0;
        Ok(())
    }

    /// Submits a forward pass over the history's tokens from `from` to `total` (in chunks)
    /// that samples the next token into readback `slot`; `fresh` clears the seen-token set
    /// first.
    fn submit_forward(&mut self, from: u32, total: u32, slot: usize, fresh: bool) {
        let gpu = self.gpu.clone();
        let started = std::time::Instant::now();
        self.written_end = self.written_end.max(total);
        let mut pos = from;
        while pos < total {
            let n = (total - pos).min(self.chunk);
            self.step.write(&gpu, &self.step_params(pos, n, total));
            let mut rec = Recorder::in_parts(&gpu);
            if pos == from && fresh {
                rec.clear_range(
                    &self.acts.seen.buffer,
                    self.seen_offset(),
                    self.seen_bytes(),
                );
            }
            self.encode_prefill_layers(&mut rec, pos, n);
            pos += n;
            if pos == total {
                self.lm_head_mv.encode(&mut rec);
                self.sample.encode(&mut rec);
                self.copy_sampled(&mut rec, total, slot);
                let submission = rec.submit();
                self.in_flight.push_back(InFlight { slot, submission });
            } else {
                rec.submit();
            }
        }
        self.last_prompt_encode = started.elapsed();
    }

    /// Feeds the last sampled token and returns the next one.
    pub fn decode(&mut self) -> Result<u32, Error> {
        if self.seq_len == 0 {
            return Err(Error::Invalid("decode before prefill".into()));
        }
        if self.seq_len >= self.capacity {
            return Err(Error::ContextFull {
                capacity: self.capacity,
            });
        }
        self.verifying.clear();
        let depth = if self.masked || self.lookahead_paused {
            1
        } else {
            self.depth
        };
        while self.in_flight.len() < depth && self.submitted_len < self.capacity {
            self.submit_decode_step(self.submitted_len);
            self.submitted_len += 1;
        }
        let token = self.read_oldest()?;
        self.seq_len += 1;
        // Returning this token means the one before it was fed.
        if let Some(fed) = self.pending.replace(token) {
            self.reusable.push(fed);
        }
        Ok(token)
    }

    /// As [`DecoderModel::decode`], sampling under the token mask `mask` returns (one bit per
    /// token), which the CPU computes while the step's forward pass runs: the mask depends on
    /// the token just fed, so no step is submitted ahead, but the GPU waits only for the
    /// sampler's share.
    pub fn decode_masked(
        &mut self,
        mask: impl FnOnce() -> Result<Vec<u32>, Error>,
    ) -> Result<u32, Error> {
        if self.seq_len == 0 {
            return Err(Error::Invalid("decode before prefill".into()));
        }
        if self.seq_len >= self.capacity {
            return Err(Error::ContextFull {
                capacity: self.capacity,
            });
        }
        self.drain()?;
        let gpu = self.gpu.clone();
        let pos = self.submitted_len;
        let slot = pos as usize % PIPELINE_DEPTH;
        if self.long_rope_after == Some(pos) && self.prompt_len <= pos {
            let words = mask()?;
            self.sample.set_mask(&gpu, Some(&words));
            self.submit_forward(0, pos + 1, slot, false);
        } else {
            self.written_end = self.written_end.max(pos + 1);
            self.step.write(&gpu, &self.step_params(pos, 1, pos + 1));
            let mut rec = Recorder::new(&gpu);
            self.encode_decode_logits(&mut rec, pos);
            rec.submit();
            let words = mask()?;
            self.sample.set_mask(&gpu, Some(&words));
            let mut rec = Recorder::new(&gpu);
            self.sample.encode(&mut rec);
            self.copy_sampled(&mut rec, pos + 1, slot);
            let submission = rec.submit();
            self.in_flight.push_back(InFlight { slot, submission });
        }
        self.masked = true;
        self.submitted_len += 1;
        let token = self.read_oldest()?;
        self.seq_len += 1;
        if let Some(fed) = self.pending.replace(token) {
            self.reusable.push(fed);
        }
        Ok(token)
    }

    /// Records and submits the step that feeds the token at `pos`.
    fn submit_decode_step(&mut self, pos: u32) {
        // Longrope: the first time the sequence passes the switch length, transformers encodes
        // it again from the start with the long factors (the cache holds short-factor keys).
        if self.long_rope_after == Some(pos) && self.prompt_len <= pos {
            self.submit_forward(0, pos + 1, pos as usize % PIPELINE_DEPTH, false);
            return;
        }
        let gpu = self.gpu.clone();
        let started = std::time::Instant::now();
        self.written_end = self.written_end.max(pos + 1);
        self.step.write(&gpu, &self.step_params(pos, 1, pos + 1));
        let mut rec = Recorder::new(&gpu);
        self.encode_decode(&mut rec, pos);
        let slot = pos as usize % PIPELINE_DEPTH;
        self.copy_sampled(&mut rec, pos + 1, slot);
        self.last_encode = started.elapsed();
        let submission = rec.submit();
        self.in_flight.push_back(InFlight { slot, submission });
    }

    fn copy_sampled(&self, rec: &mut Recorder<'_>, index: u32, slot: usize) {
        rec.copy(
            &self.acts.history.buffer,
            self.history_offset(index),
            &self.staging[slot],
            0,
            4,
        );
    }

    fn read_oldest(&mut self) -> Result<u32, Error> {
        let Some(step) = self.in_flight.pop_front() else {
            return Err(Error::Invalid("no step in flight".into()));
        };
        let v: Vec<u32> = self
            .gpu
            .map_read_after(&self.staging[step.slot], 4, step.submission)?;
        Ok(v[0])
    }

    /// Waits for steps submitted ahead and forgets their tokens (a new sequence starts).
    fn drain(&mut self) -> Result<(), Error> {
        self.verifying.clear();
        if !self.in_flight.is_empty() {
            self.in_flight.clear();
            self.gpu.wait()?;
        }
        self.submitted_len = self.seq_len;
        Ok(())
    }

    /// The logits the last token was sampled from (after any penalty and temperature the
    /// sampler applied in place). For tests and tools; needs `lookahead` off, or a later step
    /// may already have replaced them.
    pub fn last_logits(&self) -> Result<Vec<f32>, Error> {
        Ok(self
            .gpu
            .read(&self.acts.logits.buffer, 0, u64::from(self.spec.vocab))?)
    }
}

/// Tokens of the prompt `DecoderModel::warm_up` runs: enough for the prompt kernels that
/// long prompts use.
const WARM_UP_TOKENS: u32 = 128;

pub(super) type FusedNorm<'a> = (NormKind, &'a StorageBuffer, Option<&'a StorageBuffer>, f32);

fn fused(kind: NormKind, n: &(StorageBuffer, Option<StorageBuffer>), eps: f32) -> FusedNorm<'_> {
    (kind, &n.0, n.1.as_ref(), eps)
}

/// The tied LM head reads the embedding table: same buffer, same layout.
fn embedding_clone(m: &Matrix) -> Matrix {
    Matrix {
        buffer: StorageBuffer {
            buffer: m.buffer.buffer.clone(),
            size: m.buffer.size,
        },
        rows: m.rows,
        cols: m.cols,
        dtype: m.dtype,
        quant: m.quant,
    }
}
