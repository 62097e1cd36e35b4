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
    Attention, Embed, FullAttention, FullLayout, Gelu, MAX_SPLITS, MatMul, MatMulOptions, MatVec,
    MatVecOptions, Matrix, Norm, NormKind, RopeKv, Sample, SamplerParams, SpeechLogits,
    SpeechRules, SpeechTokenIds, SplitAttention, StepParams, WeightDType,
};

use super::config::WhisperConfig;
use super::encoder::{LN_EPS, fused_qkv};

type NormPair = (StorageBuffer, StorageBuffer);

struct LayerWeights {
    self_norm: NormPair,
    qkv: Matrix,
    qkv_b: StorageBuffer,
    out: Matrix,
    out_b: StorageBuffer,
    cross_norm: NormPair,
    cross_q: Matrix,
    cross_q_b: StorageBuffer,
    cross_kv: Matrix,
    cross_kv_b: StorageBuffer,
    cross_out: Matrix,
    cross_out_b: StorageBuffer,
    mlp_norm: NormPair,
    fc1: Matrix,
    fc1_b: StorageBuffer,
    fc2: Matrix,
    fc2_b: StorageBuffer,
}

struct Layer {
    // Prompt path.
    self_norm: Norm,
    qkv_mm: MatMul,
    store_kv: RopeKv,
    self_attention: Attention,
    out_mm: MatMul,
    cross_norm: Norm,
    cross_q_mm: MatMul,
    cross_attention: FullAttention,
    cross_out_mm: MatMul,
    mlp_norm: Norm,
    fc1_mm: MatMul,
    fc2_mm: MatMul,
    // One-token path.
    qkv_mv: MatVec,
    split_attention: Attention,
    out_mv: MatVec,
    cross_q_mv: MatVec,
    cross_out_mv: MatVec,
    fc1_mv: MatVec,
    fc2_mv: MatVec,
    /// The encoder output projected to this layer's cross keys and values `[positions][2d]`.
    cross_kv_mm: MatMul,
    _weights: LayerWeights,
    _buffers: Vec<StorageBuffer>,
}

/// Activations for one prompt batch, shared by the layers.
struct Acts {
    x: StorageBuffer,
    xn: StorageBuffer,
    qkv: StorageBuffer,
    q: StorageBuffer,
    attn: StorageBuffer,
    h: StorageBuffer,
    logits: StorageBuffer,
    history: StorageBuffer,
    seen: StorageBuffer,
    scores: StorageBuffer,
    partials: StorageBuffer,
    stats: StorageBuffer,
}

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

fn norm_pair(up: &mut Uploader<'_>, label: &str, prefix: &str, d: u32) -> Result<NormPair, Error> {
    let w = up.vector(label, &[(&format!("{prefix}.weight"), d)], Some(1.0))?;
    let b = up.vector(label, &[(&format!("{prefix}.bias"), d)], None)?;
    Ok((w, b))
}

fn single(
    up: &mut Uploader<'_>,
    label: &str,
    name: &str,
    rows: u32,
    cols: u32,
) -> Result<Matrix, Error> {
    up.matrix(label, &[Part { name, rows, cols }], false)
}

fn layer_weights(
    up: &mut Uploader<'_>,
    cfg: &WhisperConfig,
    i: u32,
) -> Result<LayerWeights, Error> {
    let n = |s: &str| format!("model.decoder.layers.{i}.{s}");
    let (d, ffn) = (cfg.d_model, cfg.decoder_ffn);
    let label = format!("decoder layer {i}");
    let (qkv, qkv_b) = fused_qkv(up, &label, &format!("model.decoder.layers.{i}"), d)?;
    let (ck, cv) = (
        n("encoder_attn.k_proj.weight"),
        n("encoder_attn.v_proj.weight"),
    );
    let cross_kv = up.matrix(
        &format!("{label} cross kv"),
        &[
            Part {
                name: &ck,
                rows: d,
                cols: d,
            },
            Part {
                name: &cv,
                rows: d,
                cols: d,
            },
        ],
        false,
    )?;
    let cross_kv_b = up.vector_with_zeros(
        &label,
        &[(None, d), (Some(&n("encoder_attn.v_proj.bias")), d)],
    )?;
    Ok(LayerWeights {
        self_norm: norm_pair(up, &label, &n("self_attn_layer_norm"), d)?,
        qkv,
        qkv_b,
        out: single(
            up,
            &format!("{label} out"),
            &n("self_attn.out_proj.weight"),
            d,
            d,
        )?,
        out_b: up.vector(&label, &[(&n("self_attn.out_proj.bias"), d)], None)?,
        cross_norm: norm_pair(up, &label, &n("encoder_attn_layer_norm"), d)?,
        cross_q: single(
            up,
            &format!("{label} cross q"),
            &n("encoder_attn.q_proj.weight"),
            d,
            d,
        )?,
        cross_q_b: up.vector(&label, &[(&n("encoder_attn.q_proj.bias"), d)], None)?,
        cross_kv,
        cross_kv_b,
        cross_out: single(
            up,
            &format!("{label} cross out"),
            &n("encoder_attn.out_proj.weight"),
            d,
            d,
        )?,
        cross_out_b: up.vector(&label, &[(&n("encoder_attn.out_proj.bias"), d)], None)?,
        mlp_norm: norm_pair(up, &label, &n("final_layer_norm"), d)?,
        fc1: single(up, &format!("{label} fc1"), &n("fc1.weight"), ffn, d)?,
        fc1_b: up.vector(&label, &[(&n("fc1.bias"), ffn)], None)?,
        fc2: single(up, &format!("{label} fc2"), &n("fc2.weight"), d, ffn)?,
        fc2_b: up.vector(&label, &[(&n("fc2.bias"), d)], None)?,
    })
}

