//! The remote client through the CLI (`generate`, `transcribe`, `image` with `--endpoint`)
//! against a stand-in OpenAI server on 127.0.0.1: streamed answers whose multi-byte characters
//! arrive split across chunks, the request the server sees (messages, sampling, key), reasoning
//! shown in think tags, and clear errors for a wrong key, a full queue, an error inside the
//! stream, a stall, a dropped stream and an unreachable host.

#[path = "support/fake_openai.rs"]
mod fake_openai;

use std::process::{Command, Output};
use std::time::Duration;

use fake_openai::{Config, FakeOpenAi, Fault};
use serde_json::Value;

fn backpack(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_backpack"))
        .args(args)
        .env_remove("OPENAI_API_KEY")
        .output()
        .expect("the binary runs")
}

fn json_line(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.lines().last().expect("a JSON line")).expect("json")
}

/// Fails with `needle` in its error output.
fn fails_with(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "should fail: {stderr}");
    assert!(stderr.contains(needle), "{needle:?} not in: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn generate_streams_split_utf8_with_the_request_it_was_given() {
    let server = FakeOpenAi::start(Config {
        key: Some("sk-test".into()),
        ..Default::default()
    });
    let answer = server.config.lock().expect("config").answer();
    let out = backpack(&[
        "generate",
        "--endpoint",
        &server.base,
        "--model",
        "big-model",
        "--api-key",
        "sk-test",
        "--system",
        "Be brief.",
        "--prompt",
        "Say hello",
        "--temperature",
        "0.3",
        "--top-k",
        "5",
        "--max-tokens",
        "40",
        "--no-think",
        "--json",
    ]);
    let line = json_line(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout.lines().next(),
        Some(answer.as_str()),
        "streamed text"
    );
    assert_eq!(line["text"], answer);
    assert_eq!(line["finish_reason"], "stop");
    assert_eq!(line["usage"]["prompt_tokens"], 17);
    assert_eq!(line["usage"]["completion_tokens"], 5);
    let sent: Value = serde_json::from_str(
        &server
            .last("POST /v1/chat/completions")
            .expect("a chat request"),
    )
    .expect("json body");
    assert_eq!(sent["model"], "big-model");
    assert_eq!(sent["stream"], true);
    assert_eq!(sent["messages"][0]["role"], "system");
    assert_eq!(sent["messages"][0]["content"], "Be brief.");
    assert_eq!(sent["messages"][1]["content"], "Say hello");
    assert_eq!(sent["max_tokens"], 40);
    assert!((sent["temperature"].as_f64().expect("temperature") - 0.3).abs() < 1e-6);
    assert_eq!(sent["top_k"], 5);
    assert_eq!(sent["chat_template_kwargs"]["enable_thinking"], false);

    // The key from the environment; --raw goes to text completions.
    let out = Command::new(env!("CARGO_BIN_EXE_backpack"))
        .args([
            "generate",
            "--endpoint",
            &server.base,
            "--model",
            "big-model",
        ])
        .args(["--prompt", "Once upon", "--raw", "--json"])
        .env("OPENAI_API_KEY", "sk-test")
        .output()
        .expect("runs");
    assert_eq!(json_line(&out)["text"], answer);
    let sent: Value =
        serde_json::from_str(&server.last("POST /v1/completions").expect("a completion"))
            .expect("json body");
    assert_eq!(sent["prompt"], "Once upon");
}

#[test]
fn reasoning_is_shown_in_think_tags() {
    let server = FakeOpenAi::start(Config {
        reasoning: Some("Greet them in German.".into()),
        pieces: vec!["Hallo".into()],
        ..Default::default()
    });
    let out = backpack(&[
        "generate",
        "--endpoint",
        &server.base,
        "--model",
        "big-model",
        "--prompt",
        "hi",
        "--json",
    ]);
    assert_eq!(
        json_line(&out)["text"],
        "<think>\nGreet them in German.\n</think>\n\nHallo"
    );
}

