//! The desktop app: a left rail routing to the Chat, Speech, Image, Models and Settings panels,
//! and a status bar. Each panel owns its state and actions; what they share (the engines, the
//! store, the GPU, dialogs, notices) lives in [`Shared`], lent to the panel being drawn. The
//! window's wgpu device is the engine's device; the text engine and the speech and image
//! services run on a background tokio runtime and their events are drained at the start of
//! every frame and handed to the panel they concern.

pub mod chat;
mod common;
pub mod downloads;
mod frame_stats;
pub mod image;
pub mod models;
pub mod services;
pub mod settings;
pub mod shared;
pub mod speech;
mod status_bar;
pub mod store;

use std::path::PathBuf;

use backpack_engine::runtime::Event;
use backpack_engine::runtime::image::ImageEvent;
use backpack_engine::runtime::speech::SpeechEvent;
use eframe::egui;

use chat::ChatPanel;
pub use common::{display_name, format_bytes};
use frame_stats::FrameStats;
use image::ImagePanel;
use models::ModelsPanel;
pub use services::image::ImageModelState;
pub use services::speech::SpeechModelState;
use settings::SettingsPanel;
use shared::DialogKind;
pub use shared::{AppConfig, ModelState, Shared};
use speech::SpeechPanel;
use store::Panel;

pub struct BackpackApp {
    pub shared: Shared,
    pub chat: ChatPanel,
    pub speech: SpeechPanel,
    pub image: ImagePanel,
    pub models: ModelsPanel,
    pub settings: SettingsPanel,
    frames: FrameStats,
}

impl BackpackApp {
    pub fn new(cc: &eframe::CreationContext<'_>, config: AppConfig) -> Self {
        let frames = FrameStats::new(config.frame_stats);
        let mut shared = Shared::new(cc, config);
        cc.egui_ctx.set_theme(if shared.store.state.dark_mode {
            egui::Theme::Dark
        } else {
            egui::Theme::Light
        });
        let chat = ChatPanel::new(&mut shared);
        let start_model = shared.config.model.clone().or_else(|| {
            let last = shared.store.state.last_model.clone();
            last.filter(|p| p.exists())
        });
        if let Some(path) = start_model {
            shared.load_model(&path);
        }
        let speech = SpeechPanel::new(&shared);
        let last_speech = shared.store.state.speech.last_model.clone();
        if let Some(path) = last_speech.filter(|p| p.exists())
            && shared.speech_model_path().is_none()
        {
            shared.load_speech_model(&path);
        }
        let image = ImagePanel::new(&shared, &cc.egui_ctx);
        Self {
            shared,
            chat,
            speech,
            image,
            models: ModelsPanel::default(),
            settings: SettingsPanel::default(),
            frames,
        }
    }

    /// Hands each engine event to the panel it concerns.
    fn handle_events(&mut self) {
        let events = match &mut self.shared.engine {
            Some(e) => e.drain(),
            None => return,
        };
        for event in events {
            match event {
                Event::Loaded(info) => {
                    let path = self.shared.model_loaded(info);
                    self.chat.on_model_loaded(&mut self.shared, &path);
                }
                // Only loading reports errors without a request.
                Event::Error {
                    request: None,
                    message,
                    ..
                } => {
                    self.shared.model_failed(message);
                    self.chat.on_model_failed();
                }
                // Every generation request is the chat's.
                event => self.chat.on_event(&mut self.shared, event, false),
            }
        }
    }

    /// Answers streamed from remote backends are the chat's.
    fn handle_remote_events(&mut self) {
        let events = match &mut self.shared.remote {
            Some(r) => r.drain(),
            None => return,
        };
        for event in events {
            self.chat.on_event(&mut self.shared, event, true);
        }
    }

    /// Hands each speech event to the panel whose request it is: chat dictation's to chat,
    /// the rest to Speech.
    fn handle_speech_events(&mut self) {
        let events = match &mut self.shared.speech {
            Some(s) => s.drain(),
            None => return,
        };
        for event in events {
            let request = services::speech::event_request(&event);
            if let (SpeechEvent::Done { .. } | SpeechEvent::Error { .. }, Some(id)) =
                (&event, request)
                && let Some(s) = &mut self.shared.speech
            {
                s.finished(id);
            }
            match event {
                SpeechEvent::Loaded(info) => self.shared.speech_loaded(info),
                // Only loading reports errors without a request.
                SpeechEvent::Error {
                    request: None,
                    message,
                } => self.shared.speech_failed(message),
                event if request.is_some() && request == self.chat.dictation_request() => {
                    self.chat.on_speech_event(event);
                }
                event => self.speech.on_event(&mut self.shared, event),
            }
        }
    }

