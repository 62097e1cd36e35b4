//! The HTTP endpoints: `/v1/models`, `/v1/chat/completions`, `/v1/completions`, answered whole
//! or streamed as server-sent events ending in `data: [DONE]`.

use std::convert::Infallible;
use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use backpack_engine::grammar::Constraint;
use backpack_engine::models::StopReason;
use backpack_engine::models::reasoning::{AnswerPiece, ReasoningSplitter, split_reasoning};
use backpack_engine::models::tool_calls::{ParsedCall, StreamPiece, ToolCallStream, ToolFormat};
use backpack_engine::runtime::Event;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::api::{
    ApiError, ChatRequest, CompletionRequest, Job, finish_reason, rejected, unix_now, usage,
};
use super::dispatch::Ticket;
use super::state::{Server, TextSide};
use super::stop::StopMatcher;
use super::tools::call_json;

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Chat,
    Text,
}

pub async fn models(State(s): State<Arc<Server>>) -> Json<Value> {
    let data: Vec<Value> = s
        .model_ids()
        .into_iter()
        .map(
            |id| json!({"id": id, "object": "model", "created": s.created, "owned_by": "backpack"}),
        )
        .collect();
    Json(json!({"object": "list", "data": data}))
}

fn no_text_model() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "no text model is loaded (start the server with --model DIR|FILE)",
    )
    .with_code("model_not_found")
}

pub async fn chat(
    State(s): State<Arc<Server>>,
    body: Result<Json<ChatRequest>, JsonRejection>,
) -> Response {
    text_request(&s, body, Kind::Chat, ChatRequest::job).await
}

pub async fn completions(
    State(s): State<Arc<Server>>,
    body: Result<Json<CompletionRequest>, JsonRejection>,
) -> Response {
    text_request(&s, body, Kind::Text, CompletionRequest::job).await
}

/// Checks a text request against the text model (`job` turns it into the engine's terms)
/// and answers it.
async fn text_request<R>(
    s: &Server,
    body: Result<Json<R>, JsonRejection>,
    kind: Kind,
    job: fn(R, u32) -> Result<Job, ApiError>,
) -> Response {
    let Some(text) = &s.text else {
        return no_text_model().into_response();
    };
    match body
        .map_err(rejected)
        .and_then(|Json(r)| job(r, text.facts().context))
    {
        Ok(job) => answer(text, job, kind).await,
        Err(e) => e.into_response(),
    }
}

pub async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "unknown endpoint (this server has /v1/models, /v1/chat/completions, /v1/completions, \
         /v1/audio/transcriptions, /v1/audio/translations, /v1/images/generations)",
    )
    .with_code("unknown_url")
}

/// With an API key set, every request must carry it as `Authorization: Bearer KEY`.
pub async fn authorize(State(s): State<Arc<Server>>, request: Request, next: Next) -> Response {
    if let Some(key) = &s.api_key {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if !given.is_some_and(|g| constant_time_eq(g.as_bytes(), key.as_bytes())) {
            return ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                "missing or incorrect API key (send it as Authorization: Bearer KEY)",
            )
            .with_code("invalid_api_key")
            .into_response();
        }
    }
    next.run(request).await
}

/// Compares keys in time independent of where they differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn engine_error(
    message: String,
    prompt_too_long: Option<(usize, u32)>,
    bad_grammar: Option<&'static str>,
) -> ApiError {
    match prompt_too_long {
        Some((tokens, context)) => ApiError::bad_request(
            format!("the prompt has {tokens} tokens; this model's context holds {context}"),
            Some("messages"),
        )
        .with_code("context_length_exceeded"),
        None if bad_grammar.is_some() => ApiError::bad_request(message, bad_grammar),
        None => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message),
    }
}

/// The request field that set the answer's grammar.
fn grammar_param(constraint: Option<&Constraint>) -> &'static str {
    match constraint {
        Some(Constraint::Gbnf(_) | Constraint::Lark(_)) => "grammar",
        Some(Constraint::ToolCall { .. }) => "tool_choice",
        _ => "response_format",
    }
}

