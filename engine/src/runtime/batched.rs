//! The text service's loop. With a one-slot model each request runs to its end before the
//! next starts. With several slots the service batches: a request waits in `queue` until a
//! slot is free, then its prompt runs in that slot (the one whose cache holds most of it) and
//! it joins `running`; every decode step advances all running answers by a token through one
//! forward pass, and an answer that ends, is cancelled or fails frees its slot at once.

use std::collections::VecDeque;
use std::time::Instant;

use tokio::sync::mpsc;

use super::guarded;
use super::text::{Cancellations, Event, Request, answer_alone, done_event, error_event};
use crate::Error;
use crate::gpu::Gpu;
use crate::models::{Answer, GenerateParams, Piece, Prompt, PromptProgress, TextModel};

/// Hands an event to the requests' side (and wakes the UI).
pub(super) type Send = Box<dyn Fn(Event) + std::marker::Send>;

struct Queued {
    id: u64,
    prompt: Prompt,
    params: GenerateParams,
    /// When its prompt's first chunk ran while answers were running, and the tokens it
    /// found cached then.
    joined: Option<(Instant, usize)>,
    /// Its prompt's tokens, once read for running in chunks (a long prompt is not read again
    /// for each).
    ids: Option<Vec<u32>>,
}

pub(super) struct Service {
    gpu: Gpu,
    send: Send,
    cancels: Cancellations,
    model: Option<TextModel>,
    /// Requests waiting for a slot (batched models only).
    queue: VecDeque<Queued>,
    /// Answers decoding, with their request ids, in the order they joined.
    ids: Vec<u64>,
    running: Vec<Answer>,
}

impl Service {
    pub(super) fn new(gpu: Gpu, send: Send, cancels: Cancellations) -> Self {
        Self {
            gpu,
            send,
            cancels,
            model: None,
            queue: VecDeque::new(),
            ids: Vec::new(),
            running: Vec::new(),
        }
    }

    pub(super) fn run(mut self, mut requests: mpsc::UnboundedReceiver<Request>) {
        loop {
            // Idle: wait for work. Busy: take what has arrived and go on decoding.
            if self.running.is_empty() && self.queue.is_empty() {
                match requests.blocking_recv() {
                    Some(r) => self.handle(r),
                    None => return,
                }
            }
            while let Ok(r) = requests.try_recv() {
                self.handle(r);
            }
            self.admit();
            self.step();
        }
    }

    fn slots(&self) -> u32 {
        self.model.as_ref().map_or(1, |m| m.model.slots())
    }

    fn handle(&mut self, request: Request) {
        match request {
            Request::Load { path, options } => {
                self.drop_all("the model was replaced while answering");
                self.model = None;
                match self.load(&path, options) {
                    Ok(m) => {
                        (self.send)(Event::Loaded(m.info()));
                        self.model = Some(m);
                    }
                    Err(e) => (self.send)(error_event(None, &e)),
                }
            }
            Request::Unload => {
                self.drop_all("the model was unloaded while answering");
                self.model = None;
            }
            Request::Generate { id, prompt, params } => {
                let Some(m) = self.model.as_mut() else {
                    (self.send)(error_event(Some(id), &Error::NoModel));
                    return;
                };
                if m.model.slots() > 1 {
                    self.queue.push_back(Queued {
                        id,
                        prompt,
                        params,
                        joined: None,
                        ids: None,
                    });
                    return;
                }
                let result = answer_alone(m, id, &prompt, &params, &self.cancels, &*self.send);
                if matches!(result, Err(Error::Crashed(_))) {
                    // A model interrupted mid-step may hold half-written state.
                    self.model = None;
                }
            }
        }
    }

    /// Loads a text model; where its cache slots do not fit the GPU's memory, with half as
    /// many until they do or one is left (the weights alone are the limit then).
    fn load(
        &self,
        path: &std::path::Path,
        options: crate::models::ModelOptions,
    ) -> Result<TextModel, Error> {
        load_fitting(options, |o| {
            guarded("loading the model", || TextModel::load(&self.gpu, path, o))
        })
    }

    /// Ends every queued and running answer with an error.
    fn drop_all(&mut self, why: &str) {
        let ids: Vec<u64> = self
            .queue
            .drain(..)
            .map(|q| q.id)
            .chain(self.ids.drain(..))
            .collect();
        self.running.clear();
        for id in ids {
            self.cancels.forget(id);
            (self.send)(error_event(Some(id), &Error::Invalid(why.to_owned())));
        }
    }

