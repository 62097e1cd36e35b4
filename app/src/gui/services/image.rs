//! The UI's side of the image service (started on the text engine's runtime, see
//! [`EngineLink::start_image`](super::text::EngineLink::start_image)), and the states an image
//! model goes through (the panels' view of them is in `shared`).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;

use backpack_engine::models::diffusion::{ImageModelInfo, ImageParams};
use backpack_engine::runtime::image::{ImageEvent, ImageHandle};
use tokio::sync::mpsc;

pub enum ImageModelState {
    None,
    Loading(PathBuf),
    Ready { path: PathBuf, info: ImageModelInfo },
}

/// The image service, running on the engine's runtime.
pub struct ImageLink {
    pub(crate) handle: ImageHandle,
    events: mpsc::UnboundedReceiver<ImageEvent>,
    /// Events received but held for a later frame (see [`Self::drain`]).
    backlog: VecDeque<ImageEvent>,
    /// The newest request, so loading can cancel whatever runs.
    last_request: u64,
    /// The generation under way; the app starts one at a time.
    running: Option<u64>,
    // Dropped last: the service's task lives on it.
    _runtime: Arc<tokio::runtime::Runtime>,
}

impl ImageLink {
    pub(super) fn new(
        handle: ImageHandle,
        events: mpsc::UnboundedReceiver<ImageEvent>,
        runtime: Arc<tokio::runtime::Runtime>,
    ) -> Self {
        Self {
            handle,
            events,
            backlog: VecDeque::new(),
            last_request: 0,
            running: None,
            _runtime: runtime,
        }
    }

    /// Queues `count` images with previews; returns the request id.
    pub fn generate(&mut self, params: ImageParams, count: u32) -> u64 {
        self.last_request = self.handle.generate(params, count, true);
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

    /// Stops request `id` after its current step.
    pub fn cancel(&self, id: u64) {
        self.handle.cancel(id);
    }

    pub fn cancel_all(&self) {
        self.handle.cancel(self.last_request);
    }

    /// The events for this frame. A finished image that comes after a step's preview in
    /// the same batch waits for the next frame, so every image's preview is on screen at
    /// least once however fast the steps are.
    pub fn drain(&mut self) -> Vec<ImageEvent> {
        while let Ok(e) = self.events.try_recv() {
            self.backlog.push_back(e);
        }
        let mut out = Vec::new();
        let mut previewed = false;
        while let Some(event) = self.backlog.front() {
            match event {
                ImageEvent::Step {
                    preview: Some(_), ..
                } => previewed = true,
                ImageEvent::Image { .. } if previewed => break,
                _ => {}
            }
            out.extend(self.backlog.pop_front());
        }
        out
    }

    /// Whether events wait for the next frame.
    pub fn has_backlog(&self) -> bool {
        !self.backlog.is_empty()
    }
}

impl Drop for ImageLink {
    fn drop(&mut self) {
        // The runtime waits for a running generation when it shuts down: end it soon.
        self.handle.cancel(u64::MAX);
    }
}

/// The request an event belongs to (None: the model's load).
pub fn event_request(event: &ImageEvent) -> Option<u64> {
    match event {
        ImageEvent::Loaded(_) => None,
        ImageEvent::Error { request, .. } => *request,
        ImageEvent::Step { request, .. }
        | ImageEvent::Image { request, .. }
        | ImageEvent::Done { request, .. } => Some(*request),
    }
}

pub use backpack_engine::models::diffusion::is_image_model;
