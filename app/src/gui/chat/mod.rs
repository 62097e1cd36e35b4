//! The Chat panel: conversation list with search, the transcript (Markdown, streaming), per
//! conversation system prompt, model and sampling, a context meter, and the composer (with
//! dictation). It owns what is being typed and generated; conversations themselves live in the
//! shared store.

mod actions;
mod dictation;
mod events;
mod header;
mod list;
mod prompt;
mod transcript;

use std::path::PathBuf;
use std::time::Instant;

use eframe::egui;
use egui_commonmark::CommonMarkCache;

use super::shared::DialogKind;
use super::shared::Shared;
pub use dictation::Dictation;

/// The answer being streamed.
pub struct Generation {
    pub request: u64,
    /// Streamed from a remote backend rather than the local engine (their ids are separate).
    pub remote: bool,
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

pub struct ChatPanel {
    /// The conversation shown; written through to the store so it survives a restart.
    selected: Option<u64>,
    /// The composer's text.
    pub input: String,
    search: String,
    renaming: Option<(u64, String)>,
    /// A user message being edited: (conversation, index, text).
    editing: Option<(u64, usize, String)>,
    show_settings: bool,
    /// Put the keyboard focus in the composer on the next frame.
    focus_composer: bool,
    md_cache: CommonMarkCache,
    active: Option<Generation>,
    /// A conversation waiting for its model to finish loading before it is answered.
    pending_send: Option<u64>,
    overflow: Option<Overflow>,
    last_tokens_per_s: Option<f64>,
    dictation: Option<Dictation>,
    dictation_note: Option<String>,
    /// Whether the composer showed the dictation line last frame.
    dictation_line: bool,
}

/// What a click asked for; applied after the frame's widgets are laid out.
enum Action {
    New,
    Select(u64),
    StartRename(u64),
    FinishRename,
    Delete(u64),
    Export(DialogKind),
    Send,
    Stop,
    Regenerate(u64),
    StartEdit(u64, usize),
    CancelEdit,
    Resend(u64, usize),
    Copy(String),
    DropOldest(u64),
    LoadModel(PathBuf),
    OpenModel,
    DismissError,
    Dictate,
    DismissDictationNote,
}

impl ChatPanel {
    pub fn show(&mut self, shared: &mut Shared, ui: &mut egui::Ui) {
        let mut actions = Vec::new();
        egui::Panel::left("conversations")
            .default_size(230.0)
            .min_size(160.0)
            .show(ui, |ui| list::show(self, shared, ui, &mut actions));
        egui::Panel::bottom("composer").show(ui, |ui| {
            transcript::composer(self, shared, ui, &mut actions);
        });
        egui::CentralPanel::default().show(ui, |ui| {
            header::show(self, shared, ui, &mut actions);
            transcript::show(self, shared, ui, &mut actions);
        });
        let ctx = ui.ctx().clone();
        for action in actions {
            self.apply(shared, action, &ctx);
        }
    }

    fn apply(&mut self, shared: &mut Shared, action: Action, ctx: &egui::Context) {
        match action {
            Action::New => {
                self.new_conversation(shared);
            }
            Action::Select(id) => self.select(shared, id),
            Action::StartRename(id) => {
                let title = shared.store.conversation(id).map(|c| c.title.clone());
                self.renaming = Some((id, title.unwrap_or_default()));
            }
            Action::FinishRename => {
                if let Some((id, title)) = self.renaming.take() {
                    self.rename(shared, id, &title);
                }
            }
            Action::Delete(id) => self.delete_conversation(shared, id),
            Action::Export(kind) => self.open_export(shared, kind, ctx),
            Action::Send => self.submit_input(shared),
            Action::Stop => self.stop(shared),
            Action::Regenerate(id) => self.regenerate(shared, id),
            Action::StartEdit(id, index) => {
                let text = shared
                    .store
                    .conversation(id)
                    .and_then(|c| c.messages.get(index))
                    .map(|m| m.content.clone());
                self.editing = Some((id, index, text.unwrap_or_default()));
            }
            Action::CancelEdit => self.editing = None,
            Action::Resend(id, index) => {
                if let Some((_, _, text)) = self.editing.clone() {
                    self.edit_and_resend(shared, id, index, &text);
                }
            }
            Action::Copy(text) => ctx.copy_text(text),
            Action::DropOldest(id) => self.drop_oldest_and_retry(shared, id),
            Action::LoadModel(path) => shared.load_model(&path),
            Action::OpenModel => shared.open_dialog(DialogKind::OpenModelFile, "", ctx),
            Action::DismissError => shared.model_error = None,
            Action::Dictate => self.toggle_dictation(shared),
            Action::DismissDictationNote => self.dictation_note = None,
        }
    }
}
