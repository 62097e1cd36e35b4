//! The desktop app: a left rail routing to the Chat, Models and Settings panels, and a status
//! bar. The window's wgpu device is the engine's device; the engine runs on a background tokio
//! runtime and its events are drained at the start of every frame.

mod chat;
mod dialogs;
pub mod downloads;
pub mod engine_link;
mod hub_views;
mod models;
mod settings;
pub mod store;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::Instant;

use backpack_engine::load::ChatMessage;
use backpack_engine::models::{GenerateParams, ModelInfo, ModelOptions, Prompt, StopReason};
use backpack_engine::ops::{SamplerParams, WeightDType};
use backpack_engine::runtime::Event;
use eframe::egui;
use egui_commonmark::CommonMarkCache;

use dialogs::{DialogKind, Dialogs};
use engine_link::EngineLink;
use store::{AnswerStats, Conversation, Message, Panel, Role, Store};

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
}

pub enum ModelState {
    None,
    Loading(PathBuf),
    Ready { path: PathBuf, info: ModelInfo },
}

/// The answer being streamed.
pub struct Generation {
    pub request: u64,
    pub conversation: u64,
    pub message: usize,
    pub started: Instant,
    pub first_token: Option<Instant>,
    pub tokens: usize,
    /// Set by "drop oldest turns and retry": keep dropping while the prompt overflows.
    pub truncating: bool,
}

/// A prompt that did not fit the model's context.
pub struct Overflow {
    pub conversation: u64,
    pub tokens: usize,
    pub capacity: u32,
}

/// Frame times, to show that streaming never stalls the UI.
#[derive(Default)]
pub struct FrameStats {
    last: Option<Instant>,
    /// (CPU ms of the frame, ms since the previous frame, generating?)
    samples: VecDeque<(f32, f32, bool)>,
    totals: Vec<(f32, f32, bool)>,
    keep_all: bool,
}

const FRAME_WINDOW: usize = 120;

impl FrameStats {
    fn record(&mut self, cpu_s: Option<f32>, generating: bool) {
        let now = Instant::now();
        let interval = self
            .last
            .map_or(0.0, |l| now.duration_since(l).as_secs_f32() * 1e3);
        self.last = Some(now);
        let sample = (cpu_s.unwrap_or(0.0) * 1e3, interval, generating);
        if self.samples.len() == FRAME_WINDOW {
            self.samples.pop_front();
        }
        self.samples.push_back(sample);
        if self.keep_all {
            self.totals.push(sample);
        }
    }

    /// Mean CPU time per frame over the recent window, in ms.
    pub fn recent_cpu_ms(&self) -> f32 {
        if self.samples.is_empty() {
            return 0.0;
        }
        self.samples.iter().map(|s| s.0).sum::<f32>() / self.samples.len() as f32
    }

    fn report(&self) -> String {
        let summarize = |generating: bool| {
            let mut cpu: Vec<f32> = self
                .totals
                .iter()
                .filter(|s| s.2 == generating)
                .map(|s| s.0)
                .collect();
            if cpu.is_empty() {
                return "no frames".to_owned();
            }
            cpu.sort_by(f32::total_cmp);
            let mean = cpu.iter().sum::<f32>() / cpu.len() as f32;
            let p95 = cpu[(cpu.len() * 95 / 100).min(cpu.len() - 1)];
            format!(
                "{} frames, CPU per frame mean {mean:.2} ms, p95 {p95:.2} ms, max {:.2} ms",
                cpu.len(),
                cpu[cpu.len() - 1]
            )
        };
        format!(
            "frame stats: idle: {}; generating: {}",
            summarize(false),
            summarize(true)
        )
    }
}

pub struct BackpackApp {
    pub store: Store,
    pub engine: Option<EngineLink>,
    /// Why there is no engine (no wgpu renderer).
    pub engine_error: Option<String>,
    pub model: ModelState,
    pub model_error: Option<String>,
    pub active: Option<Generation>,
    /// A conversation waiting for its model to finish loading before it is answered.
    pending_send: Option<u64>,
    pub overflow: Option<Overflow>,
    pub input: String,
    search: String,
    renaming: Option<(u64, String)>,
    pub editing: Option<(u64, usize, String)>,
    show_chat_settings: bool,
    /// Put the keyboard focus in the composer on the next frame.
    focus_composer: bool,
    model_path_input: String,
    md_cache: CommonMarkCache,
    dialogs: Dialogs,
    /// Messages for the user that are not tied to one view (save failures, exports).
    pub notices: Vec<String>,
    pub frames: FrameStats,
    config: AppConfig,
    last_tokens_per_s: Option<f64>,
    pub downloads: Option<downloads::Downloads>,
    pub models_tab: hub_views::ModelsTab,
    token_input: String,
}