/// Queues the job; answers whole or streamed. Waits for the first token before replying, so a
/// prompt the engine refuses gets an HTTP error, not a broken stream.
async fn answer(s: &TextSide, job: Job, kind: Kind) -> Response {
    let grammar_param = grammar_param(job.params.constraint.as_ref());
    let Some(mut ticket) = s.dispatch.submit(job.prompt, job.params) else {
        return ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "requests",
            format!(
                "{} requests are already running or queued; retry later",
                s.dispatch.open()
            ),
        )
        .with_code("rate_limit_exceeded")
        .into_response();
    };
    let first = match ticket.next().await {
        Some(Event::Error {
            message,
            prompt_too_long,
            bad_grammar,
            ..
        }) => {
            return engine_error(
                message,
                prompt_too_long,
                bad_grammar.then_some(grammar_param),
            )
            .into_response();
        }
        Some(event) => event,
        None => {
            return ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "the engine stopped",
            )
            .into_response();
        }
    };
    let facts = s.facts();
    let reply = Reply {
        id: format!(
            "{}-{}",
            if kind == Kind::Chat {
                "chatcmpl"
            } else {
                "cmpl"
            },
            ticket.id
        ),
        model: facts.model,
        created: unix_now(),
        kind,
        tools: job.tools,
        tool_format: facts.tool_format,
        grammar_param,
    };
    let stops = StopMatcher::new(job.stops);
    if job.stream {
        stream(reply, ticket, first, stops, job.include_usage)
    } else {
        whole(reply, ticket, first, stops).await
    }
}

/// The fields every response and chunk carries, and the tools whose calls are read out.
struct Reply {
    id: String,
    model: String,
    created: u64,
    kind: Kind,
    tools: Vec<Value>,
    tool_format: ToolFormat,
    /// The request field a grammar error is blamed on.
    grammar_param: &'static str,
}

/// How a generation ended, as the response reports it.
struct Ending {
    finish: &'static str,
    prompt_tokens: usize,
    completion_tokens: usize,
    cached_tokens: usize,
}

fn ending(stop: StopReason, stopped: bool, prompt_tokens: usize, generated: usize) -> Ending {
    Ending {
        finish: finish_reason(stop, stopped),
        prompt_tokens,
        cached_tokens: 0,
        // The end-of-text token is not part of the answer.
        completion_tokens: generated - usize::from(stop == StopReason::EndOfText && generated > 0),
    }
}

fn log_answer(request: u64, end: &Ending) {
    eprintln!(
        "request {request}: {} prompt tokens, {} generated, finish {}",
        end.prompt_tokens, end.completion_tokens, end.finish
    );
}

impl Reply {
    fn whole(&self, text: &str, end: &Ending) -> Value {
        let choice = match self.kind {
            Kind::Chat => {
                // A reasoning model's thinking goes apart, as other servers report it.
                let (reasoning, reply) = split_reasoning(text);
                let (content, calls) = if self.tools.is_empty() {
                    (reply, Vec::new())
                } else {
                    self.tool_format.parse(&reply, &self.tools)
                };
                let mut message = json!({"role": "assistant", "content": content});
                if let Some(reasoning) = reasoning {
                    message["reasoning_content"] = reasoning.into();
                }
                let mut finish = end.finish;
                if !calls.is_empty() {
                    if message["content"] == "" {
                        message["content"] = Value::Null;
                    }
                    message["tool_calls"] = calls
                        .iter()
                        .map(|c| call_json(c, self.tool_format, None))
                        .collect();
                    finish = "tool_calls";
                }
                json!({
                    "index": 0,
                    "message": message,
                    "logprobs": null,
                    "finish_reason": finish,
                })
            }
            Kind::Text => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": end.finish})
            }
        };
        json!({
            "id": self.id,
            "object": if self.kind == Kind::Chat { "chat.completion" } else { "text_completion" },
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage(end.prompt_tokens, end.completion_tokens, end.cached_tokens),
        })
    }

    /// A stream chunk with one tool call.
    fn call_chunk(&self, call: &ParsedCall, index: usize) -> Value {
        self.tool_calls_chunk(call_json(call, self.tool_format, Some(index)))
    }

    /// A stream chunk whose delta carries one entry of `tool_calls`.
    fn tool_calls_chunk(&self, entry: Value) -> Value {
        let mut chunk = self.chunk(None, None, false);
        chunk["choices"][0]["delta"]["tool_calls"] = json!([entry]);
        chunk
    }

    /// A stream chunk with a piece of the answer.
    fn piece_chunk(&self, piece: &AnswerPiece) -> Value {
        match piece {
            AnswerPiece::Reply(text) => self.chunk(Some(text), None, false),
            AnswerPiece::Reasoning(text) => {
                let mut chunk = self.chunk(None, None, false);
                chunk["choices"][0]["delta"]["reasoning_content"] = text.as_str().into();
                chunk
            }
        }
    }

    /// A stream chunk with `text` (or the opening role, or the finish reason).
    fn chunk(&self, text: Option<&str>, finish: Option<&str>, first: bool) -> Value {
        let choice = match self.kind {
            Kind::Chat => {
                let mut delta = serde_json::Map::new();
                if first {
                    delta.insert("role".into(), "assistant".into());
                }
                if let Some(t) = text {
                    delta.insert("content".into(), t.into());
                }
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
            }
            Kind::Text => {
                json!({"index": 0, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": finish})
            }
        };
        json!({
            "id": self.id,
            "object": if self.kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" },
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        })
    }

    fn usage_chunk(&self, end: &Ending) -> Value {
        json!({
            "id": self.id,
            "object": if self.kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" },
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": usage(end.prompt_tokens, end.completion_tokens, end.cached_tokens),
        })
    }
}

async fn whole(reply: Reply, mut ticket: Ticket, first: Event, mut stops: StopMatcher) -> Response {
    let mut text = String::new();
    let mut stopped = false;
    let mut event = Some(first);
    while let Some(e) = event {
        match e {
            Event::Token { text_delta, .. } if !stopped => {
                let (out, hit) = stops.push(&text_delta);
                text.push_str(&out);
                if hit {
                    stopped = true;
                    ticket.stop();
                }
            }
            Event::Done {
                stop,
                prompt_tokens,
                generated_tokens,
                cached_tokens,
                ..
            } => {
                if !stopped {
                    text.push_str(&stops.finish());
                }
                let mut end = ending(stop, stopped, prompt_tokens, generated_tokens);
                end.cached_tokens = cached_tokens;
                log_answer(ticket.id, &end);
                return Json(reply.whole(&text, &end)).into_response();
            }
            Event::Error {
                message,
                prompt_too_long,
                bad_grammar,
                ..
            } => {
                let param = bad_grammar.then_some(reply.grammar_param);
                return engine_error(message, prompt_too_long, param).into_response();
            }
            _ => {}
        }
        event = ticket.next().await;
    }
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "server_error",
        "the engine stopped",
    )
    .into_response()
}

