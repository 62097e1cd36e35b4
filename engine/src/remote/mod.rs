//! Remote backends: any server that speaks OpenAI's HTTP API (vLLM, TGI, SGLang, llama.cpp's
//! server, Ollama, LM Studio, `backpack serve`, OpenAI itself). Models too big for the local
//! GPU run there; the chat, `generate`, `transcribe` and `image` use them through this client.
//!
//! [`RemoteClient`] lists models ([`RemoteClient::models`]), streams chat and text completions
//! ([`chat`]), and sends audio and image requests ([`media`]). Every failure maps to a
//! [`RemoteError`] a user can act on: a refused key, an unreachable host, a full queue, a
//! stream that stalls or drops.

pub mod chat;
pub mod media;
pub mod sse;

use std::time::Duration;

use serde::Deserialize;
use thiserror::Error;

pub use chat::{ChatParams, RemoteAnswer, RemoteMessage};

/// How long a request may go without receiving a byte before it is given up as stalled
/// (a big prompt queued on a busy server can take a while to start).
pub const DEFAULT_STALL: Duration = Duration::from_secs(120);

#[derive(Debug, Error)]
pub enum RemoteError {
    #[error("{0:?} is not an http(s) URL")]
    InvalidUrl(String),
    #[error("could not reach {url}: {detail}")]
    Unreachable { url: String, detail: String },
    #[error(
        "{url} refused the API key ({status}: {message}); check the key (--api-key or OPENAI_API_KEY)"
    )]
    Unauthorized {
        url: String,
        status: u16,
        message: String,
    },
    #[error("{url} is busy (429: {message}); try again shortly")]
    RateLimited { url: String, message: String },
    #[error("{url} answered {status}: {message}")]
    Http {
        url: String,
        status: u16,
        message: String,
    },
    #[error("{url} sent nothing for {secs} s; gave up waiting")]
    Stalled { url: String, secs: u64 },
    #[error("the connection to {url} dropped before the answer was complete ({detail})")]
    Dropped { url: String, detail: String },
    #[error("{url} sent something that is not an OpenAI-style answer: {detail}")]
    BadResponse { url: String, detail: String },
    #[error("{url} reported an error while answering: {message}")]
    Server { url: String, message: String },
    #[error("{0}")]
    Invalid(String),
}

/// An OpenAI-compatible server: where it is and how to authenticate.
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// The API's base, ending in `/v1` (added when the URL has no path).
    pub base_url: String,
    pub api_key: Option<String>,
    /// Sent only when set: `top_k`, `repetition_penalty` and the thinking switch are
    /// extensions vLLM, SGLang and llama.cpp take but OpenAI refuses.
    pub extensions: bool,
    pub stall: Duration,
}

impl Endpoint {
    /// `url` as typed: `http://host:8000`, `http://host:8000/v1/`, `https://api.openai.com/v1`.
    pub fn new(url: &str, api_key: Option<String>) -> Result<Self, RemoteError> {
        let base_url = normalize_base(url)?;
        // OpenAI's own API refuses fields it does not know.
        let extensions = !base_url.contains("api.openai.com");
        Ok(Self {
            base_url,
            api_key: api_key
                .map(|k| k.trim().to_owned())
                .filter(|k| !k.is_empty()),
            extensions,
            stall: DEFAULT_STALL,
        })
    }

    pub fn with_stall(mut self, stall: Duration) -> Self {
        self.stall = stall;
        self
    }

    fn url(&self, path: &str) -> String {
        format!("{}/{}", self.base_url, path.trim_start_matches('/'))
    }
}

/// Trims the URL and gives it the `/v1` path servers expect when it has none.
fn normalize_base(url: &str) -> Result<String, RemoteError> {
    let url = url.trim().trim_end_matches('/');
    let Some(rest) = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
    else {
        return Err(RemoteError::InvalidUrl(url.to_owned()));
    };
    if rest.is_empty() || rest.starts_with('/') || rest.contains(char::is_whitespace) {
        return Err(RemoteError::InvalidUrl(url.to_owned()));
    }
    Ok(if rest.contains('/') {
        url.to_owned()
    } else {
        format!("{url}/v1")
    })
}

/// One model a server lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteModel {
    pub id: String,
    pub owned_by: Option<String>,
}

/// The HTTP side of one [`Endpoint`].
#[derive(Clone)]
pub struct RemoteClient {
    endpoint: Endpoint,
    http: reqwest::Client,
}

