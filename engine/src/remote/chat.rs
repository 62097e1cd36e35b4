//! Streamed chat and text completions from a remote server: `POST /chat/completions` or
//! `/completions` with `stream: true`, read as server-sent events until `data: [DONE]`.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};

use super::sse::SseDecoder;
use super::{RemoteClient, RemoteError, bad, body_error};
use crate::load::ChatMessage;

/// How often a waiting stream looks at its cancel flag.
const CANCEL_POLL: Duration = Duration::from_millis(50);

/// A chat message as sent; the same as the local engine's.
pub type RemoteMessage = ChatMessage;

/// What is sent: a conversation (through the server's chat template) or raw text.
#[derive(Clone, Copy, Debug)]
pub enum RemoteInput<'a> {
    Chat(&'a [ChatMessage]),
    Text(&'a str),
}

/// Sampling as OpenAI's API takes it; `None` leaves the server's default.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChatParams {
    pub max_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// Extensions: sent only to endpoints that take them ([`super::Endpoint::extensions`]).
    pub top_k: Option<u32>,
    pub repeat_penalty: Option<f32>,
    pub thinking: Option<bool>,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
}

/// A finished (or cancelled) answer.
#[derive(Clone, Debug, Default)]
pub struct RemoteAnswer {
    pub text: String,
    /// As the server's `usage` reports them, when it does.
    pub prompt_tokens: Option<usize>,
    /// The server's count, else the number of streamed pieces.
    pub completion_tokens: usize,
    /// `stop`, `length`, … (None when cancelled or the server did not say).
    pub finish_reason: Option<String>,
    pub ttft: Duration,
    pub tokens_per_s: f64,
    pub cancelled: bool,
}

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<Choice>,
    usage: Option<Usage>,
    error: Option<Value>,
}

#[derive(Deserialize)]
struct Choice {
    delta: Option<Delta>,
    /// Text completions carry the text here.
    text: Option<String>,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Delta {
    content: Option<String>,
    /// What reasoning servers (vLLM, SGLang, DeepSeek's API) send apart from the answer.
    reasoning_content: Option<String>,
    reasoning: Option<String>,
}

#[derive(Deserialize)]
struct Usage {
    prompt_tokens: Option<usize>,
    completion_tokens: Option<usize>,
}

/// What a stream has delivered so far.
#[derive(Default)]
struct Progress {
    answer: RemoteAnswer,
    pieces: usize,
    first: Option<Instant>,
    /// Inside reasoning sent apart from the answer (shown between `<think>` tags).
    thinking: bool,
    done: bool,
}

impl Progress {
    /// Takes one event's data from `url`.
    fn take(
        &mut self,
        data: &str,
        url: &str,
        on_delta: &mut (dyn FnMut(&str) + Send),
    ) -> Result<(), RemoteError> {
        if data.trim() == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        let chunk: Chunk = serde_json::from_str(data).map_err(|e| bad(url, &e))?;
        if let Some(error) = chunk.error {
            return Err(RemoteError::Server {
                url: url.to_owned(),
                message: super::error_message(json!({ "error": error }).to_string().as_bytes()),
            });
        }
        if let Some(u) = chunk.usage {
            self.answer.prompt_tokens = u.prompt_tokens.or(self.answer.prompt_tokens);
            if let Some(c) = u.completion_tokens {
                self.answer.completion_tokens = c;
            }
        }
        for choice in chunk.choices {
            if let Some(reason) = choice.finish_reason {
                self.answer.finish_reason = Some(reason);
            }
            let mut text = String::new();
            if let Some(d) = choice.delta {
                let reasoning = d.reasoning_content.or(d.reasoning).unwrap_or_default();
                if !reasoning.is_empty() {
                    if !self.thinking {
                        text.push_str("<think>\n");
                        self.thinking = true;
                    }
                    text.push_str(&reasoning);
                }
                if let Some(content) = d.content.filter(|c| !c.is_empty()) {
                    text.push_str(&self.end_thinking());
                    text.push_str(&content);
                }
            }
            text.push_str(choice.text.as_deref().unwrap_or_default());
            self.emit(&text, on_delta);
        }
        Ok(())
    }

    fn end_thinking(&mut self) -> String {
        if std::mem::take(&mut self.thinking) {
            "\n</think>\n\n".into()
        } else {
            String::new()
        }
    }

    fn emit(&mut self, text: &str, on_delta: &mut (dyn FnMut(&str) + Send)) {
        if text.is_empty() {
            return;
        }
        self.first.get_or_insert_with(Instant::now);
        self.pieces += 1;
        self.answer.text.push_str(text);
        on_delta(text);
    }