impl BackpackApp {
    pub fn new(cc: &eframe::CreationContext<'_>, config: AppConfig) -> Self {
        let store = Store::open(&config.data_dir);
        let notices = store.notices.clone();
        let (engine, engine_error) = match engine_link::shared_gpu(cc.wgpu_render_state.as_ref()) {
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
        let models_dir = config
            .models_dir
            .clone()
            .or_else(|| store.state.models_dir.clone())
            .unwrap_or_else(|| crate::hubutil::default_models_dir(&config.data_dir));
        let client = crate::hubutil::client_for(&config.data_dir, config.hub_endpoint.clone())
            .map_err(|e| format!("{e:#}"));
        let downloads = downloads::Downloads::new(
            &cc.egui_ctx,
            client,
            backpack_engine::hub::Library::new(models_dir),
        )
        .ok();
        cc.egui_ctx.set_theme(if store.state.dark_mode {
            egui::Theme::Dark
        } else {
            egui::Theme::Light
        });
        let mut app = Self {
            store,
            engine,
            engine_error,
            model: ModelState::None,
            model_error: None,
            active: None,
            pending_send: None,
            overflow: None,
            input: String::new(),
            search: String::new(),
            renaming: None,
            editing: None,
            show_chat_settings: false,
            focus_composer: true,
            model_path_input: String::new(),
            md_cache: CommonMarkCache::default(),
            dialogs: Dialogs::default(),
            notices,
            frames: FrameStats {
                keep_all: config.frame_stats,
                ..Default::default()
            },
            last_tokens_per_s: None,
            config,
            downloads,
            models_tab: hub_views::ModelsTab::default(),
            token_input: String::new(),
        };
        if app.store.conversations.is_empty() {
            app.new_conversation();
        }
        if app.selected_id().is_none() {
            app.store.state.selected_conversation = app.store.conversations.last().map(|c| c.id);
        }
        let start_model = app
            .config
            .model
            .clone()
            .or_else(|| app.store.state.last_model.clone().filter(|p| p.exists()));
        if let Some(path) = start_model {
            app.load_model(&path);
        }
        app
    }

    pub fn model_info(&self) -> Option<&ModelInfo> {
        match &self.model {
            ModelState::Ready { info, .. } => Some(info),
            _ => None,
        }
    }

    /// What the GPU offers models, for "will it fit" checks.
    pub fn gpu_budget(&self) -> Option<backpack_engine::hub::GpuBudget> {
        self.engine.as_ref().map(|e| e.gpu.budget())
    }

    /// Downloads go to `dir` from now on (models already there are listed; others stay where
    /// they are).
    pub fn set_models_dir(&mut self, dir: PathBuf) {
        if let Some(d) = &mut self.downloads {
            d.set_models(backpack_engine::hub::Library::new(dir.clone()));
        }
        self.store.state.models_dir = Some(dir);
        self.store.mark_dirty();
    }

    /// Saves a hub token (owner-only) and uses it from now on.
    pub fn save_token(&mut self, token: &str) {
        let path = crate::hubutil::token_path(&self.config.data_dir);
        let result = backpack_engine::hub::store_token(&path, token)
            .map_err(anyhow::Error::from)
            .and_then(|()| {
                crate::hubutil::client_for(&self.config.data_dir, self.config.hub_endpoint.clone())
            });
        match result {
            Ok(client) => {
                if let Some(d) = &mut self.downloads {
                    d.set_client(Ok(client));
                }
                self.notices.push("Hub token saved.".into());
            }
            Err(e) => self
                .notices
                .push(format!("Could not save the token: {e:#}")),
        }
    }

    pub fn model_path(&self) -> Option<&Path> {
        match &self.model {
            ModelState::Ready { path, .. } | ModelState::Loading(path) => Some(path),
            ModelState::None => None,
        }
    }

    pub fn selected_id(&self) -> Option<u64> {
        self.store
            .state
            .selected_conversation
            .filter(|id| self.store.conversation(*id).is_some())
    }

    pub fn selected(&self) -> Option<&Conversation> {
        self.selected_id()
            .and_then(|id| self.store.conversation(id))
    }

    pub fn new_conversation(&mut self) -> u64 {
        let id = self.store.next_conversation_id();
        let model = self.model_path().map(Path::to_owned);
        self.store.conversations.push(Conversation::new(
            id,
            self.store.state.default_sampling.clone(),
            model,
        ));
        self.store.state.selected_conversation = Some(id);
        self.store.mark_dirty();
        self.focus_composer = true;
        id
    }

    pub fn delete_conversation(&mut self, id: u64) {
        if self.active.as_ref().is_some_and(|g| g.conversation == id) {
            self.stop();
        }
        self.store.conversations.retain(|c| c.id != id);
        if self.store.state.selected_conversation == Some(id) {
            self.store.state.selected_conversation = self.store.conversations.last().map(|c| c.id);
        }
        if self.store.conversations.is_empty() {
            self.new_conversation();
        }
        self.store.mark_dirty();
    }

    fn load_options(&self) -> ModelOptions {
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
            ..Default::default()
        }
    }

