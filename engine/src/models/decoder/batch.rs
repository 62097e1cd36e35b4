//! Several sequences on one model: each keeps a cache slot (its keys and values, token history
//! and seen-token set side by side with the others'), and a batched decode step feeds the
//! pending token of each of several slots through one forward pass. The weights are read once
//! for all of them, which is what makes serving many clients at once cheaper than serving them
//! in turn. The step runs the prompt path's products over its rows; only the embedding, RoPE,
//! attention and the sampler know that row t belongs to its own sequence (the step's `rows`).
//!
//! The single-sequence calls (prefill, decode, verify) work on the current slot
//! ([`DecoderModel::select_slot`]); the others' state waits in `slot_states`.

use super::{BatchSetup, DecoderModel, Norm, PromptProduct, PromptWeights, SMALL_PREFILL_CHUNK};
use bytemuck::Zeroable;

use crate::Error;
use crate::gpu::{Gpu, Recorder, StorageBuffer, UniformBuffer};
use crate::load::DecoderSpec;
use crate::ops::{
    BatchRows, BatchSample, Embed, KvDType, MAX_BATCH_ROWS, MatMulOptions, Matrix, SamplerParams,
    StepParams,
};

/// The cache slots a model built with `opts` keeps: as asked (at most [`MAX_BATCH_ROWS`] and
/// one prompt chunk, the rows the activations hold), or one where a sequence's state is not
/// indexed by slot (a Gated DeltaNet's recurrent state, longrope's table switching by
/// length).
pub(super) fn slots_for(spec: &DecoderSpec, opts: &super::ModelOptions, chunk: u32) -> u32 {
    let longrope = spec
        .rope
        .as_ref()
        .is_some_and(|r| r.longrope(spec.rotary_dim).is_some());
    if spec.linear.is_some() || longrope {
        return 1;
    }
    opts.slots.clamp(1, MAX_BATCH_ROWS.min(chunk))
}

/// Slots kept when the most is asked for but the driver reports no free memory.
pub const UNREPORTED_MEMORY_SLOTS: u32 = 4;

/// Of `wanted` slots, those whose state fits the GPU's free memory beside the weights (just
/// uploaded): each slot's KV cache, token history, seen set and logits, keeping a quarter of
/// what is free (at least 512 MiB) for activations, scratch and other programs; and whose
/// layer caches (all slots in one buffer) fit one buffer binding. At most
/// [`UNREPORTED_MEMORY_SLOTS`] where the driver reports no free memory.
pub(super) fn slots_in_memory(
    gpu: &Gpu,
    spec: &DecoderSpec,
    (capacity, chunk): (u32, u32),
    kv_dtype: KvDType,
    wanted: u32,
) -> u32 {
    let layer_caches: Vec<u64> = (0..spec.layers)
        .filter(|&i| !spec.linear.as_ref().is_some_and(|l| l.is_linear(i)))
        .map(|i| super::build::cache_shape(spec, i, (capacity, chunk), kv_dtype, 1).buffer_bytes())
        .collect();
    let largest = layer_caches.iter().copied().max().unwrap_or(1).max(1);
    let bound = (gpu.caps().max_storage_binding / largest).clamp(1, u64::from(wanted)) as u32;
    let Some(free) = gpu.free_memory() else {
        return bound.min(UNREPORTED_MEMORY_SLOTS);
    };
    let vocab = u64::from(spec.vocab);
    let per_slot = 2 * layer_caches.iter().sum::<u64>()
        + u64::from(capacity + 1) * 4
        + vocab.div_ceil(32) * 4
        + vocab * 4;
    slots_that_fit(free, per_slot, bound)
}

