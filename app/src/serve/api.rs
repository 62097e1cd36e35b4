//! OpenAI's request, response and error shapes for the text endpoints, and their mapping onto
//! the engine's prompt and sampling parameters. Anything the engine cannot honour is refused
//! with a 400 that names the parameter, rather than silently ignored.

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use backpack_engine::load::{ChatMessage, ReasoningEffort};
use backpack_engine::models::{GenerateParams, Prompt, StopReason};
use backpack_engine::ops::SamplerParams;
use serde::Deserialize;
use serde_json::{Value, json};

use super::tools::{message_tool_calls, output_constraint, tool_request};

/// An error as OpenAI's API reports it: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>, param: Option<&'static str>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param,
            code: None,
        }
    }

    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
        }
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        if self.status == StatusCode::PAYLOAD_TOO_LARGE {
            // The rest of the body was not read: this connection cannot carry another request.
            response.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
        }
        response
    }
}

/// `stop`: one string or up to four.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

/// Message content: a string, or parts of which only text is understood.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Value>),
}

#[derive(Debug, Deserialize)]
pub struct Message {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    /// An assistant turn's calls.
    #[serde(default)]
    pub tool_calls: Option<Vec<Value>>,
    /// The call a `tool` message answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// The sampling fields both endpoints share.
#[derive(Debug, Default, Deserialize)]
pub struct Sampling {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// Not OpenAI's, but llama.cpp's and vLLM's servers take it too.
    pub top_k: Option<u32>,
    pub max_tokens: Option<u32>,
    pub max_completion_tokens: Option<u32>,
    pub stop: Option<Stop>,
    pub seed: Option<u64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// llama.cpp's multiplicative penalty, which the engine implements (vLLM's name too).
    #[serde(alias = "repetition_penalty")]
    pub repeat_penalty: Option<f32>,
    /// vLLM's and SGLang's way to pass template switches; `enable_thinking` and
    /// `reasoning_effort` are honoured.
    pub chat_template_kwargs: Option<Value>,
    /// OpenAI's reasoning effort: low, medium or high (GPT-OSS's template takes it).
    pub reasoning_effort: Option<String>,
    pub n: Option<u32>,
    pub logprobs: Option<Value>,
    pub logit_bias: Option<Value>,
    pub response_format: Option<Value>,
    /// llama.cpp's constrained decoding: GBNF (or llguidance's Lark).
    pub grammar: Option<String>,
    /// llama.cpp's shortcut for a JSON-schema response.
    pub json_schema: Option<Value>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
}

/// `model` is not read: one model is served, whatever a client names (as llama.cpp's server).
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<Message>,
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    #[serde(flatten)]
    pub sampling: Sampling,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum PromptField {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub prompt: PromptField,
    /// Refused: tools need a chat template.
    pub tools: Option<Value>,
    pub suffix: Option<String>,
    pub echo: Option<bool>,
    pub best_of: Option<u32>,
    #[serde(flatten)]
    pub sampling: Sampling,
}

/// What a request asks the engine for, once checked.
pub struct Job {
    pub prompt: Prompt,
    pub params: GenerateParams,
    pub stops: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    /// Tool definitions whose calls are read out of the answer (empty: none).
    pub tools: Vec<Value>,
}

impl ChatRequest {
    pub fn job(self, context: u32) -> Result<Job, ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::bad_request(
                "messages must hold at least one message",
                Some("messages"),
            ));
        }
        let mut messages = Vec::with_capacity(self.messages.len());
        for m in self.messages {
            messages.push(chat_message(m)?);
        }
        let tools = tool_request(
            self.tools.as_ref(),
            self.tool_choice.as_ref(),
            self.parallel_tool_calls,
        )?;
        let (mut params, stops, stream, include_usage) = self.sampling.check(context)?;
        if let Some(forced) = tools.forced {
            if params.constraint.is_some() {
                return Err(ApiError::bad_request(
                    "a required tool call cannot be combined with response_format or grammar",
                    Some("tool_choice"),
                ));
            }
            params.constraint = Some(forced);
        }
        params.tools = tools.tools.clone();
        Ok(Job {
            prompt: Prompt::Chat(messages),
            params,
            stops,
            stream,
            include_usage,
            tools: tools.tools,
        })
    }
}

