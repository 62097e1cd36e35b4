//! The server switch in Settings: `backpack serve` inside the app, on the window's GPU, serving
//! the models the app has loaded (text, speech, image) so editors and scripts can use them
//! while the window stays open. The chat's text model is shared: the server sends its requests
//! to the chat's engine, which answers them in turn with the chat's. Speech and image models
//! are loaded again on the shared device. The server runs on its own thread and runtime;
//! switching it off stops it gracefully.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use backpack_engine::gpu::Gpu;
use backpack_engine::models::ModelOptions;
use eframe::egui;
use tokio::sync::oneshot;

use crate::serve::{ServeOptions, SharedText, serve_until};

#[derive(Clone, Debug, PartialEq)]
pub enum ServerState {
    Off,
    Starting,
    Running { url: String, models: Vec<String> },
    Failed(String),
}

/// The state, and which start it belongs to: a server stopped while still loading finishes in
/// the background and must not overwrite what a newer start reports.
type Shared = Arc<Mutex<(u64, ServerState)>>;

pub struct ServerLink {
    state: Shared,
    stop: Option<oneshot::Sender<()>>,
}

impl Default for ServerLink {
    fn default() -> Self {
        Self {
            state: Arc::new(Mutex::new((0, ServerState::Off))),
            stop: None,
        }
    }
}

impl ServerLink {
    pub fn state(&self) -> ServerState {
        self.state
            .lock()
            .map_or_else(|_| ServerState::Off, |s| s.1.clone())
    }

    pub fn is_on(&self) -> bool {
        self.stop.is_some()
    }

    /// Starts serving `models` (stopping a server already running first).
    pub fn start(
        &mut self,
        gpu: Gpu,
        models: Vec<PathBuf>,
        load: ModelOptions,
        opts: ServeOptions,
        shared: Option<SharedText>,
        ctx: &egui::Context,
    ) {
        self.stop();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let state = self.state.clone();
        let epoch = match self.state.lock() {
            Ok(mut s) => {
                s.0 += 1;
                s.1 = ServerState::Starting;
                s.0
            }
            Err(_) => return,
        };
        let ctx = ctx.clone();
        let thread = std::thread::Builder::new()
            .name("backpack-server".into())
            .spawn(move || {
                let result = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .map_err(anyhow::Error::from)
                    .and_then(|runtime| {
                        let shutdown = async {
                            let _ = stop_rx.await;
                        };
                        let running = state.clone();
                        let wake = ctx.clone();
                        runtime.block_on(serve_until(
                            gpu,
                            models,
                            load,
                            opts,
                            shared,
                            shutdown,
                            move |addr, models| {
                                let url = format!("http://{addr}/v1");
                                set(&running, epoch, ServerState::Running { url, models });
                                wake.request_repaint();
                            },
                        ))
                    });
                set(
                    &state,
                    epoch,
                    match result {
                        Ok(()) => ServerState::Off,
                        Err(e) => ServerState::Failed(format!("{e:#}")),
                    },
                );
                ctx.request_repaint();
            });
        match thread {
            Ok(_detached) => self.stop = Some(stop_tx),
            Err(e) => set(
                &self.state,
                epoch,
                ServerState::Failed(format!("could not start the server thread: {e}")),
            ),
        }
    }

    /// Stops the server without waiting: requests in flight end and the models it loaded are
    /// freed in the background (one still loading stops as soon as it is ready).
    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Ok(mut s) = self.state.lock() {
            s.0 += 1;
            if !matches!(s.1, ServerState::Failed(_)) {
                s.1 = ServerState::Off;
            }
        }
    }
}

/// Sets the state if start `epoch` is still the newest.
fn set(state: &Mutex<(u64, ServerState)>, epoch: u64, value: ServerState) {
    if let Ok(mut s) = state.lock()
        && s.0 == epoch
    {
        s.1 = value;
    }
}
