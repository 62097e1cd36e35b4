//! The text service: chat generation with one [`TextModel`], on its own blocking task (every
//! token waits on the GPU).

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;

use super::{WakeFn, guarded};
use crate::gpu::Gpu;
use crate::models::{GenerateParams, ModelInfo, ModelOptions, Prompt, StopReason, TextModel};

pub enum Request {
    Load {
        path: PathBuf,
        options: ModelOptions,
    },
    Generate {
        id: u64,
        prompt: Prompt,
        params: GenerateParams,
    },
    Unload,
}

#[derive(Clone, Debug)]
pub enum Event {
    Loaded(ModelInfo),
    Token {
        request: u64,
        /// The token's id; 0 from a remote backend, which sends text, not ids.
        id: u32,
        text_delta: String,
    },
    Done {
        request: u64,
        prompt_ids: Vec<u32>,
        prompt_tokens: usize,
        generated_tokens: usize,
        ttft: Duration,
        /// The local model's time over the prompt (the time to first token less tokenizing);
        /// unknown for a remote backend.
        prompt_time: Option<Duration>,
        tokens_per_s: f64,
        stop: StopReason,
        /// Prompt tokens the local model took from its cache of the previous prompt.
        cached_tokens: usize,
        /// Speculative decoding's drafts offered and kept (zero without speculation).
        drafts: crate::models::speculate::DraftStats,
    },
    Error {
        request: Option<u64>,
        message: String,
        /// Set when the prompt did not fit the context: (prompt tokens, context length), so a
        /// UI can offer to drop the oldest turns.
        prompt_too_long: Option<(usize, u32)>,
        /// The request's grammar or JSON schema could not be compiled or followed (its fault,
        /// not the engine's).
        bad_grammar: bool,
    },
}

/// The caller's side of a running engine.
#[derive(Clone)]
pub struct EngineHandle {
    requests: mpsc::UnboundedSender<Request>,
    next_id: Arc<AtomicU64>,
    cancelled_through: Arc<AtomicU64>,
    /// Single requests cancelled (a server's client that went away), not those before them.
    cancelled: Arc<Mutex<HashSet<u64>>>,
}

impl EngineHandle {
    pub fn load(&self, path: PathBuf, options: ModelOptions) {
        let _ = self.requests.send(Request::Load { path, options });
    }

    /// Queues a generation and returns its request id.
    pub fn generate(&self, prompt: Prompt, params: GenerateParams) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::AcqRel) + 1;
        let _ = self.requests.send(Request::Generate { id, prompt, params });
        id
    }

    /// Cancels request `id` and any earlier one; a running generation stops before its next
    /// token.
    pub fn cancel(&self, id: u64) {
        self.cancelled_through.fetch_max(id, Ordering::AcqRel);
    }

    /// Cancels request `id` alone (queued or running); others go on.
    pub fn cancel_one(&self, id: u64) {
        if let Ok(mut set) = self.cancelled.lock() {
            set.insert(id);
        }
    }

    pub fn unload(&self) {
        let _ = self.requests.send(Request::Unload);
    }
}

pub struct Engine;

impl Engine {
    /// Starts the engine on the current tokio runtime.
    pub fn spawn(gpu: Gpu, wake: Option<WakeFn>) -> (EngineHandle, mpsc::UnboundedReceiver<Event>) {
        let (req_tx, mut req_rx) = mpsc::unbounded_channel::<Request>();
        let (ev_tx, ev_rx) = mpsc::unbounded_channel::<Event>();
        let cancelled_through = Arc::new(AtomicU64::new(0));
        let cancelled = Arc::new(Mutex::new(HashSet::new()));
        let handle = EngineHandle {
            requests: req_tx,
            next_id: Arc::new(AtomicU64::new(0)),
            cancelled_through: cancelled_through.clone(),
            cancelled: cancelled.clone(),
        };
        tokio::task::spawn_blocking(move || {
            let send = |event: Event| {
                let _ = ev_tx.send(event);
                if let Some(w) = &wake {
                    w();
                }
            };
            let mut model: Option<TextModel> = None;
            while let Some(request) = req_rx.blocking_recv() {
                match request {
                    Request::Load { path, options } => {
                        model = None;
                        match guarded("loading the model", || {
                            TextModel::load(&gpu, &path, &options)
                        }) {
                            Ok(m) => {
                                send(Event::Loaded(m.info()));
                                model = Some(m);
                            }
                            Err(e) => send(Event::Error {
                                request: None,
                                message: e.to_string(),
                                prompt_too_long: None,
                                bad_grammar: false,
                            }),
                        }
                    }
                    Request::Unload => model = None,
                    Request::Generate { id, prompt, params } => {
                        let Some(m) = model.as_mut() else {
                            send(Event::Error {
                                request: Some(id),
                                message: crate::Error::NoModel.to_string(),
                                prompt_too_long: None,
                                bad_grammar: false,
                            });
                            continue;
                        };
                        let is_cancelled = || {
                            cancelled_through.load(Ordering::Acquire) >= id
                                || cancelled.lock().is_ok_and(|set| set.contains(&id))
                        };
                        let result = guarded("generating", || {
                            m.generate(&prompt, &params, &is_cancelled, |tok, delta| {
                                send(Event::Token {
                                    request: id,
                                    id: tok,
                                    text_delta: delta.to_owned(),
                                });
                            })
                        });
                        if let Ok(mut set) = cancelled.lock() {
                            set.remove(&id);
                        }
                        if matches!(result, Err(crate::Error::Crashed(_))) {
                            // A model interrupted mid-step may hold half-written state.
                            model = None;
                        }
                        match result {
                            Ok(stats) => send(Event::Done {
                                request: id,
                                prompt_tokens: stats.prompt_tokens.len(),
                                prompt_ids: stats.prompt_tokens,
                                generated_tokens: stats.tokens.len(),
                                ttft: stats.ttft,
                                prompt_time: Some(stats.prompt_time),
                                tokens_per_s: stats.tokens_per_s,
                                stop: stats.stop,
                                cached_tokens: stats.cached_tokens,
                                drafts: stats.drafts,
                            }),
                            Err(e) => send(Event::Error {
                                request: Some(id),
                                message: e.to_string(),
                                prompt_too_long: match e {
                                    crate::Error::PromptTooLong { tokens, capacity } => {
                                        Some((tokens, capacity))
                                    }
                                    _ => None,
                                },
                                bad_grammar: matches!(
                                    e,
                                    crate::Error::Grammar(
                                        crate::grammar::GrammarError::Invalid(_)
                                            | crate::grammar::GrammarError::Matcher(_)
                                    )
                                ),
                            }),
                        }
                    }
                }
            }
        });
        (handle, ev_rx)
    }
}