/// One OpenAI message in the template's terms.
fn chat_message(m: Message) -> Result<ChatMessage, ApiError> {
    let role = match m.role.as_str() {
        "system" | "developer" => "system",
        "user" => "user",
        "assistant" => "assistant",
        "tool" => "tool",
        other => {
            return Err(ApiError::bad_request(
                format!(
                    "messages with role {other:?} are not supported (system, developer, user, assistant, tool are)"
                ),
                Some("messages"),
            ));
        }
    };
    let content = match m.content {
        None => String::new(),
        Some(Content::Text(t)) => t,
        Some(Content::Parts(parts)) => text_parts(&parts)?,
    };
    let mut message = ChatMessage::new(role, &content);
    if let Some(calls) = &m.tool_calls {
        message.tool_calls = message_tool_calls(calls)?;
    }
    message.tool_call_id = m.tool_call_id;
    message.name = m.name;
    Ok(message)
}

/// The text of content parts; other kinds (images, audio) are refused.
fn text_parts(parts: &[Value]) -> Result<String, ApiError> {
    let mut text = String::new();
    for p in parts {
        match (
            p.get("type").and_then(Value::as_str),
            p.get("text").and_then(Value::as_str),
        ) {
            (Some("text"), Some(t)) => text.push_str(t),
            (kind, _) => {
                return Err(ApiError::bad_request(
                    format!(
                        "content parts of type {:?} are not supported (text is)",
                        kind.unwrap_or("?")
                    ),
                    Some("messages"),
                ));
            }
        }
    }
    Ok(text)
}

impl CompletionRequest {
    pub fn job(self, context: u32) -> Result<Job, ApiError> {
        let prompt = match self.prompt {
            PromptField::One(p) => p,
            PromptField::Many(mut ps) if ps.len() == 1 => ps.remove(0),
            PromptField::Many(_) => {
                return Err(ApiError::bad_request(
                    "one prompt per request is supported",
                    Some("prompt"),
                ));
            }
        };
        if self.suffix.is_some() {
            return Err(ApiError::bad_request(
                "suffix is not supported",
                Some("suffix"),
            ));
        }
        if self.echo == Some(true) {
            return Err(ApiError::bad_request("echo is not supported", Some("echo")));
        }
        if self
            .tools
            .as_ref()
            .is_some_and(|v| v.as_array().is_some_and(|a| !a.is_empty()))
        {
            return Err(ApiError::bad_request(
                "tools need a chat template: use /v1/chat/completions",
                Some("tools"),
            ));
        }
        if self.best_of.is_some_and(|b| b > 1) {
            return Err(ApiError::bad_request(
                "best_of above 1 is not supported",
                Some("best_of"),
            ));
        }
        let (params, stops, stream, include_usage) = self.sampling.check(context)?;
        Ok(Job {
            prompt: Prompt::Raw(prompt),
            params,
            stops,
            stream,
            include_usage,
            tools: Vec::new(),
        })
    }
}

