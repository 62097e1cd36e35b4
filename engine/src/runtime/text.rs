//! The text service: chat generation with one [`TextModel`], on its own blocking task (every
//! token waits on the GPU). A model loaded with one cache slot answers requests one after
//! another; with several (a server's `--parallel`), answers share the GPU: each takes a free
//! slot, new ones join between decode steps, and every step advances all of them by a token
//! (see `batched.rs`).

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

/// What the service thread needs to tell whether a request was cancelled.
#[derive(Clone)]
pub(super) struct Cancellations {
    through: Arc<AtomicU64>,
    single: Arc<Mutex<HashSet<u64>>>,
}

impl Cancellations {
    pub(super) fn is_cancelled(&self, id: u64) -> bool {
        self.through.load(Ordering::Acquire) >= id
            || self.single.lock().is_ok_and(|set| set.contains(&id))
    }

    /// Forgets a finished request.
    pub(super) fn forget(&self, id: u64) {
        if let Ok(mut set) = self.single.lock() {
            set.remove(&id);
        }
    }
}

impl Engine {
    /// Starts the engine on the current tokio runtime.
    pub fn spawn(gpu: Gpu, wake: Option<WakeFn>) -> (EngineHandle, mpsc::UnboundedReceiver<Event>) {
        let (req_tx, req_rx) = mpsc::unbounded_channel::<Request>();
        let (ev_tx, ev_rx) = mpsc::unbounded_channel::<Event>();
        let cancels = Cancellations {
            through: Arc::new(AtomicU64::new(0)),
            single: Arc::new(Mutex::new(HashSet::new())),
        };
        let handle = EngineHandle {
            requests: req_tx,
            next_id: Arc::new(AtomicU64::new(0)),
            cancelled_through: cancels.through.clone(),
            cancelled: cancels.single.clone(),
        };
        tokio::task::spawn_blocking(move || {
            let send: super::batched::Send = Box::new(move |event: Event| {
                let _ = ev_tx.send(event);
                if let Some(w) = &wake {
                    w();
                }
            });
            super::batched::Service::new(gpu, send, cancels).run(req_rx);
        });
        (handle, ev_rx)
    }
}

/// Runs one answer to its end, sending its tokens and how it ended.
pub(super) fn answer_alone(
    m: &mut TextModel,
    id: u64,
    prompt: &Prompt,
    params: &GenerateParams,
    cancels: &Cancellations,
    send: &dyn Fn(Event),
) -> Result<(), crate::Error> {
    let is_cancelled = || cancels.is_cancelled(id);
    let result = guarded("generating", || {
        m.generate(prompt, params, &is_cancelled, |tok, delta| {
            send(Event::Token {
                request: id,
                id: tok,
                text_delta: delta.to_owned(),
            });
        })
    });
    cancels.forget(id);
    match result {
        Ok(stats) => {
            send(done_event(id, stats));
            Ok(())
        }
        Err(e) => {
            send(error_event(Some(id), &e));
            Err(e)
        }
    }
}

pub(super) fn done_event(id: u64, stats: crate::models::GenerationStats) -> Event {
    Event::Done {
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
    }
}

pub(super) fn error_event(id: Option<u64>, e: &crate::Error) -> Event {
    Event::Error {
        request: id,
        message: e.to_string(),
        prompt_too_long: match e {
            crate::Error::PromptTooLong { tokens, capacity } => Some((*tokens, *capacity)),
            _ => None,
        },
        bad_grammar: matches!(
            e,
            crate::Error::Grammar(
                crate::grammar::GrammarError::Invalid(_) | crate::grammar::GrammarError::Matcher(_)
            )
        ),
    }
}
