//! Whisper's text decoder on the GPU: token + learned position embeddings, pre-norm layers
//! of causal self-attention (KV cache), cross-attention over the encoder's keys and values
//! (projected once per window), and a GELU MLP; the LM head is the tied embedding. A prompt
//! runs as one batch of tiled products; each later token is one submit of mat-vec kernels,
//! Whisper's logit rules, the sampler and a score, reading back only the token and its
//! log-probability.

use crate::Error;
use crate::gpu::{Gpu, Recorder, StorageBuffer, UniformBuffer};
use crate::models::weights::{Part, Uploader};
use crate::ops::{
    Embed, MAX_SPLITS, MatVec, MatVecLayout, MatVecOptions, Matrix, NormKind, Sample,
    SamplerParams, SpeechLogits, SpeechRules, SpeechTokenIds, StepParams,
};

use super::config::WhisperConfig;
use super::decoder_layer::{Acts, Binding, Layer, NormPair, build_layer, layer_weights};
use super::encoder::{LN_EPS, norm_pair};

/// One decoded token: its id and log-probability under the processed logits.
#[derive(Clone, Copy, Debug)]
pub struct Sampled {
    pub token: u32,
    pub logprob: f32,
}

pub struct Decoder {
    gpu: Gpu,
    vocab: u32,
    capacity: u32,
    step: UniformBuffer,
    probe_step: UniformBuffer,
    embed: Embed,
    layers: Vec<Layer>,
    head_mv: MatVec,
    probe_head_mv: MatVec,
    rules: SpeechLogits,
    sample: Sample,
    acts: Acts,
    staging: wgpu::Buffer,
    logits_staging: wgpu::Buffer,
    seq_len: u32,
    _table: Matrix,
    _positions: StorageBuffer,
    _final_norm: NormPair,
    pub cache_bytes: u64,
}

impl Decoder {
    pub fn build(
        gpu: &Gpu,
        up: &mut Uploader<'_>,
        cfg: &WhisperConfig,
        ids: SpeechTokenIds,
        encoder_out: &StorageBuffer,
        encoder_step: &UniformBuffer,
    ) -> Result<Self, Error> {
        let (d, vocab) = (cfg.d_model, cfg.vocab);
        let capacity = cfg.max_target_positions;
        let heads = cfg.decoder_heads;
        if !MatVec::stages_input(gpu, d) {
            return Err(Error::Invalid(format!(
                "d_model {d} is wider than the decoder's one-token kernels stage"
            )));
        }
        // The tied LM head reads the embedding table, which stays dense (learned positions
        // are added while gathering).
        let table = up.dense_matrix(
            "token embedding",
            &[Part {
                name: "model.decoder.embed_tokens.weight",
                rows: vocab,
                cols: d,
            }],
            false,
        )?;
        let positions = up.dense(
            "decoder positions",
            "model.decoder.embed_positions.weight",
            capacity,
            d,
        )?;
        let mut weights = Vec::with_capacity(cfg.decoder_layers as usize);
        for i in 0..cfg.decoder_layers {
            weights.push(layer_weights(up, cfg, i)?);
        }
        let final_norm = norm_pair(up, "decoder norm", "model.decoder.layer_norm", d)?;
        let f = |n: u32| u64::from(n) * 4;
        let t = capacity;
        let acts = Acts {
            x: gpu.storage("decoder x", f(t * d))?,
            xn: gpu.storage("decoder x normed", f(t * d))?,
            qkv: gpu.storage("decoder qkv", f(t * 3 * d))?,
            q: gpu.storage("decoder q", f(t * d))?,
            attn: gpu.storage("decoder attention", f(t * d))?,
            h: gpu.storage("decoder mlp", f(t * cfg.decoder_ffn))?,
            logits: gpu.storage("logits", f(vocab.div_ceil(4) * 4))?,
            history: gpu.storage("token history", f(capacity + 1))?,
            seen: gpu.storage("seen tokens", f(vocab.div_ceil(32)))?,
            scores: gpu.storage("token scores", f(capacity + 1))?,
            partials: gpu.storage("attention runs", f(MAX_SPLITS * heads * (d / heads)))?,
            stats: gpu.storage("attention run stats", f(2 * MAX_SPLITS * heads))?,
        };
        let step = gpu.uniform("decoder step", &StepParams::new(0, 1));
        let probe_step = gpu.uniform("decoder probe step", &StepParams::new(0, 1));
        let binding = Binding {
            acts: &acts,
            step: &step,
            encoder_out,
            encoder_step,
            positions: cfg.max_source_positions,
            capacity,
            dtype: up.dtype,
        };
        let mut layers = Vec::with_capacity(weights.len());
        let mut cache_bytes = 0;
        for w in weights {
            let layer = build_layer(gpu, cfg, w, &binding)?;
            cache_bytes += layer._buffers.iter().map(|b| b.size).sum::<u64>();
            layers.push(layer);
        }
        let head_opts = || MatVecOptions {
            norm: Some((NormKind::Layer, &final_norm.0, Some(&final_norm.1), LN_EPS)),
            layout: MatVecLayout::for_head(up.dtype),
            ..Default::default()
        };
        let head_mv = MatVec::new(gpu, &table, &acts.x, &acts.logits, &step, head_opts())?;
        let probe_head_mv =
            MatVec::new(gpu, &table, &acts.x, &acts.logits, &probe_step, head_opts())?;
        let embed = Embed::new(
            gpu,
            &table,
            Some(&positions),
            &acts.history,
            &acts.seen,
            &acts.x,
            &step,
            1.0,
        )?;
        let rules = SpeechLogits::new(gpu, ids, &acts.logits, &acts.history, &acts.scores, &step)?;
        let sample = Sample::new(gpu, vocab, &acts.logits, &acts.history, &acts.seen, &step)?;
        Ok(Self {
            gpu: gpu.clone(),
            vocab,
            capacity,
            step,
            probe_step,
            embed,
            layers,
            head_mv,
            probe_head_mv,
            rules,
            sample,
            staging: gpu.readback_buffer("sampled token", 8),
            logits_staging: gpu.readback_buffer("probe logits", f(vocab)),
            acts,
            seq_len: 0,
            _table: table,
            _positions: positions,
            _final_norm: final_norm,
            cache_bytes,
        })
    }

