//! The UI's side of the text engine: the shared GPU, a tokio runtime the engine (and the speech
//! and image services, see [`super::speech`] and [`super::image`]) runs on, and the event channel
//! drained once per frame.
//! The engine wakes the UI through a repaint request that is batched over a few milliseconds,
//! so a fast token stream costs one frame per batch.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The descriptor the renderer opens its device with: the engine's, so the window and the
/// engine share one device with everything the kernels want.
pub use backpack_engine::gpu::device_descriptor;
use backpack_engine::gpu::{Gpu, adapter_filter, pick_adapter};
use backpack_engine::models::{GenerateParams, ModelOptions, Prompt};
use backpack_engine::runtime::image::ImageService;
use backpack_engine::runtime::speech::SpeechService;
use backpack_engine::runtime::{Engine, EngineHandle, Event, WakeFn};
use eframe::{egui, egui_wgpu, wgpu};
use tokio::sync::mpsc;

use super::image::ImageLink;
use super::speech::SpeechLink;

/// Tokens arriving within this window share one repaint.
const REPAINT_BATCH: Duration = Duration::from_millis(8);

/// What the status bar and Settings show about the GPU.
#[derive(Clone, Debug)]
pub struct GpuSummary {
    pub name: String,
    pub backend: String,
    pub device_type: String,
    pub driver: String,
    pub software: bool,
    pub shader_f16: bool,
    pub subgroups: bool,
    pub max_buffer: u64,
    pub max_binding: u64,
    /// The free memory a discrete GPU's driver reported when the app started.
    pub free_memory: Option<u64>,
}

impl GpuSummary {
    pub fn of(gpu: &Gpu) -> Self {
        let info = gpu.info();
        let caps = gpu.caps();
        Self {
            name: info.name.clone(),
            backend: format!("{:?}", info.backend),
            device_type: format!("{:?}", info.device_type),
            driver: format!("{} {}", info.driver, info.driver_info)
                .trim()
                .to_owned(),
            software: gpu.is_software(),
            shader_f16: caps.shader_f16,
            subgroups: caps.subgroups,
            max_buffer: caps.max_buffer,
            max_binding: caps.max_storage_binding,
            free_memory: gpu.free_memory(),
        }
    }
}

impl GpuSummary {
    /// What a model may use here; software and integrated adapters draw on system memory,
    /// discrete GPUs offer what their driver reported free.
    pub fn budget(&self) -> backpack_engine::hub::GpuBudget {
        let shared = self.software || self.device_type == "IntegratedGpu";
        backpack_engine::hub::GpuBudget {
            adapter: self.name.clone(),
            max_binding: self.max_binding,
            max_buffer: self.max_buffer,
            memory: if shared {
                backpack_engine::hub::system_memory()
            } else {
                self.free_memory
            },
        }
    }
}

/// The text engine, running on its own runtime.
pub struct EngineLink {
    handle: EngineHandle,
    events: mpsc::UnboundedReceiver<Event>,
    /// Where the engine's events also go while the in-app server shares the model.
    tap: Tap,
    /// The newest generation request, so loading or unloading can cancel whatever runs
    /// without knowing which panel asked for it.
    last_request: u64,
    // Dropped last: the engine task lives on it (shared with the speech service).
    runtime: Arc<tokio::runtime::Runtime>,
}

type Tap = Arc<std::sync::Mutex<Option<mpsc::UnboundedSender<Event>>>>;

/// Wakes `ctx`, batching wake-ups that come within [`REPAINT_BATCH`].
fn wake_fn(ctx: &egui::Context) -> WakeFn {
    let ctx = ctx.clone();
    Arc::new(move || ctx.request_repaint_after(REPAINT_BATCH))
}