type FusedNorm<'a> = Option<(NormKind, &'a StorageBuffer, Option<&'a StorageBuffer>, f32)>;

fn fused(n: &NormPair) -> FusedNorm<'_> {
    Some((NormKind::Layer, &n.0, Some(&n.1), LN_EPS))
}

fn bias(v: &StorageBuffer) -> MatMulOptions<'_> {
    MatMulOptions {
        bias: Some(v),
        ..Default::default()
    }
}

fn bias_res(v: &StorageBuffer) -> MatMulOptions<'_> {
    MatMulOptions {
        bias: Some(v),
        residual: true,
        ..Default::default()
    }
}

/// What the layers bind: activations, step uniforms and the encoder.
struct Binding<'a> {
    acts: &'a Acts,
    step: &'a UniformBuffer,
    encoder_out: &'a StorageBuffer,
    encoder_step: &'a UniformBuffer,
    positions: u32,
    capacity: u32,
    dtype: WeightDType,
}

fn build_layer(
    gpu: &Gpu,
    cfg: &WhisperConfig,
    w: LayerWeights,
    b: &Binding<'_>,
) -> Result<Layer, Error> {
    let (d, heads) = (cfg.d_model, cfg.decoder_heads);
    let hd = d / heads;
    let a = b.acts;
    let step = b.step;
    let cache_len = u64::from(heads) * u64::from(b.capacity) * u64::from(hd) * b.dtype.bytes();
    let k_cache = gpu.storage("decoder k cache", cache_len)?;
    let v_cache = gpu.storage("decoder v cache", cache_len)?;
    let cross_kv = gpu.storage("cross kv", u64::from(b.positions) * u64::from(2 * d) * 4)?;
    let ln = |n: &NormPair, x: &StorageBuffer, y: &StorageBuffer| {
        Norm::new(
            gpu,
            NormKind::Layer,
            d,
            LN_EPS,
            &n.0,
            Some(&n.1),
            x,
            y,
            step,
        )
    };
    let mm = |m: &Matrix, x: &StorageBuffer, y: &StorageBuffer, opts: MatMulOptions<'_>| {
        MatMul::new(gpu, m, x, y, step, opts)
    };
    let cross_layout = FullLayout {
        heads,
        kv_heads: heads,
        head_dim: hd,
        keys: b.positions,
        q_stride: d,
        kv_stride: 2 * d,
        k_off: 0,
    };
    Ok(Layer {
        self_norm: ln(&w.self_norm, &a.x, &a.xn)?,
        qkv_mm: mm(&w.qkv, &a.xn, &a.qkv, bias(&w.qkv_b))?,
        store_kv: RopeKv::new(
            gpu, heads, heads, hd, b.capacity, b.dtype, None, &a.qkv, &a.q, &k_cache, &v_cache,
            step,
        )?,
        self_attention: Attention::new(
            gpu, heads, heads, hd, b.capacity, b.dtype, &a.q, &k_cache, &v_cache, &a.attn, step,
        )?,
        out_mm: mm(&w.out, &a.attn, &a.x, bias_res(&w.out_b))?,
        cross_norm: ln(&w.cross_norm, &a.x, &a.xn)?,
        cross_q_mm: mm(&w.cross_q, &a.xn, &a.q, bias(&w.cross_q_b))?,
        cross_attention: FullAttention::new(gpu, cross_layout, &a.q, &cross_kv, &a.attn, step)?,
        cross_out_mm: mm(&w.cross_out, &a.attn, &a.x, bias_res(&w.cross_out_b))?,
        mlp_norm: ln(&w.mlp_norm, &a.x, &a.xn)?,
        fc1_mm: mm(
            &w.fc1,
            &a.xn,
            &a.h,
            MatMulOptions {
                bias: Some(&w.fc1_b),
                gelu: Some(Gelu::Erf),
                ..Default::default()
            },
        )?,
        fc2_mm: mm(&w.fc2, &a.h, &a.x, bias_res(&w.fc2_b))?,
        qkv_mv: MatVec::new(
            gpu,
            &w.qkv,
            &a.x,
            &a.qkv,
            step,
            MatVecOptions {
                norm: fused(&w.self_norm),
                bias: Some(&w.qkv_b),
                ..Default::default()
            },
        )?,
        split_attention: Attention::new_split(
            gpu,
            heads,
            heads,
            hd,
            b.capacity,
            b.dtype,
            &a.qkv,
            None,
            &k_cache,
            &v_cache,
            &a.partials,
            &a.stats,
            step,
        )?,
        out_mv: MatVec::new(
            gpu,
            &w.out,
            &a.attn,
            &a.x,
            step,
            MatVecOptions {
                bias: Some(&w.out_b),
                residual: true,
                combine: Some(SplitAttention {
                    partials: &a.partials,
                    stats: &a.stats,
                    heads,
                    head_dim: hd,
                }),
                ..Default::default()
            },
        )?,
        cross_q_mv: MatVec::new(
            gpu,
            &w.cross_q,
            &a.x,
            &a.q,
            step,
            MatVecOptions {
                norm: fused(&w.cross_norm),
                bias: Some(&w.cross_q_b),
                ..Default::default()
            },
        )?,
        cross_out_mv: MatVec::new(
            gpu,
            &w.cross_out,
            &a.attn,
            &a.x,
            step,
            MatVecOptions {
                bias: Some(&w.cross_out_b),
                residual: true,
                ..Default::default()
            },
        )?,
        fc1_mv: MatVec::new(
            gpu,
            &w.fc1,
            &a.x,
            &a.h,
            step,
            MatVecOptions {
                norm: fused(&w.mlp_norm),
                bias: Some(&w.fc1_b),
                gelu: Some(Gelu::Erf),
                ..Default::default()
            },
        )?,
        fc2_mv: MatVec::new(
            gpu,
            &w.fc2,
            &a.h,
            &a.x,
            step,
            MatVecOptions {
                bias: Some(&w.fc2_b),
                residual: true,
                ..Default::default()
            },
        )?,
        cross_kv_mm: MatMul::new(
            gpu,
            &w.cross_kv,
            b.encoder_out,
            &cross_kv,
            b.encoder_step,
            bias(&w.cross_kv_b),
        )?,
        _weights: w,
        _buffers: vec![k_cache, v_cache, cross_kv],
    })
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
        if self.seq_len == 0 || self.seq_len + 1 >= self.capacity {
            return Err(Error::ContextFull {
                capacity: self.capacity,
            });
        }
        let gpu = self.gpu.clone();
        let pos = self.seq_len;
        self.step.write(&gpu, &StepParams::new(pos, 1));
        let mut rec = Recorder::new(&gpu);
        self.embed.encode(&mut rec, 1);
        for l in &self.layers {
            l.qkv_mv.encode(&mut rec);
            l.split_attention.encode(&mut rec, pos, 1);
            l.out_mv.encode(&mut rec);
            l.cross_q_mv.encode(&mut rec);
            l.cross_attention.encode(&mut rec, 1);
            l.cross_out_mv.encode(&mut rec);
            l.fc1_mv.encode(&mut rec);
            l.fc2_mv.encode(&mut rec);
        }
        self.head_mv.encode(&mut rec);
        self.encode_sampling(&mut rec, pos + 1);
        let submission = rec.submit();
        let sampled = self.read_sampled(submission)?;
        self.seq_len += 1;
        Ok(sampled)
    }

    /// The processed logits of the last step (for tests and tools).
    pub fn last_logits(&self) -> Result<Vec<f32>, Error> {
        Ok(self
            .gpu
            .read(&self.acts.logits.buffer, 0, u64::from(self.vocab))?)
    }
}