/// The pieces `text` completes (the reply, for completions, which have no reasoning split);
/// `last` flushes what the splitter holds back.
fn pieces(splitter: &mut Option<ReasoningSplitter>, text: &str, last: bool) -> Vec<AnswerPiece> {
    let Some(splitter) = splitter else {
        return if text.is_empty() {
            Vec::new()
        } else {
            vec![AnswerPiece::Reply(text.to_owned())]
        };
    };
    let mut out = splitter.push(text);
    if last {
        out.extend(splitter.finish());
    }
    out
}

/// A streamed answer's text as chunks: the reasoning apart (chat), and tool calls read out
/// where the request gave tools.
struct AnswerStream {
    splitter: Option<ReasoningSplitter>,
    calls_in: Option<ToolCallStream>,
    /// Calls sent so far (their indexes).
    calls: usize,
}

impl AnswerStream {
    fn new(reply: &Reply) -> Self {
        let chat = reply.kind == Kind::Chat;
        Self {
            splitter: chat.then(ReasoningSplitter::default),
            calls_in: (chat && !reply.tools.is_empty())
                .then(|| ToolCallStream::new(reply.tool_format, reply.tools.clone())),
            calls: 0,
        }
    }

    /// The chunks `text` completes; `last` flushes what is held back.
    fn chunks(&mut self, reply: &Reply, text: &str, last: bool) -> Vec<Value> {
        let mut out = Vec::new();
        for piece in pieces(&mut self.splitter, text, last) {
            match (&mut self.calls_in, piece) {
                (Some(calls), AnswerPiece::Reply(text)) => {
                    let pieces = calls.push(&text);
                    self.tool_pieces(reply, pieces, &mut out);
                }
                (_, piece) => out.push(reply.piece_chunk(&piece)),
            }
        }
        if last && let Some(calls) = &mut self.calls_in {
            let pieces = calls.finish();
            self.tool_pieces(reply, pieces, &mut out);
        }
        out
    }

    fn tool_pieces(&mut self, reply: &Reply, pieces: Vec<StreamPiece>, out: &mut Vec<Value>) {
        for piece in pieces {
            match piece {
                StreamPiece::Text(t) => out.push(reply.piece_chunk(&AnswerPiece::Reply(t))),
                StreamPiece::Call(call) => {
                    out.push(reply.call_chunk(&call, self.calls));
                    self.calls += 1;
                }
                // OpenAI's streamed call: the id and name with empty arguments, then the
                // arguments in fragments under the same index.
                StreamPiece::CallStart { name, id } => {
                    let call = ParsedCall {
                        name,
                        arguments: Value::String(String::new()),
                        id,
                    };
                    out.push(reply.call_chunk(&call, self.calls));
                    self.calls += 1;
                }
                StreamPiece::CallArguments { call, text } => {
                    let fragment = json!({"index": call, "function": {"arguments": text}});
                    out.push(reply.tool_calls_chunk(fragment));
                }
            }
        }
    }
}

