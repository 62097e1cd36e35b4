//! A stand-in for an OpenAI-compatible server on 127.0.0.1 (what vLLM, llama.cpp's server or
//! OpenAI answer): `/v1/models`, streamed `/v1/chat/completions` and `/v1/completions` sent a
//! few bytes per chunk (so multi-byte UTF-8 characters arrive split), `/v1/audio/transcriptions`
//! and `/v1/images/generations`, with faults on demand: a refused key, 429, an error inside
//! the stream, a stream that stalls, one that drops mid-answer.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};

#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    None,
    /// 429 with an OpenAI error object.
    RateLimited,
    /// Send the first `pieces` pieces, then nothing for this long.
    Stall {
        pieces: usize,
        pause: Duration,
    },
    /// Send the first `pieces` pieces, then close the connection mid-body.
    Drop {
        pieces: usize,
    },
    /// An error object inside the stream after the first piece.
    ErrorInStream,
}

pub struct Config {
    pub key: Option<String>,
    pub models: Vec<String>,
    /// The answer, in the pieces it is streamed as (one event each).
    pub pieces: Vec<String>,
    /// Bytes per TCP write of a streamed body.
    pub write_size: usize,
    pub fault: Fault,
    /// What `/v1/images/generations` returns for each image.
    pub image: Vec<u8>,
    /// Reasoning sent as `reasoning_content` before the answer.
    pub reasoning: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            key: None,
            models: vec!["big-model".into()],
            pieces: ["Grüße", " aus", " 東京", " 🎒", "!"]
                .map(String::from)
                .to_vec(),
            write_size: 3,
            fault: Fault::None,
            image: Vec::new(),
            reasoning: None,
        }
    }
}

impl Config {
    pub fn answer(&self) -> String {
        self.pieces.concat()
    }
}

pub struct FakeOpenAi {
    pub base: String,
    pub config: Arc<Mutex<Config>>,
    /// Every request: (method and path, body as JSON or the raw multipart text).
    pub requests: Arc<Mutex<Vec<(String, String)>>>,
}

impl FakeOpenAi {
    pub fn start(config: Config) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let base = format!("http://{}/v1", listener.local_addr().expect("addr"));
        let config = Arc::new(Mutex::new(config));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (c, r) = (config.clone(), requests.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().map_while(Result::ok) {
                let (c, r) = (c.clone(), r.clone());
                std::thread::spawn(move || {
                    let _ = handle(stream, &c, &r);
                });
            }
        });
        Self {
            base,
            config,
            requests,
        }
    }

    pub fn set_fault(&self, fault: Fault) {
        self.config.lock().expect("config").fault = fault;
    }

    /// The body of the last request to `path` (e.g. "POST /v1/chat/completions").
    pub fn last(&self, path: &str) -> Option<String> {
        let requests = self.requests.lock().expect("requests");
        requests
            .iter()
            .rev()
            .find(|(p, _)| p == path)
            .map(|(_, b)| b.clone())
    }
}