    fn finish(mut self, started: Instant, on_delta: &mut (dyn FnMut(&str) + Send)) -> RemoteAnswer {
        let closing = self.end_thinking();
        if !closing.is_empty() {
            self.answer.text.push_str(&closing);
            on_delta(&closing);
        }
        let mut answer = self.answer;
        if answer.completion_tokens == 0 {
            answer.completion_tokens = self.pieces;
        }
        let first = self.first.unwrap_or_else(Instant::now);
        answer.ttft = first.duration_since(started);
        let streaming = first.elapsed().as_secs_f64();
        answer.tokens_per_s = if answer.completion_tokens > 1 && streaming > 0.0 {
            (answer.completion_tokens - 1) as f64 / streaming
        } else {
            0.0
        };
        answer
    }
}

impl RemoteClient {
    /// Streams `model`'s answer to `input`, calling `on_delta` with each piece of text.
    /// Reasoning sent apart from the answer is shown in `<think>` tags, as local models write
    /// it. `cancelled` is polled while waiting; a cancelled answer returns what came so far.
    pub async fn stream(
        &self,
        model: &str,
        input: RemoteInput<'_>,
        params: &ChatParams,
        cancelled: &(dyn Fn() -> bool + Sync),
        on_delta: &mut (dyn FnMut(&str) + Send),
    ) -> Result<RemoteAnswer, RemoteError> {
        let (path, body) = self.request_body(model, input, params);
        let url = self.endpoint.url(path);
        let started = Instant::now();
        let response = self.send(self.http.post(&url).json(&body), &url).await?;
        let mut bytes = response.bytes_stream();
        let mut decoder = SseDecoder::default();
        let mut progress = Progress::default();
        let mut events = Vec::new();
        let mut idle = Duration::ZERO;
        while !progress.done {
            if cancelled() {
                progress.answer.cancelled = true;
                break;
            }
            let Ok(next) = tokio::time::timeout(CANCEL_POLL, bytes.next()).await else {
                idle += CANCEL_POLL;
                if idle >= self.endpoint.stall {
                    return Err(self.stalled(&url));
                }
                continue;
            };
            idle = Duration::ZERO;
            let ended = match next {
                Some(Ok(chunk)) => {
                    decoder
                        .push(&chunk, &mut events)
                        .map_err(|e| bad(&url, &e))?;
                    false
                }
                Some(Err(e)) if e.is_timeout() => return Err(self.stalled(&url)),
                Some(Err(e)) => return Err(body_error(&url, &e)),
                None => {
                    decoder.finish(&mut events).map_err(|e| bad(&url, &e))?;
                    true
                }
            };
            for data in events.drain(..) {
                progress.take(&data, &url, on_delta)?;
                if progress.done {
                    break;
                }
            }
            // Closed without [DONE]: complete only if the server said why it finished.
            if ended && !progress.done {
                if progress.answer.finish_reason.is_none() {
                    return Err(RemoteError::Dropped {
                        url,
                        detail: "the stream ended before the answer did".into(),
                    });
                }
                break;
            }
        }
        Ok(progress.finish(started, on_delta))
    }

    /// The endpoint's path and the JSON body for `input`.
    fn request_body(
        &self,
        model: &str,
        input: RemoteInput<'_>,
        p: &ChatParams,
    ) -> (&'static str, Value) {
        let (path, mut body) = match input {
            RemoteInput::Chat(messages) => {
                let messages: Vec<Value> = messages
                    .iter()
                    .map(|m| json!({"role": m.role, "content": m.content}))
                    .collect();
                (
                    "chat/completions",
                    json!({"model": model, "messages": messages}),
                )
            }
            RemoteInput::Text(prompt) => ("completions", json!({"model": model, "prompt": prompt})),
        };
        let fields = body.as_object_mut().expect("a JSON object");
        fields.insert("stream".into(), json!(true));
        fields.insert("stream_options".into(), json!({"include_usage": true}));
        let mut put = |key: &str, value: Value| {
            fields.insert(key.into(), value);
        };
        if let Some(v) = p.max_tokens {
            put("max_tokens", json!(v));
        }
        if let Some(v) = p.temperature {
            put("temperature", json!(v));
        }
        if let Some(v) = p.top_p {
            put("top_p", json!(v));
        }
        if let Some(v) = p.seed {
            put("seed", json!(v));
        }
        if !p.stop.is_empty() {
            put("stop", json!(p.stop));
        }
        if self.endpoint.extensions {
            if let Some(v) = p.top_k.filter(|&k| k > 0) {
                put("top_k", json!(v));
            }
            if let Some(v) = p.repeat_penalty.filter(|&r| r != 1.0) {
                // llama.cpp's name and vLLM's/SGLang's; each server ignores the other.
                put("repeat_penalty", json!(v));
                put("repetition_penalty", json!(v));
            }
            if let Some(on) = p.thinking {
                put("chat_template_kwargs", json!({"enable_thinking": on}));
            }
        }
        (path, body)
    }
}
