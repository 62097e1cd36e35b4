//! Backpack's headless inference engine: a wgpu compute core, WGSL kernels, model loaders,
//! models, and a runtime that streams tokens over channels. Knows nothing about any UI.
//!
//! The path of a prompt: [`runtime`] receives a request → [`models::TextModel`] tokenizes it
//! ([`load`]) → [`models::DecoderModel`] records the forward pass of [`ops`] kernels with a
//! [`gpu::Recorder`] → the GPU samples the next token → its id comes back → a text delta goes
//! out as an [`runtime::Event`]. Models too big for the GPU can answer from a server instead
//! ([`remote`], any OpenAI-compatible API), through the same events.

pub mod audio;
pub mod gpu;
pub mod grammar;
pub mod http;
pub mod hub;
pub mod load;
pub mod models;
pub mod ops;
pub mod remote;
pub mod runtime;
pub mod selftest;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    #[error(transparent)]
    Load(#[from] load::LoadError),
    #[error(transparent)]
    Gpu(#[from] gpu::GpuError),
    #[error(transparent)]
    Audio(#[from] audio::AudioError),
    #[error(transparent)]
    Grammar(#[from] grammar::GrammarError),
    #[error(
        "the prompt is {tokens} tokens long but the context holds {capacity}; shorten it or raise the context length"
    )]
    PromptTooLong { tokens: usize, capacity: u32 },
    #[error("the context of {capacity} tokens is full")]
    ContextFull { capacity: u32 },
    #[error("no model is loaded")]
    NoModel,
    #[error("{0}")]
    Invalid(String),
    /// A panic caught inside a dependency; the service that caught it keeps running.
    #[error("{0}")]
    Crashed(String),
}
