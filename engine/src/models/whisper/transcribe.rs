//! Transcription of any length of 16 kHz audio, as OpenAI's reference and transformers do
//! it: 30 s windows; the first window detects the language of a multilingual model when
//! none is given; each window is decoded greedily (temperature 0) and decoded again at rising
//! temperatures while the result looks degenerate (too compressible, or too unlikely); a
//! window the model thinks holds no speech is skipped; with timestamps, the window is cut
//! into segments at timestamp pairs and the next window starts at the last timestamp, with
//! the text so far as the prompt.

use std::io::Write;

use serde::Serialize;

use super::WhisperModel;
use super::tokens::{Task, language_code};
use crate::Error;
use crate::audio::SAMPLE_RATE;
use crate::ops::{SamplerParams, SpeechRules};

/// Samples per mel frame.
const HOP: usize = 160;
/// One window's audio: 30 s.
pub const WINDOW_SAMPLES: usize = 480_000;
/// Seconds per timestamp step.
const TIME_PRECISION: f64 = 0.02;
/// Mel frames per encoder position (and so per timestamp step).
const FRAMES_PER_POSITION: usize = 2;

#[derive(Clone, Debug)]
pub struct TranscribeOptions {
    /// A language code or name; None detects it (multilingual models) or uses English.
    pub language: Option<String>,
    pub task: Task,
    pub timestamps: bool,
    /// Temperatures tried in turn while a window's result needs a fallback.
    pub temperatures: Vec<f32>,
    pub compression_ratio_threshold: Option<f32>,
    pub logprob_threshold: Option<f32>,
    pub no_speech_threshold: Option<f32>,
    pub condition_on_previous_text: bool,
    pub initial_prompt: Option<String>,
    pub seed: u64,
    /// Most tokens a window may generate (None: as many as the decoder holds).
    pub max_new_tokens: Option<u32>,
}

impl Default for TranscribeOptions {
    fn default() -> Self {
        Self {
            language: None,
            task: Task::Transcribe,
            timestamps: true,
            temperatures: vec![0.0, 0.2, 0.4, 0.6, 0.8, 1.0],
            compression_ratio_threshold: Some(2.4),
            logprob_threshold: Some(-1.0),
            no_speech_threshold: Some(0.6),
            condition_on_previous_text: true,
            initial_prompt: None,
            seed: 0,
            max_new_tokens: None,
        }
    }
}

impl TranscribeOptions {
    /// Greedy decoding only: one temperature, no fallback.
    pub fn without_fallback(mut self) -> Self {
        self.temperatures = vec![self.temperatures.first().copied().unwrap_or(0.0)];
        self.compression_ratio_threshold = None;
        self.logprob_threshold = None;
        self.no_speech_threshold = None;
        self
    }
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Segment {
    pub start: f64,
    pub end: f64,
    pub text: String,
    #[serde(skip)]
    pub tokens: Vec<u32>,
    #[serde(skip)]
    pub avg_logprob: f32,
    #[serde(skip)]
    pub no_speech_prob: f32,
    #[serde(skip)]
    pub temperature: f32,
}

#[derive(Clone, Debug, Default)]
pub struct Transcript {
    pub language: Option<String>,
    pub segments: Vec<Segment>,
    pub text: String,
    /// The first window's decoder prompt.
    pub prompt_tokens: Vec<u32>,
    /// The first window's generated tokens (no prompt, no end token).
    pub tokens: Vec<u32>,
    pub audio_s: f64,
    pub windows: u32,
    /// Tokens decoded in all windows, fallbacks included.
    pub decoded_tokens: u64,
}

/// What a transcription reports while it runs.
pub enum Progress<'a> {
    Language {
        code: &'a str,
        probability: f32,
    },
    Segment(&'a Segment),
    /// Audio seconds transcribed so far, of the total.
    Position {
        done_s: f64,
        total_s: f64,
    },
}

/// transformers' compression ratio of a window: its token ids as little-endian integers of
/// the vocabulary's width, against their zlib-compressed size.
pub fn compression_ratio(tokens: &[u32], vocab: u32) -> f32 {
    if tokens.is_empty() {
        return 0.0;
    }
    let width = ((f64::from(vocab).log2() / 8.0) as usize + 1).min(4);
    let bytes: Vec<u8> = tokens
        .iter()
        .flat_map(|t| t.to_le_bytes().into_iter().take(width))
        .collect();
    let mut enc = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    if enc.write_all(&bytes).is_err() {
        return 0.0;
    }
    match enc.finish() {
        Ok(c) if !c.is_empty() => bytes.len() as f32 / c.len() as f32,
        _ => 0.0,
    }
}

/// One window's decoding at the temperature that was kept.
struct WindowResult {
    tokens: Vec<u32>,
    avg_logprob: f32,
    no_speech_prob: f32,
    temperature: f32,
    prompt: Vec<u32>,
    decoded: u64,
}

pub struct Transcriber<'m> {
    model: &'m mut WhisperModel,
    opts: TranscribeOptions,
    language: Option<String>,
}