/// The prompt chunk of a model: `wanted`, halved while a chunk would take more than the
/// quarter of the free memory that [`slots_in_memory`] leaves it (its activations, `row_bytes`
/// a row, and the rows sliding-window layers' caches keep past their window for it), or its
/// largest buffer (`largest_row` bytes a row) more than one binding holds; never below
/// [`SMALL_PREFILL_CHUNK`] (or `wanted`, if less), which is also what a GPU that reports no
/// free memory takes.
pub(super) fn chunk_in_memory(
    gpu: &Gpu,
    spec: &DecoderSpec,
    (capacity, kv_dtype): (u32, KvDType),
    wanted: u32,
    (row_bytes, largest_row): (u64, u64),
) -> u32 {
    let floor = wanted.min(SMALL_PREFILL_CHUNK);
    let Some(free) = gpu.free_memory() else {
        return floor;
    };
    let caches = |chunk: u32| -> u64 {
        (0..spec.layers)
            .filter(|&i| !spec.linear.as_ref().is_some_and(|l| l.is_linear(i)))
            .map(|i| {
                super::build::cache_shape(spec, i, (capacity, chunk), kv_dtype, 1).buffer_bytes()
            })
            .sum()
    };
    let at_floor = caches(floor);
    let cost = |chunk: u32| u64::from(chunk) * row_bytes + caches(chunk).saturating_sub(at_floor);
    chunk_that_fits(
        free / 4,
        gpu.caps().max_storage_binding,
        (wanted, floor),
        cost,
        largest_row,
    )
}

fn chunk_that_fits(
    room: u64,
    binding: u64,
    (wanted, floor): (u32, u32),
    cost: impl Fn(u32) -> u64,
    largest_row: u64,
) -> u32 {
    let mut chunk = wanted;
    while chunk > floor && (cost(chunk) > room || u64::from(chunk) * largest_row > binding) {
        chunk = (chunk / 2).max(floor);
    }
    chunk
}

/// How many slots of `per_slot` bytes, at most `wanted` and at least one, fit in `free`
/// bytes less the reserve.
fn slots_that_fit(free: u64, per_slot: u64, wanted: u32) -> u32 {
    let room = free.saturating_sub((free / 4).max(512 << 20));
    (room / per_slot.max(1)).clamp(1, u64::from(wanted)) as u32
}

/// A batched step's uniforms: the step (its row count) and the rows.
type BatchStep = (StepParams, BatchRows);

/// What the model keeps of a sequence while another slot is current.
#[derive(Clone, Default)]
pub(super) struct SlotState {
    seq_len: u32,
    prompt_len: u32,
    pub(super) reusable: Vec<u32>,
    pub(super) pending: Option<u32>,
    pub(super) written_end: u32,
    sampler: SamplerParams,
}

/// One row of a batched decode step: the slot whose pending token it feeds, and the grammar
/// mask its next token must obey (None: free).
#[derive(Clone, Copy, Debug)]
pub struct BatchRow<'a> {
    pub slot: u32,
    pub mask: Option<&'a [u32]>,
}

/// The kernels of a batched decode step that the single-sequence passes do not have.
pub(super) struct BatchKernels {
    embed: Embed,
    norm: Norm,
    head: PromptProduct,
    sample: BatchSample,
    /// The rows' sampled tokens, read back.
    staging: wgpu::Buffer,
    _logits: StorageBuffer,
}

impl BatchKernels {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        gpu: &Gpu,
        spec: &DecoderSpec,
        slots: u32,
        [embedding, lm_head]: [&Matrix; 2],
        positions: Option<&StorageBuffer>,
        final_norm: &(StorageBuffer, Option<StorageBuffer>),
        acts: &super::Activations,
        step: &UniformBuffer,
        invariant: bool,
    ) -> Result<Self, Error> {
        let Some(rows) = &acts.batch_rows else {
            return Err(Error::Invalid("batched kernels without their rows".into()));
        };
        let embed = Embed::batched(
            gpu,
            embedding,
            positions,
            [&acts.history, &acts.seen, &acts.x],
            step,
            rows,
            spec.embed_scale,
        )?;
        let norm = Norm::new(
            gpu,
            spec.norm,
            spec.hidden,
            spec.norm_eps,
            &final_norm.0,
            final_norm.1.as_ref(),
            &acts.x,
            &acts.xn,
            step,
        )?;
        let logits = gpu.storage(
            "batched logits",
            u64::from(slots) * u64::from(spec.vocab) * 4,
        )?;
        let head = PromptProduct::new(
            gpu,
            PromptWeights::Blocks,
            lm_head,
            &acts.xn,
            &logits,
            step,
            MatMulOptions::default(),
            // Logits pick tokens: the rows' rounding remainders go in a second level, as the
            // decode path's head takes them.
            acts.batch_int8.as_ref().map(|rows| BatchSetup {
                rows,
                fine: true,
                steps: true,
                invariant,
            }),
        )?;
        let sample = BatchSample::new(
            gpu,
            spec.vocab,
            slots,
            [&logits, &acts.history, &acts.seen],
            rows,
        )?;
        Ok(Self {
            embed,
            norm,
            head,
            sample,
            staging: gpu.readback_buffer("batched tokens", u64::from(slots) * 4),
            _logits: logits,
        })
    }
}