    /// Starts loading `path` (an HF folder, a .gguf file, or a folder holding one).
    pub fn load_model(&mut self, path: &Path) {
        self.model_error = None;
        let Some(engine) = &self.engine else {
            self.model_error = self.engine_error.clone();
            return;
        };
        if !path.exists() {
            self.model_error = Some(format!("{} does not exist", path.display()));
            return;
        }
        if let Some(g) = &self.active {
            engine.handle.cancel(g.request);
        }
        engine.handle.load(path.to_owned(), self.load_options());
        self.model = ModelState::Loading(path.to_owned());
    }

    pub fn unload_model(&mut self) {
        self.stop();
        if let Some(engine) = &self.engine {
            engine.handle.unload();
        }
        self.model = ModelState::None;
    }

    /// Sends the selected conversation to the model, answering its last user message.
    pub fn submit_input(&mut self) {
        let text = self.input.trim().to_owned();
        if text.is_empty() || self.active.is_some() {
            return;
        }
        let id = match self.selected_id() {
            Some(id) => id,
            None => self.new_conversation(),
        };
        self.input.clear();
        let Some(conv) = self.store.conversation_mut(id) else {
            return;
        };
        if conv.messages.is_empty() && conv.title == "New chat" {
            conv.title = title_from(&text);
        }
        conv.messages.push(Message::user(&text));
        self.store.mark_dirty();
        self.answer(id);
    }

    /// Streams a new answer to conversation `id`, whose last message is from the user.
    pub fn answer(&mut self, id: u64) {
        self.overflow = None;
        let ready = matches!(self.model, ModelState::Ready { .. });
        if !ready {
            let wanted = self.store.conversation(id).and_then(|c| c.model.clone());
            match (&self.model, wanted) {
                (ModelState::Loading(_), _) => self.pending_send = Some(id),
                (ModelState::None, Some(path)) if path.exists() => {
                    self.load_model(&path);
                    self.pending_send = Some(id);
                }
                _ => {
                    self.model_error = Some("Open a model first: Models, then Open model….".into());
                }
            }
            return;
        }
        let Some(engine) = &self.engine else {
            return;
        };
        let Some(info) = self.model_info().cloned() else {
            return;
        };
        let model_path = self.model_path().map(Path::to_owned);
        let Some(conv) = self.store.conversation_mut(id) else {
            return;
        };
        if conv.messages.last().map(|m| m.role) != Some(Role::User) {
            return;
        }
        conv.model = model_path;
        let prompt = prompt_for(conv, info.has_chat_template);
        let s = &conv.sampling;
        let seed = s.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
        let params = GenerateParams {
            max_tokens: s.max_tokens.max(1),
            sampler: SamplerParams {
                temperature: s.temperature,
                top_k: s.top_k,
                top_p: s.top_p,
                repeat_penalty: s.repeat_penalty,
                seed,
            },
        };
        conv.messages.push(Message::assistant());
        let message = conv.messages.len() - 1;
        let request = engine.handle.generate(prompt, params);
        self.active = Some(Generation {
            request,
            conversation: id,
            message,
            started: Instant::now(),
            first_token: None,
            tokens: 0,
            truncating: false,
        });
        self.store.mark_dirty();
    }