impl Sampling {
    /// The engine's parameters; `context` bounds max_tokens's default.
    fn check(self, context: u32) -> Result<(GenerateParams, Vec<String>, bool, bool), ApiError> {
        let refuse = |param: &'static str, what: &str| {
            Err(ApiError::bad_request(
                format!("{param} {what}"),
                Some(param),
            ))
        };
        if self.n.is_some_and(|n| n != 1) {
            return refuse("n", "other than 1 is not supported");
        }
        for (param, value) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if value.is_some_and(|v| v != 0.0) {
                return refuse(
                    param,
                    "is not supported; repeat_penalty (multiplicative, as llama.cpp's) is",
                );
            }
        }
        if self
            .logprobs
            .as_ref()
            .is_some_and(|v| !v.is_null() && *v != Value::Bool(false))
        {
            return refuse("logprobs", "is not supported");
        }
        if self
            .logit_bias
            .as_ref()
            .is_some_and(|v| v.as_object().is_some_and(|o| !o.is_empty()))
        {
            return refuse("logit_bias", "is not supported");
        }
        let constraint = output_constraint(
            self.response_format.as_ref(),
            self.grammar.as_deref(),
            self.json_schema.as_ref(),
        )?;
        let temperature = self.temperature.unwrap_or(1.0);
        if !(0.0..=2.0).contains(&temperature) {
            return refuse("temperature", "must be between 0 and 2");
        }
        let top_p = self.top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return refuse("top_p", "must be in (0, 1]");
        }
        let repeat_penalty = self.repeat_penalty.unwrap_or(1.0);
        if !(repeat_penalty > 0.0 && repeat_penalty.is_finite()) {
            return refuse("repeat_penalty", "must be positive");
        }
        let max_tokens = match self.max_completion_tokens.or(self.max_tokens) {
            Some(0) => return refuse("max_tokens", "must be at least 1"),
            Some(n) => n,
            None => context,
        };
        let stops = match self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s],
            Some(Stop::Many(v)) => v,
        };
        if stops.len() > 4 || stops.iter().any(String::is_empty) {
            return refuse("stop", "takes up to 4 non-empty strings");
        }
        let seed = self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
        let kwarg = |key: &str| self.chat_template_kwargs.as_ref().and_then(|k| k.get(key));
        let effort = self
            .reasoning_effort
            .as_deref()
            .or_else(|| kwarg("reasoning_effort").and_then(Value::as_str));
        let reasoning_effort = match effort {
            None => None,
            Some(text) => match ReasoningEffort::parse(text) {
                Some(effort) => Some(effort),
                None => return refuse("reasoning_effort", "must be low, medium or high"),
            },
        };
        let params = GenerateParams {
            max_tokens,
            sampler: SamplerParams {
                temperature,
                top_k: self.top_k.unwrap_or(0),
                top_p,
                repeat_penalty,
                seed,
            },
            thinking: kwarg("enable_thinking").and_then(Value::as_bool),
            reasoning_effort,
            constraint,
            tools: Vec::new(),
        };
        let include_usage = self.stream_options.is_some_and(|o| o.include_usage);
        Ok((params, stops, self.stream, include_usage))
    }
}

/// OpenAI's finish_reason for how a generation ended (`stopped`: a stop string was met).
pub fn finish_reason(stop: StopReason, stopped: bool) -> &'static str {
    match stop {
        _ if stopped => "stop",
        StopReason::EndOfText | StopReason::Cancelled => "stop",
        StopReason::MaxTokens | StopReason::ContextFull => "length",
    }
}

/// OpenAI's usage object; `cached` prompt tokens came from the prompt cache.
pub fn usage(prompt: usize, completion: usize, cached: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

/// Malformed JSON, a wrong content type or an oversized body, as OpenAI-style errors.
pub fn rejected(e: JsonRejection) -> ApiError {
    let status = e.status();
    let message = match status {
        StatusCode::PAYLOAD_TOO_LARGE => "the request body is too large".to_owned(),
        _ => e.body_text(),
    };
    ApiError::new(status, "invalid_request_error", message)
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(extra: Value) -> Result<Job, ApiError> {
        let mut body = serde_json::json!({"messages": [{"role": "user", "content": "Hi"}]});
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        let request: ChatRequest = serde_json::from_value(body).expect("a chat request");
        request.job(4096)
    }

    #[test]
    fn reasoning_effort_is_read_from_either_place_and_checked() {
        let effort = |extra| chat(extra).map(|j| j.params.reasoning_effort);
        assert_eq!(effort(serde_json::json!({})).ok(), Some(None));
        assert_eq!(
            effort(serde_json::json!({"reasoning_effort": "High"})).ok(),
            Some(Some(ReasoningEffort::High))
        );
        assert_eq!(
            effort(serde_json::json!({"chat_template_kwargs": {"reasoning_effort": "low"}})).ok(),
            Some(Some(ReasoningEffort::Low))
        );
        let refused = chat(serde_json::json!({"reasoning_effort": "extreme"}))
            .err()
            .expect("an unknown effort is refused");
        assert_eq!(refused.param, Some("reasoning_effort"));
        assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    }
}
