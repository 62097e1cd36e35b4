//! The UI's side of the speech service (started on the text engine's runtime, see
//! [`EngineLink::start_speech`](super::text::EngineLink::start_speech)), and the states a speech
//! model goes through (the panels' view of them is in `shared`).

use std::path::PathBuf;
use std::sync::Arc;

use backpack_engine::models::whisper::{SpeechModelInfo, TranscribeOptions};
use backpack_engine::runtime::ListenOptions;
use backpack_engine::runtime::speech::{AudioSource, LiveSource, SpeechEvent, SpeechHandle};
use tokio::sync::mpsc;

pub enum SpeechModelState {
    None,
    Loading(PathBuf),
    Ready {
        path: PathBuf,
        info: SpeechModelInfo,
    },
}

/// The speech service, running on the engine's runtime.
pub struct SpeechLink {
    pub(crate) handle: SpeechHandle,
    events: mpsc::UnboundedReceiver<SpeechEvent>,
    /// The newest request, so loading can cancel whatever runs whoever started it.
    last_request: u64,
    /// The transcription or recording under way. The service runs one at a time, and a
    /// cancel also stops every earlier request, so the app never queues a second.
    running: Option<u64>,
    // Dropped last: the service's task lives on it.
    _runtime: Arc<tokio::runtime::Runtime>,
}

impl SpeechLink {
    pub(super) fn new(
        handle: SpeechHandle,
        events: mpsc::UnboundedReceiver<SpeechEvent>,
        runtime: Arc<tokio::runtime::Runtime>,
    ) -> Self {
        Self {
            handle,
            events,
            last_request: 0,
            running: None,
            _runtime: runtime,
        }
    }

    /// Queues a file (or samples) to transcribe; returns the request id.
    pub fn transcribe(&mut self, audio: AudioSource, options: TranscribeOptions) -> u64 {
        self.last_request = self.handle.transcribe(audio, options);
        self.running = Some(self.last_request);
        self.last_request
    }

    /// Starts live captions; returns the request id.
    pub fn listen(&mut self, source: LiveSource, options: ListenOptions) -> u64 {
        self.last_request = self.handle.listen(source, options);
        self.running = Some(self.last_request);
        self.last_request
    }

    pub fn is_busy(&self) -> bool {
        self.running.is_some()
    }

    /// Request `id` ended (done or failed).
    pub fn finished(&mut self, id: u64) {
        if self.running == Some(id) {
            self.running = None;
        }
    }

    /// Stops request `id` (and earlier ones): a recording commits its last words first.
    pub fn cancel(&self, id: u64) {
        self.handle.cancel(id);
    }

    pub fn cancel_all(&self) {
        self.handle.cancel(self.last_request);
    }

    /// Everything the service sent since the last call.
    pub fn drain(&mut self) -> Vec<SpeechEvent> {
        let mut out = Vec::new();
        while let Ok(e) = self.events.try_recv() {
            out.push(e);
        }
        out
    }
}

impl Drop for SpeechLink {
    fn drop(&mut self) {
        // A recording only ends when stopped; the runtime waits for it when it shuts down.
        self.handle.cancel(u64::MAX);
    }
}

/// The request an event belongs to (None: the model's load).
pub fn event_request(event: &SpeechEvent) -> Option<u64> {
    match event {
        SpeechEvent::Loaded(_) => None,
        SpeechEvent::Error { request, .. } => *request,
        SpeechEvent::Language { request, .. }
        | SpeechEvent::Segment { request, .. }
        | SpeechEvent::Progress { request, .. }
        | SpeechEvent::Listening { request, .. }
        | SpeechEvent::Level { request, .. }
        | SpeechEvent::Partial { request, .. }
        | SpeechEvent::Commit { request, .. }
        | SpeechEvent::Done { request, .. } => Some(*request),
    }
}
