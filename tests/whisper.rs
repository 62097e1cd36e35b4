//! Whisper against transformers, on a tiny random model with our own shapes (goldens from
//! tests/reference/make_tiny_whisper.py): log-mel features on awkward lengths, the encoder,
//! prompt logits, language detection, and greedy tokens with and without timestamps, in f32
//! and f16.

mod common;

use std::path::{Path, PathBuf};

use backpack_engine::audio::{LogMel, decode_file};
use backpack_engine::models::whisper::{WhisperModel, WhisperOptions};
use backpack_engine::ops::{SamplerParams, SpeechRules, WeightDType};
use common::{assert_close, assert_greedy_prefix, gpu};
use serde::Deserialize;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[derive(Deserialize)]
struct Golden {
    audio: AudioInfo,
    special_tokens: Special,
    mel: Vec<MelCase>,
    encoder: EncoderCase,
    prompt_logits: PromptLogits,
    language_detection: Detection,
    max_new_tokens: u32,
    greedy: Vec<GreedyCase>,
}

#[derive(Deserialize)]
struct AudioInfo {
    path: String,
    samples: usize,
}

#[derive(Deserialize)]
struct Special {
    timestamp_begin: u32,
}

#[derive(Deserialize)]
struct MelCase {
    samples: usize,
    n_mels: usize,
    frames: Vec<usize>,
    values: Vec<Vec<f32>>,
    sum: f64,
    max: f32,
    min: f32,
}

#[derive(Deserialize)]
struct EncoderCase {
    rows: Vec<usize>,
    values: Vec<Vec<f32>>,
    sum: f64,
}

#[derive(Deserialize)]
struct PromptLogits {
    prompt_ids: Vec<u32>,
    last: Vec<f32>,
    first: Vec<f32>,
}

#[derive(Deserialize)]
struct Detection {
    detected: u32,
    margin: f32,
}

#[derive(Deserialize)]
struct GreedyCase {
    name: String,
    return_timestamps: bool,
    prompt_ids: Vec<u32>,
    tokens: Vec<u32>,
    margins: Vec<f32>,
    tokens_f16: Vec<u32>,
    margins_f16: Vec<f32>,
}