    /// Stops the answer being streamed; it ends within one token.
    pub fn stop(&mut self) {
        if let (Some(g), Some(engine)) = (&self.active, &self.engine) {
            engine.handle.cancel(g.request);
        }
    }

    /// Replaces the last answer of conversation `id` with a new one.
    pub fn regenerate(&mut self, id: u64) {
        if self.active.is_some() {
            return;
        }
        let Some(conv) = self.store.conversation_mut(id) else {
            return;
        };
        if conv.messages.last().map(|m| m.role) == Some(Role::Assistant) {
            conv.messages.pop();
        }
        self.answer(id);
    }

    /// Replaces user message `index` of conversation `id` with `text`, drops everything after
    /// it, and answers again.
    pub fn edit_and_resend(&mut self, id: u64, index: usize, text: &str) {
        if self.active.is_some() {
            self.stop();
            // The cancelled answer's Done event must not land in the edited transcript.
            self.active = None;
        }
        let Some(conv) = self.store.conversation_mut(id) else {
            return;
        };
        if conv.messages.get(index).map(|m| m.role) != Some(Role::User) {
            return;
        }
        conv.messages.truncate(index + 1);
        conv.messages[index].content = text.trim().to_owned();
        self.editing = None;
        self.store.mark_dirty();
        self.answer(id);
    }

    /// Drops the oldest exchange of conversation `id` (keeping the system prompt and the last
    /// user message) and retries; repeats while the prompt still overflows.
    pub fn drop_oldest_and_retry(&mut self, id: u64) {
        self.overflow = None;
        if !drop_oldest_turn(self.store.conversation_mut(id)) {
            self.model_error = Some(
                "The last message alone is longer than the model's context; shorten it or raise the context length in Models."
                    .into(),
            );
            return;
        }
        self.store.mark_dirty();
        self.answer(id);
        if let Some(g) = self.active.as_mut().filter(|g| g.conversation == id) {
            g.truncating = true;
        }
    }

    fn handle_events(&mut self) {
        let events = match &mut self.engine {
            Some(e) => e.drain(),
            None => return,
        };
        for event in events {
            self.handle_event(event);
        }
    }

    fn handle_event(&mut self, event: Event) {
        match event {
            Event::Loaded(info) => {
                let path = match &self.model {
                    ModelState::Loading(p) | ModelState::Ready { path: p, .. } => p.clone(),
                    ModelState::None => PathBuf::new(),
                };
                self.store.state.remember_model(&path);
                if let Some(conv) = self
                    .selected_id()
                    .and_then(|id| self.store.conversation_mut(id))
                    && conv.messages.is_empty()
                {
                    conv.model = Some(path.clone());
                }
                self.model = ModelState::Ready { path, info };
                self.model_error = None;
                self.store.mark_dirty();
                if let Some(id) = self.pending_send.take() {
                    self.answer(id);
                }
            }
            Event::Token {
                request,
                text_delta,
                ..
            } => {
                let Some(g) = self.active.as_mut().filter(|g| g.request == request) else {
                    return;
                };
                g.tokens += 1;
                g.first_token.get_or_insert_with(Instant::now);
                let (conv, index) = (g.conversation, g.message);
                if let Some(m) = self
                    .store
                    .conversation_mut(conv)
                    .and_then(|c| c.messages.get_mut(index))
                {
                    m.content.push_str(&text_delta);
                }
            }
            Event::Done {
                request,
                prompt_tokens,
                generated_tokens,
                ttft,
                tokens_per_s,
                stop,
                ..
            } => {
                let Some(g) = self.active.take_if(|g| g.request == request) else {
                    return;
                };
                let stop = match stop {
                    StopReason::EndOfText => "end of text",
                    StopReason::MaxTokens => "max tokens",
                    StopReason::ContextFull => "context full",
                    StopReason::Cancelled => "stopped",
                };
                self.last_tokens_per_s = Some(tokens_per_s);
                if let Some(conv) = self.store.conversation_mut(g.conversation) {
                    conv.context_used = Some(prompt_tokens + generated_tokens);
                    if let Some(m) = conv.messages.get_mut(g.message) {
                        m.stats = Some(AnswerStats {
                            prompt_tokens,
                            tokens: generated_tokens,
                            ttft_ms: ttft.as_secs_f64() * 1e3,
                            tokens_per_s,
                            stop: stop.into(),
                        });
                    }
                }
                self.store.mark_dirty();
                self.save_now();
            }
            Event::Error {
                request: None,
                message,
                ..
            } => {
                // Only loading reports errors without a request.
                self.model = ModelState::None;
                self.pending_send = None;
                self.model_error = Some(message);
            }
            Event::Error {
                request: Some(request),
                message,
                prompt_too_long,
            } => {
                let Some(g) = self.active.take_if(|g| g.request == request) else {
                    return;
                };
                let Some(conv) = self.store.conversation_mut(g.conversation) else {
                    return;
                };
                match prompt_too_long {
                    Some((tokens, capacity)) => {
                        // Nothing was generated: drop the empty answer.
                        if conv.messages.len() == g.message + 1
                            && conv.messages[g.message].content.is_empty()
                        {
                            conv.messages.pop();
                        }
                        if g.truncating {
                            self.drop_oldest_and_retry(g.conversation);
                        } else {
                            self.overflow = Some(Overflow {
                                conversation: g.conversation,
                                tokens,
                                capacity,
                            });
                        }
                    }
                    None => {
                        if let Some(m) = conv.messages.get_mut(g.message) {
                            m.error = Some(message);
                        }
                    }
                }
                self.store.mark_dirty();
            }
        }
    }

