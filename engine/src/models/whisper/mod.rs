//! Whisper speech recognition: a Hugging Face Whisper folder (`config.json`,
//! `model.safetensors`, `tokenizer.json`, `generation_config.json`,
//! `preprocessor_config.json`) loaded onto the GPU, and transcription of 16 kHz audio window
//! by window ([`transcribe`]).
//!
//! The path of audio: samples → log-mel spectrogram ([`crate::audio::LogMel`]) → encoder
//! ([`encoder`]) → cross keys/values → decoder with Whisper's logit rules ([`decoder`]) →
//! tokens → segments with timestamps ([`transcribe`]).

mod config;
mod decoder;
mod decoder_layer;
mod encoder;
pub mod streaming;
pub mod subtitles;
mod tokens;
pub mod transcribe;

use std::path::Path;

pub use config::{WhisperConfig, WhisperGeneration};
pub use decoder::Sampled;
pub use tokens::{LANGUAGES, SpecialTokens, Task, language_code, multilingual_by_vocab};
pub use transcribe::{Progress, Segment, TranscribeOptions, Transcriber, Transcript};

use crate::Error;
use crate::audio::LogMel;
use crate::gpu::{Gpu, Recorder};
use crate::load::{GgmlType, LoadError, SafeTensors, TextTokenizer};
use crate::models::weights::{Uploader, WeightSource};
use crate::ops::{SamplerParams, SpeechRules, SpeechTokenIds, WeightDType};
use decoder::Decoder;
use encoder::Encoder;

/// How to place a Whisper model on the GPU.
#[derive(Clone, Debug)]
pub struct WhisperOptions {
    pub dtype: WeightDType,
    /// Quantize the weight matrices while loading (Q8_0 is the one offered).
    pub quantize: Option<GgmlType>,
}

impl Default for WhisperOptions {
    fn default() -> Self {
        Self {
            dtype: WeightDType::F16,
            quantize: None,
        }
    }
}

/// What a loaded speech model is, for the UI and the CLI.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct SpeechModelInfo {
    pub name: String,
    pub parameters: u64,
    pub weight_bytes: u64,
    pub cache_bytes: u64,
    pub dtype: String,
    pub multilingual: bool,
    pub n_mels: u32,
}

/// A decoded window: the generated tokens (with the end token if one ended it) and their
/// log-probabilities.
#[derive(Clone, Debug, Default)]
pub struct WindowTokens {
    pub tokens: Vec<u32>,
    pub logprobs: Vec<f32>,
    /// Raw logits at the probed prompt position.
    pub probe_logits: Option<Vec<f32>>,
}

pub struct WhisperModel {
    gpu: Gpu,
    pub config: WhisperConfig,
    pub generation: WhisperGeneration,
    pub tokens: SpecialTokens,
    pub tokenizer: TextTokenizer,
    mel: LogMel,
    encoder: Encoder,
    decoder: Decoder,
    name: String,
    weight_bytes: u64,
    dtype: WeightDType,
    /// A hash of the window the encoder last ran on: the same window (decoded again with
    /// other settings) is not encoded twice.
    encoded: Option<u64>,
}

fn window_hash(window: &[f32]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for v in window {
        v.to_bits().hash(&mut h);
    }
    h.finish()
}

/// Whether `path` is a Whisper model folder (its config says `model_type: whisper`).
pub fn is_whisper_dir(path: &Path) -> bool {
    let config = path.join("config.json");
    std::fs::read_to_string(config)
        .ok()
        .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
        .and_then(|v| v.get("model_type")?.as_str().map(|t| t == "whisper"))
        .unwrap_or(false)
}

impl WhisperModel {
    pub fn load(gpu: &Gpu, path: &Path, opts: &WhisperOptions) -> Result<Self, Error> {
        if !path.is_dir() {
            return Err(if path.exists() {
                Error::Invalid(format!(
                    "{}: expected a Whisper model folder (config.json, model.safetensors, and tokenizer.json or vocab.json + merges.txt)",
                    path.display()
                ))
            } else {
                LoadError::Missing {
                    path: path.to_owned(),
                }
                .into()
            });
        }
        let config = WhisperConfig::from_file(&path.join("config.json"))?;
        if config.scale_embedding {
            return Err(Error::Invalid(
                "scale_embedding is not used by any Whisper checkpoint and is not supported".into(),
            ));
        }
        let generation = WhisperGeneration::from_dir(path)?;
        let tokenizer = TextTokenizer::from_dir(path)?;
        let tokens = SpecialTokens::resolve(&config, &generation, &tokenizer)?;
        let weights = SafeTensors::open_dir(path)?;
        let device = gpu.device();
        let oom = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let built = Self::upload(gpu, &config, &tokens, WeightSource::Files(&weights), opts);
        if let Some(err) = pollster::block_on(oom.pop()) {
            return Err(Error::Invalid(format!(
                "the GPU ran out of memory loading this model (about {:.2} GiB of weights as {:?}): {err}",
                (config.parameters() * opts.dtype.bytes()) as f64 / f64::from(1u32 << 30),
                opts.dtype
            )));
        }
        let (encoder, decoder, weight_bytes) = built?;
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        Ok(Self {
            gpu: gpu.clone(),
            mel: LogMel::new(config.n_mels as usize),
            config,
            generation,
            tokens,
            tokenizer,
            encoder,
            decoder,
            name,
            weight_bytes,
            dtype: opts.dtype,
            encoded: None,
        })
    }