/// Streams chunks from a task that follows the generation; when the client goes away the
/// channel closes, the task drops its ticket and the generation is cancelled.
fn stream(
    reply: Reply,
    mut ticket: Ticket,
    first: Event,
    mut stops: StopMatcher,
    include_usage: bool,
) -> Response {
    let (tx, rx) = mpsc::channel::<Value>(64);
    tokio::spawn(async move {
        let send = |v: Value| {
            let tx = tx.clone();
            async move { tx.send(v).await.is_ok() }
        };
        if !send(reply.chunk(Some(""), None, true)).await {
            return;
        }
        let mut stopped = false;
        let mut pieces = AnswerStream::new(&reply);
        let mut event = Some(first);
        while let Some(e) = event {
            match e {
                Event::Token { text_delta, .. } if !stopped => {
                    let (out, hit) = stops.push(&text_delta);
                    if hit {
                        stopped = true;
                        ticket.stop();
                    }
                    for chunk in pieces.chunks(&reply, &out, false) {
                        if !send(chunk).await {
                            return;
                        }
                    }
                }
                Event::Done {
                    stop,
                    prompt_tokens,
                    generated_tokens,
                    cached_tokens,
                    ..
                } => {
                    let rest = if stopped {
                        String::new()
                    } else {
                        stops.finish()
                    };
                    for chunk in pieces.chunks(&reply, &rest, true) {
                        if !send(chunk).await {
                            return;
                        }
                    }
                    let mut end = ending(stop, stopped, prompt_tokens, generated_tokens);
                    end.cached_tokens = cached_tokens;
                    if pieces.calls > 0 {
                        end.finish = "tool_calls";
                    }
                    log_answer(ticket.id, &end);
                    if !send(reply.chunk(None, Some(end.finish), false)).await {
                        return;
                    }
                    if include_usage {
                        let _ = send(reply.usage_chunk(&end)).await;
                    }
                    return;
                }
                Event::Error {
                    message,
                    prompt_too_long,
                    bad_grammar,
                    ..
                } => {
                    let param = bad_grammar.then_some(reply.grammar_param);
                    let _ = send(engine_error(message, prompt_too_long, param).body()).await;
                    return;
                }
                _ => {}
            }
            event = tokio::select! {
                e = ticket.next() => e,
                () = tx.closed() => return,
            };
        }
    });
    let chunks = futures_util::stream::unfold((rx, false), |(mut rx, done)| async move {
        if done {
            return None;
        }
        match rx.recv().await {
            Some(v) => Some((
                Ok::<_, Infallible>(SseEvent::default().data(v.to_string())),
                (rx, false),
            )),
            None => Some((Ok(SseEvent::default().data("[DONE]")), (rx, true))),
        }
    });
    Sse::new(chunks)
        .keep_alive(KeepAlive::default())
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(kind: Kind) -> Reply {
        Reply {
            id: "chatcmpl-1".into(),
            model: "m".into(),
            created: 0,
            kind,
            tools: Vec::new(),
            tool_format: ToolFormat::Hermes,
            grammar_param: "response_format",
        }
    }

    #[test]
    fn chat_answers_carry_the_reasoning_apart() {
        let end = ending(StopReason::EndOfText, false, 3, 5);
        let whole = reply(Kind::Chat).whole("<think>\nweigh it\n</think>\n\nYes.", &end);
        let message = &whole["choices"][0]["message"];
        assert_eq!(message["content"], "Yes.");
        assert_eq!(message["reasoning_content"], "weigh it");
        let plain = reply(Kind::Chat).whole("Yes.", &end);
        assert!(
            plain["choices"][0]["message"]
                .get("reasoning_content")
                .is_none()
        );
        // Completions are text as it came.
        let text = reply(Kind::Text).whole("<think>x</think>y", &end);
        assert_eq!(text["choices"][0]["text"], "<think>x</think>y");
    }

    #[test]
    fn streamed_reasoning_goes_to_its_own_delta_field() {
        let r = reply(Kind::Chat);
        let mut splitter = Some(ReasoningSplitter::default());
        let mut chunks = Vec::new();
        for (delta, last) in [
            ("<thi", false),
            ("nk>\nhm", false),
            ("</think>\n\nOk", false),
            ("", true),
        ] {
            chunks.extend(
                pieces(&mut splitter, delta, last)
                    .iter()
                    .map(|p| r.piece_chunk(p)),
            );
        }
        let field =
            |c: &Value, key: &str| c["choices"][0]["delta"][key].as_str().map(str::to_owned);
        let reasoning: String = chunks
            .iter()
            .filter_map(|c| field(c, "reasoning_content"))
            .collect();
        let content: String = chunks.iter().filter_map(|c| field(c, "content")).collect();
        assert_eq!((reasoning.as_str(), content.as_str()), ("\nhm", "Ok"));
    }
}