    /// Hands each image event to the Image panel; a model's load is the app's.
    fn handle_image_events(&mut self, ctx: &egui::Context) {
        let events = match &mut self.shared.image {
            Some(i) => i.drain(),
            None => return,
        };
        for event in events {
            let request = services::image::event_request(&event);
            if let (ImageEvent::Done { .. } | ImageEvent::Error { .. }, Some(id)) =
                (&event, request)
                && let Some(i) = &mut self.shared.image
            {
                i.finished(id);
            }
            match event {
                ImageEvent::Loaded(info) => {
                    self.shared.image_loaded(info);
                    self.image.on_model_loaded();
                }
                // Only loading reports errors without a request.
                ImageEvent::Error {
                    request: None,
                    message,
                } => self.shared.image_failed(message),
                event => self.image.on_event(&mut self.shared, event, ctx),
            }
        }
        if self.shared.image.as_ref().is_some_and(|i| i.has_backlog()) {
            ctx.request_repaint();
        }
    }

    /// Files dropped on the window: PNGs and image models go to Image (a start image, a model
    /// to load), as does anything dropped while Image is shown; the rest to Speech (audio to
    /// transcribe, or a Whisper folder).
    fn handle_dropped_files(&mut self, ctx: &egui::Context) {
        let dropped: Vec<PathBuf> = ctx.input(|i| {
            let files = i.raw.dropped_files.iter();
            files.map(|f| f.path().to_owned()).collect()
        });
        if dropped.is_empty() {
            return;
        }
        if self.shared.store.state.panel == Panel::Image || dropped.iter().any(|p| is_for_image(p))
        {
            self.shared.go_to(Panel::Image);
            self.image.open_dropped(&mut self.shared, ctx, dropped);
        } else {
            self.shared.go_to(Panel::Speech);
            self.speech.open_dropped(&mut self.shared, dropped);
        }
    }

    /// Applies the file dialogs answered since the last frame.
    fn handle_dialogs(&mut self, ctx: &egui::Context) {
        for (kind, path) in self.shared.dialogs.finished() {
            let Some(path) = path else { continue };
            match kind {
                DialogKind::ModelsFolder => self.shared.set_models_dir(path),
                DialogKind::OpenModelFile | DialogKind::OpenModelFolder => {
                    self.shared.go_to(Panel::Chat);
                    self.shared.load_model(&path);
                }
                DialogKind::ExportMarkdown(id) => {
                    self.chat.finish_export(&mut self.shared, id, &path, false);
                }
                DialogKind::ExportJson(id) => {
                    self.chat.finish_export(&mut self.shared, id, &path, true);
                }
                DialogKind::OpenSpeechModelFolder => self.speech.load_model(&mut self.shared, path),
                DialogKind::OpenAudioFile => self.speech.transcribe_file(&mut self.shared, &path),
                DialogKind::ExportTranscript(id, format) => {
                    self.speech
                        .finish_export(&mut self.shared, id, &path, format);
                }
                DialogKind::OpenImageModelFolder | DialogKind::OpenImageModelFile => {
                    self.image.load_model(&mut self.shared, path);
                }
                DialogKind::OpenStartImage => self.image.set_start_image(ctx, &path),
                DialogKind::SaveImageAs(id) => {
                    self.image.finish_save_as(&mut self.shared, id, &path);
                }
            }
        }
    }

