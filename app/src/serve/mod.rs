//! `backpack serve`: an OpenAI-compatible HTTP server (axum on the tokio runtime the engine
//! already uses) over one loaded model, so editors, scripts and agents can use it as they use
//! LM Studio's or llama.cpp's servers.

mod api;
mod dispatch;
mod routes;
mod stop;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use backpack_engine::gpu::Gpu;
use backpack_engine::models::{ModelInfo, ModelOptions};
use backpack_engine::runtime::{Engine, Event};

pub use dispatch::Dispatch;
pub use routes::Server;

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

/// The routes over `server`.
pub fn router(server: Arc<Server>, body_limit: usize) -> Router {
    Router::new()
        .route("/v1/models", get(routes::models))
        .route("/v1/chat/completions", post(routes::chat))
        .route("/v1/completions", post(routes::completions))
        .fallback(routes::not_found)
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(axum::middleware::from_fn_with_state(
            server.clone(),
            routes::authorize,
        ))
        .with_state(server)
}

/// Loads `model` on `gpu` and serves it until ctrl-c. Prints the address once listening.
pub async fn serve(gpu: Gpu, model: PathBuf, load: ModelOptions, opts: ServeOptions) -> Result<()> {
    let (engine, mut events) = Engine::spawn(gpu, None);
    engine.load(model.clone(), load);
    let info: ModelInfo = loop {
        match events.recv().await {
            Some(Event::Loaded(info)) => break info,
            Some(Event::Error { message, .. }) => {
                bail!("loading {}: {message}", model.display())
            }
            Some(_) => {}
            None => bail!("the engine stopped while loading the model"),
        }
    };
    let server = Arc::new(Server {
        dispatch: Dispatch::new(engine, events, opts.queue),
        model: info.name.clone(),
        context: info.context,
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        api_key: opts.api_key.clone(),
    });
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
    eprintln!(
        "serving {} ({}, context {}) at http://{local}/v1",
        info.name, info.architecture, info.context
    );
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
    axum::serve(listener, router(server, opts.body_limit))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .context("serving")
}
