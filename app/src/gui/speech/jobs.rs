//! What the Speech panel does: recordings and file transcriptions (start, stop, and the
//! events that fill their transcripts), and transcripts (rename, delete, export).

use std::path::{Path, PathBuf};
use std::time::Instant;

use backpack_engine::models::whisper::is_whisper_dir;
use backpack_engine::runtime::speech::SpeechEvent;

use super::{Job, SpeechPanel};
use crate::gui::common::display_name;
use crate::gui::services::speech::event_request;
use crate::gui::shared::Shared;
use crate::gui::store::speech::{Line, Origin, Transcript, TranscriptFormat, date_time};
use crate::gui::store::{self, now_secs};

/// The meter's floor: quieter than this reads as silence.
pub const SILENCE_DB: f32 = -60.0;

impl Job {
    fn new(request: u64, transcript: u64, origin: Origin) -> Self {
        Self {
            request,
            transcript,
            origin,
            started: Instant::now(),
            input: None,
            level_db: SILENCE_DB,
            elapsed_s: 0.0,
            lag_s: 0.0,
            progress: None,
            partial: String::new(),
            partial_span: (0.0, 0.0),
            stopping: false,
        }
    }
}

impl SpeechPanel {
    /// Records into a new transcript, from the chosen device or the `--audio-input` file,
    /// until Stop (or the file's end).
    pub fn record(&mut self, shared: &mut Shared) {
        if self.job.is_some() {
            return;
        }
        self.error = None;
        let request = match shared.start_listening() {
            Ok(id) => id,
            Err(e) => {
                self.error = Some(e);
                return;
            }
        };
        let title = format!("Recording {} UTC", date_time(now_secs()));
        let id = self.new_transcript(shared, title, Origin::Recording, None);
        self.job = Some(Job::new(request, id, Origin::Recording));
    }

    /// Transcribes `path` into a new transcript; while another job runs, it waits its turn.
    pub fn transcribe_file(&mut self, shared: &mut Shared, path: &Path) {
        if self.job.is_some() {
            self.queue.push_back(path.to_owned());
            return;
        }
        self.error = None;
        if !path.is_file() {
            self.error = Some(format!("{} is not an audio file", path.display()));
            return;
        }
        let request = match shared.start_transcribing(path) {
            Ok(id) => id,
            Err(e) => {
                self.error = Some(e);
                return;
            }
        };
        let id = self.new_transcript(shared, display_name(path), Origin::File, Some(path));
        self.job = Some(Job::new(request, id, Origin::File));
    }

    /// Files dropped on the window: a Whisper folder is loaded, anything else transcribed.
    pub fn open_dropped(&mut self, shared: &mut Shared, paths: Vec<PathBuf>) {
        for path in paths {
            if is_whisper_dir(&path) {
                self.load_model(shared, path);
            } else {
                self.transcribe_file(shared, &path);
            }
        }
    }

    /// Stops the job: a recording keeps what was said, a file what was transcribed. Files
    /// waiting their turn are dropped.
    pub fn stop(&mut self, shared: &Shared) {
        self.queue.clear();
        if let Some(job) = &mut self.job {
            shared.cancel_speech(job.request);
            job.stopping = true;
        }
    }

    fn new_transcript(
        &mut self,
        shared: &mut Shared,
        title: String,
        origin: Origin,
        file: Option<&Path>,
    ) -> u64 {
        let id = shared.store.next_transcript_id();
        let mut t = Transcript::new(id, title, origin);
        t.file = file.map(Path::to_owned);
        t.model = shared.speech_model_path().map(Path::to_owned);
        t.language = shared.store.state.speech.language.clone();
        shared.store.transcripts.push(t);
        self.search.clear();
        self.select(shared, id);
        id
    }

    /// A speech event of this panel's job (others are ignored).
    pub fn on_event(&mut self, shared: &mut Shared, event: SpeechEvent) {
        let Some(job) = self
            .job
            .as_mut()
            .filter(|j| Some(j.request) == event_request(&event))
        else {
            return;
        };
        let id = job.transcript;
        match event {
            SpeechEvent::Listening { input, .. } => job.input = Some(input),
            SpeechEvent::Level {
                rms,
                elapsed_s,
                lag_s,
                ..
            } => {
                job.level_db = (20.0 * rms.max(1e-6).log10()).clamp(SILENCE_DB, 0.0);
                job.elapsed_s = elapsed_s;
                job.lag_s = lag_s;
            }
            SpeechEvent::Partial {
                start, end, text, ..
            } => {
                job.partial = text;
                job.partial_span = (start, end);
            }
            SpeechEvent::Progress {
                done_s, total_s, ..
            } => job.progress = Some((done_s, total_s)),
            SpeechEvent::Commit {
                start, end, text, ..
            } => add_line(shared, id, start, end, text),
            SpeechEvent::Segment { segment, .. } => {
                add_line(shared, id, segment.start, segment.end, segment.text);
            }
            SpeechEvent::Language { code, .. } => {
                if let Some(t) = shared.store.transcript_mut(id) {
                    t.language = Some(code);
                }
            }
            SpeechEvent::Done {
                language,
                audio_s,
                cancelled,
                ..
            } => self.on_done(shared, language, audio_s, cancelled),
            SpeechEvent::Error { message, .. } => self.on_error(shared, message),
            SpeechEvent::Loaded(_) => {}
        }
    }

