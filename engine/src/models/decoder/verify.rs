//! Speculative decoding's side of the decoder: the pending token and a few draft tokens run
//! through the prompt path in one forward pass at the end of the sequence, which gives logits
//! at each of their positions for the price of about one read of the weights; the caller keeps
//! the drafts the model agrees with (`commit`) and the cache forgets the rest by being written
//! over, position by position, as it is in any later step.

use super::prompt_product::prompt_takes_int8;
use super::{DecoderModel, Norm};
use crate::Error;
use crate::gpu::{Recorder, StorageBuffer};
use crate::ops::{FEW_ROWS, FewRows, FewRowsInt8, MatMulOptions};

/// Rows one verification may run: the pending token and up to this many less one drafts (the
/// few-row products' limit, past which the prompt tiles would read the weights far slower).
pub const MAX_VERIFY_ROWS: u32 = FEW_ROWS;

/// The final norm and LM head over several rows, with their logits' readback; built at the
/// first verification.
pub(super) struct VerifyHead {
    norm: Norm,
    head: HeadProduct,
    logits: StorageBuffer,
    staging: wgpu::Buffer,
}

/// The verification's LM head: the float few-row products, and where the head's format has
/// them the int8 products in two levels (as the decode path's head takes its input), which
/// verifications of a few rows take (see `prompt_takes_int8`).
struct HeadProduct {
    int8: Option<FewRowsInt8>,
    float: FewRows,
}

impl HeadProduct {
    fn encode(&self, rec: &mut Recorder<'_>, rows: u32) {
        match &self.int8 {
            Some(p) if prompt_takes_int8(rows) && p.takes(rows) => p.encode(rec, rows),
            _ => self.float.encode(rec),
        }
    }
}

impl DecoderModel {
    /// Whether drafts can be verified and rolled back: the cache of every layer is indexed by
    /// position (a Gated DeltaNet state cannot rewind), the RoPE table does not switch with
    /// the sequence's length (longrope), and the hidden width suits the few-row products.
    pub fn can_speculate(&self) -> bool {
        self.spec.linear.is_none()
            && self.long_rope_after.is_none()
            && self.lm_head.cols.is_multiple_of(8)
    }

    /// The most drafts one verification takes (its rows fit one prompt chunk).
    pub fn max_drafts(&self) -> u32 {
        MAX_VERIFY_ROWS.min(self.chunk) - 1
    }

    /// Tokens in the cache plus the pending one: the position the next token returned takes.
    pub fn next_position(&self) -> u32 {
        self.seq_len
    }

    /// Keeps every decode step waiting for the one before it (no step submitted ahead): a
    /// speculating caller alternates decode steps with verifications, which a step in flight
    /// would only delay.
    pub fn set_lookahead(&mut self, on: bool) {
        self.lookahead_paused = !on;
    }

    /// Runs the pending token (the last one returned) and `drafts` after it through one forward
    /// pass and returns the logits at each of those positions, `[1 + drafts][vocab]`: row `i`
    /// is what the model predicts after `drafts[..i]`. Nothing is kept until [`Self::commit`].
    pub fn verify(&mut self, drafts: &[u32]) -> Result<Vec<f32>, Error> {
        let Some(pending) = self.pending else {
            return Err(Error::Invalid("verify before prefill".into()));
        };
        if !self.can_speculate() {
            return Err(Error::Invalid(
                "this model's state cannot rewind, so drafts cannot be verified".into(),
            ));
        }
        let rows = drafts.len() as u32 + 1;
        if rows > self.max_drafts() + 1 {
            return Err(Error::Invalid(format!(
                "{} drafts; at most {} fit one verification",
                drafts.len(),
                self.max_drafts()
            )));
        }
        let pos = self.seq_len;
        if pos + rows > self.capacity {
            return Err(Error::ContextFull {
                capacity: self.capacity,
            });
        }
        if let Some(&bad) = drafts.iter().find(|&&id| id >= self.spec.vocab) {
            return Err(Error::Invalid(format!(
                "draft token {bad} is outside the vocabulary of {} tokens",
                self.spec.vocab
            )));
        }
        self.drain()?;
        if self.verify_head.is_none() {
            self.verify_head = Some(self.make_verify_head()?);
        }
        let gpu = self.gpu.clone();
        self.verifying.clear();
        self.verifying.push(pending);
        self.verifying.extend_from_slice(drafts);
        gpu.queue().write_buffer(
            &self.acts.history.buffer,
            self.history_offset(pos),
            bytemuck::cast_slice(&self.verifying),
        );
        self.written_end = self.written_end.max(pos + rows);
        self.step
            .write(&gpu, &self.step_params(pos, rows, pos + rows));
        let Some(head) = &self.verify_head else {
            unreachable!("made above")
        };
        let bytes = u64::from(rows) * u64::from(self.spec.vocab) * 4;
        // Submitted as it is recorded: the GPU starts on the first layers while the host
        // records the rest, which for a model of 32 layers is about as long as a decode step.
        let mut rec = Recorder::in_parts(&gpu);
        self.encode_prefill_layers(&mut rec, pos, rows);
        head.norm.encode(&mut rec, rows);
        head.head.encode(&mut rec, rows);
        rec.copy(&head.logits.buffer, 0, &head.staging, 0, bytes);
        let submission = rec.submit();
        Ok(gpu.map_read_after(&head.staging, bytes, submission)?)
    }