    fn save_now(&mut self) {
        if let Err(e) = self.store.save() {
            self.notices.push(format!("{e:#}"));
        }
    }

    pub(crate) fn open_dialog(&mut self, kind: DialogKind, ctx: &egui::Context) {
        let name = self
            .selected()
            .map(|c| file_stem_for(&c.title))
            .unwrap_or_else(|| "chat".into());
        self.dialogs.open(kind, &name, ctx);
    }

    fn handle_dialogs(&mut self) {
        for (kind, path) in self.dialogs.finished() {
            let Some(path) = path else { continue };
            match kind {
                DialogKind::ModelsFolder => self.set_models_dir(path),
                DialogKind::OpenModelFile | DialogKind::OpenModelFolder => {
                    self.store.state.panel = Panel::Chat;
                    self.load_model(&path);
                }
                DialogKind::ExportMarkdown(id) | DialogKind::ExportJson(id) => {
                    let json = matches!(kind, DialogKind::ExportJson(_));
                    self.notices
                        .push(match self.export_conversation(id, &path, json) {
                            Ok(()) => format!("Exported to {}", path.display()),
                            Err(e) => format!("Export failed: {e:#}"),
                        });
                }
            }
        }
    }

    /// Writes conversation `id` to `path` as JSON or Markdown (what the export dialogs do once a
    /// path is chosen).
    pub fn export_conversation(&self, id: u64, path: &Path, json: bool) -> anyhow::Result<()> {
        let conv = self
            .store
            .conversation(id)
            .ok_or_else(|| anyhow::anyhow!("no conversation {id}"))?;
        let bytes = if json {
            serde_json::to_vec_pretty(conv)?
        } else {
            conv.to_markdown().into_bytes()
        };
        store::write_atomic(path, &bytes)
    }

    fn rail(&mut self, ui: &mut egui::Ui) {
        ui.add_space(8.0);
        ui.vertical_centered(|ui| {
            ui.label(egui::RichText::new("Backpack").strong());
        });
        ui.add_space(8.0);
        for (panel, label) in [
            (Panel::Chat, "Chat"),
            (Panel::Models, "Models"),
            (Panel::Settings, "Settings"),
        ] {
            let selected = self.store.state.panel == panel;
            let button = egui::Button::selectable(selected, label)
                .min_size(egui::vec2(ui.available_width(), 32.0));
            if ui.add(button).clicked() && !selected {
                self.store.state.panel = panel;
                self.store.mark_dirty();
            }
        }
    }

