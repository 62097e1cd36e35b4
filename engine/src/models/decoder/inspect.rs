//! The decoder looked into, for tests, goldens, tools and benchmarks rather than generation:
//! logits at every prompt position, the residual stream after chosen layers (what diffusion
//! pipelines take from a text encoder), and per-kernel GPU times of a prompt and a decode step.

use super::DecoderModel;
use crate::Error;
use crate::gpu::Recorder;
use crate::ops::{MatMul, MatMulOptions, Norm};

impl DecoderModel {
    /// Logits for every prompt position `[tokens][vocab]` through the prefill path. For tests
    /// and tools; leaves the sequence reset.
    pub fn prompt_logits(&mut self, ids: &[u32]) -> Result<Vec<f32>, Error> {
        self.check_prompt(ids)?;
        self.drain()?;
        let gpu = self.gpu.clone();
        let vocab = self.spec.vocab;
        let all = gpu.storage(
            "prompt logits",
            u64::from(self.chunk) * u64::from(vocab) * 4,
        )?;
        let norm = self.final_norm_over_rows()?;
        let head = MatMul::new(
            &gpu,
            &self.lm_head,
            &self.acts.xn,
            &all,
            &self.step,
            MatMulOptions::default(),
        )?;
        gpu.queue().write_buffer(
            &self.acts.history.buffer,
            self.history_offset(0),
            bytemuck::cast_slice(ids),
        );
        let total = ids.len() as u32;
        let mut out = Vec::with_capacity(ids.len() * vocab as usize);
        let mut pos = 0;
        while pos < total {
            let n = (total - pos).min(self.chunk);
            self.step.write(&gpu, &self.step_params(pos, n, total));
            let mut rec = Recorder::new(&gpu);
            self.encode_prefill_layers(&mut rec, pos, n);
            norm.encode(&mut rec, n);
            head.encode(&mut rec, n);
            rec.submit();
            out.extend(gpu.read::<f32>(&all.buffer, 0, u64::from(n) * u64::from(vocab))?);
            pos += n;
        }
        self.seq_len = 0;
        self.forget_prefix();
        Ok(out)
    }

    /// The final norm over a prompt chunk's rows of the residual stream (into `xn`), for the
    /// paths that need logits at several positions.
    pub(super) fn final_norm_over_rows(&self) -> Result<Norm, Error> {
        Ok(Norm::new(
            &self.gpu,
            self.spec.norm,
            self.spec.hidden,
            self.spec.norm_eps,
            &self.final_norm.0,
            self.final_norm.1.as_ref(),
            &self.acts.x,
            &self.acts.xn,
            &self.step,
        )?)
    }

    /// The residual stream after the first `depth` layers at every prompt position,
    /// `[tokens][hidden]`: transformers' `hidden_states[depth]`, what diffusion pipelines take
    /// as a text encoder's output. Leaves the sequence reset.
    pub fn hidden_states(&mut self, ids: &[u32], depth: usize) -> Result<Vec<f32>, Error> {
        self.hidden_states_at(ids, ids.len(), &[depth])
    }

