//! `backpack serve`: an OpenAI-compatible HTTP server (axum on the tokio runtime the engine
//! already uses) over one loaded model, so editors, scripts and agents can use it as they use
//! LM Studio's or llama.cpp's servers.

mod api;
mod dispatch;
mod media;
mod routes;
mod state;
mod stop;
mod tools;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use backpack_engine::gpu::Gpu;
use backpack_engine::models::{ModelInfo, ModelOptions};
use backpack_engine::runtime::{Engine, EngineHandle, Event};

pub use dispatch::Dispatch;
pub use state::{Server, TextFacts, TextSide};

/// How the server runs.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub host: String,
    pub port: u16,
    /// Required as `Authorization: Bearer KEY` on every request when set.
    pub api_key: Option<String>,
    /// Requests running or queued at once; more get 429.
    pub queue: usize,
    /// Largest request body accepted (413 above).
    pub body_limit: usize,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 8080,
            api_key: None,
            queue: 16,
            body_limit: 4 << 20,
        }
    }
}

/// Largest audio upload (OpenAI's own limit).
const AUDIO_LIMIT: usize = 25 << 20;

/// The routes over `server`.
pub fn router(server: Arc<Server>, body_limit: usize) -> Router {
    let audio_limit = DefaultBodyLimit::max(AUDIO_LIMIT.max(body_limit));
    Router::new()
        .route("/v1/models", get(routes::models))
        .route("/v1/chat/completions", post(routes::chat))
        .route("/v1/completions", post(routes::completions))
        .route("/v1/images/generations", post(media::images))
        .route(
            "/v1/audio/transcriptions",
            post(media::transcriptions).layer(audio_limit),
        )
        .route(
            "/v1/audio/translations",
            post(media::translations).layer(audio_limit),
        )
        .fallback(routes::not_found)
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(axum::middleware::from_fn_with_state(
            server.clone(),
            routes::authorize,
        ))
        .with_state(server)
}

/// Loads every model of `models` into the service of its kind (a Whisper folder: speech; a
/// diffusers folder or single-file checkpoint: images; else text, one of each) on `gpu` and
/// serves them until ctrl-c. Prints the address once listening.
pub async fn serve(
    gpu: Gpu,
    models: Vec<PathBuf>,
    load: ModelOptions,
    opts: ServeOptions,
) -> Result<()> {
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    serve_until(gpu, models, load, opts, None, shutdown, |local, served| {
        eprintln!("serving {} at http://{local}/v1", served.join(", "));
    })
    .await
}

/// A text model another engine already holds (the app's chat model), served through that
/// engine instead of loading a second copy.
pub struct SharedText {
    pub path: PathBuf,
    pub info: ModelInfo,
    pub engine: EngineHandle,
    /// The engine's events from now on (the server picks out its own requests').
    pub events: tokio::sync::mpsc::UnboundedReceiver<Event>,
}

/// As [`serve`], until `shutdown` completes; `listening` gets the bound address and the model
/// ids served once requests are taken (the app's server switch shows them). `shared` serves
/// its text model where `models` names it.
pub async fn serve_until(
    gpu: Gpu,
    models: Vec<PathBuf>,
    load: ModelOptions,
    opts: ServeOptions,
    shared: Option<SharedText>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    listening: impl FnOnce(SocketAddr, Vec<String>),
) -> Result<()> {
    let server = Arc::new(load_all(&gpu, models, load, &opts, shared).await?);
    let addr: SocketAddr = format!("{}:{}", opts.host, opts.port)
        .parse()
        .or_else(|_| {
            std::net::ToSocketAddrs::to_socket_addrs(&(opts.host.as_str(), opts.port))
                .ok()
                .and_then(|mut a| a.next())
                .ok_or(())
        })
        .map_err(|()| anyhow::anyhow!("{} is not an address to listen on", opts.host))?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("listening on {addr}"))?;
    let local = listener.local_addr()?;
    if !local.ip().is_loopback() {
        eprintln!(
            "warning: {local} is reachable from the network{}",
            if opts.api_key.is_some() {
                " (an API key is required)"
            } else {
                "; anyone who can reach it can use the model (set --api-key)"
            }
        );
    }
    listening(local, server.model_ids());
    axum::serve(listener, router(server, opts.body_limit))
        .with_graceful_shutdown(shutdown)
        .await
        .context("serving")
}

