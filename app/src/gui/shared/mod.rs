//! What the panels share: the text engine and the model it holds, the speech and image
//! services and their models (see [`super::services::speech`] and [`super::services::image`]),
//! the GPU and the window's renderer, the store, the hub and its downloads, file dialogs and
//! notices. The app owns one and lends it to the panel being drawn; each panel keeps its own
//! state to itself.

mod dialogs;
mod image_model;
mod speech_model;

use std::path::{Path, PathBuf};

use backpack_engine::hub::{GpuBudget, Library, SearchRoots};
use backpack_engine::models::{ModelInfo, ModelOptions};
use backpack_engine::ops::WeightDType;
use eframe::{egui, egui_wgpu};

use super::downloads::Downloads;
use super::services::image::{self, ImageLink, ImageModelState};
use super::services::remote::RemoteLink;
use super::services::speech::{SpeechLink, SpeechModelState};
use super::services::text::{self, EngineLink, GpuSummary};
use super::store::{Panel, Store};
pub use dialogs::{DialogKind, Dialogs};

/// How the app was started.
#[derive(Clone, Debug, Default)]
pub struct AppConfig {
    /// Where settings and conversations live.
    pub data_dir: PathBuf,
    /// A model to load at start (instead of the last one used).
    pub model: Option<PathBuf>,
    /// Print frame-time statistics to stderr on exit.
    pub frame_stats: bool,
    /// The hub to talk to (default: `HF_ENDPOINT`, else huggingface.co).
    pub hub_endpoint: Option<String>,
    /// Where downloads go (default: the saved choice, else `models` in the data dir).
    pub models_dir: Option<PathBuf>,
    /// An audio file played in real time as the only live input (a virtual microphone),
    /// for machines without one, demos and tests.
    pub audio_input: Option<PathBuf>,
    /// Where other tools keep models (the Hugging Face cache, LM Studio, Ollama), shown as
    /// found on this machine; `SearchRoots::from_env()` for the real app.
    pub other_tools: SearchRoots,
}

pub enum ModelState {
    None,
    Loading(PathBuf),
    Ready { path: PathBuf, info: ModelInfo },
}

pub struct Shared {
    pub store: Store,
    pub engine: Option<EngineLink>,
    /// Why there is no engine (no wgpu renderer, or it failed to start).
    pub engine_error: Option<String>,
    /// The window's adapter, which the engine shares.
    pub gpu: Option<GpuSummary>,
    /// The window's renderer, which draws textures the engine fills (image previews).
    pub render_state: Option<egui_wgpu::RenderState>,
    pub model: ModelState,
    /// What went wrong with loading or using a model; Chat and Models show it.
    pub model_error: Option<String>,
    pub speech: Option<SpeechLink>,
    pub speech_model: SpeechModelState,
    /// What went wrong loading the speech model; Speech shows it.
    pub speech_error: Option<String>,
    /// Most tokens a window of audio may produce (None: the model's limit). Tests cap it,
    /// since random-weight fixtures never stop on their own.
    pub speech_max_new_tokens: Option<u32>,
    pub image: Option<ImageLink>,
    pub image_model: ImageModelState,
    /// What went wrong loading the image model; Image shows it.
    pub image_error: Option<String>,
    /// Remote OpenAI-compatible backends and the chat answers streamed from them.
    pub remote: Option<RemoteLink>,
    /// The hub client, the models folder and the download queue.
    pub downloads: Option<Downloads>,
    pub dialogs: Dialogs,
    /// Messages for the user that are not tied to one view (save failures, exports).
    pub notices: Vec<String>,
    pub config: AppConfig,
}

impl Shared {
    pub fn new(cc: &eframe::CreationContext<'_>, config: AppConfig) -> Self {
        let store = Store::open(&config.data_dir);
        let mut notices = store.notices.clone();
        let remote = match RemoteLink::start(&config.data_dir, &cc.egui_ctx) {
            Ok((link, problem)) => {
                notices.extend(problem);
                Some(link)
            }
            Err(e) => {
                notices.push(format!("Remote backends are unavailable: {e}"));
                None
            }
        };
        let gpu = text::shared_gpu(cc.wgpu_render_state.as_ref());
        let mut summary = gpu.as_ref().map(GpuSummary::of);
        let (engine, engine_error) = match gpu.clone() {
            Some(gpu) => match EngineLink::start(gpu, &cc.egui_ctx) {
                Ok(link) => (Some(link), None),
                Err(e) => (None, Some(format!("the engine could not start: {e}"))),
            },
            None => (
                None,
                Some(
                    "the window is not drawn with wgpu, so there is no GPU to run models on".into(),
                ),
            ),
        };
        if engine.is_none() {
            // No engine, no GPU for models, whatever draws the window.
            summary = None;
        }
        let speech = engine
            .as_ref()
            .zip(gpu.clone())
            .map(|(link, gpu)| link.start_speech(gpu, &cc.egui_ctx));
        let image = engine
            .as_ref()
            .zip(gpu)
            .map(|(link, gpu)| link.start_image(gpu, &cc.egui_ctx));
        let models_dir = config
            .models_dir
            .clone()
            .or_else(|| store.state.models_dir.clone())
            .unwrap_or_else(|| crate::hub::default_models_dir(&config.data_dir));
        let client = crate::hub::client_for(&config.data_dir, config.hub_endpoint.clone())
            .map_err(|e| format!("{e:#}"));
        let downloads = Downloads::new(
            &cc.egui_ctx,
            client,
            Library::new(models_dir),
            config.other_tools.clone(),
        )
        .ok();
        Self {
            store,
            engine,
            engine_error,
            gpu: summary,
            render_state: cc.wgpu_render_state.clone(),
            model: ModelState::None,
            model_error: None,
            speech,
            speech_model: SpeechModelState::None,
            speech_error: None,
            speech_max_new_tokens: None,
            image,
            image_model: ImageModelState::None,
            image_error: None,
            remote,
            downloads,
            dialogs: Dialogs::default(),
            notices,
            config,
        }
    }