    /// The residual stream after each of `depths` layers (ascending) at every token of `ids`,
    /// `[tokens][depths.len()·hidden]`: a token's states side by side in the order of
    /// `depths`. Only the first `real` tokens are attended to: the rest are padding, as a
    /// padded batch's attention mask has it (each pad row sees the real tokens, not itself).
    pub fn hidden_states_at(
        &mut self,
        ids: &[u32],
        real: usize,
        depths: &[usize],
    ) -> Result<Vec<f32>, Error> {
        self.check_prompt(ids)?;
        let ascending = depths.windows(2).all(|d| d[0] < d[1]);
        let deepest = depths.last().copied().unwrap_or(0);
        if depths.is_empty() || !ascending || deepest > self.layers.len() || real == 0 {
            return Err(Error::Invalid(format!(
                "hidden states after layers {depths:?} of {} real tokens: the model has {} layers",
                real.min(ids.len()),
                self.layers.len()
            )));
        }
        self.drain()?;
        let gpu = self.gpu.clone();
        gpu.queue().write_buffer(
            &self.acts.history.buffer,
            self.history_offset(0),
            bytemuck::cast_slice(ids),
        );
        let total = ids.len() as u32;
        let real = real.min(ids.len()) as u32;
        let hidden = self.spec.hidden as usize;
        let width = hidden * depths.len();
        let mut out = vec![0.0f32; ids.len() * width];
        let mut pos = 0;
        while pos < total {
            let n = (total - pos).min(self.chunk);
            let mut step = self.step_params(pos, n, total);
            step.seq_len = step.seq_len.min(real);
            self.step.write(&gpu, &step);
            // In parts, as a prompt is: a text encoder's pass runs in a window's image
            // generation, whose frames wait for whatever is in the queue.
            let mut rec = Recorder::in_parts(&gpu);
            if pos == 0 {
                for l in &self.layers {
                    l.clear_state(&mut rec);
                }
            }
            self.embed.encode(&mut rec, n);
            let mut done = 0;
            for (slot, &depth) in depths.iter().enumerate() {
                for l in &self.layers[done..depth] {
                    l.encode_prompt(&mut rec, pos, n);
                }
                done = depth;
                rec.submit();
                rec = Recorder::in_parts(&gpu);
                let states: Vec<f32> =
                    gpu.read(&self.acts.x.buffer, 0, u64::from(n) * hidden as u64)?;
                for (t, row) in states.chunks_exact(hidden).enumerate() {
                    let at = (pos as usize + t) * width + slot * hidden;
                    out[at..at + hidden].copy_from_slice(row);
                }
            }
            drop(rec);
            pos += n;
        }
        self.seq_len = 0;
        self.forget_prefix();
        Ok(out)
    }

    /// Per-kernel GPU time of processing `ids` as a prompt in one chunk (timestamp queries).
    pub fn profile_prefill(&mut self, ids: &[u32]) -> Result<Vec<crate::gpu::KernelTiming>, Error> {
        self.check_prompt(ids)?;
        if ids.len() as u32 > self.chunk || !self.gpu.caps().timestamps {
            return Err(Error::Invalid(
                "profiling needs timestamp queries and a prompt of at most one chunk".into(),
            ));
        }
        self.drain()?;
        let gpu = self.gpu.clone();
        let n = ids.len() as u32;
        gpu.queue().write_buffer(
            &self.acts.history.buffer,
            self.history_offset(0),
            bytemuck::cast_slice(ids),
        );
        self.step.write(&gpu, &self.step_params(0, n, n));
        let mut profiler = crate::gpu::Profiler::new(&gpu, 20 * self.spec.layers + 8);
        let mut rec = Recorder::with_profiler(&gpu, Some(&mut profiler));
        self.encode_prefill_layers(&mut rec, 0, n);
        self.lm_head_mv.encode(&mut rec);
        self.sample.encode(&mut rec);
        rec.submit();
        gpu.wait()?;
        self.seq_len = n;
        self.submitted_len = n;
        self.forget_prefix();
        Ok(profiler.read(&gpu)?)
    }

    /// Assignments per expert of the last prompt's last sparse layer (None for dense models).
    pub fn prompt_expert_counts(&self) -> Result<Option<Vec<u32>>, Error> {
        match (&self.acts.moe, &self.spec.moe) {
            (Some(bufs), Some(moe)) => Ok(Some(bufs.expert_counts(&self.gpu, moe.experts)?)),
            _ => Ok(None),
        }
    }

    /// Per-kernel GPU time of one decode step at the current position (timestamp queries).
    pub fn profile_decode(&mut self) -> Result<Vec<crate::gpu::KernelTiming>, Error> {
        if !self.gpu.caps().timestamps {
            return Err(Error::Invalid(
                "this GPU does not support timestamp queries".into(),
            ));
        }
        if self.seq_len == 0 || self.seq_len >= self.capacity {
            return Err(Error::Invalid(
                "profile needs a prompt and room for one token".into(),
            ));
        }
        self.drain()?;
        let gpu = self.gpu.clone();
        let mut profiler = crate::gpu::Profiler::new(&gpu, self.decode_dispatches + 8);
        self.step
            .write(&gpu, &self.step_params(self.seq_len, 1, self.seq_len + 1));
        let mut rec = Recorder::with_profiler(&gpu, Some(&mut profiler));
        self.encode_decode(&mut rec, self.seq_len);
        rec.submit();
        gpu.wait()?;
        self.forget_prefix();
        Ok(profiler.read(&gpu)?)
    }
}