/// Each model in the service of its kind.
async fn load_all(
    gpu: &Gpu,
    models: Vec<PathBuf>,
    load: ModelOptions,
    opts: &ServeOptions,
    mut shared: Option<SharedText>,
) -> Result<Server> {
    let (mut text, mut speech, mut image) = (None, None, None);
    for path in models {
        let kind = if backpack_engine::models::whisper::is_whisper_dir(&path) {
            "speech"
        } else if backpack_engine::models::diffusion::is_image_model(&path) {
            "image"
        } else {
            "text"
        };
        let taken = match kind {
            "speech" => speech.is_some(),
            "image" => image.is_some(),
            _ => text.is_some(),
        };
        if taken {
            bail!(
                "one {kind} model at a time ({} is the second)",
                path.display()
            );
        }
        match kind {
            "speech" => speech = Some(load_speech(gpu, &path, opts.queue).await?),
            "image" => image = Some(load_image(gpu, &path, opts.queue).await?),
            _ => match shared.take_if(|s| s.path == path) {
                Some(s) => {
                    eprintln!("text: {} (shared with the chat)", s.info.name);
                    text = Some(TextSide::new(s.engine, s.events, &s.info, opts.queue));
                }
                None => text = Some(load_text(gpu, &path, load.clone(), opts.queue).await?),
            },
        }
    }
    Ok(Server {
        text,
        speech,
        image,
        created: api::unix_now(),
        api_key: opts.api_key.clone(),
    })
}

async fn load_text(gpu: &Gpu, path: &Path, load: ModelOptions, queue: usize) -> Result<TextSide> {
    let (engine, mut events) = Engine::spawn(gpu.clone(), None);
    engine.load(path.to_owned(), load);
    let info: ModelInfo = loop {
        match events.recv().await {
            Some(Event::Loaded(info)) => break info,
            Some(Event::Error { message, .. }) => bail!("loading {}: {message}", path.display()),
            Some(_) => {}
            None => bail!("the engine stopped while loading {}", path.display()),
        }
    };
    eprintln!(
        "text: {} ({}, context {}, {} answer{} at once)",
        info.name,
        info.architecture,
        info.context,
        info.slots,
        if info.slots == 1 { "" } else { "s" }
    );
    Ok(TextSide::new(engine, events, &info, queue))
}

async fn load_speech(gpu: &Gpu, path: &Path, queue: usize) -> Result<state::Speech> {
    use backpack_engine::runtime::speech::{SpeechEvent, SpeechService};
    let (handle, mut events) = SpeechService::spawn(gpu.clone(), None);
    handle.load(path.to_owned(), Default::default());
    let info = loop {
        match events.recv().await {
            Some(SpeechEvent::Loaded(info)) => break info,
            Some(SpeechEvent::Error { message, .. }) => {
                bail!("loading {}: {message}", path.display())
            }
            Some(_) => {}
            None => bail!(
                "the speech service stopped while loading {}",
                path.display()
            ),
        }
    };
    eprintln!("speech: {}", info.name);
    Ok(state::OneAtATime::new(handle, events, info.name, queue))
}

async fn load_image(
    gpu: &Gpu,
    path: &Path,
    queue: usize,
) -> Result<(
    state::Images,
    backpack_engine::models::diffusion::ImageModelInfo,
)> {
    use backpack_engine::runtime::image::{ImageEvent, ImageService};
    let (handle, mut events) = ImageService::spawn(gpu.clone(), None);
    handle.load(path.to_owned(), Default::default());
    let info = loop {
        match events.recv().await {
            Some(ImageEvent::Loaded(info)) => break info,
            Some(ImageEvent::Error { message, .. }) => {
                bail!("loading {}: {message}", path.display())
            }
            Some(_) => {}
            None => bail!("the image service stopped while loading {}", path.display()),
        }
    };
    eprintln!("images: {} ({})", info.name, info.family);
    Ok((
        state::OneAtATime::new(handle, events, info.name.clone(), queue),
        info,
    ))
}