    /// Per-kernel GPU time of one verification of `drafts` after the sequence so far (for
    /// `bench --profile`); nothing is committed.
    pub fn profile_verify(
        &mut self,
        drafts: &[u32],
    ) -> Result<Vec<crate::gpu::KernelTiming>, Error> {
        if !self.gpu.caps().timestamps {
            return Err(Error::Invalid("profiling needs timestamp queries".into()));
        }
        // A verification first, so that the head exists and the positions are checked.
        self.verify(drafts)?;
        let gpu = self.gpu.clone();
        let (pos, rows) = (self.seq_len, self.verifying.len() as u32);
        self.step
            .write(&gpu, &self.step_params(pos, rows, pos + rows));
        let Some(head) = &self.verify_head else {
            unreachable!("made by verify")
        };
        let mut profiler = crate::gpu::Profiler::new(&gpu, 20 * self.spec.layers + 8);
        let mut rec = Recorder::with_profiler(&gpu, Some(&mut profiler));
        self.encode_prefill_layers(&mut rec, pos, rows);
        head.norm.encode(&mut rec, rows);
        head.head.encode(&mut rec, rows);
        rec.submit();
        gpu.wait()?;
        self.verifying.clear();
        Ok(profiler.read(&gpu)?)
    }

    /// Keeps the first `accepted` drafts of the last [`Self::verify`] (the pending token is fed
    /// with them) and makes `next` the pending token, as if each had been decoded in turn.
    pub fn commit(&mut self, accepted: usize, next: u32) -> Result<(), Error> {
        if self.verifying.is_empty() || accepted >= self.verifying.len() {
            return Err(Error::Invalid(format!(
                "commit of {accepted} drafts after a verification of {}",
                self.verifying.len().saturating_sub(1)
            )));
        }
        if next >= self.spec.vocab {
            return Err(Error::Invalid(format!(
                "token id {next} is outside the vocabulary"
            )));
        }
        let fed = &self.verifying[..=accepted];
        self.reusable.extend_from_slice(fed);
        self.seq_len += fed.len() as u32;
        self.submitted_len = self.seq_len;
        self.pending = Some(next);
        self.verifying.clear();
        let queue = self.gpu.queue();
        queue.write_buffer(
            &self.acts.history.buffer,
            self.history_offset(self.seq_len),
            bytemuck::bytes_of(&next),
        );
        // The embedding marked every draft as seen; a repetition penalty must only see the
        // tokens kept (the fed ones and the pending one). Without one the set is unread until
        // the next prompt, which writes it afresh.
        if self.penalized {
            let mut seen = vec![0u32; self.spec.vocab.div_ceil(32) as usize];
            for &id in self.reusable.iter().chain([&next]) {
                seen[(id / 32) as usize] |= 1 << (id % 32);
            }
            queue.write_buffer(
                &self.acts.seen.buffer,
                self.seen_offset(),
                bytemuck::cast_slice(&seen),
            );
        }
        Ok(())
    }

    fn make_verify_head(&self) -> Result<VerifyHead, Error> {
        let gpu = &self.gpu;
        let rows = u64::from(MAX_VERIFY_ROWS.min(self.chunk));
        let logits = gpu.storage("verify logits", rows * u64::from(self.spec.vocab) * 4)?;
        let norm = self.final_norm_over_rows()?;
        let opts = MatMulOptions::default();
        let (head, x) = (&self.lm_head, &self.acts.xn);
        let int8 = match &self.acts.batch_int8 {
            Some(int8_rows) => {
                FewRowsInt8::new(gpu, head, x, &logits, &self.step, &opts, int8_rows, true)?
            }
            None => None,
        };
        let float = FewRows::new(gpu, head, x, &logits, &self.step, &opts)?.ok_or_else(|| {
            Error::Invalid(format!(
                "the LM head's rows of {} values are no multiple of 8, which verification needs",
                head.cols
            ))
        })?;
        let head = HeadProduct { int8, float };
        let staging = gpu.readback_buffer("verify logits readback", logits.size);
        Ok(VerifyHead {
            norm,
            head,
            logits,
            staging,
        })
    }
}