    fn status_bar(&mut self, ui: &mut egui::Ui) {
        ui.horizontal(|ui| {
            match &self.model {
                ModelState::None => {
                    ui.label("No model loaded");
                }
                ModelState::Loading(path) => {
                    ui.spinner();
                    ui.label(format!("Loading {}…", display_name(path)));
                }
                ModelState::Ready { info, .. } => {
                    ui.label(egui::RichText::new(&info.name).strong());
                    ui.separator();
                    ui.label(format!(
                        "Weights {} · KV cache {}",
                        format_bytes(info.weight_bytes),
                        format_bytes(info.cache_bytes)
                    ));
                }
            }
            ui.separator();
            if let Some(g) = &self.active {
                let rate = g.first_token.map(|t| {
                    let secs = t.elapsed().as_secs_f64();
                    if secs > 0.0 && g.tokens > 1 {
                        (g.tokens - 1) as f64 / secs
                    } else {
                        0.0
                    }
                });
                ui.label(match rate {
                    Some(r) => format!("{r:.1} tokens/s"),
                    None => "Reading the prompt…".into(),
                });
                ui.label(format!("UI {:.1} ms/frame", self.frames.recent_cpu_ms()));
            } else if let Some(r) = self.last_tokens_per_s {
                ui.label(format!("Last answer {r:.1} tokens/s"));
            }
            ui.with_layout(
                egui::Layout::right_to_left(egui::Align::Center),
                |ui| match &self.engine {
                    Some(engine) if engine.gpu.software => {
                        ui.colored_label(
                            ui.visuals().warn_fg_color,
                            format!(
                                "⚠ CPU adapter {} ({}): no GPU found, models run slowly",
                                engine.gpu.name, engine.gpu.backend
                            ),
                        );
                    }
                    Some(engine) => {
                        ui.label(format!("GPU {} ({})", engine.gpu.name, engine.gpu.backend));
                    }
                    None => {
                        ui.colored_label(ui.visuals().error_fg_color, "No GPU");
                    }
                },
            );
        });
    }

    fn shortcuts(&mut self, ctx: &egui::Context) {
        let (quit, new_chat) = ctx.input_mut(|i| {
            (
                i.consume_key(egui::Modifiers::COMMAND, egui::Key::Q),
                i.consume_key(egui::Modifiers::COMMAND, egui::Key::N),
            )
        });
        if quit {
            ctx.send_viewport_cmd(egui::ViewportCommand::Close);
        }
        if new_chat {
            self.new_conversation();
            self.store.state.panel = Panel::Chat;
        }
    }

    fn remember_window(&mut self, ctx: &egui::Context) {
        let size = ctx.input(|i| i.viewport().inner_rect.map(|r| r.size()));
        if let Some(size) = size {
            let new = [size.x.round(), size.y.round()];
            if self.store.state.window_size != Some(new) && size.x > 100.0 && size.y > 100.0 {
                self.store.state.window_size = Some(new);
                self.store.mark_dirty();
            }
        }
    }

    fn notices_ui(&mut self, ui: &mut egui::Ui) {
        let mut dismiss = None;
        for (i, notice) in self.notices.iter().enumerate() {
            ui.horizontal(|ui| {
                ui.label(notice);
                if ui.small_button("Dismiss").clicked() {
                    dismiss = Some(i);
                }
            });
        }
        if let Some(i) = dismiss {
            self.notices.remove(i);
        }
    }
}

impl eframe::App for BackpackApp {
    fn ui(&mut self, ui: &mut egui::Ui, frame: &mut eframe::Frame) {
        self.frames
            .record(frame.info().cpu_usage, self.active.is_some());
        self.handle_events();
        self.handle_dialogs();
        if let Some(d) = &mut self.downloads {
            d.poll();
        }
        let ctx = ui.ctx().clone();
        self.shortcuts(&ctx);
        self.remember_window(&ctx);
        // Tokens wake the UI; this keeps the live tokens/s figure moving between them.
        if self.active.is_some() {
            ctx.request_repaint_after(std::time::Duration::from_millis(250));
        }

        egui::Panel::left("rail")
            .resizable(false)
            .exact_size(96.0)
            .show(ui, |ui| self.rail(ui));
        egui::Panel::bottom("status").show(ui, |ui| self.status_bar(ui));
        if !self.notices.is_empty() {
            egui::Panel::top("notices").show(ui, |ui| self.notices_ui(ui));
        }
        match self.store.state.panel {
            Panel::Chat => chat::show(self, ui),
            Panel::Models => models::show(self, ui),
            Panel::Settings => settings::show(self, ui),
        }
        if let Err(e) = self.store.save_if_due() {
            self.notices.push(format!("{e:#}"));
        }
    }