#[test]
fn failures_are_clear_errors() {
    let server = FakeOpenAi::start(Config {
        key: Some("sk-right".into()),
        ..Default::default()
    });
    let run = |key: &str, extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--endpoint",
            &server.base,
            "--model",
            "big-model",
            "--prompt",
            "hi",
            "--api-key",
            key,
        ];
        args.extend(extra);
        backpack(&args)
    };
    fails_with(&run("sk-wrong", &[]), "refused the API key");
    fails_with(&run("sk-wrong", &[]), "Incorrect API key provided");

    server.set_fault(Fault::RateLimited);
    fails_with(&run("sk-right", &[]), "is busy (429: Rate limit reached");

    server.set_fault(Fault::ErrorInStream);
    fails_with(&run("sk-right", &[]), "the model crashed");

    server.set_fault(Fault::Drop { pieces: 2 });
    fails_with(
        &run("sk-right", &[]),
        "dropped before the answer was complete",
    );

    server.set_fault(Fault::Stall {
        pieces: 1,
        pause: Duration::from_secs(30),
    });
    let started = std::time::Instant::now();
    fails_with(
        &run("sk-right", &["--timeout", "1"]),
        "sent nothing for 1 s",
    );
    assert!(started.elapsed() < Duration::from_secs(20));

    // Nothing listens on a port just released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let out = backpack(&[
        "generate",
        "--endpoint",
        &format!("http://127.0.0.1:{port}"),
        "--model",
        "m",
        "--prompt",
        "hi",
    ]);
    fails_with(&out, "could not reach");
    fails_with(
        &backpack(&[
            "generate",
            "--endpoint",
            "ftp://x",
            "--model",
            "m",
            "--prompt",
            "hi",
        ]),
        "is not an http(s) URL",
    );
    // Local-only options are refused with an endpoint.
    let out = backpack(&[
        "generate",
        "--endpoint",
        &server.base,
        "--model",
        "m",
        "--prompt",
        "hi",
        "--quant",
        "q8_0",
    ]);
    fails_with(&out, "cannot be used with");
}

#[test]
fn transcribe_and_image_through_an_endpoint() {
    let png = backpack_app::image_files::png_bytes(4, 2, &[200; 24], "a fox").expect("png");
    let server = FakeOpenAi::start(Config {
        image: png.clone(),
        ..Default::default()
    });
    let dir = std::env::temp_dir().join(format!("backpack-remote-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    // The server decodes the audio; the client sends the file as it is.
    let audio = dir.join("clip.wav");
    std::fs::write(&audio, b"RIFF....WAVEfmt not really audio").expect("audio");
    let audio = audio.to_str().expect("utf-8");
    let out = backpack(&[
        "transcribe",
        "--endpoint",
        &server.base,
        "--model",
        "whisper-1",
        "--audio",
        audio,
        "--format",
        "srt",
        "--json",
    ]);
    let line = json_line(&out);
    assert_eq!(line["text"], "Bonjour de loin.");
    assert_eq!(line["language"], "french");
    assert_eq!(line["audio_s"], 3.5);
    assert_eq!(line["segments"].as_array().map(Vec::len), Some(2));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("00:00:01,500 --> 00:00:03,500"), "{stdout}");
    let form = server
        .last("POST /v1/audio/transcriptions")
        .expect("a transcription");
    assert!(form.contains("clip.wav") && form.contains("whisper-1"));
    assert!(
        !form.contains("name=\"language\""),
        "auto sends no language"
    );

    let out = backpack(&[
        "transcribe",
        "--endpoint",
        &server.base,
        "--model",
        "whisper-1",
        "--audio",
        audio,
        "--task",
        "translate",
        "--language",
        "fr",
    ]);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "Hello from far away."
    );
    assert!(
        server
            .last("POST /v1/audio/translations")
            .expect("a translation")
            .contains("name=\"language\"")
    );

    let out_png = dir.join("fox.png");
    let out = backpack(&[
        "image",
        "--endpoint",
        &server.base,
        "--model",
        "sd-xl",
        "--prompt",
        "a fox",
        "--batch",
        "2",
        "--seed",
        "7",
        "--width",
        "512",
        "--height",
        "512",
        "--out",
        out_png.to_str().expect("utf-8"),
        "--json",
    ]);
    let line = json_line(&out);
    assert_eq!(line["width"], 4);
    assert_eq!(line["height"], 2);
    assert_eq!(std::fs::read(&out_png).expect("first"), png);
    assert_eq!(std::fs::read(dir.join("fox-2.png")).expect("second"), png);
    let sent: Value =
        serde_json::from_str(&server.last("POST /v1/images/generations").expect("images"))
            .expect("json");
    assert_eq!(sent["n"], 2);
    assert_eq!(sent["size"], "512x512");
    assert_eq!(sent["seed"], 7);
    assert_eq!(sent["response_format"], "b64_json");
    let _ = std::fs::remove_dir_all(&dir);
}