    fn on_done(
        &mut self,
        shared: &mut Shared,
        language: Option<String>,
        audio_s: f64,
        cancelled: bool,
    ) {
        let Some(job) = self.job.take() else { return };
        if let Some(t) = shared.store.transcript_mut(job.transcript) {
            if language.is_some() {
                t.language = language;
            }
            // Live captions report no length (wall time is no measure when decoding lags).
            t.audio_s = audio_s;
            // Stop is how a recording ends; only a file can be cut short.
            t.stopped = cancelled && job.origin == Origin::File;
        }
        shared.store.mark_dirty();
        shared.save_now();
        self.start_next(shared);
    }

    fn on_error(&mut self, shared: &mut Shared, message: String) {
        let Some(job) = self.job.take() else { return };
        let empty = shared
            .store
            .transcript(job.transcript)
            .is_some_and(|t| t.segments.is_empty());
        if empty {
            // Nothing was heard: keep the list to transcripts with text.
            self.delete(shared, job.transcript);
        } else if let Some(t) = shared.store.transcript_mut(job.transcript) {
            t.error = Some(message.clone());
            shared.store.mark_dirty();
        }
        self.error = Some(message);
        self.start_next(shared);
    }

    /// Starts the next file waiting, skipping those that cannot start.
    fn start_next(&mut self, shared: &mut Shared) {
        while self.job.is_none() {
            let Some(path) = self.queue.pop_front() else {
                return;
            };
            self.transcribe_file(shared, &path);
        }
    }

    /// Renames transcript `id`; a blank title is ignored.
    pub fn rename(&mut self, shared: &mut Shared, id: u64, title: &str) {
        if let Some(t) = shared.store.transcript_mut(id)
            && !title.trim().is_empty()
        {
            t.title = title.trim().to_owned();
            shared.store.mark_dirty();
        }
    }

    /// Deletes transcript `id`, stopping its job if it has one.
    pub fn delete(&mut self, shared: &mut Shared, id: u64) {
        if self.job.as_ref().is_some_and(|j| j.transcript == id) {
            self.stop(shared);
        }
        let store = &mut shared.store;
        store.transcripts.retain(|t| t.id != id);
        if self.selected == Some(id) {
            self.selected = store.transcripts.last().map(|t| t.id);
            store.state.speech.selected_transcript = self.selected;
        }
        store.mark_dirty();
    }

    /// A file name for exporting transcript `id`, without extension.
    pub(super) fn file_stem(&self, shared: &Shared, id: u64) -> String {
        let title = shared.store.transcript(id).map(|t| t.title.as_str());
        let stem: String = title
            .unwrap_or_default()
            .chars()
            .map(|c| if c.is_alphanumeric() { c } else { '-' })
            .collect();
        let stem = stem.trim_matches('-').to_owned();
        if stem.is_empty() {
            "transcript".into()
        } else {
            stem
        }
    }

    /// Writes transcript `id` to `path` in `format`.
    pub fn export_transcript(
        &self,
        shared: &Shared,
        id: u64,
        path: &Path,
        format: TranscriptFormat,
    ) -> anyhow::Result<()> {
        let t = shared
            .store
            .transcript(id)
            .ok_or_else(|| anyhow::anyhow!("no transcript {id}"))?;
        store::write_atomic(path, t.export(format).as_bytes())
    }

    /// Exports to the path chosen in the dialog, with a notice either way.
    pub fn finish_export(
        &self,
        shared: &mut Shared,
        id: u64,
        path: &Path,
        format: TranscriptFormat,
    ) {
        let notice = match self.export_transcript(shared, id, path, format) {
            Ok(()) => format!("Exported to {}", path.display()),
            Err(e) => format!("Export failed: {e:#}"),
        };
        shared.notices.push(notice);
    }
}

fn add_line(shared: &mut Shared, id: u64, start: f64, end: f64, text: String) {
    let text = text.trim();
    if text.is_empty() {
        return;
    }
    if let Some(t) = shared.store.transcript_mut(id) {
        t.segments.push(Line {
            start,
            end,
            text: text.to_owned(),
        });
        shared.store.mark_dirty();
    }
}