    /// Tokens a window's prompt and output may hold together.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    pub fn seq_len(&self) -> u32 {
        self.seq_len
    }

    /// Records the projection of the encoder output into every layer's cross keys/values.
    pub fn encode_cross_kv(&self, rec: &mut Recorder<'_>, positions: u32) {
        for l in &self.layers {
            l.cross_kv_mm.encode(rec, positions);
        }
    }

    /// Sets sampling and logit rules for the next prompt and its tokens.
    pub fn configure(&self, sampler: &SamplerParams, rules: &SpeechRules) {
        self.sample.set(&self.gpu, sampler);
        self.rules.set(&self.gpu, rules);
    }

    fn check_prompt(&self, ids: &[u32]) -> Result<(), Error> {
        if ids.is_empty() || ids.len() as u32 >= self.capacity {
            return Err(Error::Invalid(format!(
                "a decoder prompt of {} tokens does not fit the {} positions",
                ids.len(),
                self.capacity
            )));
        }
        if let Some(bad) = ids.iter().find(|&&id| id >= self.vocab) {
            return Err(Error::Invalid(format!(
                "token id {bad} is outside the vocabulary of {} tokens",
                self.vocab
            )));
        }
        Ok(())
    }

    fn encode_prompt_layers(&self, rec: &mut Recorder<'_>, n: u32) {
        self.embed.encode(rec, n);
        for l in &self.layers {
            l.self_norm.encode(rec, n);
            l.qkv_mm.encode(rec, n);
            l.store_kv.encode(rec, n);
            l.self_attention.encode(rec, 0, n);
            l.out_mm.encode(rec, n);
            l.cross_norm.encode(rec, n);
            l.cross_q_mm.encode(rec, n);
            l.cross_attention.encode(rec, n);
            l.cross_out_mm.encode(rec, n);
            l.mlp_norm.encode(rec, n);
            l.fc1_mm.encode(rec, n);
            l.fc2_mm.encode(rec, n);
        }
    }

    fn encode_sampling(&self, rec: &mut Recorder<'_>, at: u32) {
        self.rules.encode_rules(rec);
        self.sample.encode(rec);
        self.rules.encode_score(rec);
        rec.copy(
            &self.acts.history.buffer,
            u64::from(at) * 4,
            &self.staging,
            0,
            4,
        );
        rec.copy(
            &self.acts.scores.buffer,
            u64::from(at) * 4,
            &self.staging,
            4,
            4,
        );
    }

    fn read_sampled(&self, submission: wgpu::SubmissionIndex) -> Result<Sampled, Error> {
        let v: Vec<u32> = self.gpu.map_read_after(&self.staging, 8, submission)?;
        Ok(Sampled {
            token: v[0],
            logprob: f32::from_bits(v[1]),
        })
    }

    /// Runs the prompt (one batch) and samples the first token. With `probe`, also returns
    /// the raw logits at that prompt position (before any rule), e.g. at
    /// `<|startoftranscript|>` for language detection and the no-speech probability.
    pub fn prefill(
        &mut self,
        ids: &[u32],
        probe: Option<u32>,
    ) -> Result<(Sampled, Option<Vec<f32>>), Error> {
        self.check_prompt(ids)?;
        let gpu = self.gpu.clone();
        let n = ids.len() as u32;
        gpu.queue()
            .write_buffer(&self.acts.history.buffer, 0, bytemuck::cast_slice(ids));
        self.step.write(&gpu, &StepParams::new(0, n));
        let probe = probe.filter(|&p| p < n);
        if let Some(p) = probe {
            self.probe_step.write(&gpu, &StepParams::new(0, p + 1));
        }
        let mut rec = Recorder::new(&gpu);
        rec.clear(&self.acts.seen.buffer);
        self.encode_prompt_layers(&mut rec, n);
        if probe.is_some() {
            self.probe_head_mv.encode(&mut rec);
            rec.copy(
                &self.acts.logits.buffer,
                0,
                &self.logits_staging,
                0,
                u64::from(self.vocab) * 4,
            );
        }
        self.head_mv.encode(&mut rec);
        self.encode_sampling(&mut rec, n);
        let submission = rec.submit();
        let sampled = self.read_sampled(submission.clone())?;
        let logits = match probe {
            Some(_) => Some(gpu.map_read_after(
                &self.logits_staging,
                u64::from(self.vocab) * 4,
                submission,
            )?),
            None => None,
        };
        self.seq_len = n;
        Ok((sampled, logits))
    }

    /// Feeds the last sampled token and samples the next.
    pub fn decode(&mut self) -> Result<Sampled, Error> {
        self.step_with(None)
    }

    /// As `decode`, timing each kernel of the step (timestamp queries).
    pub fn profile_decode(&mut self) -> Result<Vec<crate::gpu::KernelTiming>, Error> {
        let gpu = self.gpu.clone();
        let mut profiler = crate::gpu::Profiler::new(&gpu, 16 * self.layers.len() as u32 + 16);
        self.step_with(Some(&mut profiler))?;
        Ok(profiler.read(&gpu)?)
    }

    fn step_with(&mut self, profiler: Option<&mut crate::gpu::Profiler>) -> Result<Sampled, Error> {
        if self.seq_len == 0 || self.seq_len + 1 >= self.capacity {
            return Err(Error::ContextFull {
                capacity: self.capacity,
            });
        }
        let gpu = self.gpu.clone();
        let mut rec = Recorder::with_profiler(&gpu, profiler);
        self.record_step(&mut rec);
        let submission = rec.submit();
        let sampled = self.read_sampled(submission)?;
        self.seq_len += 1;
        Ok(sampled)
    }

    /// One token's step at the current position, through sampling.
    fn record_step(&self, rec: &mut Recorder<'_>) {
        let pos = self.seq_len;
        self.step.write(&self.gpu, &StepParams::new(pos, 1));
        self.embed.encode(rec, 1);
        for l in &self.layers {
            l.qkv_mv.encode(rec);
            l.split_attention.encode(rec, pos, 1);
            l.out_mv.encode(rec);
            l.cross_q_mv.encode(rec);
            l.cross_attention.encode(rec, 1);
            l.cross_out_mv.encode(rec);
            l.fc1_mv.encode(rec);
            l.fc2_mv.encode(rec);
        }
        self.head_mv.encode(rec);
        self.encode_sampling(rec, pos + 1);
    }

    /// The processed logits of the last step (for tests and tools).
    pub fn last_logits(&self) -> Result<Vec<f32>, Error> {
        Ok(self
            .gpu
            .read(&self.acts.logits.buffer, 0, u64::from(self.vocab))?)
    }
}