impl EngineLink {
    /// Starts the engine on `gpu` (the renderer's own device) and has it wake `ctx`.
    pub fn start(gpu: Gpu, ctx: &egui::Context) -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("backpack-engine")
            .enable_all()
            .build()?;
        let (handle, mut from_engine) = {
            let _inside = runtime.enter();
            Engine::spawn(gpu, None)
        };
        // Every event reaches the UI, and the in-app server too while it shares the model
        // (each side ignores the other's requests); the server's reach it without waiting
        // for a frame.
        let (to_ui, events) = mpsc::unbounded_channel();
        let tap: Tap = Arc::default();
        let wake = wake_fn(ctx);
        let forward = tap.clone();
        runtime.spawn(async move {
            while let Some(event) = from_engine.recv().await {
                if let Ok(mut tap) = forward.lock()
                    && let Some(server) = tap.as_ref()
                    && server.send(event.clone()).is_err()
                {
                    *tap = None;
                }
                if to_ui.send(event).is_err() {
                    break;
                }
                wake();
            }
        });
        Ok(Self {
            handle,
            events,
            tap,
            last_request: 0,
            runtime: Arc::new(runtime),
        })
    }

    /// The engine for the in-app server to send requests to, and the events it sees from now
    /// on: the server then answers with the model the chat has loaded, not a second copy.
    pub fn share(&self) -> (EngineHandle, mpsc::UnboundedReceiver<Event>) {
        let (tx, rx) = mpsc::unbounded_channel();
        if let Ok(mut tap) = self.tap.lock() {
            *tap = Some(tx);
        }
        (self.handle.clone(), rx)
    }

    /// Starts the speech service on the engine's runtime, on the same GPU.
    pub fn start_speech(&self, gpu: Gpu, ctx: &egui::Context) -> SpeechLink {
        let (handle, events) = {
            let _inside = self.runtime.enter();
            SpeechService::spawn(gpu, Some(wake_fn(ctx)))
        };
        SpeechLink::new(handle, events, self.runtime.clone())
    }

    /// Starts the image service on the engine's runtime, on the same GPU.
    pub fn start_image(&self, gpu: Gpu, ctx: &egui::Context) -> ImageLink {
        let (handle, events) = {
            let _inside = self.runtime.enter();
            ImageService::spawn(gpu, Some(wake_fn(ctx)))
        };
        ImageLink::new(handle, events, self.runtime.clone())
    }

    pub fn load(&self, path: PathBuf, options: ModelOptions) {
        self.handle.load(path, options);
    }

    pub fn unload(&self) {
        self.handle.unload();
    }

    /// Queues a generation and returns its request id.
    pub fn generate(&mut self, prompt: Prompt, params: GenerateParams) -> u64 {
        self.last_request = self.handle.generate(prompt, params);
        self.last_request
    }

    /// Cancels request `id` (alone: the in-app server's may be queued around it); it ends
    /// within one token.
    pub fn cancel(&self, id: u64) {
        self.handle.cancel_one(id);
    }

    /// Cancels every request sent so far.
    pub fn cancel_all(&self) {
        self.handle.cancel(self.last_request);
    }

    /// Everything the engine sent since the last call.
    pub fn drain(&mut self) -> Vec<Event> {
        let mut out = Vec::new();
        while let Ok(e) = self.events.try_recv() {
            out.push(e);
        }
        out
    }
}

/// eframe's wgpu setup: the engine's device descriptor, and the adapter the engine would pick
/// (`--adapter` / `BACKPACK_ADAPTER`, discrete before integrated before CPU) among those that
/// can present to the window.
pub fn wgpu_setup(adapter: Option<&str>) -> egui_wgpu::WgpuSetup {
    let mut setup = egui_wgpu::WgpuSetupCreateNew::without_display_handle();
    // Validation layers make software drivers several times slower; opt in with WGPU_DEBUG.
    if std::env::var_os("WGPU_DEBUG").is_none() {
        setup.instance_descriptor.flags = wgpu::InstanceFlags::empty();
    }
    let filter = adapter_filter(adapter);
    setup.native_adapter_selector = Some(Arc::new(move |adapters, surface| {
        let usable: Vec<wgpu::Adapter> = adapters
            .iter()
            .filter(|a| surface.is_none_or(|s| a.is_surface_supported(s)))
            .cloned()
            .collect();
        pick_adapter(&usable, filter.as_deref()).map_err(|e| e.to_string())
    }));
    setup.device_descriptor = Arc::new(device_descriptor);
    setup.into()
}

/// GPU time each part of a long sequence (a prompt, an image step, a VAE decode) aims at
/// on the window's device: with two parts at most in the queue, a frame waits 8 ms at most
/// for the engine's work ahead of it.
pub const WINDOW_PART_BUDGET: std::time::Duration = std::time::Duration::from_millis(4);

/// The engine's GPU handle for the renderer's device, when the renderer is wgpu: its long
/// sequences paced so the window keeps drawing (`Gpu::pace_parts`).
pub fn shared_gpu(render_state: Option<&egui_wgpu::RenderState>) -> Option<Gpu> {
    render_state.map(|rs| {
        let gpu = Gpu::from_device(rs.device.clone(), rs.queue.clone(), rs.adapter.get_info());
        gpu.pace_parts(Some(WINDOW_PART_BUDGET));
        gpu
    })
}