impl RemoteClient {
    pub fn new(endpoint: Endpoint) -> Result<Self, RemoteError> {
        let http = crate::http::client_builder()
            .user_agent(concat!("backpack/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(15))
            // The stream's own watch (which names the stall) fires first; this one guards
            // the reads nothing else watches.
            .read_timeout(endpoint.stall + Duration::from_secs(5))
            .build()
            .map_err(|e| RemoteError::Invalid(format!("HTTP client: {e}")))?;
        Ok(Self { endpoint, http })
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// `GET /models`: what the server offers, sorted by id.
    pub async fn models(&self) -> Result<Vec<RemoteModel>, RemoteError> {
        #[derive(Deserialize)]
        struct List {
            data: Vec<Entry>,
        }
        #[derive(Deserialize)]
        struct Entry {
            id: String,
            owned_by: Option<String>,
        }
        let url = self.endpoint.url("models");
        let response = self.send(self.http.get(&url), &url).await?;
        let body = self.body(response, &url).await?;
        let list: List = serde_json::from_slice(&body).map_err(|e| bad(&url, &e))?;
        let mut out: Vec<RemoteModel> = list
            .data
            .into_iter()
            .map(|e| RemoteModel {
                id: e.id,
                owned_by: e.owned_by,
            })
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    /// Sends `request` with the key, mapping failures and error statuses.
    async fn send(
        &self,
        mut request: reqwest::RequestBuilder,
        url: &str,
    ) -> Result<reqwest::Response, RemoteError> {
        if let Some(key) = &self.endpoint.api_key {
            request = request.bearer_auth(key);
        }
        let sent = tokio::time::timeout(self.endpoint.stall, request.send()).await;
        let response = match sent {
            Err(_) => return Err(self.stalled(url)),
            Ok(Err(e)) if e.is_timeout() => return Err(self.stalled(url)),
            Ok(Err(e)) => return Err(send_error(url, &e)),
            Ok(Ok(r)) => r,
        };
        let status = response.status().as_u16();
        if response.status().is_success() {
            return Ok(response);
        }
        let body = response.bytes().await.unwrap_or_default();
        let message = error_message(&body);
        Err(match status {
            401 | 403 => RemoteError::Unauthorized {
                url: url.to_owned(),
                status,
                message,
            },
            429 => RemoteError::RateLimited {
                url: url.to_owned(),
                message,
            },
            _ => RemoteError::Http {
                url: url.to_owned(),
                status,
                message,
            },
        })
    }

    /// A whole (non-streamed) body.
    async fn body(&self, response: reqwest::Response, url: &str) -> Result<Vec<u8>, RemoteError> {
        match tokio::time::timeout(self.endpoint.stall, response.bytes()).await {
            Err(_) => Err(self.stalled(url)),
            Ok(Err(e)) if e.is_timeout() => Err(self.stalled(url)),
            Ok(Err(e)) => Err(body_error(url, &e)),
            Ok(Ok(b)) => Ok(b.to_vec()),
        }
    }

    fn stalled(&self, url: &str) -> RemoteError {
        RemoteError::Stalled {
            url: url.to_owned(),
            secs: self.endpoint.stall.as_secs().max(1),
        }
    }
}

fn bad(url: &str, e: &dyn std::fmt::Display) -> RemoteError {
    RemoteError::BadResponse {
        url: url.to_owned(),
        detail: e.to_string(),
    }
}

/// A request that got no answer at all.
fn send_error(url: &str, e: &reqwest::Error) -> RemoteError {
    let mut detail = e.to_string();
    let mut source = std::error::Error::source(e);
    // reqwest's own text is generic ("error sending request"); the cause says what happened.
    while let Some(s) = source {
        detail = s.to_string();
        source = s.source();
    }
    RemoteError::Unreachable {
        url: url.to_owned(),
        detail,
    }
}

/// A body that broke off after the answer began.
fn body_error(url: &str, e: &reqwest::Error) -> RemoteError {
    RemoteError::Dropped {
        url: url.to_owned(),
        detail: e.to_string(),
    }
}

/// The message of an OpenAI error object (`{"error": {"message": …}}`), else the body's start.
fn error_message(body: &[u8]) -> String {
    #[derive(Deserialize)]
    struct Wrapper {
        error: Detail,
    }
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Detail {
        Object { message: String },
        Text(String),
    }
    if let Ok(w) = serde_json::from_slice::<Wrapper>(body) {
        return match w.error {
            Detail::Object { message } | Detail::Text(message) => message,
        };
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        return "no message".into();
    }
    text.chars().take(300).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_get_their_api_path() {
        let base = |u: &str| normalize_base(u).expect("valid");
        assert_eq!(base("http://host:8000"), "http://host:8000/v1");
        assert_eq!(base(" http://host:8000/ "), "http://host:8000/v1");
        assert_eq!(base("http://host:8000/v1/"), "http://host:8000/v1");
        assert_eq!(base("https://x.example/api/v1"), "https://x.example/api/v1");
        for wrong in [
            "",
            "host:8000",
            "ftp://host",
            "http://",
            "http:///v1",
            "http://a b",
        ] {
            assert!(normalize_base(wrong).is_err(), "{wrong:?}");
        }
    }

    #[test]
    fn openai_itself_gets_no_extensions() {
        let e = Endpoint::new("https://api.openai.com/v1", Some(" sk-x ".into())).expect("valid");
        assert!(!e.extensions);
        assert_eq!(e.api_key.as_deref(), Some("sk-x"));
        let e = Endpoint::new("http://127.0.0.1:8080", Some("  ".into())).expect("valid");
        assert!(e.extensions);
        assert_eq!(e.api_key, None);
    }

    #[test]
    fn error_objects_give_their_message() {
        assert_eq!(
            error_message(br#"{"error":{"message":"bad key","type":"auth"}}"#),
            "bad key"
        );
        assert_eq!(error_message(br#"{"error":"overloaded"}"#), "overloaded");
        assert_eq!(error_message(b"  plain text \n"), "plain text");
        assert_eq!(error_message(b""), "no message");
    }
}
