//! The UI's side of the image service (started on the text engine's runtime, see
//! [`EngineLink::start_image`](super::engine_link::EngineLink::start_image)), and the image
//! model the panels share: what is loaded, and how loading starts and ends.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use backpack_engine::models::diffusion::{ImageModelInfo, ImageModelOptions, ImageParams};
use backpack_engine::runtime::image::{ImageEvent, ImageHandle};
use tokio::sync::mpsc;

use super::common::display_name;
use super::shared::Shared;

pub enum ImageModelState {
    None,
    Loading(PathBuf),
    Ready { path: PathBuf, info: ImageModelInfo },
}

/// The image service, running on the engine's runtime.
pub struct ImageLink {
    handle: ImageHandle,
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

/// A diffusers folder (with `model_index.json`) or a single-file `.safetensors` checkpoint.
pub fn is_image_model(path: &Path) -> bool {
    if path.is_dir() {
        return path.join("model_index.json").is_file();
    }
    path.is_file()
        && path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("safetensors"))
}

impl Shared {
    pub fn image_info(&self) -> Option<&ImageModelInfo> {
        match &self.image_model {
            ImageModelState::Ready { info, .. } => Some(info),
            _ => None,
        }
    }

    /// The image model loaded or loading.
    pub fn image_model_path(&self) -> Option<&Path> {
        match &self.image_model {
            ImageModelState::Ready { path, .. } | ImageModelState::Loading(path) => Some(path),
            ImageModelState::None => None,
        }
    }

    /// Starts loading the image model at `path`; a generation running is stopped.
    pub fn load_image_model(&mut self, path: &Path) {
        self.image_error = None;
        if self.image.is_none() {
            self.image_error = self.engine_error.clone();
            return;
        }
        if !path.exists() {
            self.image_error = Some(format!("{} does not exist", path.display()));
            return;
        }
        if !is_image_model(path) {
            self.image_error = Some(format!(
                "{} is not an image model: choose a diffusers folder (with model_index.json) or a .safetensors checkpoint",
                path.display()
            ));
            return;
        }
        // Full-size previews when the matching TAESD decoder is installed.
        let taesd = if path.join("text_encoder_2").is_dir() {
            "madebyollin/taesdxl"
        } else {
            "madebyollin/taesd"
        };
        let preview_decoder = self.downloads.as_mut().and_then(|d| {
            d.installed()
                .iter()
                .find(|m| m.repo == taesd)
                .map(|m| m.model_path())
        });
        let options = ImageModelOptions {
            preview_decoder,
            ..Default::default()
        };
        let Some(image) = &self.image else {
            return;
        };
        image.cancel_all();
        image.handle.load(path.to_owned(), options);
        self.image_model = ImageModelState::Loading(path.to_owned());
    }

    pub fn unload_image_model(&mut self) {
        if let Some(image) = &self.image {
            image.cancel_all();
            image.handle.unload();
        }
        self.image_model = ImageModelState::None;
    }

    /// The service finished loading: the model is ready and remembered.
    pub fn image_loaded(&mut self, info: ImageModelInfo) {
        let path = self.image_model_path().map(Path::to_owned);
        let path = path.unwrap_or_else(|| info.path.clone());
        let settings = &mut self.store.state.image;
        settings.remember_model(&path);
        settings.adopt_defaults(&path, &info.defaults);
        self.store.mark_dirty();
        self.image_model = ImageModelState::Ready { path, info };
        self.image_error = None;
    }

    pub fn image_failed(&mut self, message: String) {
        self.image_model = ImageModelState::None;
        self.image_error = Some(message);
    }

    /// Why nothing can be generated yet.
    pub fn image_not_ready(&self) -> String {
        match &self.image_model {
            ImageModelState::Loading(path) => format!("{} is still loading", display_name(path)),
            _ if self.image.is_none() => self
                .engine_error
                .clone()
                .unwrap_or_else(|| "the image service is not running".into()),
            _ => "Load an image model first".into(),
        }
    }
}