    pub fn model_info(&self) -> Option<&ModelInfo> {
        match &self.model {
            ModelState::Ready { info, .. } => Some(info),
            _ => None,
        }
    }

    /// The model loaded or loading.
    pub fn model_path(&self) -> Option<&Path> {
        match &self.model {
            ModelState::Ready { path, .. } | ModelState::Loading(path) => Some(path),
            ModelState::None => None,
        }
    }

    /// What the GPU offers models, for "will it fit" checks.
    pub fn gpu_budget(&self) -> Option<GpuBudget> {
        self.gpu.as_ref().map(GpuSummary::budget)
    }

    pub fn load_options(&self) -> ModelOptions {
        use backpack_engine::load::GgmlType;
        let load = &self.store.state.load;
        let quantize = match load.quant.as_deref() {
            Some("q8_0") => Some(GgmlType::Q8_0),
            Some("q4_0") => Some(GgmlType::Q4_0),
            Some("q4_k") => Some(GgmlType::Q4K),
            _ => None,
        };
        ModelOptions {
            dtype: if load.dtype == "f32" {
                WeightDType::F32
            } else {
                WeightDType::F16
            },
            quantize,
            context: load.context,
            kv_cache: load.kv_q8.then_some(backpack_engine::ops::KvDType::Q8_0),
            f16_prompt_weights: load.f16_prompt_weights,
            speculate: load.speculate.map(|tokens| {
                backpack_engine::models::speculate::Speculation {
                    tokens,
                    draft: load.draft_model.clone(),
                    paced: true,
                }
            }),
            ..Default::default()
        }
    }

    /// Starts loading `path` (an HF folder, a .gguf file, or a folder holding one); an answer
    /// being streamed is stopped. A Whisper folder is loaded by the speech service instead,
    /// an image model by the image service.
    pub fn load_model(&mut self, path: &Path) {
        // The library's "Use" and `--model` can name a Whisper folder or an image model too.
        if backpack_engine::models::whisper::is_whisper_dir(path) {
            self.load_speech_model(path);
            self.go_to(Panel::Speech);
            return;
        }
        if image::is_image_model(path) {
            self.load_image_model(path);
            self.go_to(Panel::Image);
            return;
        }
        self.model_error = None;
        let Some(engine) = &self.engine else {
            self.model_error = self.engine_error.clone();
            return;
        };
        if !path.exists() {
            self.model_error = Some(format!("{} does not exist", path.display()));
            return;
        }
        engine.cancel_all();
        engine.load(path.to_owned(), self.load_options());
        self.model = ModelState::Loading(path.to_owned());
    }

    pub fn unload_model(&mut self) {
        if let Some(engine) = &self.engine {
            engine.cancel_all();
            engine.unload();
        }
        self.model = ModelState::None;
    }

    /// The engine finished loading: the model is ready and remembered. Returns its path.
    pub fn model_loaded(&mut self, info: ModelInfo) -> PathBuf {
        let path = self.model_path().map(Path::to_owned).unwrap_or_default();
        self.store.state.remember_model(&path);
        self.model = ModelState::Ready {
            path: path.clone(),
            info,
        };
        self.model_error = None;
        self.store.mark_dirty();
        path
    }

    pub fn model_failed(&mut self, message: String) {
        self.model = ModelState::None;
        self.model_error = Some(message);
    }

    /// Downloads go to `dir` from now on (models already there are listed; others stay where
    /// they are).
    pub fn set_models_dir(&mut self, dir: PathBuf) {
        if let Some(d) = &mut self.downloads {
            d.set_models(Library::new(dir.clone()));
        }
        self.store.state.models_dir = Some(dir);
        self.store.mark_dirty();
    }

    pub fn go_to(&mut self, panel: Panel) {
        if self.store.state.panel != panel {
            self.store.state.panel = panel;
            self.store.mark_dirty();
        }
    }

    /// Shows a file dialog; `name` seeds an export's file name. Answers come back to the app.
    pub fn open_dialog(&mut self, kind: DialogKind, name: &str, ctx: &egui::Context) {
        self.dialogs.open(kind, name, ctx);
    }

    pub fn save_now(&mut self) {
        if let Err(e) = self.store.save() {
            self.notices.push(format!("{e:#}"));
        }
    }

    pub fn save_if_due(&mut self) {
        if let Err(e) = self.store.save_if_due() {
            self.notices.push(format!("{e:#}"));
        }
    }
}
