//! Live transcription inside the speech service: audio from a [`LiveInput`] is buffered,
//! checked for voice (earshot), transcribed again about once a second while someone speaks,
//! and turned into partial and committed text by [`LocalAgreement`]. A pause (or the end of
//! the input, or Stop) commits the rest of the utterance. When transcription is slower than
//! real time, audio waits in the buffer and the events report the lag.

use std::time::Instant;

use super::speech::SpeechEvent;
use crate::Error;
use crate::audio::{InputState, LiveInput, SAMPLE_RATE};
use crate::models::whisper::streaming::{Hypothesis, HypothesisSegment, LocalAgreement, Update};
use crate::models::whisper::{TranscribeOptions, Transcriber, WhisperModel};

/// How live captions behave.
#[derive(Clone, Debug)]
pub struct ListenOptions {
    /// Language and task; timestamps are always on and fallback off (speed matters here).
    pub transcribe: TranscribeOptions,
    /// Seconds of new audio between two passes over the buffer.
    pub interval: f64,
    /// Seconds of silence after speech that end an utterance.
    pub pause: f64,
    /// earshot's voice score above which a 16 ms frame counts as speech.
    pub voice_threshold: f32,
}

impl Default for ListenOptions {
    fn default() -> Self {
        Self {
            transcribe: TranscribeOptions::default(),
            interval: 1.0,
            pause: 0.8,
            voice_threshold: 0.5,
        }
    }
}

/// earshot's frame: 16 ms at 16 kHz.
const VAD_FRAME: usize = 256;
/// Audio kept before the first voiced frame, so a word's onset is not cut.
const LEAD_IN: f64 = 0.3;
/// Characters of committed text given to each pass as its prompt.
const PROMPT_CHARS: usize = 200;

struct State {
    /// Audio of the current utterance, from `buffer_start` (seconds since listening began).
    buffer: Vec<f32>,
    buffer_start: f64,
    /// Samples received in all.
    received: usize,
    /// Buffer length at the last pass.
    decoded_len: usize,
    vad: Box<earshot::Detector>,
    vad_pending: Vec<f32>,
    voiced: bool,
    silence: f64,
    policy: LocalAgreement,
    committed: String,
    language: Option<String>,
}

fn secs(samples: usize) -> f64 {
    samples as f64 / f64::from(SAMPLE_RATE)
}

/// What a live session heard.
pub struct Heard {
    /// All committed text.
    pub text: String,
    /// Seconds of audio received.
    pub audio_s: f64,
    pub language: Option<String>,
}

/// Runs until the input ends or `cancelled()`.
pub fn listen(
    model: &mut WhisperModel,
    request: u64,
    mut input: LiveInput,
    opts: &ListenOptions,
    cancelled: &dyn Fn() -> bool,
    send: &dyn Fn(SpeechEvent),
) -> Result<Heard, Error> {
    let started = Instant::now();
    let mut st = State {
        buffer: Vec::new(),
        buffer_start: 0.0,
        received: 0,
        decoded_len: 0,
        vad: earshot::Detector::default_boxed(),
        vad_pending: Vec::new(),
        voiced: false,
        silence: 0.0,
        policy: LocalAgreement::default(),
        committed: String::new(),
        language: opts.transcribe.language.clone(),
    };
    send(SpeechEvent::Listening {
        request,
        input: input.name().to_owned(),
    });
    let mut fresh = Vec::new();
    loop {
        fresh.clear();
        let state = input.poll(&mut fresh);
        let stop = cancelled() || (state == InputState::Ended && fresh.is_empty());
        if !fresh.is_empty() {
            take_audio(&mut st, &fresh, opts);
            send(SpeechEvent::Level {
                request,
                rms: rms(&fresh),
                elapsed_s: started.elapsed().as_secs_f64(),
                lag_s: secs(st.buffer.len() - st.decoded_len.min(st.buffer.len())),
            });
        }
        if stop {
            if st.voiced {
                finish_utterance(model, &mut st, opts, request, started, send)?;
            }
            return Ok(Heard {
                text: st.committed.trim().to_owned(),
                audio_s: secs(st.received),
                language: st.language,
            });
        }
        if st.voiced && st.silence >= opts.pause {
            finish_utterance(model, &mut st, opts, request, started, send)?;
        } else if st.voiced && secs(st.buffer.len() - st.decoded_len) >= opts.interval {
            let hyp = hypothesis(model, &mut st, opts)?;
            let buffer_s = secs(st.buffer.len());
            let update = st.policy.update(&hyp, buffer_s);
            publish(model, &mut st, &update, request, started, send)?;
            if let Some(cut) = update.cut {
                let n = ((cut * f64::from(SAMPLE_RATE)) as usize).min(st.buffer.len());
                st.buffer.drain(..n);
                st.decoded_len = st.decoded_len.saturating_sub(n);
                st.buffer_start += secs(n);
            }
        } else if fresh.is_empty() {
            std::thread::sleep(std::time::Duration::from_millis(15));
        }
    }
}

