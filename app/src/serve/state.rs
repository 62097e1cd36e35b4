//! What every handler shares: the models served, one per modality, each with its queue.

use std::sync::Arc;

use backpack_engine::models::diffusion::ImageModelInfo;
use backpack_engine::runtime::image::{ImageEvent, ImageHandle};
use backpack_engine::runtime::speech::{SpeechEvent, SpeechHandle};
use tokio::sync::{Mutex, Semaphore, mpsc};

use super::dispatch::Dispatch;

/// What every handler shares: the models served, one per modality.
pub struct Server {
    pub text: Option<TextSide>,
    pub speech: Option<Speech>,
    pub image: Option<(Images, ImageModelInfo)>,
    pub created: u64,
    pub api_key: Option<String>,
}

/// The text model: its queue and what requests need to know of it.
pub struct TextSide {
    pub dispatch: Arc<Dispatch>,
    /// Kept current by the dispatch: the app's chat may load another model into the engine
    /// it shares with the server.
    pub facts: Arc<std::sync::RwLock<TextFacts>>,
}

/// The text model as requests see it.
#[derive(Clone, Debug)]
pub struct TextFacts {
    /// Its id as `/v1/models` lists it.
    pub model: String,
    pub context: u32,
    /// How the model writes tool calls.
    pub tool_format: backpack_engine::models::tool_calls::ToolFormat,
}

impl TextFacts {
    pub fn of(info: &backpack_engine::models::ModelInfo) -> Self {
        Self {
            model: info.name.clone(),
            context: info.context,
            tool_format: info.tool_format,
        }
    }
}

impl TextSide {
    /// The served engine with its model's `info`: the facts follow the engine's later loads.
    pub fn new(
        engine: backpack_engine::runtime::EngineHandle,
        events: mpsc::UnboundedReceiver<backpack_engine::runtime::Event>,
        info: &backpack_engine::models::ModelInfo,
        queue: usize,
    ) -> Self {
        let facts = Arc::new(std::sync::RwLock::new(TextFacts::of(info)));
        Self {
            dispatch: Dispatch::new(engine, events, queue, facts.clone()),
            facts,
        }
    }

    pub fn facts(&self) -> TextFacts {
        match self.facts.read() {
            Ok(f) => f.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
}

impl Server {
    /// The ids `/v1/models` lists: text, speech, image.
    pub fn model_ids(&self) -> Vec<String> {
        let ids = [
            self.text.as_ref().map(|t| t.facts().model),
            self.speech.as_ref().map(|m| m.model.clone()),
            self.image.as_ref().map(|(m, _)| m.model.clone()),
        ];
        ids.into_iter().flatten().collect()
    }
}

/// A service that answers one request at a time.
pub struct OneAtATime<H, E> {
    pub handle: H,
    pub model: String,
    pub(super) events: Mutex<mpsc::UnboundedReceiver<E>>,
    pub(super) waiting: Arc<Semaphore>,
    pub(super) queue: usize,
}

impl<H, E> OneAtATime<H, E> {
    pub fn new(handle: H, events: mpsc::UnboundedReceiver<E>, model: String, queue: usize) -> Self {
        Self {
            handle,
            model,
            events: Mutex::new(events),
            waiting: Arc::new(Semaphore::new(queue.max(1))),
            queue: queue.max(1),
        }
    }
}

pub type Speech = OneAtATime<SpeechHandle, SpeechEvent>;
pub type Images = OneAtATime<ImageHandle, ImageEvent>;