    /// A model of `config`'s shape with random weights on the GPU and no tokenizer, for
    /// benchmarks at real shapes.
    pub fn random(gpu: &Gpu, config: WhisperConfig, opts: &WhisperOptions) -> Result<Self, Error> {
        let tokens = SpecialTokens::synthetic(config.vocab);
        let (encoder, decoder, weight_bytes) = Self::upload(
            gpu,
            &config,
            &tokens,
            WeightSource::Random { seed: 1 },
            opts,
        )?;
        let empty = tokenizers::Tokenizer::new(tokenizers::models::bpe::BPE::default());
        Ok(Self {
            gpu: gpu.clone(),
            mel: LogMel::new(config.n_mels as usize),
            config,
            generation: WhisperGeneration::default(),
            tokens,
            tokenizer: TextTokenizer::from_parts(empty, None, None),
            encoder,
            decoder,
            name: "random weights".into(),
            weight_bytes,
            dtype: opts.dtype,
            encoded: None,
        })
    }

    /// Times the encoder over the current window (including the cross key/value
    /// projections), waiting for the GPU.
    pub fn time_encode(&mut self, window: &[f32]) -> Result<std::time::Duration, Error> {
        self.encoded = None;
        let start = std::time::Instant::now();
        self.encode(window)?;
        self.gpu.wait()?;
        Ok(start.elapsed())
    }

    /// Per-kernel GPU time of the encoder over the current window (timestamp queries).
    pub fn profile_encode(&mut self) -> Result<Vec<crate::gpu::KernelTiming>, Error> {
        if !self.gpu.caps().timestamps {
            return Err(Error::Invalid("this GPU has no timestamp queries".into()));
        }
        let mut profiler =
            crate::gpu::Profiler::new(&self.gpu, 16 * self.config.encoder_layers + 64);
        let mut rec = Recorder::with_profiler(&self.gpu, Some(&mut profiler));
        self.encoder.encode(&mut rec);
        self.decoder
            .encode_cross_kv(&mut rec, self.encoder.positions_len);
        rec.submit();
        self.gpu.wait()?;
        Ok(profiler.read(&self.gpu)?)
    }

    /// Per-kernel GPU time of one decoder step after `prompt` and `n` decoded tokens (after
    /// `profile_encode` or a transcription, so the cross-attention keys exist).
    pub fn profile_decode(
        &mut self,
        prompt: &[u32],
        n: u32,
    ) -> Result<Vec<crate::gpu::KernelTiming>, Error> {
        self.time_decode(prompt, n)?;
        self.decoder.profile_decode()
    }

    /// Times a prompt of `prompt` and then `n` more decoded tokens whatever they are (no end
    /// token stops it): (prompt time, decode time).
    pub fn time_decode(
        &mut self,
        prompt: &[u32],
        n: u32,
    ) -> Result<(std::time::Duration, std::time::Duration), Error> {
        self.decoder
            .configure(&SamplerParams::default(), &SpeechRules::default());
        let start = std::time::Instant::now();
        self.decoder.prefill(prompt, None)?;
        let prefill = start.elapsed();
        let start = std::time::Instant::now();
        for _ in 0..n.min(
            self.decoder
                .capacity()
                .saturating_sub(prompt.len() as u32 + 2),
        ) {
            self.decoder.decode()?;
        }
        Ok((prefill, start.elapsed()))
    }

    fn upload(
        gpu: &Gpu,
        config: &WhisperConfig,
        tokens: &SpecialTokens,
        source: WeightSource<'_>,
        opts: &WhisperOptions,
    ) -> Result<(Encoder, Decoder, u64), Error> {
        let mut up = Uploader::new(gpu, source, opts.dtype);
        up.quantize = opts.quantize;
        let encoder = Encoder::build(gpu, &mut up, config)?;
        let ids = SpeechTokenIds {
            vocab: config.vocab,
            eot: tokens.eot,
            no_timestamps: tokens.no_timestamps,
            timestamp_begin: tokens.timestamp_begin,
        };
        let decoder = Decoder::build(
            gpu,
            &mut up,
            config,
            ids,
            &encoder.output,
            &encoder.positions_step,
        )?;
        gpu.finish_uploads()?;
        Ok((encoder, decoder, up.bytes))
    }