impl DecoderModel {
    /// Whether a lone answer takes the batched step too (see
    /// [`super::ModelOptions::batch_invariant`]).
    pub fn batch_invariant(&self) -> bool {
        self.batch_invariant && self.batch.is_some()
    }

    /// Cache slots: sequences kept at once.
    pub fn slots(&self) -> u32 {
        self.slot_states.len() as u32
    }

    /// The slot the single-sequence calls work on.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// Makes `slot` the sequence that prefill, decode and verify work on (its cache, history,
    /// prompt cache and sampler settings); the current one's state is kept for later.
    pub fn select_slot(&mut self, slot: u32) -> Result<(), Error> {
        if slot >= self.slots() {
            return Err(Error::Invalid(format!(
                "slot {slot} of a model with {} slots",
                self.slots()
            )));
        }
        if slot == self.slot {
            return Ok(());
        }
        self.drain()?;
        self.park();
        self.slot = slot;
        self.unpark();
        Ok(())
    }

    /// Tokens of `ids` that slot `slot`'s cache holds at their positions from its last prompt
    /// and answer: what a prefill there would take from the cache (a server picks the slot
    /// with the most).
    pub fn cached_prefix(&self, slot: u32, ids: &[u32]) -> usize {
        let held = if slot == self.slot {
            &self.reusable
        } else {
            match self.slot_states.get(slot as usize) {
                Some(s) => &s.reusable,
                None => return 0,
            }
        };
        held.iter().zip(ids).take_while(|(a, b)| a == b).count()
    }

    /// Sets slot `slot`'s sampling settings (the current slot's as [`Self::set_sampler`]).
    pub fn set_slot_sampler(&mut self, slot: u32, params: &SamplerParams) -> Result<(), Error> {
        if slot == self.slot {
            self.set_sampler(params);
            return Ok(());
        }
        let state = self
            .slot_states
            .get_mut(slot as usize)
            .ok_or_else(|| Error::Invalid(format!("no slot {slot}")))?;
        state.sampler = *params;
        Ok(())
    }

