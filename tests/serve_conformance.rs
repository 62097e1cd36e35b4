//! `backpack serve` against what OpenAI's own client sends (requests recorded from the
//! `openai` Python package, tests/conformance/openai/), and against hostile bodies: mutated
//! JSON and multipart, each answered with a clean OpenAI-style error or an answer, never a
//! server error, a hang or a dead server.

#[path = "support/mutate.rs"]
mod mutate;
#[path = "support/server_process.rs"]
mod server_process;

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use server_process::{fixture, start_with};

fn recorded(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/conformance/openai/client-requests")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The multipart `Content-Type` the client sent with the recorded transcription body.
fn multipart_type() -> String {
    let index: Value = serde_json::from_slice(&recorded("requests_index.json")).expect("index");
    index["requests"]
        .as_array()
        .expect("requests")
        .iter()
        .find(|r| r["path"] == "/v1/audio/transcriptions")
        .and_then(|r| {
            let headers = r["headers"].as_object()?;
            headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
                .and_then(|(_, v)| v.as_str())
                .map(str::to_owned)
        })
        .expect("multipart content type")
}

/// A server of the tiny text model, and of the tiny Whisper model when `speech`.
fn server(speech: bool) -> server_process::ServerProcess {
    let (text, whisper) = (fixture("tiny-qwen2"), fixture("tiny-whisper"));
    let mut args = vec![
        "--model",
        text.to_str().expect("utf-8"),
        // Bounds how long any generation can run, whatever a mutated body asks.
        "--context",
        "64",
    ];
    if speech {
        args.extend(["--model", whisper.to_str().expect("utf-8")]);
    }
    start_with(&args)
}

/// `body` (a multipart form) with one more text field before its closing boundary.
fn with_field(body: &[u8], content_type: &str, name: &str, value: &str) -> Vec<u8> {
    let boundary = content_type
        .split("boundary=")
        .nth(1)
        .expect("boundary")
        .trim_matches('"');
    let closing = format!("--{boundary}--");
    let at = body
        .windows(closing.len())
        .rposition(|w| w == closing.as_bytes())
        .expect("closing boundary");
    let field = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n"
    );
    [&body[..at], field.as_bytes(), &body[at..]].concat()
}

fn client() -> reqwest::Client {
    backpack_engine::http::client_builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("HTTP client")
}

/// A POST with the headers the OpenAI Python client sends.
fn as_the_client(
    client: &reqwest::Client,
    url: String,
    body: Vec<u8>,
    kind: &str,
) -> impl std::future::Future<Output = reqwest::Result<reqwest::Response>> + use<> {
    client
        .post(url)
        .header("content-type", kind)
        .header("user-agent", "OpenAI/Python 3.57.0")
        .body(body)
        .send()
}

