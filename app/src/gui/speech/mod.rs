//! The Speech panel: a Whisper model (shared with chat dictation), language, task and input
//! device; recording live captions (level meter, committed text as timed segments, partial
//! text after them), transcribing audio files (dialog, typed path, or dropped on the window)
//! with progress; and the transcripts themselves: listed, searched, renamed, deleted, copied
//! and exported. Transcripts live in the shared store (`transcripts.json`).

mod controls;
mod jobs;
mod list;
mod record;
mod view;

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::Instant;

use eframe::egui;

use super::shared::DialogKind;
use super::shared::Shared;
pub use crate::gui::store::speech::{
    Line, Origin, SpeechSettings, Transcript, TranscriptFormat, clock,
};

/// A recording or a file being transcribed.
pub struct Job {
    pub request: u64,
    pub transcript: u64,
    pub origin: Origin,
    pub started: Instant,
    /// The input being heard, once the service started listening.
    pub input: Option<String>,
    /// Loudness of the latest audio, in dB below full scale.
    pub level_db: f32,
    /// Seconds since the recording began.
    pub elapsed_s: f64,
    /// Seconds of audio waiting to be transcribed.
    pub lag_s: f64,
    /// Seconds of a file transcribed, of its total.
    pub progress: Option<(f64, f64)>,
    /// Text that may still change, shown after the committed segments, and its times.
    pub partial: String,
    pub partial_span: (f64, f64),
    /// Stop was pressed; the service is finishing.
    pub stopping: bool,
}

pub struct SpeechPanel {
    selected: Option<u64>,
    search: String,
    renaming: Option<(u64, String)>,
    /// The Whisper folder typed or picked.
    model_input: String,
    /// The audio file typed.
    file_input: String,
    /// Input devices as last listed; None until first needed.
    devices: Option<Result<Vec<String>, String>>,
    job: Option<Job>,
    /// Files dropped together wait for the one before them.
    queue: VecDeque<PathBuf>,
    /// What went wrong with the last recording or file.
    pub error: Option<String>,
}

/// What a click asked for; applied after the frame's widgets are laid out.
enum Action {
    LoadModel(PathBuf),
    UnloadModel,
    Dialog(DialogKind),
    Record,
    Stop,
    Transcribe(PathBuf),
    RefreshDevices,
    Select(u64),
    StartRename(u64),
    FinishRename,
    Delete(u64),
    Copy(String),
    DismissError,
}

impl SpeechPanel {
    pub fn new(shared: &Shared) -> Self {
        let speech = &shared.store.state.speech;
        let selected = speech
            .selected_transcript
            .filter(|id| shared.store.transcript(*id).is_some())
            .or_else(|| shared.store.transcripts.last().map(|t| t.id));
        let model_input = speech
            .last_model
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        Self {
            selected,
            search: String::new(),
            renaming: None,
            model_input,
            file_input: String::new(),
            devices: None,
            job: None,
            queue: VecDeque::new(),
            error: None,
        }
    }

    pub fn show(&mut self, shared: &mut Shared, ui: &mut egui::Ui) {
        if self.model_input.is_empty()
            && let Some(path) = shared.speech_model_path()
        {
            // Loaded from elsewhere (`--model`, the library): show which.
            self.model_input = path.display().to_string();
        }
        let mut actions = Vec::new();
        egui::Panel::left("transcripts")
            .default_size(230.0)
            .min_size(160.0)
            .show(ui, |ui| list::show(self, shared, ui, &mut actions));
        egui::CentralPanel::default().show(ui, |ui| {
            ui.heading("Speech");
            ui.add_space(4.0);
            controls::model_rows(self, shared, ui, &mut actions);
            controls::option_rows(self, shared, ui, &mut actions);
            ui.separator();
            record::job_rows(self, shared, ui, &mut actions);
            ui.separator();
            view::show(self, shared, ui, &mut actions);
        });
        if self.job.is_some() {
            // Elapsed time and the estimate move between events.
            ui.ctx()
                .request_repaint_after(std::time::Duration::from_millis(250));
        }
        let ctx = ui.ctx().clone();
        for action in actions {
            self.apply(shared, action, &ctx);
        }
    }

    fn apply(&mut self, shared: &mut Shared, action: Action, ctx: &egui::Context) {
        match action {
            Action::LoadModel(path) => self.load_model(shared, path),
            Action::UnloadModel => shared.unload_speech_model(),
            Action::Dialog(kind) => {
                let name = match kind {
                    DialogKind::ExportTranscript(id, _) => self.file_stem(shared, id),
                    _ => String::new(),
                };
                shared.open_dialog(kind, &name, ctx);
            }
            Action::Record => self.record(shared),
            Action::Stop => self.stop(shared),
            Action::Transcribe(path) => self.transcribe_file(shared, &path),
            Action::RefreshDevices => self.devices = Some(list_devices()),
            Action::Select(id) => self.select(shared, id),
            Action::StartRename(id) => {
                let title = shared.store.transcript(id).map(|t| t.title.clone());
                self.renaming = Some((id, title.unwrap_or_default()));
            }
            Action::FinishRename => {
                if let Some((id, title)) = self.renaming.take() {
                    self.rename(shared, id, &title);
                }
            }
            Action::Delete(id) => self.delete(shared, id),
            Action::Copy(text) => ctx.copy_text(text),
            Action::DismissError => self.error = None,
        }
    }

    pub fn selected_id(&self) -> Option<u64> {
        self.selected
    }

    /// The recording or file being transcribed.
    pub fn job(&self) -> Option<&Job> {
        self.job.as_ref()
    }

    pub fn is_busy(&self) -> bool {
        self.job.is_some()
    }

    /// Whether speech event `request` is this panel's.
    pub fn owns(&self, request: u64) -> bool {
        self.job.as_ref().is_some_and(|j| j.request == request)
    }

    pub fn select(&mut self, shared: &mut Shared, id: u64) {
        self.selected = Some(id);
        shared.store.state.speech.selected_transcript = Some(id);
        shared.store.mark_dirty();
    }

    /// Loads a Whisper folder (and shows it in the path field).
    pub fn load_model(&mut self, shared: &mut Shared, path: PathBuf) {
        self.model_input = path.display().to_string();
        shared.load_speech_model(&path);
    }
}

/// The input devices, or why they cannot be listed.
fn list_devices() -> Result<Vec<String>, String> {
    backpack_engine::audio::input_devices().map_err(|e| e.to_string())
}
