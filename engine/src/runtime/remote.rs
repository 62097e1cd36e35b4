//! The remote service: chat answers from OpenAI-compatible servers, streamed as the same
//! [`Event`]s the local text engine sends, so a chat panel handles both alike. Each request
//! runs as its own task (the server does the queueing); model lists are fetched the same way.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use super::{Event, WakeFn};
use crate::load::ChatMessage;
use crate::models::StopReason;
use crate::remote::chat::RemoteInput;
use crate::remote::{ChatParams, Endpoint, RemoteAnswer, RemoteClient, RemoteModel};

pub enum RemoteEvent {
    /// The models `backend` lists, or why they could not be listed.
    Models {
        backend: String,
        result: Result<Vec<RemoteModel>, String>,
    },
    /// Tokens (`id` 0: servers send text, not ids), the end or the failure of an answer.
    Text(Event),
}

/// The caller's side of the remote service.
#[derive(Clone)]
pub struct RemoteHandle {
    events: mpsc::UnboundedSender<RemoteEvent>,
    wake: Option<WakeFn>,
    next_id: Arc<AtomicU64>,
    cancelled: Arc<Mutex<HashSet<u64>>>,
    runtime: tokio::runtime::Handle,
}

pub struct RemoteService;

impl RemoteService {
    /// Starts the service on the current tokio runtime.
    pub fn spawn(wake: Option<WakeFn>) -> (RemoteHandle, mpsc::UnboundedReceiver<RemoteEvent>) {
        let (events, rx) = mpsc::unbounded_channel();
        let handle = RemoteHandle {
            events,
            wake,
            next_id: Arc::new(AtomicU64::new(0)),
            cancelled: Arc::new(Mutex::new(HashSet::new())),
            runtime: tokio::runtime::Handle::current(),
        };
        (handle, rx)
    }
}

impl RemoteHandle {
    fn send(&self, event: RemoteEvent) {
        let _ = self.events.send(event);
        if let Some(w) = &self.wake {
            w();
        }
    }

    /// Asks `endpoint` for its models; the answer comes as [`RemoteEvent::Models`].
    pub fn list_models(&self, backend: &str, endpoint: Endpoint) {
        let this = self.clone();
        let backend = backend.to_owned();
        self.runtime.spawn(async move {
            let result = match RemoteClient::new(endpoint) {
                Ok(client) => client.models().await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            this.send(RemoteEvent::Models { backend, result });
        });
    }

    /// Streams `model`'s answer to `messages` from `endpoint`; returns the request id its
    /// events carry.
    pub fn generate(
        &self,
        endpoint: Endpoint,
        model: String,
        messages: Vec<ChatMessage>,
        params: ChatParams,
    ) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::AcqRel) + 1;
        let this = self.clone();
        self.runtime.spawn(async move {
            let result = match RemoteClient::new(endpoint) {
                Ok(client) => {
                    let is_cancelled = || this.cancelled.lock().is_ok_and(|set| set.contains(&id));
                    let mut on_delta = |text: &str| {
                        this.send(RemoteEvent::Text(Event::Token {
                            request: id,
                            id: 0,
                            text_delta: text.to_owned(),
                        }))
                    };
                    let input = RemoteInput::Chat(&messages);
                    client
                        .stream(&model, input, &params, &is_cancelled, &mut on_delta)
                        .await
                }
                Err(e) => Err(e),
            };
            if let Ok(mut set) = this.cancelled.lock() {
                set.remove(&id);
            }
            this.send(RemoteEvent::Text(match result {
                Ok(answer) => done(id, &answer),
                Err(e) => Event::Error {
                    request: Some(id),
                    message: e.to_string(),
                    prompt_too_long: None,
                    bad_grammar: false,
                },
            }));
        });
        id
    }

    /// Stops answer `id`; what came so far is kept.
    pub fn cancel(&self, id: u64) {
        if let Ok(mut set) = self.cancelled.lock() {
            set.insert(id);
        }
    }
}

fn done(id: u64, answer: &RemoteAnswer) -> Event {
    let stop = if answer.cancelled {
        StopReason::Cancelled
    } else if answer.finish_reason.as_deref() == Some("length") {
        StopReason::MaxTokens
    } else {
        StopReason::EndOfText
    };
    Event::Done {
        request: id,
        prompt_ids: Vec::new(),
        prompt_tokens: answer.prompt_tokens.unwrap_or(0),
        generated_tokens: answer.completion_tokens,
        ttft: answer.ttft,
        prompt_time: None,
        tokens_per_s: answer.tokens_per_s,
        stop,
        cached_tokens: 0,
        drafts: Default::default(),
    }
}