/// The JSON type a raw, already validated value has, by its first character.
fn json_kind(raw: &str) -> Value {
    match raw.trim_start().chars().next() {
        Some('"') => "string",
        Some('{') => "object",
        Some('[') => "array",
        Some('t' | 'f') => "boolean",
        Some('n') => "null",
        _ => "number",
    }
    .into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_as_the_openai_client_sends_them() {
    let server = server(true);
    let client = client();
    let post = |path: &str, body: Vec<u8>, kind: &str| {
        as_the_client(&client, format!("{}{path}", server.base), body, kind)
    };
    let json = "application/json";

    let answer = post(
        "/v1/chat/completions",
        recorded("chat_basic.request.json"),
        json,
    )
    .await
    .expect("basic");
    assert_eq!(answer.status(), 200);
    let answer: Value = answer.json().await.expect("json");
    assert_eq!(answer["object"], "chat.completion");
    assert_eq!(answer["choices"][0]["message"]["role"], "assistant");
    assert!(
        answer["usage"]["total_tokens"]
            .as_u64()
            .is_some_and(|n| n > 0)
    );

    for file in [
        "chat_stream_helper.request.json",
        "chat_stream_options.request.json",
    ] {
        let response = post("/v1/chat/completions", recorded(file), json)
            .await
            .expect("stream");
        assert_eq!(response.status(), 200, "{file}");
        let text = response.text().await.expect("body");
        let events: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .collect();
        assert_eq!(events.last(), Some(&"[DONE]"), "{file}");
        let chunks: Vec<Value> = events[..events.len() - 1]
            .iter()
            .map(|e| serde_json::from_str(e).expect("chunk"))
            .collect();
        assert!(
            chunks
                .iter()
                .all(|c| c["object"] == "chat.completion.chunk")
        );
        if file.contains("options") {
            // include_usage: a last chunk with no choices carries the usage.
            let last = chunks.last().expect("chunks");
            assert_eq!(last["choices"].as_array().map(Vec::len), Some(0), "{last}");
            assert!(
                last["usage"]["completion_tokens"].as_u64().is_some(),
                "{last}"
            );
        }
    }

    // Tools and structured outputs, as the client sends them, to a server whose model has
    // room for tool definitions. A bound on the answer keeps the tiny random model quick; an
    // answer that ends on its own is held to what was asked.
    let long = server_process::LongContext::of("tiny-qwen2");
    let tool_server = start_with(&["--model", long.path()]);
    let post = |path: &str, body: Vec<u8>, kind: &str| {
        as_the_client(&client, format!("{}{path}", tool_server.base), body, kind)
    };
    let bounded = |file: &str| {
        let mut body: Value = serde_json::from_slice(&recorded(file)).expect("json");
        body["max_tokens"] = 96.into();
        serde_json::to_vec(&body).expect("body")
    };
    for file in [
        "chat_tools.request.json",
        "chat_json_object.request.json",
        "chat_parse_json_schema.request.json",
    ] {
        let response = post("/v1/chat/completions", bounded(file), json)
            .await
            .expect("answer");
        assert_eq!(response.status(), 200, "{file}");
        let answer: Value = response.json().await.expect("json");
        let choice = &answer["choices"][0];
        let finish = choice["finish_reason"].as_str().expect("finish_reason");
        assert!(
            ["stop", "length", "tool_calls"].contains(&finish),
            "{file}: {answer}"
        );
        if finish != "stop" || file.contains("tools") {
            continue;
        }
        let content = choice["message"]["content"].as_str().expect("content");
        // Raw members: JSON bounds no number, and a random model may write one past f64's
        // range (`9E177331`), which `Value` cannot hold but every JSON parser must accept.
        let members: serde_json::Map<String, Value> = match serde_json::from_str::<
            std::collections::BTreeMap<String, Box<serde_json::value::RawValue>>,
        >(content)
        {
            Ok(raw) => raw
                .into_iter()
                .map(|(key, value)| (key, json_kind(value.get())))
                .collect(),
            Err(e) => panic!("{file}: not a JSON object: {e}: {content:?}"),
        };
        if file.contains("schema") {
            assert_eq!(
                Value::Object(members),
                json!({"city": "string", "temperature": "number"}),
                "{content:?}"
            );
        }
    }

    // A forced call of the recorded tool: the answer is the call, in OpenAI's shape.
    let mut forced: Value =
        serde_json::from_slice(&recorded("chat_tools.request.json")).expect("json");
    forced["tool_choice"] = json!({"type": "function", "function": {"name": "get_weather"}});
    forced["tools"][0]["function"]["parameters"]["properties"]["city"]["enum"] =
        json!(["San Francisco", "Paris"]);
    forced["max_tokens"] = 96.into();
    forced["parallel_tool_calls"] = false.into();
    let response = post(
        "/v1/chat/completions",
        serde_json::to_vec(&forced).expect("body"),
        json,
    )
    .await
    .expect("forced");
    assert_eq!(response.status(), 200);
    let answer: Value = response.json().await.expect("json");
    let choice = &answer["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{answer}");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    assert!(
        call["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("call_"))
    );
    let arguments: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().expect("text")).expect("json");
    assert!(["San Francisco", "Paris"].contains(&arguments["city"].as_str().unwrap_or("")));

    // What the server cannot honour is refused by name: a schema keyword strict mode cannot
    // hold, a tool_choice naming no tool.
    let mut strict: Value =
        serde_json::from_slice(&recorded("chat_parse_json_schema.request.json")).expect("json");
    strict["response_format"]["json_schema"]["schema"]["dependentSchemas"] = json!({"city": {}});
    let mut unknown = forced.clone();
    unknown["tool_choice"]["function"]["name"] = "nope".into();
    for (body, param) in [(strict, "response_format"), (unknown, "tool_choice")] {
        let response = post(
            "/v1/chat/completions",
            serde_json::to_vec(&body).expect("body"),
            json,
        )
        .await
        .expect("refused");
        assert_eq!(response.status(), 400, "{param}");
        let error: Value = response.json().await.expect("json");
        assert_eq!(error["error"]["param"], param, "{error}");
        if param == "response_format" {
            let message = error["error"]["message"].as_str().unwrap_or_default();
            assert!(message.contains("dependentSchemas"), "{message}");
        }
    }

    drop(tool_server);
    let post = |path: &str, body: Vec<u8>, kind: &str| {
        as_the_client(&client, format!("{}{path}", server.base), body, kind)
    };

    // The recorded form with one field more: the tiny random Whisper model would otherwise
    // decode 448 tokens a window at every fallback temperature, minutes on a software GPU.
    let content_type = multipart_type();
    let body = with_field(
        &recorded("audio_transcriptions.request.multipart"),
        &content_type,
        "max_new_tokens",
        "4",
    );
    let response = post("/v1/audio/transcriptions", body, &content_type)
        .await
        .expect("transcription");
    assert_eq!(response.status(), 200);
    let transcript: Value = response.json().await.expect("json");
    assert!(transcript["text"].is_string(), "{transcript}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_bodies_get_clean_errors() {
    // No speech model: forms are read and checked whole first, then refused for the missing
    // model, so every mutated form meets the parser without running a transcription.
    let server = server(false);
    let client = client();
    let targets = [
        (
            "/v1/chat/completions",
            "application/json".to_owned(),
            vec![
                recorded("chat_basic.request.json"),
                recorded("chat_stream_options.request.json"),
                recorded("chat_tools.request.json"),
                recorded("chat_json_object.request.json"),
                recorded("chat_parse_json_schema.request.json"),
            ],
        ),
        (
            "/v1/completions",
            "application/json".to_owned(),
            vec![br#"{"model":"m","prompt":"Once upon","max_tokens":4,"stop":["\n"]}"#.to_vec()],
        ),
        (
            "/v1/audio/transcriptions",
            multipart_type(),
            vec![recorded("audio_transcriptions.request.multipart")],
        ),
    ];
    let mut rng = mutate::Rng::new(47);
    let (mut cases, mut refused) = (0, 0);
    let per_target = mutate::cases(60);
    for (path, kind, seeds) in &targets {
        for _ in 0..per_target {
            let seed = &seeds[rng.below(seeds.len())];
            let body = mutate::mutate(seed, &mut rng, Some(400));
            let response = client
                .post(format!("{}{path}", server.base))
                .header("content-type", kind)
                .body(body.clone())
                .send()
                .await
                .unwrap_or_else(|e| {
                    panic!(
                        "{path}: no answer to {:?}: {e}",
                        String::from_utf8_lossy(&body)
                    )
                });
            let status = response.status();
            let text = response.text().await.expect("body");
            assert!(
                status.is_success() || status.is_client_error(),
                "{path}: {status} for {:?}: {text}",
                String::from_utf8_lossy(&body)
            );
            if status.is_client_error() {
                let error: Value = serde_json::from_str(&text)
                    .unwrap_or_else(|e| panic!("{path}: {status} body is not JSON ({e}): {text}"));
                assert!(
                    error["error"]["message"]
                        .as_str()
                        .is_some_and(|m| !m.is_empty()),
                    "{text}"
                );
                refused += 1;
            }
            cases += 1;
        }
    }
    let alive = client
        .get(format!("{}/v1/models", server.base))
        .send()
        .await
        .expect("still serving");
    assert_eq!(alive.status(), 200);
    println!("fuzz server bodies: {cases} cases, {refused} clean errors, 0 server errors");
}