    pub fn info(&self) -> SpeechModelInfo {
        SpeechModelInfo {
            name: self.name.clone(),
            parameters: self.config.parameters(),
            weight_bytes: self.weight_bytes,
            cache_bytes: self.decoder.cache_bytes,
            dtype: format!("{:?}", self.dtype).to_lowercase(),
            multilingual: self.tokens.multilingual,
            n_mels: self.config.n_mels,
        }
    }

    pub fn mel(&self) -> &LogMel {
        &self.mel
    }

    /// Mel frames per window.
    pub fn window_frames(&self) -> usize {
        self.config.window_frames() as usize
    }

    /// Runs the encoder over one window `[n_mels][window_frames]` and projects the cross
    /// keys and values of every decoder layer.
    pub fn encode(&mut self, window: &[f32]) -> Result<(), Error> {
        let want = self.config.n_mels as usize * self.window_frames();
        if window.len() != want {
            return Err(Error::Invalid(format!(
                "a window holds {want} mel values, not {}",
                window.len()
            )));
        }
        let hash = window_hash(window);
        if self.encoded == Some(hash) {
            return Ok(());
        }
        self.encoded = Some(hash);
        self.gpu
            .queue()
            .write_buffer(&self.encoder.mel.buffer, 0, bytemuck::cast_slice(window));
        let mut rec = Recorder::in_parts(&self.gpu);
        self.encoder.encode(&mut rec);
        self.decoder
            .encode_cross_kv(&mut rec, self.encoder.positions_len);
        rec.submit();
        Ok(())
    }

    /// The encoder output of the last window `[positions][d_model]` (for tests and tools).
    pub fn encoder_output(&self) -> Result<Vec<f32>, Error> {
        let n = u64::from(self.encoder.positions_len) * u64::from(self.config.d_model);
        Ok(self.gpu.read(&self.encoder.output.buffer, 0, n)?)
    }

    /// Language probabilities for the encoded window, best first: the decoder's logits after
    /// `<|startoftranscript|>`, restricted to language tokens.
    pub fn detect_language(&mut self) -> Result<Vec<(&'static str, f32)>, Error> {
        if self.tokens.languages.is_empty() {
            return Err(Error::Invalid(
                "this model knows no languages to detect".into(),
            ));
        }
        self.decoder
            .configure(&SamplerParams::default(), &SpeechRules::default());
        let (_, logits) = self.decoder.prefill(&[self.tokens.sot], Some(0))?;
        let logits = logits.unwrap_or_default();
        let lang: Vec<(&'static str, f32)> = self
            .tokens
            .languages
            .iter()
            .filter_map(|&(code, id)| Some((code, *logits.get(id as usize)?)))
            .collect();
        let max = lang.iter().map(|l| l.1).fold(f32::NEG_INFINITY, f32::max);
        let total: f32 = lang.iter().map(|l| (l.1 - max).exp()).sum();
        let mut probs: Vec<_> = lang
            .into_iter()
            .map(|(c, l)| (c, (l - max).exp() / total))
            .collect();
        probs.sort_by(|a, b| b.1.total_cmp(&a.1));
        Ok(probs)
    }

    /// Decodes the encoded window from `prompt` until the end token, `max_tokens` or
    /// `stop()`. `probe` asks for the raw logits at that prompt position.
    pub fn decode(
        &mut self,
        prompt: &[u32],
        rules: &SpeechRules,
        sampler: &SamplerParams,
        max_tokens: u32,
        probe: Option<u32>,
        mut stop: impl FnMut(&[u32]) -> bool,
    ) -> Result<WindowTokens, Error> {
        self.decoder.configure(sampler, rules);
        let (first, probe_logits) = self.decoder.prefill(prompt, probe)?;
        let mut out = WindowTokens {
            tokens: vec![first.token],
            logprobs: vec![first.logprob],
            probe_logits,
        };
        let room = self.decoder.capacity().saturating_sub(1);
        while out.tokens.last() != Some(&self.tokens.eot)
            && (out.tokens.len() as u32) < max_tokens
            && self.decoder.seq_len() + 1 < room
            && !stop(&out.tokens)
        {
            let s = self.decoder.decode()?;
            out.tokens.push(s.token);
            out.logprobs.push(s.logprob);
        }
        Ok(out)
    }

    /// The processed logits of the last decoded step.
    pub fn last_logits(&self) -> Result<Vec<f32>, Error> {
        self.decoder.last_logits()
    }

    /// Text of `ids` with special and timestamp tokens left out.
    pub fn text(&self, ids: &[u32]) -> Result<String, Error> {
        let text: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|&id| id < self.tokens.eot)
            .collect();
        Ok(self.tokenizer.decode(&text, true)?)
    }
}
