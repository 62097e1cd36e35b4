//! The engine as a UI sees it: requests in, events out. Streaming, cancellation within a token,
//! whole-character UTF-8 deltas, and clear errors for bad input that leave the engine usable.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use backpack_engine::load::{StreamDecoder, TextTokenizer};
use backpack_engine::models::{GenerateParams, ModelOptions, Prompt, StopReason};
use backpack_engine::ops::SamplerParams;
use backpack_engine::runtime::{Engine, EngineHandle, Event};
use common::gpu;
use tokio::sync::mpsc::UnboundedReceiver;

fn model_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/models")
        .join(name)
}

/// A scratch copy of a fixture model that a test may damage.
fn scratch_copy(name: &str, tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("backpack-test-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    for entry in std::fs::read_dir(model_dir(name)).expect("fixture") {
        let path = entry.expect("entry").path();
        std::fs::copy(&path, dir.join(path.file_name().expect("name"))).expect("copy");
    }
    dir
}

async fn next(events: &mut UnboundedReceiver<Event>) -> Event {
    tokio::time::timeout(Duration::from_secs(120), events.recv())
        .await
        .expect("engine answered in time")
        .expect("engine alive")
}

async fn load(
    engine: &EngineHandle,
    events: &mut UnboundedReceiver<Event>,
    path: &Path,
    options: ModelOptions,
) -> Result<(), String> {
    engine.load(path.to_owned(), options);
    match next(events).await {
        Event::Loaded(_) => Ok(()),
        Event::Error { message, .. } => Err(message),
        other => panic!("unexpected event {other:?}"),
    }
}