impl<'m> Transcriber<'m> {
    pub fn new(model: &'m mut WhisperModel, opts: TranscribeOptions) -> Result<Self, Error> {
        let language = match opts.language.as_deref() {
            None | Some("auto") | Some("") => None,
            Some(l) => Some(
                language_code(l)
                    .ok_or_else(|| {
                        Error::Invalid(format!("{l:?} is not a language Whisper knows"))
                    })?
                    .to_owned(),
            ),
        };
        if !model.tokens.multilingual {
            if language.as_deref().is_some_and(|l| l != "en") {
                return Err(Error::Invalid(
                    "this model is English-only; choose a multilingual model for other languages"
                        .into(),
                ));
            }
            if opts.task == Task::Translate {
                return Err(Error::Invalid(
                    "this model is English-only and cannot translate".into(),
                ));
            }
        } else if let Some(l) = &language
            && model.tokens.language_id(l).is_none()
        {
            return Err(Error::Invalid(format!(
                "this model has no token for language {l:?}"
            )));
        }
        if opts.task == Task::Translate && model.tokens.translate.is_none() {
            return Err(Error::Invalid(
                "this model has no <|translate|> token".into(),
            ));
        }
        Ok(Self {
            model,
            opts,
            language,
        })
    }

    /// Transcribes `samples` (16 kHz mono). `cancelled` is polled before every token; a
    /// cancelled transcription returns what was finished.
    pub fn run(
        &mut self,
        samples: &[f32],
        cancelled: &dyn Fn() -> bool,
        on: &mut dyn FnMut(Progress<'_>),
    ) -> Result<Transcript, Error> {
        let audio_s = samples.len() as f64 / f64::from(SAMPLE_RATE);
        let mut out = Transcript {
            audio_s,
            language: self.language.clone(),
            ..Default::default()
        };
        if samples.is_empty() {
            return Ok(out);
        }
        let mel = self.model.mel().compute(samples, WINDOW_SAMPLES);
        let window_frames = self.model.window_frames();
        // Audio up to 30 s is one zero-padded window, as transformers pads it; longer audio
        // runs to its last frame.
        let content_frames = mel.frames;
        let mut seek = 0usize;
        let mut context: Vec<u32> = match &self.opts.initial_prompt {
            Some(p) => self
                .model
                .tokenizer
                .encode(&format!(" {}", p.trim()), false)?,
            None => Vec::new(),
        };
        while seek < content_frames.max(1) && !cancelled() {
            let segment_frames = window_frames
                .min(content_frames.saturating_sub(seek))
                .max(1);
            let offset_s = (seek * HOP) as f64 / f64::from(SAMPLE_RATE);
            self.model.encode(&mel.window(seek, window_frames))?;
            if self.language.is_none() {
                self.detect(&mut out, on)?;
            }
            let result = self.decode_window(&context, cancelled)?;
            out.decoded_tokens += result.decoded;
            if out.windows == 0 {
                out.prompt_tokens = result.prompt.clone();
                out.tokens = result.tokens.clone();
            }
            out.windows += 1;
            if self.is_silence(&result) {
                seek += segment_frames;
                continue;
            }
            let (segments, advance) = self.segments(&result, offset_s, segment_frames, audio_s);
            for s in &segments {
                on(Progress::Segment(s));
            }
            seek += advance.max(1);
            if self.opts.condition_on_previous_text && result.temperature <= 0.5 {
                // The kept segments' tokens, timestamps included (a trailing pair keeps
                // only its first timestamp); text after the last pair is decoded again.
                for s in &segments {
                    let t = &self.model.tokens;
                    let n = s.tokens.len();
                    let pair_end = n >= 2
                        && t.is_timestamp(s.tokens[n - 1])
                        && t.is_timestamp(s.tokens[n - 2]);
                    context.extend(&s.tokens[..if pair_end { n - 1 } else { n }]);
                }
            } else {
                context.clear();
            }
            out.segments.extend(segments);
            on(Progress::Position {
                done_s: ((seek * HOP) as f64 / f64::from(SAMPLE_RATE)).min(audio_s),
                total_s: audio_s,
            });
        }
        // Decoded as one sequence, so words split across segments join as transformers
        // joins them.
        let all: Vec<u32> = out
            .segments
            .iter()
            .flat_map(|s| s.tokens.iter().copied())
            .collect();
        out.text = self.model.text(&all)?.trim().to_owned();
        Ok(out)
    }

    fn detect(
        &mut self,
        out: &mut Transcript,
        on: &mut dyn FnMut(Progress<'_>),
    ) -> Result<(), Error> {
        let code = if self.model.tokens.multilingual {
            let probs = self.model.detect_language()?;
            let (code, p) = probs.first().copied().unwrap_or(("en", 1.0));
            on(Progress::Language {
                code,
                probability: p,
            });
            code
        } else {
            "en"
        };
        self.language = Some(code.to_owned());
        out.language = Some(code.to_owned());
        Ok(())
    }

    fn is_silence(&self, r: &WindowResult) -> bool {
        match (self.opts.no_speech_threshold, self.opts.logprob_threshold) {
            (Some(ns), Some(lp)) => r.no_speech_prob > ns && r.avg_logprob < lp,
            (Some(ns), None) => r.no_speech_prob > ns,
            _ => false,
        }
    }

    /// The prompt of a window: the previous text after `<|startofprev|>` (at most half the
    /// decoder's positions), then the task tokens.
    fn prompt(&self, context: &[u32]) -> (Vec<u32>, u32) {
        let t = &self.model.tokens;
        let mut prompt = Vec::new();
        if let (Some(prev), false) = (t.start_of_prev, context.is_empty()) {
            let keep = (self.model.config.max_target_positions / 2).saturating_sub(1) as usize;
            prompt.push(prev);
            prompt.extend(&context[context.len().saturating_sub(keep)..]);
        }
        let sot_index = prompt.len() as u32;
        prompt.extend(t.prompt(
            self.language.as_deref(),
            self.opts.task,
            self.opts.timestamps,
        ));
        (prompt, sot_index)
    }

    fn decode_window(
        &mut self,
        context: &[u32],
        cancelled: &dyn Fn() -> bool,
    ) -> Result<WindowResult, Error> {
        let (prompt, sot_index) = self.prompt(context);
        let eot = self.model.tokens.eot;
        let vocab = self.model.config.vocab;
        let no_speech = self.model.tokens.no_speech;
        let max_tokens = self
            .model
            .config
            .max_target_positions
            .saturating_sub(prompt.len() as u32)
            .min(self.opts.max_new_tokens.unwrap_or(u32::MAX));
        let mut kept: Option<WindowResult> = None;
        let mut decoded = 0;
        let temperatures = if self.opts.temperatures.is_empty() {
            vec![0.0]
        } else {
            self.opts.temperatures.clone()
        };
        for (i, &temperature) in temperatures.iter().enumerate() {
            let rules = SpeechRules {
                timestamps: self.opts.timestamps,
                begin_index: prompt.len() as u32,
                max_initial_timestamp: self.model.generation.max_initial_timestamp_index,
                suppress: self.model.generation.suppress_tokens.clone(),
                begin_suppress: self.model.generation.begin_suppress_tokens.clone(),
                temperature,
            };
            let sampler = SamplerParams {
                temperature,
                seed: self.opts.seed.wrapping_add(i as u64),
                ..Default::default()
            };
            let probe = no_speech.map(|_| sot_index);
            let w = self
                .model
                .decode(&prompt, &rules, &sampler, max_tokens, probe, |_| {
                    cancelled()
                })?;
            decoded += w.tokens.len() as u64;
            let mut tokens = w.tokens;
            if tokens.last() == Some(&eot) {
                tokens.pop();
            }
            let sum: f32 = w.logprobs.iter().sum();
            let avg_logprob = sum / (tokens.len() as f32 + 1.0);
            let no_speech_prob = match (no_speech, &w.probe_logits) {
                (Some(id), Some(logits)) => softmax_at(logits, id as usize),
                _ => 0.0,
            };
            let ratio = compression_ratio(&tokens, vocab);
            let result = WindowResult {
                tokens,
                avg_logprob,
                no_speech_prob,
                temperature,
                prompt: prompt.clone(),
                decoded,
            };
            let too_repetitive = self
                .opts
                .compression_ratio_threshold
                .is_some_and(|t| ratio > t);
            let too_unlikely = self.opts.logprob_threshold.is_some_and(|t| avg_logprob < t);
            let fallback = (too_repetitive || too_unlikely) && !self.is_silence(&result);
            kept = Some(result);
            if !fallback || cancelled() {
                break;
            }
        }
        let mut kept =
            kept.ok_or_else(|| Error::Invalid("no temperature to decode with".into()))?;
        kept.decoded = decoded;
        Ok(kept)
    }

    /// Segments of a decoded window and how many mel frames to move on.
    fn segments(
        &self,
        r: &WindowResult,
        offset_s: f64,
        segment_frames: usize,
        audio_s: f64,
    ) -> (Vec<Segment>, usize) {
        let t = &self.model.tokens;
        let tokens = &r.tokens;
        let is_ts: Vec<bool> = tokens.iter().map(|&id| t.is_timestamp(id)).collect();
        let make = |slice: &[u32], start: f64, end: f64| Segment {
            start,
            end,
            text: self.model.text(slice).unwrap_or_default().trim().to_owned(),
            tokens: slice.to_vec(),
            avg_logprob: r.avg_logprob,
            no_speech_prob: r.no_speech_prob,
            temperature: r.temperature,
        };
        let ts_time = |id: u32| f64::from(id - t.timestamp_begin) * TIME_PRECISION;
        let single_ending = is_ts.len() >= 2 && !is_ts[is_ts.len() - 2] && is_ts[is_ts.len() - 1]
            || is_ts.len() == 1 && is_ts[0];
        let mut cuts: Vec<usize> = (1..is_ts.len())
            .filter(|&i| is_ts[i - 1] && is_ts[i])
            .collect();
        let mut segments = Vec::new();
        if !self.opts.timestamps || cuts.is_empty() {
            let mut duration = segment_frames as f64 * HOP as f64 / f64::from(SAMPLE_RATE);
            if let Some(&last) = tokens.iter().rev().find(|&&id| t.is_timestamp(id))
                && last != t.timestamp_begin
            {
                duration = ts_time(last);
            }
            if tokens.iter().any(|&id| !t.is_timestamp(id)) {
                // The zero padding of a short clip is no part of its last segment.
                let end = (offset_s + duration).min(audio_s.max(offset_s));
                segments.push(make(tokens, offset_s, end));
            }
            return (segments, segment_frames);
        }
        if single_ending {
            cuts.push(tokens.len());
        }
        let mut last_cut = 0;
        for &cut in &cuts {
            let slice = &tokens[last_cut..cut];
            if let (Some(&first), Some(&last)) = (slice.first(), slice.last())
                && t.is_timestamp(first)
                && t.is_timestamp(last)
            {
                let seg = make(slice, offset_s + ts_time(first), offset_s + ts_time(last));
                if !seg.text.is_empty() {
                    segments.push(seg);
                }
            }
            last_cut = cut;
        }
        let advance = if single_ending {
            segment_frames
        } else {
            let last_ts = tokens[last_cut - 1];
            (last_ts - t.timestamp_begin) as usize * FRAMES_PER_POSITION
        };
        (segments, advance)
    }
}

/// softmax(logits)[index], computed stably.
fn softmax_at(logits: &[f32], index: usize) -> f32 {
    let Some(&at) = logits.get(index) else {
        return 0.0;
    };
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let total: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    (f64::from(at - max).exp() / total) as f32
}
