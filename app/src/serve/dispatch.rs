//! One engine, many HTTP requests: each request gets its own stream of the engine's events,
//! the engine works through them in order, a full queue is refused (429) instead of growing,
//! and a request dropped before it finished (its client went away) is cancelled alone. The
//! engine's later loads (the app's chat switching models) update what requests see of it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use backpack_engine::models::{GenerateParams, Prompt};
use backpack_engine::runtime::{EngineHandle, Event};
use tokio::sync::mpsc;

use super::state::TextFacts;

type Routes = Arc<Mutex<HashMap<u64, mpsc::UnboundedSender<Event>>>>;

pub struct Dispatch {
    engine: EngineHandle,
    routes: Routes,
    /// Requests accepted and not finished (running or queued).
    open: Arc<AtomicUsize>,
    limit: usize,
}

/// A generation in the engine's queue: its events, in order, until `Done` or `Error`.
pub struct Ticket {
    pub id: u64,
    events: mpsc::UnboundedReceiver<Event>,
    engine: EngineHandle,
    finished: bool,
    open: Arc<AtomicUsize>,
}

impl Dispatch {
    /// Routes `events` (the engine's channel) to the tickets it hands out, at most `limit` of
    /// them open at once.
    /// A model the engine loads later (the app's chat switching models) replaces `facts`.
    pub fn new(
        engine: EngineHandle,
        mut events: mpsc::UnboundedReceiver<Event>,
        limit: usize,
        facts: Arc<std::sync::RwLock<TextFacts>>,
    ) -> Arc<Self> {
        let routes: Routes = Arc::default();
        let forward = routes.clone();
        tokio::spawn(async move {
            while let Some(event) = events.recv().await {
                let (request, last) = match &event {
                    Event::Token { request, .. } => (Some(*request), false),
                    Event::Done { request, .. } => (Some(*request), true),
                    Event::Error { request, .. } => (*request, true),
                    Event::Loaded(info) => {
                        if let Ok(mut f) = facts.write() {
                            *f = TextFacts::of(info);
                        }
                        (None, false)
                    }
                };
                let Some(request) = request else { continue };
                let Ok(mut routes) = forward.lock() else {
                    break;
                };
                if let Some(tx) = routes.get(&request) {
                    let _ = tx.send(event);
                }
                if last {
                    routes.remove(&request);
                }
            }
        });
        Arc::new(Self {
            engine,
            routes,
            open: Arc::default(),
            limit: limit.max(1),
        })
    }

    /// Queues a generation, or None when `limit` requests are already open.
    pub fn submit(&self, prompt: Prompt, params: GenerateParams) -> Option<Ticket> {
        let taken = self
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limit).then_some(n + 1)
            })
            .is_ok();
        if !taken {
            return None;
        }
        let (tx, rx) = mpsc::unbounded_channel();
        // The route exists before the engine can answer: the forwarder waits on this lock.
        let Ok(mut routes) = self.routes.lock() else {
            self.open.fetch_sub(1, Ordering::AcqRel);
            return None;
        };
        let id = self.engine.generate(prompt, params);
        routes.insert(id, tx);
        drop(routes);
        Some(Ticket {
            id,
            events: rx,
            engine: self.engine.clone(),
            finished: false,
            open: self.open.clone(),
        })
    }

    /// Requests open now (running or queued).
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }
}

impl Ticket {
    /// The next event of this generation; None once it has finished.
    pub async fn next(&mut self) -> Option<Event> {
        if self.finished {
            return None;
        }
        let event = self.events.recv().await;
        if matches!(event, None | Some(Event::Done { .. } | Event::Error { .. })) {
            self.finished = true;
        }
        event
    }

    /// Stops the generation before its next token (a stop string was met).
    pub fn stop(&self) {
        self.engine.cancel_one(self.id);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.finished {
            // The client went away: nobody reads the rest.
            self.engine.cancel_one(self.id);
            eprintln!("request {}: the client went away; cancelled", self.id);
        }
        self.open.fetch_sub(1, Ordering::AcqRel);
    }
}
