//! The engine's services, each a background task with its own request and event channels,
//! all sharing one [`Gpu`](crate::gpu::Gpu) (wgpu's device and queue are safe to share): text
//! generation ([`text`]), speech recognition ([`speech`]) and image generation ([`image`]);
//! beside them, chat answers from remote OpenAI-compatible servers ([`remote`]), sent as the
//! text engine's events. A long transcription never waits for a chat answer or the other way
//! round. They share one design: requests go in over an unbounded channel, events come out
//! over another, an optional wake callback tells a UI to repaint, cancellation is an atomic
//! "cancelled through request N", and a panic inside a dependency while loading or serving a
//! request becomes an error event — the service keeps serving.

mod batched;
pub mod image;
mod live;
pub mod remote;
pub mod speech;
pub mod text;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

pub use live::ListenOptions;
pub use text::{Engine, EngineHandle, Event, Request};

use crate::Error;

/// Called after every event so a UI can wake up and drain its channel.
pub type WakeFn = Arc<dyn Fn() + Send + Sync>;

/// Runs `f`, turning a panic inside it (a dependency's bug, e.g. a tokenizer library
/// panicking on a malformed file) into an error that names what was being done.
pub fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, Error>) -> Result<T, Error> {
    match std::panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(payload) => {
            let detail = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".to_owned());
            Err(Error::Crashed(format!(
                "{what} failed inside a library ({detail}); the engine is still running"
            )))
        }
    }
}
