//! The image service: one diffusion model, generating on its own blocking task; after every
//! denoising step it reports progress with the preview texture the step drew into.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::mpsc;

use super::{WakeFn, guarded};
use crate::gpu::Gpu;
use crate::models::diffusion::{
    DiffusionModel, Generated, ImageModelInfo, ImageModelOptions, ImageParams,
};

pub enum ImageRequest {
    Load {
        path: PathBuf,
        options: ImageModelOptions,
    },
    /// `count` images with seeds `params.seed`, `params.seed + 1`, …
    Generate {
        id: u64,
        params: ImageParams,
        count: u32,
        preview: bool,
    },
    Unload,
}

#[derive(Clone, Debug)]
pub enum ImageEvent {
    Loaded(ImageModelInfo),
    /// A denoising step finished; `preview` holds the current estimate (the same texture
    /// every step of an image size, redrawn on the GPU).
    Step {
        request: u64,
        index: u32,
        step: u32,
        steps: u32,
        elapsed_ms: f64,
        preview: Option<wgpu::Texture>,
    },
    Image {
        request: u64,
        index: u32,
        seed: u64,
        params: ImageParams,
        image: Arc<Generated>,
    },
    Done {
        request: u64,
        cancelled: bool,
    },
    Error {
        request: Option<u64>,
        message: String,
    },
}

/// The caller's side of the image service.
#[derive(Clone)]
pub struct ImageHandle {
    requests: mpsc::UnboundedSender<ImageRequest>,
    next_id: Arc<AtomicU64>,
    cancelled_through: Arc<AtomicU64>,
}

impl ImageHandle {
    pub fn load(&self, path: PathBuf, options: ImageModelOptions) {
        let _ = self.requests.send(ImageRequest::Load { path, options });
    }

    /// Queues `count` images and returns the request id.
    pub fn generate(&self, params: ImageParams, count: u32, preview: bool) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::AcqRel) + 1;
        let _ = self.requests.send(ImageRequest::Generate {
            id,
            params,
            count,
            preview,
        });
        id
    }

    /// Cancels request `id` and any earlier one; a running image stops after its current
    /// step.
    pub fn cancel(&self, id: u64) {
        self.cancelled_through.fetch_max(id, Ordering::AcqRel);
    }

    pub fn unload(&self) {
        let _ = self.requests.send(ImageRequest::Unload);
    }
}

pub struct ImageService;

impl ImageService {
    /// Starts the service on the current tokio runtime.
    pub fn spawn(
        gpu: Gpu,
        wake: Option<WakeFn>,
    ) -> (ImageHandle, mpsc::UnboundedReceiver<ImageEvent>) {
        let (req_tx, mut req_rx) = mpsc::unbounded_channel::<ImageRequest>();
        let (ev_tx, ev_rx) = mpsc::unbounded_channel::<ImageEvent>();
        let cancelled_through = Arc::new(AtomicU64::new(0));
        let handle = ImageHandle {
            requests: req_tx,
            next_id: Arc::new(AtomicU64::new(0)),
            cancelled_through: cancelled_through.clone(),
        };
        tokio::task::spawn_blocking(move || {
            let send = |event: ImageEvent| {
                let _ = ev_tx.send(event);
                if let Some(w) = &wake {
                    w();
                }
            };
            let mut model: Option<DiffusionModel> = None;
            while let Some(request) = req_rx.blocking_recv() {
                match request {
                    ImageRequest::Load { path, options } => {
                        model = None;
                        match guarded("loading the image model", || {
                            DiffusionModel::load(&gpu, &path, &options)
                        }) {
                            Ok(m) => {
                                send(ImageEvent::Loaded(m.info().clone()));
                                model = Some(m);
                            }
                            Err(e) => send(ImageEvent::Error {
                                request: None,
                                message: e.to_string(),
                            }),
                        }
                    }
                    ImageRequest::Unload => model = None,
                    ImageRequest::Generate {
                        id,
                        params,
                        count,
                        preview,
                    } => {
                        let Some(m) = model.as_mut() else {
                            send(ImageEvent::Error {
                                request: Some(id),
                                message: "no image model is loaded".into(),
                            });
                            continue;
                        };
                        let cancelled = || cancelled_through.load(Ordering::Acquire) >= id;
                        let result = guarded("generating an image", || {
                            generate(m, id, &params, count, preview, &cancelled, &send)
                        });
                        match result {
                            Ok(()) => send(ImageEvent::Done {
                                request: id,
                                cancelled: cancelled(),
                            }),
                            Err(e) => {
                                if matches!(e, crate::Error::Crashed(_)) {
                                    model = None;
                                }
                                send(ImageEvent::Error {
                                    request: Some(id),
                                    message: e.to_string(),
                                });
                            }
                        }
                    }
                }
            }
        });
        (handle, ev_rx)
    }
}

fn generate(
    model: &mut DiffusionModel,
    id: u64,
    params: &ImageParams,
    count: u32,
    preview: bool,
    cancelled: &dyn Fn() -> bool,
    send: &dyn Fn(ImageEvent),
) -> Result<(), crate::Error> {
    for index in 0..count.max(1) {
        if cancelled() {
            break;
        }
        let mut p = params.clone();
        p.seed = params.seed.wrapping_add(u64::from(index));
        let texture = if preview {
            Some(model.preview_texture(p.width, p.height)?)
        } else {
            None
        };
        let image = model.generate(&p, preview, |info| {
            send(ImageEvent::Step {
                request: id,
                index,
                step: info.step,
                steps: info.steps,
                elapsed_ms: info.elapsed_ms,
                preview: texture.clone(),
            });
            !cancelled()
        })?;
        match image {
            Some(image) => send(ImageEvent::Image {
                request: id,
                index,
                seed: p.seed,
                params: p,
                image: Arc::new(image),
            }),
            None => break,
        }
    }
    Ok(())
}