fn handle(
    stream: TcpStream,
    config: &Mutex<Config>,
    requests: &Mutex<Vec<(String, String)>>,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut out = stream;
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let (method, path) = (
        parts.next().unwrap_or_default().to_owned(),
        parts.next().unwrap_or_default().to_owned(),
    );
    let (mut length, mut auth) = (0usize, None);
    loop {
        let mut header = String::new();
        reader.read_line(&mut header)?;
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':').unwrap_or((header, ""));
        match name.to_ascii_lowercase().as_str() {
            "content-length" => length = value.trim().parse().unwrap_or(0),
            "authorization" => auth = Some(value.trim().to_owned()),
            _ => {}
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    let body = String::from_utf8_lossy(&body).into_owned();
    let route = format!("{method} {path}");
    requests
        .lock()
        .expect("requests")
        .push((route.clone(), body.clone()));
    let (key, fault) = {
        let c = config.lock().expect("config");
        (c.key.clone(), c.fault.clone())
    };
    if let Some(key) = key
        && auth.as_deref() != Some(&format!("Bearer {key}"))
    {
        let error = json!({"error": {"message": "Incorrect API key provided", "type": "invalid_request_error", "code": "invalid_api_key"}});
        return respond(&mut out, 401, &error);
    }
    if fault == Fault::RateLimited && method == "POST" {
        let error =
            json!({"error": {"message": "Rate limit reached for requests", "type": "requests"}});
        return respond(&mut out, 429, &error);
    }
    match route.as_str() {
        "GET /v1/models" => {
            let models = config.lock().expect("config").models.clone();
            let data: Vec<Value> = models
                .iter()
                .map(|id| json!({"id": id, "object": "model", "owned_by": "lab"}))
                .collect();
            respond(&mut out, 200, &json!({"object": "list", "data": data}))
        }
        "POST /v1/chat/completions" | "POST /v1/completions" => {
            let chat = path.ends_with("chat/completions");
            stream_answer(&mut out, config, chat, &fault)
        }
        "POST /v1/audio/transcriptions" | "POST /v1/audio/translations" => {
            let verbose = body.contains("verbose_json");
            let text = if path.ends_with("translations") {
                "Hello from far away."
            } else {
                "Bonjour de loin."
            };
            let mut answer = json!({"text": text});
            if verbose {
                answer = json!({
                    "task": "transcribe", "language": "french", "duration": 3.5, "text": text,
                    "segments": [
                        {"id": 0, "start": 0.0, "end": 1.5, "text": text.split(' ').next()},
                        {"id": 1, "start": 1.5, "end": 3.5, "text": text.split_once(' ').map(|(_, r)| r)},
                    ],
                });
            }
            respond(&mut out, 200, &answer)
        }
        "POST /v1/images/generations" => {
            let request: Value = serde_json::from_str(&body).unwrap_or_default();
            let n = request.get("n").and_then(Value::as_u64).unwrap_or(1);
            let image = config.lock().expect("config").image.clone();
            let b64 = base64::engine::general_purpose::STANDARD.encode(image);
            let data: Vec<Value> = (0..n).map(|_| json!({"b64_json": b64})).collect();
            respond(&mut out, 200, &json!({"created": 0, "data": data}))
        }
        _ => respond(
            &mut out,
            404,
            &json!({"error": {"message": format!("no route {route}")}}),
        ),
    }
}

fn respond(out: &mut TcpStream, status: u16, body: &Value) -> std::io::Result<()> {
    let body = body.to_string();
    write!(
        out,
        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )?;
    out.flush()
}

/// The answer as server-sent events in HTTP chunks of `write_size` bytes.
fn stream_answer(
    out: &mut TcpStream,
    config: &Mutex<Config>,
    chat: bool,
    fault: &Fault,
) -> std::io::Result<()> {
    let (pieces, write_size, reasoning) = {
        let c = config.lock().expect("config");
        (c.pieces.clone(), c.write_size.max(1), c.reasoning.clone())
    };
    write!(
        out,
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    )?;
    let event = |piece: Value| format!("data: {piece}\n\n");
    let mut events = Vec::new();
    if let Some(r) = reasoning {
        events.push(event(
            json!({"choices": [{"index": 0, "delta": {"reasoning_content": r}}]}),
        ));
    }
    for (i, p) in pieces.iter().enumerate() {
        if i == 1 && *fault == Fault::ErrorInStream {
            events.push(event(json!({"error": {"message": "the model crashed"}})));
            break;
        }
        let choice = if chat {
            json!({"index": 0, "delta": {"content": p}, "finish_reason": null})
        } else {
            json!({"index": 0, "text": p, "finish_reason": null})
        };
        events.push(event(json!({"choices": [choice]})));
    }
    let stop_after = match fault {
        Fault::Stall { pieces, .. } | Fault::Drop { pieces } => Some(*pieces),
        _ => None,
    };
    if stop_after.is_none() {
        events.push(event(
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        ));
        events.push(event(
            json!({"choices": [], "usage": {"prompt_tokens": 17, "completion_tokens": pieces.len(), "total_tokens": 17 + pieces.len()}}),
        ));
        events.push("data: [DONE]\n\n".into());
    }
    let sent = events.len().min(stop_after.unwrap_or(usize::MAX));
    for e in &events[..sent] {
        for bytes in e.as_bytes().chunks(write_size) {
            write!(out, "{:x}\r\n", bytes.len())?;
            out.write_all(bytes)?;
            out.write_all(b"\r\n")?;
            out.flush()?;
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    match fault {
        Fault::Stall { pause, .. } => std::thread::sleep(*pause),
        // Closing without the last chunk: the body is cut off mid-stream.
        Fault::Drop { .. } => {}
        _ => {
            out.write_all(b"0\r\n\r\n")?;
            out.flush()?;
        }
    }
    Ok(())
}