    fn rail(&mut self, ui: &mut egui::Ui) {
        ui.add_space(8.0);
        ui.vertical_centered(|ui| {
            ui.label(egui::RichText::new("Backpack").strong());
        });
        ui.add_space(8.0);
        for (panel, label) in [
            (Panel::Chat, "Chat"),
            (Panel::Speech, "Speech"),
            (Panel::Image, "Image"),
            (Panel::Models, "Models"),
            (Panel::Settings, "Settings"),
        ] {
            let selected = self.shared.store.state.panel == panel;
            let button = egui::Button::selectable(selected, label)
                .min_size(egui::vec2(ui.available_width(), 32.0));
            if ui.add(button).clicked() {
                self.shared.go_to(panel);
            }
        }
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
            self.chat.new_conversation(&mut self.shared);
            self.shared.go_to(Panel::Chat);
        }
    }

    fn remember_window(&mut self, ctx: &egui::Context) {
        let size = ctx.input(|i| i.viewport().inner_rect.map(|r| r.size()));
        let state = &mut self.shared.store.state;
        if let Some(size) = size {
            let new = [size.x.round(), size.y.round()];
            if state.window_size != Some(new) && size.x > 100.0 && size.y > 100.0 {
                state.window_size = Some(new);
                self.shared.store.mark_dirty();
            }
        }
    }

    fn notices_ui(&mut self, ui: &mut egui::Ui) {
        let mut dismiss = None;
        for (i, notice) in self.shared.notices.iter().enumerate() {
            ui.horizontal(|ui| {
                ui.label(notice);
                if ui.small_button("Dismiss").clicked() {
                    dismiss = Some(i);
                }
            });
        }
        if let Some(i) = dismiss {
            self.shared.notices.remove(i);
        }
    }
}

impl eframe::App for BackpackApp {
    fn ui(&mut self, ui: &mut egui::Ui, frame: &mut eframe::Frame) {
        self.frames
            .record(frame.info().cpu_usage, self.chat.is_busy());
        let ctx = ui.ctx().clone();
        self.handle_events();
        self.handle_remote_events();
        self.handle_speech_events();
        self.handle_image_events(&ctx);
        self.handle_dialogs(&ctx);
        if let Some(d) = &mut self.shared.downloads {
            d.poll();
        }
        self.handle_dropped_files(&ctx);
        self.shortcuts(&ctx);
        self.remember_window(&ctx);
        // Tokens wake the UI; this keeps the live tokens/s figure moving between them.
        if self.chat.is_busy() {
            ctx.request_repaint_after(std::time::Duration::from_millis(250));
        }

        egui::Panel::left("rail")
            .resizable(false)
            .exact_size(96.0)
            .show(ui, |ui| self.rail(ui));
        egui::Panel::bottom("status").show(ui, |ui| {
            let source = self.chat.remote_source(&self.shared);
            let speed = self.chat.speed_text();
            let frame_ms = self.chat.is_busy().then(|| self.frames.recent_cpu_ms());
            status_bar::show(ui, &self.shared, source, speed, frame_ms);
        });
        if !self.shared.notices.is_empty() {
            egui::Panel::top("notices").show(ui, |ui| self.notices_ui(ui));
        }
        match self.shared.store.state.panel {
            Panel::Chat => self.chat.show(&mut self.shared, ui),
            Panel::Speech => self.speech.show(&mut self.shared, ui),
            Panel::Image => self.image.show(&mut self.shared, ui),
            Panel::Models => self.models.show(&mut self.shared, ui),
            Panel::Settings => self.settings.show(&mut self.shared, ui),
        }
        drop_hint(&ctx, self.shared.store.state.panel);
        self.shared.save_if_due();
    }

    fn on_exit(&mut self) {
        self.chat.stop(&self.shared);
        self.chat.stop_dictation(&self.shared);
        self.speech.stop(&self.shared);
        self.image.stop(&self.shared);
        self.settings.stop_server();
        self.shared.save_now();
        if self.shared.config.frame_stats {
            eprintln!("{}", self.frames.report());
        }
    }
}

/// A picture (a start image) or an image model.
fn is_for_image(path: &std::path::Path) -> bool {
    crate::image_files::is_start_image(path) || services::image::is_image_model(path)
}

/// While files are dragged over the window, says what dropping them does.
fn drop_hint(ctx: &egui::Context, panel: Panel) {
    if ctx.input(|i| i.raw.hovered_files.is_empty()) {
        return;
    }
    let hovered: Vec<PathBuf> = ctx.input(|i| {
        let files = i.raw.hovered_files.iter();
        files.filter_map(|f| f.path.clone()).collect()
    });
    let text = if panel == Panel::Image || hovered.iter().any(|p| is_for_image(p)) {
        "Drop a PNG to start from it, or an image model to load it"
    } else {
        "Drop audio files to transcribe them"
    };
    let painter = ctx.layer_painter(egui::LayerId::new(
        egui::Order::Foreground,
        egui::Id::unique("drop-hint"),
    ));
    let rect = ctx.content_rect();
    painter.rect_filled(rect, 0.0, egui::Color32::from_black_alpha(160));
    painter.text(
        rect.center(),
        egui::Align2::CENTER_CENTER,
        text,
        egui::FontId::proportional(22.0),
        egui::Color32::WHITE,
    );
}