/// Appends new audio, runs the voice detector over it, and keeps only a short lead-in
/// while nobody speaks.
fn take_audio(st: &mut State, fresh: &[f32], opts: &ListenOptions) {
    st.received += fresh.len();
    st.buffer.extend_from_slice(fresh);
    st.vad_pending.extend_from_slice(fresh);
    let frames = st.vad_pending.len() / VAD_FRAME;
    for f in 0..frames {
        let frame = &st.vad_pending[f * VAD_FRAME..(f + 1) * VAD_FRAME];
        if st.vad.predict_f32(frame) >= opts.voice_threshold {
            st.voiced = true;
            st.silence = 0.0;
        } else {
            st.silence += secs(VAD_FRAME);
        }
    }
    st.vad_pending.drain(..frames * VAD_FRAME);
    if !st.voiced {
        let keep = (LEAD_IN * f64::from(SAMPLE_RATE)) as usize;
        if st.buffer.len() > keep {
            let n = st.buffer.len() - keep;
            st.buffer.drain(..n);
            st.buffer_start += secs(n);
            st.decoded_len = 0;
        }
    }
}

/// Transcribes the buffer, with the committed text so far as the prompt.
fn hypothesis(
    model: &mut WhisperModel,
    st: &mut State,
    opts: &ListenOptions,
) -> Result<Hypothesis, Error> {
    st.decoded_len = st.buffer.len();
    let tail: String = {
        let chars: Vec<char> = st.committed.chars().collect();
        chars[chars.len().saturating_sub(PROMPT_CHARS)..]
            .iter()
            .collect()
    };
    let mut t_opts = TranscribeOptions {
        timestamps: true,
        language: st.language.clone(),
        initial_prompt: (!tail.trim().is_empty()).then_some(tail),
        condition_on_previous_text: false,
        ..opts.transcribe.clone()
    }
    .without_fallback();
    t_opts.no_speech_threshold = None;
    let transcript = Transcriber::new(model, t_opts)?.run(&st.buffer, &|| false, &mut |_| {})?;
    if st.language.is_none() {
        st.language = transcript.language.clone();
    }
    let eot = model.tokens.eot;
    let mut segments = Vec::with_capacity(transcript.segments.len());
    for s in &transcript.segments {
        let tokens: Vec<u32> = s.tokens.iter().copied().filter(|&t| t < eot).collect();
        let keys = tokens
            .iter()
            .map(|&t| Ok(word_key(&model.tokenizer.decode(&[t], true)?)))
            .collect::<Result<Vec<u64>, Error>>()?;
        segments.push(HypothesisSegment {
            start: s.start,
            end: s.end,
            tokens,
            keys,
        });
    }
    Ok(Hypothesis { segments })
}

/// A token's text without case, spacing or punctuation, so that passes which spell the same
/// word differently agree on it.
fn word_key(text: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let normal: String = text
        .chars()
        .filter(|c| c.is_alphanumeric())
        .flat_map(char::to_lowercase)
        .collect();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    normal.hash(&mut h);
    h.finish()
}

fn finish_utterance(
    model: &mut WhisperModel,
    st: &mut State,
    opts: &ListenOptions,
    request: u64,
    started: Instant,
    send: &dyn Fn(SpeechEvent),
) -> Result<(), Error> {
    let hyp = hypothesis(model, st, opts)?;
    let update = st.policy.finish(&hyp);
    publish(model, st, &update, request, started, send)?;
    st.buffer_start += secs(st.buffer.len());
    st.buffer.clear();
    st.decoded_len = 0;
    st.voiced = false;
    st.silence = 0.0;
    Ok(())
}

fn publish(
    model: &WhisperModel,
    st: &mut State,
    update: &Update,
    request: u64,
    started: Instant,
    send: &dyn Fn(SpeechEvent),
) -> Result<(), Error> {
    let t = started.elapsed().as_secs_f64();
    if !update.commit.is_empty() {
        let text = model.tokenizer.decode(&update.commit, true)?;
        st.committed.push_str(&text);
        send(SpeechEvent::Commit {
            request,
            t,
            start: st.buffer_start + update.commit_span.0,
            end: st.buffer_start + update.commit_span.1,
            text: text.trim().to_owned(),
        });
    }
    let partial = model.tokenizer.decode(&update.partial, true)?;
    send(SpeechEvent::Partial {
        request,
        t,
        start: st.buffer_start + update.partial_span.0,
        end: st.buffer_start + update.partial_span.1,
        text: partial.trim().to_owned(),
    });
    Ok(())
}

fn rms(samples: &[f32]) -> f32 {
    if samples.is_empty() {
        return 0.0;
    }
    (samples.iter().map(|s| s * s).sum::<f32>() / samples.len() as f32).sqrt()
}