fn sampling(max_tokens: u32) -> GenerateParams {
    GenerateParams {
        max_tokens,
        sampler: SamplerParams {
            temperature: 0.8,
            top_p: 0.95,
            seed: 3,
            ..Default::default()
        },
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_stream_and_wake_the_ui() {
    let wakes = Arc::new(AtomicUsize::new(0));
    let counter = wakes.clone();
    let (engine, mut events) = Engine::spawn(
        gpu(),
        Some(Arc::new(move || {
            counter.fetch_add(1, Ordering::Relaxed);
        })),
    );
    load(
        &engine,
        &mut events,
        &model_dir("tiny-qwen2"),
        ModelOptions::default(),
    )
    .await
    .expect("loads");
    let request = engine.generate(Prompt::Raw("The fox".into()), sampling(12));
    let mut tokens = 0;
    loop {
        match next(&mut events).await {
            Event::Token { request: r, .. } => {
                assert_eq!(r, request);
                tokens += 1;
            }
            Event::Done {
                request: r,
                generated_tokens,
                prompt_tokens,
                tokens_per_s,
                ..
            } => {
                assert_eq!(r, request);
                assert_eq!(generated_tokens, tokens);
                assert!(prompt_tokens > 0);
                assert!(tokens_per_s >= 0.0);
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(tokens > 0);
    // The wake for the last event runs just after it is sent.
    for _ in 0..100 {
        if wakes.load(Ordering::Relaxed) >= tokens + 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        wakes.load(Ordering::Relaxed) >= tokens + 2,
        "every event wakes the UI"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_within_one_token() {
    let (engine, mut events) = Engine::spawn(gpu(), None);
    load(
        &engine,
        &mut events,
        &model_dir("tiny-llama"),
        ModelOptions::default(),
    )
    .await
    .expect("loads");
    // Greedy on a random model rarely hits end-of-text; allow the whole context.
    let params = GenerateParams {
        max_tokens: 200,
        sampler: SamplerParams::default(),
        ..Default::default()
    };
    let request = engine.generate(Prompt::Raw("Once upon a time".into()), params);
    let mut seen = 0;
    let stop = loop {
        match next(&mut events).await {
            Event::Token { .. } => {
                seen += 1;
                if seen == 3 {
                    engine.cancel(request);
                }
            }
            Event::Done {
                generated_tokens,
                stop,
                ..
            } => {
                assert!(
                    generated_tokens <= 4,
                    "stopped after {generated_tokens} tokens"
                );
                break stop;
            }
            other => panic!("unexpected {other:?}"),
        }
    };
    assert!(
        matches!(stop, StopReason::Cancelled | StopReason::EndOfText),
        "{stop:?}"
    );
    // The engine takes the next request normally.
    let next_request = engine.generate(Prompt::Raw("Again".into()), sampling(3));
    loop {
        if let Event::Done { request, .. } = next(&mut events).await {
            assert_eq!(request, next_request);
            break;
        }
    }
}

/// Cancelling one request (a server's client that went away) leaves those queued before and
/// after it alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_one_stops_only_that_request() {
    let (engine, mut events) = Engine::spawn(gpu(), None);
    load(
        &engine,
        &mut events,
        &model_dir("tiny-llama"),
        ModelOptions::default(),
    )
    .await
    .expect("loads");
    let params = || GenerateParams {
        max_tokens: 12,
        sampler: SamplerParams::default(),
        ..Default::default()
    };
    let first = engine.generate(Prompt::Raw("Once upon a time".into()), params());
    let second = engine.generate(Prompt::Raw("Once upon a time".into()), params());
    let third = engine.generate(Prompt::Raw("Once upon a time".into()), params());
    engine.cancel_one(second);
    let mut ends = std::collections::HashMap::new();
    while ends.len() < 3 {
        if let Event::Done {
            request,
            stop,
            generated_tokens,
            ..
        } = next(&mut events).await
        {
            ends.insert(request, (stop, generated_tokens));
        }
    }
    assert_eq!(ends[&second], (StopReason::Cancelled, 0));
    for request in [first, third] {
        let (stop, tokens) = ends[&request];
        assert!(
            stop != StopReason::Cancelled && tokens > 0,
            "{request}: {stop:?}"
        );
    }
}

#[test]
fn utf8_deltas_are_whole_characters() {
    let tokenizer = TextTokenizer::from_dir(&model_dir("tiny-gpt2")).expect("tokenizer");
    let text = "Café 日本語 🦀🎒 naïve — 🙂 über";
    let ids = tokenizer.encode(text, false).expect("encode");
    assert!(
        ids.len() > text.chars().count() / 2,
        "the emoji split into byte-level tokens"
    );
    let mut decoder = StreamDecoder::default();
    let mut out = String::new();
    for id in ids {
        let delta = decoder.push(&tokenizer, id).expect("push");
        assert!(
            !delta.contains('\u{FFFD}'),
            "delta {delta:?} holds a broken character"
        );
        out.push_str(&delta);
    }
    out.push_str(&decoder.finish(&tokenizer).expect("finish"));
    assert_eq!(out, text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gives_clear_errors_and_the_engine_keeps_working() {
    let (engine, mut events) = Engine::spawn(gpu(), None);

    let err = load(
        &engine,
        &mut events,
        Path::new("/nonexistent/model"),
        ModelOptions::default(),
    )
    .await
    .expect_err("missing");
    assert!(
        err.contains("/nonexistent/model") && err.contains("no such file"),
        "{err}"
    );

    let truncated = scratch_copy("tiny-qwen2", "truncated");
    let weights = truncated.join("model.safetensors");
    let len = std::fs::metadata(&weights).expect("meta").len();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&weights)
        .expect("open");
    file.set_len(len / 2).expect("truncate");
    let err = load(&engine, &mut events, &truncated, ModelOptions::default())
        .await
        .expect_err("truncated");
    assert!(
        err.contains("model.safetensors") && err.contains("truncated"),
        "{err}"
    );

    let garbage = scratch_copy("tiny-qwen2", "garbage");
    std::fs::write(
        garbage.join("model.safetensors"),
        b"\xff\xff\xff\xff\xff\xff\xff\x7fnot a model",
    )
    .expect("write");
    let err = load(&engine, &mut events, &garbage, ModelOptions::default())
        .await
        .expect_err("garbage");
    assert!(
        err.contains("model.safetensors") && err.contains("corrupt"),
        "{err}"
    );

    let unsupported = scratch_copy("tiny-qwen2", "arch");
    let config = std::fs::read_to_string(unsupported.join("config.json")).expect("config");
    let config = config.replace("\"qwen2\"", "\"mamba\"");
    std::fs::write(unsupported.join("config.json"), config).expect("write");
    let err = load(&engine, &mut events, &unsupported, ModelOptions::default())
        .await
        .expect_err("arch");
    assert!(
        err.contains("mamba") && err.contains("unsupported"),
        "{err}"
    );

    let request = engine.generate(Prompt::Raw("hi".into()), sampling(2));
    match next(&mut events).await {
        Event::Error {
            request: r,
            message,
            prompt_too_long,
            ..
        } => {
            assert_eq!(r, Some(request));
            assert!(message.contains("no model"), "{message}");
            assert_eq!(prompt_too_long, None);
        }
        other => panic!("unexpected {other:?}"),
    }

    let small = ModelOptions {
        context: Some(16),
        ..Default::default()
    };
    load(&engine, &mut events, &model_dir("tiny-qwen2"), small)
        .await
        .expect("loads");
    let long = "The quick brown fox jumps over the lazy dog. ".repeat(10);
    let request = engine.generate(Prompt::Raw(long), sampling(2));
    match next(&mut events).await {
        Event::Error {
            request: r,
            message,
            prompt_too_long,
            ..
        } => {
            assert_eq!(r, Some(request));
            assert!(message.contains("context holds 16"), "{message}");
            let (tokens, capacity) = prompt_too_long.expect("overflow is reported");
            assert!(tokens > 16 && capacity == 16, "{tokens} {capacity}");
        }
        other => panic!("unexpected {other:?}"),
    }
    let request = engine.generate(Prompt::Raw("The".into()), sampling(30));
    loop {
        match next(&mut events).await {
            Event::Token { .. } => {}
            Event::Done {
                request: r,
                stop,
                generated_tokens,
                ..
            } => {
                assert_eq!(r, request);
                assert!(generated_tokens <= 16);
                assert!(matches!(
                    stop,
                    StopReason::ContextFull | StopReason::EndOfText | StopReason::MaxTokens
                ));
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    for dir in [truncated, garbage, unsupported] {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// A tokenizer.json cut off mid-file makes the tokenizers library panic while parsing; the
/// service reports it as an error and still loads and runs a good model afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_while_loading_is_an_error_and_the_engine_keeps_serving() {
    let (engine, mut events) = Engine::spawn(gpu(), None);
    let broken = scratch_copy("tiny-qwen2", "truncated-tokenizer");
    let tokenizer = broken.join("tokenizer.json");
    let text = std::fs::read(&tokenizer).expect("tokenizer");
    std::fs::write(&tokenizer, &text[..text.len() / 2]).expect("truncate");
    let err = load(&engine, &mut events, &broken, ModelOptions::default())
        .await
        .expect_err("a truncated tokenizer cannot load");
    assert!(err.contains("tokenizer"), "{err}");
    load(
        &engine,
        &mut events,
        &model_dir("tiny-qwen2"),
        ModelOptions::default(),
    )
    .await
    .expect("a good model loads after the failure");
    let id = engine.generate(Prompt::Raw("Hello".into()), sampling(4));
    loop {
        match next(&mut events).await {
            Event::Done { request, .. } if request == id => break,
            Event::Error { message, .. } => panic!("{message}"),
            _ => {}
        }
    }
    let _ = std::fs::remove_dir_all(&broken);
}