    /// Feeds the pending token (the last one returned) of each row's slot through one forward
    /// pass and returns each row's next token, sampled with its slot's settings under the
    /// row's mask. Each slot must hold a prompt and have room for one more token.
    pub fn decode_batch(&mut self, rows: &[BatchRow<'_>]) -> Result<Vec<u32>, Error> {
        if self.batch.is_none() {
            return Err(Error::Invalid(
                "this model decodes one sequence at a time (one slot)".into(),
            ));
        }
        let n = rows.len() as u32;
        if n == 0 || n > self.slots() {
            return Err(Error::Invalid(format!(
                "a batched step of {n} rows on a model with {} slots",
                self.slots()
            )));
        }
        for (i, row) in rows.iter().enumerate() {
            if rows[..i].iter().any(|r| r.slot == row.slot) {
                return Err(Error::Invalid(format!(
                    "slot {} appears twice in one batched step",
                    row.slot
                )));
            }
        }
        self.drain()?;
        self.park();
        let result = self.run_batch(rows);
        self.unpark();
        result
    }

    /// The step uniform and rows of a batched step over `rows`, each slot checked for a prompt
    /// and room.
    fn batch_step(&self, rows: &[BatchRow<'_>]) -> Result<BatchStep, Error> {
        let step = StepParams::new(0, rows.len() as u32);
        let mut table = BatchRows::zeroed();
        for (t, row) in rows.iter().enumerate() {
            let state = self
                .slot_states
                .get(row.slot as usize)
                .ok_or_else(|| Error::Invalid(format!("no slot {}", row.slot)))?;
            if state.pending.is_none() {
                return Err(Error::Invalid(format!(
                    "slot {} has no prompt to decode from",
                    row.slot
                )));
            }
            if state.seq_len >= self.capacity {
                return Err(Error::ContextFull {
                    capacity: self.capacity,
                });
            }
            table.rows[t] = [
                state.seq_len,
                row.slot,
                self.history_base(row.slot),
                self.seen_base(row.slot),
            ];
        }
        Ok((step, table))
    }

    /// Writes the step and the rows' sampler settings, and records the batched forward pass
    /// and sampler.
    fn encode_batch(
        &self,
        rec: &mut Recorder<'_>,
        (step, table): &BatchStep,
        rows: &[BatchRow<'_>],
    ) -> Result<(), Error> {
        let (Some(batch), Some(table_uniform)) = (&self.batch, &self.acts.batch_rows) else {
            return Err(Error::Invalid(
                "this model decodes one sequence at a time (one slot)".into(),
            ));
        };
        // Checked before anything is recorded: a recorder in parts may have submitted the
        // first layers by the time a later one turned out to have no batched kernels.
        if !self.layers.iter().all(|l| l.batches()) {
            return Err(Error::Invalid(
                "a layer of this model has no batched decode kernels".into(),
            ));
        }
        let n = step.n_tokens;
        self.step.write(&self.gpu, step);
        table_uniform.write(&self.gpu, table);
        for row in rows {
            let sampler = &self.slot_states[row.slot as usize].sampler;
            batch.sample.set(&self.gpu, row.slot, sampler, row.mask);
        }
        batch.embed.encode(rec, n);
        // Keys the longest row sees: its position and those before.
        let longest = table.rows[..n as usize]
            .iter()
            .map(|r| r[0] + 1)
            .max()
            .unwrap_or(1);
        for layer in &self.layers {
            if !layer.encode_batch(rec, n, longest) {
                return Err(Error::Invalid(
                    "a layer of this model has no batched decode kernels".into(),
                ));
            }
        }
        batch.norm.encode(rec, n);
        batch.head.encode_batch(rec, n);
        batch.sample.encode(rec, n);
        Ok(())
    }

    fn run_batch(&mut self, rows: &[BatchRow<'_>]) -> Result<Vec<u32>, Error> {
        let n = rows.len() as u32;
        let step = self.batch_step(rows)?;
        let gpu = self.gpu.clone();
        // Submitted as it is recorded, as a verification is (see `DecoderModel::verify`).
        let mut rec = Recorder::in_parts(&gpu);
        self.encode_batch(&mut rec, &step, rows)?;
        let Some(batch) = &self.batch else {
            unreachable!("checked by encode_batch")
        };
        for (t, r) in step.1.rows[..n as usize].iter().enumerate() {
            let [pos, _, history, _] = *r;
            let at = u64::from(history + pos + 1) * 4;
            rec.copy(
                &self.acts.history.buffer,
                at,
                &batch.staging,
                t as u64 * 4,
                4,
            );
        }
        let submission = rec.submit();
        let tokens: Vec<u32> = gpu.map_read_after(&batch.staging, u64::from(n) * 4, submission)?;
        for (row, &token) in rows.iter().zip(&tokens) {
            let state = &mut self.slot_states[row.slot as usize];
            if let Some(fed) = state.pending.replace(token) {
                state.reusable.push(fed);
            }
            state.seq_len += 1;
            state.written_end = state.written_end.max(state.seq_len);
        }
        Ok(tokens)
    }

    /// Per-kernel GPU time of one batched step over the pending tokens of `slots` (timestamp
    /// queries); nothing advances.
    pub fn profile_batch(&mut self, slots: &[u32]) -> Result<Vec<crate::gpu::KernelTiming>, Error> {
        if !self.gpu.caps().timestamps {
            return Err(Error::Invalid(
                "this GPU does not support timestamp queries".into(),
            ));
        }
        let rows: Vec<BatchRow<'_>> = slots
            .iter()
            .map(|&slot| BatchRow { slot, mask: None })
            .collect();
        self.drain()?;
        self.park();
        let result = self.batch_step(&rows).and_then(|step| {
            let gpu = self.gpu.clone();
            let mut profiler = crate::gpu::Profiler::new(&gpu, 20 * self.spec.layers + 8);
            let mut rec = Recorder::with_profiler(&gpu, Some(&mut profiler));
            self.encode_batch(&mut rec, &step, &rows)?;
            rec.submit();
            gpu.wait()?;
            Ok(profiler.read(&gpu)?)
        });
        self.unpark();
        result
    }

    /// Where slot `slot`'s token history starts in the history buffer (in tokens).
    pub(super) fn history_base(&self, slot: u32) -> u32 {
        slot * (self.capacity + 1)
    }

    /// Where slot `slot`'s seen-token set starts (in words).
    pub(super) fn seen_base(&self, slot: u32) -> u32 {
        slot * self.spec.vocab.div_ceil(32)
    }

    /// The byte offset of the current slot's history entry `index`.
    pub(super) fn history_offset(&self, index: u32) -> u64 {
        u64::from(self.history_base(self.slot) + index) * 4
    }

    /// The byte offset of the current slot's seen-token set.
    pub(super) fn seen_offset(&self) -> u64 {
        u64::from(self.seen_base(self.slot)) * 4
    }

    /// Bytes of one seen-token set.
    pub(super) fn seen_bytes(&self) -> u64 {
        u64::from(self.spec.vocab.div_ceil(32)) * 4
    }

    /// Keeps the current slot's sequence in `slot_states` (no step may be in flight).
    fn park(&mut self) {
        let state = SlotState {
            seq_len: self.seq_len,
            prompt_len: self.prompt_len,
            reusable: std::mem::take(&mut self.reusable),
            pending: self.pending,
            written_end: self.written_end,
            sampler: self.sampler,
        };
        self.slot_states[self.slot as usize] = state;
    }

    /// Takes the current slot's sequence back from `slot_states`.
    fn unpark(&mut self) {
        let state = std::mem::take(&mut self.slot_states[self.slot as usize]);
        self.seq_len = state.seq_len;
        self.submitted_len = state.seq_len;
        self.prompt_len = state.prompt_len;
        self.reusable = state.reusable;
        self.pending = state.pending;
        self.written_end = state.written_end;
        self.set_sampler(&state.sampler);
    }
}

#[cfg(test)]
mod tests {
    use super::{chunk_that_fits, slots_that_fit};

    #[test]
    fn prompt_chunks_shrink_to_the_room_and_the_binding() {
        const MIB: u64 = 1 << 20;
        let binding = 2048 * MIB;
        // 400 KiB of activations a row: 2,048 rows take 800 MiB.
        let rows = |chunk: u32| u64::from(chunk) * (400 << 10);
        let widest = 100 << 10;
        assert_eq!(
            chunk_that_fits(1024 * MIB, binding, (2048, 512), rows, widest),
            2048
        );
        assert_eq!(
            chunk_that_fits(700 * MIB, binding, (2048, 512), rows, widest),
            1024
        );
        // Never below the floor, however little room.
        assert_eq!(
            chunk_that_fits(MIB, binding, (2048, 512), rows, widest),
            512
        );
        // A chunk asked below the floor stays as asked.
        assert_eq!(chunk_that_fits(MIB, binding, (7, 7), rows, widest), 7);
        // The widest buffer must fit one binding: 128 MiB holds 1,310 rows of 100 KiB.
        assert_eq!(
            chunk_that_fits(u64::MAX, 128 * MIB, (2048, 512), rows, widest),
            1024
        );
        // Halving stops at the floor, not below it.
        assert_eq!(
            chunk_that_fits(MIB, binding, (3000, 512), rows, widest),
            512
        );
        assert_eq!(
            chunk_that_fits(800 * MIB, binding, (3000, 512), rows, widest),
            1500
        );
        // Longer sliding-window caches count too: 300 MiB more at 2,048 rows.
        let windowed = |chunk: u32| rows(chunk) + if chunk > 1024 { 300 * MIB } else { 0 };
        assert_eq!(
            chunk_that_fits(1024 * MIB, binding, (2048, 512), windowed, widest),
            1024
        );
    }

    #[test]
    fn slots_fit_the_free_memory_less_a_reserve() {
        const GIB: u64 = 1 << 30;
        // 20 GiB free: 15 GiB of room, for slots of 2 GiB.
        assert_eq!(slots_that_fit(20 * GIB, 2 * GIB, 16), 7);
        assert_eq!(slots_that_fit(20 * GIB, 2 * GIB, 4), 4);
        // Little free: the 512 MiB reserve, and still one slot.
        assert_eq!(slots_that_fit(GIB, 100 << 20, 16), 5);
        assert_eq!(slots_that_fit(256 << 20, GIB, 16), 1);
        assert_eq!(slots_that_fit(u64::MAX, 1, 64), 64);
    }
}