    /// Starts queued requests in free slots, oldest first. While answers are running, a long
    /// prompt runs one prefill chunk per call (between two of their steps) until the rest is
    /// a chunk, so that they never wait for more than a chunk's time.
    fn admit(&mut self) {
        while self.running.len() < self.slots() as usize {
            let Some(q) = self.queue.front_mut() else {
                return;
            };
            let Some(m) = self.model.as_mut() else {
                let q = self.queue.pop_front();
                (self.send)(error_event(q.map(|q| q.id), &Error::NoModel));
                continue;
            };
            let free: Vec<u32> = (0..m.model.slots())
                .filter(|s| self.running.iter().all(|a| a.slot() != *s))
                .collect();
            let cancelled = self.cancels.is_cancelled(q.id);
            if !self.running.is_empty() && !cancelled {
                let started = Instant::now();
                let ran = guarded("generating", || {
                    let ids = match &mut q.ids {
                        Some(ids) => ids,
                        None => q.ids.insert(m.prompt_ids(&q.prompt, &q.params)?),
                    };
                    m.run_prompt_chunk(ids, &free)
                });
                match ran {
                    Ok(PromptProgress::Ran { reused, .. }) => {
                        q.joined.get_or_insert((started, reused));
                        return;
                    }
                    Ok(PromptProgress::Ready) => {}
                    Err(e) => {
                        let id = q.id;
                        self.queue.pop_front();
                        self.fail(id, e);
                        continue;
                    }
                }
            }
            let Some(q) = self.queue.pop_front() else {
                return;
            };
            let started = guarded("generating", || {
                m.start_answer(&q.prompt, &q.params, &free, cancelled)
            });
            match started {
                Ok((mut answer, piece)) => {
                    if let Some((first_chunk, reused)) = q.joined {
                        answer.joined_in_chunks(first_chunk, reused);
                    }
                    self.send_piece(q.id, &piece);
                    if answer.stopped() {
                        self.finish(q.id, answer);
                    } else {
                        self.ids.push(q.id);
                        self.running.push(answer);
                    }
                }
                Err(e) => self.fail(q.id, e),
            }
        }
    }

    /// One batched decode step over the running answers.
    fn step(&mut self) {
        if self.running.is_empty() {
            return;
        }
        let Some(m) = self.model.as_mut() else {
            return;
        };
        let (ids, cancels) = (&self.ids, &self.cancels);
        let cancelled = |i: usize| cancels.is_cancelled(ids[i]);
        let running = &mut self.running;
        match guarded("generating", || m.step_answers(running, &cancelled)) {
            Ok(pieces) => {
                let mut failed = Vec::new();
                for (i, piece) in pieces {
                    match piece {
                        Ok(p) => self.send_piece(self.ids[i], &p),
                        Err(e) => failed.push((self.ids[i], e)),
                    }
                }
                for (id, e) in failed {
                    self.fail(id, e);
                }
            }
            Err(e) => {
                let ids = std::mem::take(&mut self.ids);
                self.running.clear();
                if matches!(e, Error::Crashed(_)) {
                    self.model = None;
                }
                for id in ids {
                    self.fail(id, Error::Invalid(e.to_string()));
                }
                return;
            }
        }
        // Finished answers leave, freeing their slots (failed ones have left already).
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].stopped() {
                let id = self.ids.remove(i);
                let answer = self.running.remove(i);
                self.finish(id, answer);
            } else {
                i += 1;
            }
        }
    }

    fn send_piece(&self, id: u64, piece: &Piece) {
        (self.send)(Event::Token {
            request: id,
            id: piece.token,
            text_delta: piece.delta.clone(),
        });
    }

    fn finish(&self, id: u64, answer: Answer) {
        self.cancels.forget(id);
        (self.send)(done_event(id, answer.finish()));
    }

    fn fail(&mut self, id: u64, e: Error) {
        self.cancels.forget(id);
        if let Some(i) = self.ids.iter().position(|&r| r == id) {
            self.ids.remove(i);
            self.running.remove(i);
        }
        (self.send)(error_event(Some(id), &e));
    }
}

/// `load` with `options`, and again with half the slots each time it fails for want of memory
/// while more than one is asked for.
fn load_fitting<T>(
    mut options: crate::models::ModelOptions,
    mut load: impl FnMut(&crate::models::ModelOptions) -> Result<T, Error>,
) -> Result<T, Error> {
    loop {
        match load(&options) {
            Err(e) if options.slots > 1 && is_out_of_memory(&e) => options.slots /= 2,
            other => return other,
        }
    }
}

/// Whether loading failed for want of GPU memory, or of a buffer binding that large (each
/// layer's cache holds every slot).
fn is_out_of_memory(e: &Error) -> bool {
    matches!(e, Error::Gpu(crate::gpu::GpuError::TooLarge { .. }))
        || e.to_string().contains("ran out of memory")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::GpuError;
    use crate::models::ModelOptions;

    fn too_large() -> Error {
        Error::Gpu(GpuError::TooLarge {
            what: "layer 0 k cache".into(),
            size: 1 << 33,
            limit: 1 << 31,
        })
    }

    #[test]
    fn slots_halve_until_their_caches_fit() {
        let mut tried = Vec::new();
        let got = load_fitting(
            ModelOptions {
                slots: 16,
                ..Default::default()
            },
            |o| {
                tried.push(o.slots);
                if o.slots > 4 {
                    Err(too_large())
                } else {
                    Ok(o.slots)
                }
            },
        );
        assert_eq!(got.ok(), Some(4));
        assert_eq!(tried, [16, 8, 4]);
    }

    #[test]
    fn other_failures_and_one_slot_are_not_retried() {
        let mut calls = 0;
        let missing = load_fitting(
            ModelOptions {
                slots: 8,
                ..Default::default()
            },
            |_| -> Result<(), Error> {
                calls += 1;
                Err(Error::Invalid("config.json is missing".into()))
            },
        );
        assert!(missing.is_err());
        assert_eq!(calls, 1);
        let mut calls = 0;
        let alone = load_fitting(ModelOptions::default(), |_| -> Result<(), Error> {
            calls += 1;
            Err(too_large())
        });
        assert!(alone.is_err());
        assert_eq!(calls, 1, "one slot is as small as it gets");
        assert!(is_out_of_memory(&Error::Invalid(
            "the GPU ran out of memory loading this model".into()
        )));
    }
}