    fn on_exit(&mut self) {
        self.stop();
        self.save_now();
        if self.config.frame_stats {
            eprintln!("{}", self.frames.report());
        }
    }
}

/// The prompt for a conversation: its system prompt and messages through the model's chat
/// template, or a plain transcript for models without one.
fn prompt_for(conv: &Conversation, chat_template: bool) -> Prompt {
    let mut messages = Vec::new();
    if !conv.system_prompt.trim().is_empty() {
        messages.push(ChatMessage::new("system", conv.system_prompt.trim()));
    }
    for m in &conv.messages {
        messages.push(ChatMessage::new(m.role.as_str(), &m.content));
    }
    if chat_template {
        return Prompt::Chat(messages);
    }
    let mut text = String::new();
    for m in &messages {
        let who = match m.role.as_str() {
            "system" => "System",
            "user" => "User",
            _ => "Assistant",
        };
        text += &format!("{who}: {}\n", m.content);
    }
    text += "Assistant:";
    Prompt::Raw(text)
}

/// Removes the oldest exchange (everything before the second user message). False when only
/// one user message is left.
fn drop_oldest_turn(conv: Option<&mut Conversation>) -> bool {
    let Some(conv) = conv else { return false };
    let second_user = conv
        .messages
        .iter()
        .enumerate()
        .filter(|(_, m)| m.role == Role::User)
        .nth(1)
        .map(|(i, _)| i);
    match second_user {
        Some(i) => {
            conv.messages.drain(..i);
            true
        }
        None => false,
    }
}

fn title_from(text: &str) -> String {
    let line = text.lines().next().unwrap_or_default().trim();
    let mut title: String = line.chars().take(40).collect();
    if line.chars().count() > 40 {
        title.push('…');
    }
    if title.is_empty() {
        "New chat".into()
    } else {
        title
    }
}

fn file_stem_for(title: &str) -> String {
    let stem: String = title
        .chars()
        .map(|c| if c.is_alphanumeric() { c } else { '-' })
        .collect();
    let stem = stem.trim_matches('-').to_owned();
    if stem.is_empty() { "chat".into() } else { stem }
}

pub fn display_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// One "key: value" row of a two-column grid.
fn info_row(ui: &mut egui::Ui, key: &str, value: String) {
    ui.label(key);
    ui.label(value);
    ui.end_row();
}

pub fn format_bytes(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= 1024.0 * 1024.0 * 1024.0 {
        format!("{:.2} GiB", b / (1024.0 * 1024.0 * 1024.0))
    } else if b >= 1024.0 * 1024.0 {
        format!("{:.1} MiB", b / (1024.0 * 1024.0))
    } else {
        format!("{:.0} KiB", b / 1024.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use store::Sampling;

    #[test]
    fn oldest_turns_are_dropped_until_one_user_message_is_left() {
        let mut c = Conversation::new(1, Sampling::default(), None);
        for text in ["a", "b", "c"] {
            c.messages.push(Message::user(text));
            c.messages.push(Message::assistant());
        }
        c.messages.pop();
        assert!(drop_oldest_turn(Some(&mut c)));
        assert_eq!(c.messages.len(), 3);
        assert_eq!(c.messages[0].content, "b");
        assert!(drop_oldest_turn(Some(&mut c)));
        assert_eq!(c.messages.len(), 1);
        assert!(!drop_oldest_turn(Some(&mut c)));
    }

    #[test]
    fn prompts_use_the_template_or_a_plain_transcript() {
        let mut c = Conversation::new(1, Sampling::default(), None);
        c.system_prompt = "Be brief.".into();
        c.messages.push(Message::user("Hi"));
        match prompt_for(&c, true) {
            Prompt::Chat(m) => {
                assert_eq!(m.len(), 2);
                assert_eq!(m[0].role, "system");
            }
            _ => panic!("chat prompt expected"),
        }
        match prompt_for(&c, false) {
            Prompt::Raw(t) => assert_eq!(t, "System: Be brief.\nUser: Hi\nAssistant:"),
            _ => panic!("raw prompt expected"),
        }
    }

    #[test]
    fn titles_are_short_first_lines() {
        assert_eq!(title_from("Hello\nworld"), "Hello");
        assert_eq!(title_from(&"x".repeat(50)).chars().count(), 41);
        assert_eq!(file_stem_for("What's up?"), "What-s-up");
    }
}
