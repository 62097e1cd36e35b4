//! Native file dialogs (rfd) on their own threads: a dialog blocks until the user answers, and
//! the UI must keep drawing (and streaming) meanwhile.

use std::path::PathBuf;
use std::sync::mpsc;

use eframe::egui;

use crate::gui::store::speech::TranscriptFormat;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DialogKind {
    OpenModelFile,
    OpenModelFolder,
    ModelsFolder,
    ExportMarkdown(u64),
    ExportJson(u64),
    OpenSpeechModelFolder,
    OpenAudioFile,
    ExportTranscript(u64, TranscriptFormat),
    OpenImageModelFolder,
    OpenImageModelFile,
    OpenStartImage,
    /// Where to save a copy of gallery image `id`.
    SaveImageAs(u64),
}

/// What the audio decoder reads.
const AUDIO_EXTENSIONS: &[&str] = &["wav", "flac", "mp3", "ogg", "oga", "m4a", "mp4", "aac"];

pub struct Dialogs {
    done_tx: mpsc::Sender<(DialogKind, Option<PathBuf>)>,
    done_rx: mpsc::Receiver<(DialogKind, Option<PathBuf>)>,
    pub open: Option<DialogKind>,
}

impl Default for Dialogs {
    fn default() -> Self {
        let (done_tx, done_rx) = mpsc::channel();
        Self {
            done_tx,
            done_rx,
            open: None,
        }
    }
}

impl Dialogs {
    /// Shows a dialog unless one is already open; `name` seeds an export's file name.
    pub fn open(&mut self, kind: DialogKind, name: &str, ctx: &egui::Context) {
        if self.open.is_some() {
            return;
        }
        self.open = Some(kind);
        let tx = self.done_tx.clone();
        let name = name.to_owned();
        let ctx = ctx.clone();
        let spawned = std::thread::Builder::new()
            .name("file-dialog".into())
            .spawn(move || {
                let dialog = rfd::FileDialog::new();
                let path = match kind {
                    DialogKind::OpenModelFile => dialog
                        .set_title("Open a model file")
                        .add_filter("GGUF model", &["gguf"])
                        .pick_file(),
                    DialogKind::ModelsFolder => {
                        dialog.set_title("Where downloaded models go").pick_folder()
                    }
                    DialogKind::OpenModelFolder => dialog
                        .set_title(
                            "Open a model folder (config.json, *.safetensors, tokenizer.json)",
                        )
                        .pick_folder(),
                    DialogKind::ExportMarkdown(_) => dialog
                        .set_title("Export conversation as Markdown")
                        .add_filter("Markdown", &["md"])
                        .set_file_name(format!("{name}.md"))
                        .save_file(),
                    DialogKind::ExportJson(_) => dialog
                        .set_title("Export conversation as JSON")
                        .add_filter("JSON", &["json"])
                        .set_file_name(format!("{name}.json"))
                        .save_file(),
                    DialogKind::OpenSpeechModelFolder => dialog
                        .set_title("Open a Whisper model folder")
                        .pick_folder(),
                    DialogKind::OpenAudioFile => dialog
                        .set_title("Transcribe an audio file")
                        .add_filter("Audio", AUDIO_EXTENSIONS)
                        .pick_file(),
                    DialogKind::OpenImageModelFolder => dialog
                        .set_title("Open an image model folder (model_index.json)")
                        .pick_folder(),
                    DialogKind::OpenImageModelFile => dialog
                        .set_title("Open an image model checkpoint")
                        .add_filter("Safetensors checkpoint", &["safetensors"])
                        .pick_file(),
                    DialogKind::OpenStartImage => dialog
                        .set_title("Start from an image")
                        .add_filter("Image (PNG, JPEG, WebP)", &["png", "jpg", "jpeg", "webp"])
                        .pick_file(),
                    DialogKind::SaveImageAs(_) => dialog
                        .set_title("Save image as")
                        .add_filter("PNG image", &["png"])
                        .set_file_name(format!("{name}.png"))
                        .save_file(),
                    DialogKind::ExportTranscript(_, format) => {
                        let ext = format.extension();
                        dialog
                            .set_title("Export transcript")
                            .add_filter(format.name(), &[ext])
                            .set_file_name(format!("{name}.{ext}"))
                            .save_file()
                    }
                };
                let _ = tx.send((kind, path));
                ctx.request_repaint();
            });
        if spawned.is_err() {
            self.open = None;
        }
    }

    /// Dialogs answered since the last call (None: cancelled, or no dialog service).
    pub fn finished(&mut self) -> Vec<(DialogKind, Option<PathBuf>)> {
        let done: Vec<_> = self.done_rx.try_iter().collect();
        if !done.is_empty() {
            self.open = None;
        }
        done
    }
}