fn golden() -> Golden {
    let path = root().join("tests/fixtures/goldens/tiny-whisper.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("golden")).expect("golden json")
}

fn chirp(g: &Golden) -> Vec<f32> {
    let audio = decode_file(&root().join(&g.audio.path)).expect("chirp.wav decodes");
    assert_eq!(audio.sample_rate, 16_000);
    assert_eq!(audio.samples.len(), g.audio.samples);
    audio.samples
}

/// The first `n` samples of the chirp repeated end to end, cut to one 30 s window as the
/// feature extractor cuts longer audio.
fn excerpt(chirp: &[f32], n: usize) -> Vec<f32> {
    chirp.iter().copied().cycle().take(n.min(480_000)).collect()
}

#[test]
fn log_mel_matches_the_feature_extractor() {
    let g = golden();
    let audio = chirp(&g);
    for case in &g.mel {
        let mel = LogMel::new(case.n_mels);
        let features = mel.compute(&excerpt(&audio, case.samples), 480_000);
        let what = format!("{} samples, {} mels", case.samples, case.n_mels);
        assert_eq!(features.frames, 3000, "{what}");
        assert_eq!(features.n_mels, case.n_mels, "{what}");
        for (frame, want) in case.frames.iter().zip(&case.values) {
            let got: Vec<f32> = (0..case.n_mels)
                .map(|m| features.data[m * features.frames + frame])
                .collect();
            let ones = vec![1.0; want.len()];
            assert_close(
                &format!("{what}, frame {frame}"),
                &got,
                want,
                &ones,
                2e-4,
                0.0,
            );
        }
        let sum: f64 = features.data.iter().map(|&v| f64::from(v)).sum();
        assert!(
            (sum - case.sum).abs() <= 1e-4 * case.sum.abs().max(1.0),
            "{what}: sum {sum} against {}",
            case.sum
        );
        let max = features.data.iter().copied().fold(f32::MIN, f32::max);
        let min = features.data.iter().copied().fold(f32::MAX, f32::min);
        assert!(
            (max - case.max).abs() < 2e-4 && (min - case.min).abs() < 2e-4,
            "{what}"
        );
    }
}

/// Every container and codec the fixtures use decodes to the length and rate sox gave them.
#[test]
fn audio_files_of_every_format_decode() {
    let dir = root().join("tests/fixtures/audio");
    // (file, rate, channels, approximate seconds)
    for (file, rate, channels, seconds) in [
        ("speech_short.wav", 16_000, 1, 3.98),
        ("speech_two.flac", 16_000, 1, 7.91),
        ("speech_short.ogg", 22_050, 1, 3.98),
        ("speech_short.mp3", 44_100, 1, 4.0),
        ("chirp_44k_stereo.wav", 44_100, 2, 1.1),
    ] {
        let audio = decode_file(&dir.join(file)).expect(file);
        assert_eq!(
            (audio.sample_rate, audio.channels),
            (rate, channels),
            "{file}"
        );
        let secs = audio.samples.len() as f64 / f64::from(rate);
        assert!((secs - seconds).abs() < 0.1, "{file}: {secs} s");
        let loaded = backpack_engine::audio::load_file(&dir.join(file)).expect(file);
        let want = (audio.samples.len() as f64 * 16_000.0 / f64::from(rate)).round() as usize;
        assert!(
            loaded.len().abs_diff(want) <= 1,
            "{file}: {} samples at 16 kHz",
            loaded.len()
        );
        let peak = loaded.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert!(peak > 0.05 && peak <= 1.0, "{file}: peak {peak}");
    }
    let bad = std::env::temp_dir().join(format!("backpack-not-audio-{}.wav", std::process::id()));
    std::fs::write(&bad, b"this is text, not audio").expect("write");
    let err = decode_file(&bad).expect_err("text is not audio");
    assert!(err.to_string().contains("not an audio format"), "{err}");
    let _ = std::fs::remove_file(&bad);
}

fn model_dir() -> PathBuf {
    root().join("tests/fixtures/models/tiny-whisper")
}

fn load(dtype: WeightDType) -> WhisperModel {
    WhisperModel::load(
        &gpu(),
        &model_dir(),
        &WhisperOptions {
            dtype,
            quantize: None,
        },
    )
    .expect("tiny whisper loads")
}

fn window(model: &WhisperModel, audio: &[f32]) -> Vec<f32> {
    let features = model.mel().compute(audio, 480_000);
    features.window(0, model.window_frames())
}

fn rules(model: &WhisperModel, prompt: &[u32], timestamps: bool) -> SpeechRules {
    SpeechRules {
        timestamps,
        begin_index: prompt.len() as u32,
        max_initial_timestamp: model.generation.max_initial_timestamp_index,
        suppress: model.generation.suppress_tokens.clone(),
        begin_suppress: model.generation.begin_suppress_tokens.clone(),
        temperature: 0.0,
    }
}

#[test]
fn encoder_and_prompt_logits_match_transformers() {
    let g = golden();
    let audio = chirp(&g);
    let mut model = load(WeightDType::F32);
    model.encode(&window(&model, &audio)).expect("encode");
    let out = model.encoder_output().expect("encoder output");
    let d = model.config.d_model as usize;
    for (row, want) in g.encoder.rows.iter().zip(&g.encoder.values) {
        let got = &out[row * d..(row + 1) * d];
        let scale: Vec<f32> = want.iter().map(|v| v.abs()).collect();
        assert_close(&format!("encoder row {row}"), got, want, &scale, 2e-3, 1e-3);
    }
    let sum: f64 = out.iter().map(|&v| f64::from(v)).sum();
    assert!(
        (sum - g.encoder.sum).abs() < 1e-3 * out.len() as f64,
        "encoder sum {sum}"
    );

    let prompt = &g.prompt_logits.prompt_ids;
    let r = rules(&model, prompt, false);
    for (probe, want) in [
        (0, &g.prompt_logits.first),
        (prompt.len() as u32 - 1, &g.prompt_logits.last),
    ] {
        let w = model
            .decode(
                prompt,
                &r,
                &SamplerParams::default(),
                1,
                Some(probe),
                |_| false,
            )
            .expect("decode");
        let got = w.probe_logits.expect("probe logits");
        let scale: Vec<f32> = want.iter().map(|v| v.abs()).collect();
        assert_close(
            &format!("logits at prompt position {probe}"),
            &got,
            want,
            &scale,
            2e-3,
            1e-3,
        );
    }

    let detected = model.detect_language().expect("detection");
    let want = model
        .tokens
        .language_of(g.language_detection.detected)
        .expect("a language token");
    if g.language_detection.margin > 0.02 {
        assert_eq!(detected[0].0, want);
    }
    let total: f32 = detected.iter().map(|d| d.1).sum();
    assert!((total - 1.0).abs() < 1e-3);
}

fn greedy_matches(dtype: WeightDType) {
    let g = golden();
    let audio = chirp(&g);
    let mut model = load(dtype);
    model.encode(&window(&model, &audio)).expect("encode");
    assert_eq!(
        model.tokens.timestamp_begin,
        g.special_tokens.timestamp_begin
    );
    for case in &g.greedy {
        let (want, margins) = match dtype {
            WeightDType::F32 => (&case.tokens, &case.margins),
            WeightDType::F16 => (&case.tokens_f16, &case.margins_f16),
        };
        let r = rules(&model, &case.prompt_ids, case.return_timestamps);
        let w = model
            .decode(
                &case.prompt_ids,
                &r,
                &SamplerParams::default(),
                g.max_new_tokens,
                None,
                |_| false,
            )
            .expect("decode");
        let compared = assert_greedy_prefix(
            &format!("{} ({dtype:?})", case.name),
            &w.tokens,
            want,
            margins,
            0.02,
        );
        assert!(
            compared >= 8,
            "{}: only {compared} tokens comparable",
            case.name
        );
        for (i, lp) in w.logprobs.iter().enumerate() {
            assert!(
                lp.is_finite() && *lp <= 1e-4,
                "{}: log-prob {i} is {lp}",
                case.name
            );
        }
    }
}

#[test]
fn greedy_tokens_match_transformers_f32() {
    greedy_matches(WeightDType::F32);
}

#[test]
fn greedy_tokens_match_transformers_f16() {
    greedy_matches(WeightDType::F16);
}

#[test]
fn missing_and_broken_models_are_clear_errors() {
    let err = WhisperModel::load(
        &gpu(),
        Path::new("/nonexistent/whisper"),
        &Default::default(),
    )
    .err()
    .expect("missing");
    assert!(err.to_string().contains("no such file"), "{err}");
    // A text model folder is not a speech model.
    let text = root().join("tests/fixtures/models/tiny-qwen2");
    let err = WhisperModel::load(&gpu(), &text, &Default::default())
        .err()
        .expect("not whisper");
    assert!(err.to_string().contains("Whisper"), "{err}");
}

/// Live captions through the speech service on a file played faster than real time: partial
/// text comes and goes, committed text only grows, and the final text is all that was
/// committed. (The tiny random model says nonsense; the policy is what is checked here.)
#[test]
fn live_captions_commit_text_that_never_changes() {
    use backpack_engine::models::whisper::TranscribeOptions;
    use backpack_engine::runtime::ListenOptions;
    use backpack_engine::runtime::speech::{LiveSource, SpeechEvent, SpeechService};
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .build()
        .expect("runtime");
    let _guard = runtime.enter();
    let (speech, mut events) = SpeechService::spawn(gpu(), None);
    speech.load(model_dir(), WhisperOptions::default());
    assert!(matches!(
        events.blocking_recv(),
        Some(SpeechEvent::Loaded(_))
    ));
    let id = speech.listen(
        LiveSource::File {
            path: root().join("tests/fixtures/audio/speech_short.wav"),
            pace: 4.0,
        },
        ListenOptions {
            transcribe: TranscribeOptions {
                language: Some("en".into()),
                // The random model never ends a window by itself.
                max_new_tokens: Some(12),
                ..Default::default()
            },
            interval: 0.5,
            ..Default::default()
        },
    );
    let (mut commits, mut partials, mut levels) = (Vec::new(), 0, 0);
    let mut last_t = 0.0;
    let done = loop {
        match events.blocking_recv().expect("service alive") {
            SpeechEvent::Commit {
                request,
                t,
                start,
                end,
                text,
            } => {
                assert_eq!(request, id);
                assert!(t >= last_t && end >= start, "{t} {start} {end}");
                last_t = t;
                commits.push(text);
            }
            SpeechEvent::Partial { t, .. } => {
                assert!(t >= last_t);
                last_t = t;
                partials += 1;
            }
            SpeechEvent::Level { rms, lag_s, .. } => {
                assert!(rms.is_finite() && lag_s >= 0.0);
                levels += 1;
            }
            SpeechEvent::Done { request, text, .. } => {
                assert_eq!(request, id);
                break text;
            }
            SpeechEvent::Error { message, .. } => panic!("{message}"),
            _ => {}
        }
    };
    assert!(
        levels > 0 && partials > 0 && !commits.is_empty(),
        "{levels} {partials} {commits:?}"
    );
    let joined: String = commits
        .iter()
        .map(|c| c.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join(" ");
    assert_eq!(
        done.split_whitespace().collect::<Vec<_>>().join(" "),
        joined.split_whitespace().collect::<Vec<_>>().join(" ")
    );
}

/// Matrices quantized to Q8_0 while loading: the encoder stays close to the f32 one and the
/// decoder runs on the quantized kernels.
#[test]
fn q8_0_quantized_weights_stay_close() {
    let g = golden();
    let audio = chirp(&g);
    let mut q8 = WhisperModel::load(
        &gpu(),
        &model_dir(),
        &WhisperOptions {
            dtype: WeightDType::F32,
            quantize: Some(backpack_engine::load::GgmlType::Q8_0),
        },
    )
    .expect("q8_0 loads");
    q8.encode(&window(&q8, &audio)).expect("encode");
    let out = q8.encoder_output().expect("output");
    let d = q8.config.d_model as usize;
    let mut worst = 0.0f32;
    for (row, want) in g.encoder.rows.iter().zip(&g.encoder.values) {
        let got = &out[row * d..(row + 1) * d];
        let norm = want.iter().map(|v| v * v).sum::<f32>().sqrt();
        let err = got
            .iter()
            .zip(want)
            .map(|(a, b)| (a - b) * (a - b))
            .sum::<f32>()
            .sqrt();
        worst = worst.max(err / norm);
    }
    assert!(
        worst < 0.05,
        "q8_0 encoder rows differ by {worst} (relative)"
    );
    let case = &g.greedy[0];
    let r = rules(&q8, &case.prompt_ids, false);
    let w = q8
        .decode(
            &case.prompt_ids,
            &r,
            &SamplerParams::default(),
            6,
            None,
            |_| false,
        )
        .expect("decode");
    assert_eq!(w.tokens.len(), 6);
    assert!(w.tokens.iter().all(|&t| t < q8.config.vocab));
}
