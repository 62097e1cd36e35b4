//! The Speech panel and chat dictation, driven through the real app with egui_kittest on the
//! GPU (lavapipe in CI), with no sound card: the only live input is an audio file played in
//! real time (`--audio-input`). A tiny random-weight Whisper model says nonsense, quickly; what
//! is checked is the way text, progress and errors reach the UI, exports, and persistence.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use backpack_app::gui::services;
use backpack_app::gui::speech::{Line, Origin, Transcript, TranscriptFormat, clock};
use backpack_app::gui::store::{Panel, Store};
use backpack_app::gui::{AppConfig, BackpackApp, SpeechModelState};
use eframe::{egui, egui_wgpu, wgpu};
use egui_kittest::kittest::Queryable;
use egui_kittest::{Harness, SnapshotOptions};

fn fixture(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(path)
}

fn tiny_whisper() -> PathBuf {
    fixture("models/tiny-whisper")
}

fn fresh_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("backpack-speech-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The real app on a wgpu device made the way the app makes its own, with `audio_input` as the
/// virtual microphone. `any_text`: transcripts hold whatever the random model writes,
/// including characters the fonts bundled for tests lack.
fn harness(
    data_dir: &Path,
    audio_input: Option<PathBuf>,
    any_text: bool,
) -> Harness<'static, BackpackApp> {
    let config = AppConfig {
        data_dir: data_dir.to_owned(),
        model: None,
        frame_stats: false,
        hub_endpoint: Some("http://127.0.0.1:9".into()),
        models_dir: Some(data_dir.join("models")),
        audio_input,
        other_tools: Default::default(),
    };
    let egui_wgpu::WgpuSetup::CreateNew(mut setup) = egui_kittest::wgpu::default_wgpu_setup()
    else {
        panic!("kittest's default setup creates a device");
    };
    setup.instance_descriptor.flags = wgpu::InstanceFlags::empty();
    setup.device_descriptor = Arc::new(services::text::device_descriptor);
    let mut builder = Harness::builder();
    if any_text {
        builder = builder.allow_missing_glyphs();
    }
    let mut h = builder
        .with_size(egui::vec2(1100.0, 720.0))
        .with_render_cursor(false)
        .wgpu_setup(setup.into())
        .build_eframe(move |cc| BackpackApp::new(cc, config));
    // The random model never ends a window by itself.
    h.state_mut().shared.speech_max_new_tokens = Some(12);
    h
}

/// Runs frames until `done` holds (the speech service works in the background meanwhile).
fn wait_for(h: &mut Harness<'_, BackpackApp>, what: &str, done: impl Fn(&BackpackApp) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(180);
    while !done(h.state()) {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        h.step();
        std::thread::sleep(Duration::from_millis(5));
    }
    h.step();
}

fn speech_ready(app: &BackpackApp) -> bool {
    matches!(app.shared.speech_model, SpeechModelState::Ready { .. })
}

fn speech_idle(app: &BackpackApp) -> bool {
    !app.speech.is_busy()
}

fn selected(app: &BackpackApp) -> &Transcript {
    let id = app.speech.selected_id().expect("a transcript is selected");
    app.shared.store.transcript(id).expect("the transcript")
}

fn type_into(h: &mut Harness<'_, BackpackApp>, label: &str, text: &str) {
    h.get_by_label(label).focus();
    h.step();
    h.get_by_label(label).type_text(text);
    h.step();
}

/// A file dropped on the window, as the windowing backend hands it over.
#[derive(Debug)]
struct Dropped(PathBuf);

impl egui::DroppedFile for Dropped {
    fn path(&self) -> &Path {
        &self.0
    }

    fn bytes(&self) -> Result<Vec<u8>, String> {
        std::fs::read(&self.0).map_err(|e| e.to_string())
    }
}

/// SRT blocks: an index, a `start --> end` line, text, a blank line.
fn assert_srt(srt: &str, blocks: usize) {
    let parsed: Vec<&str> = srt.split("\n\n").filter(|b| !b.trim().is_empty()).collect();
    assert_eq!(parsed.len(), blocks, "{srt}");
    for (i, block) in parsed.iter().enumerate() {
        let lines: Vec<&str> = block.lines().collect();
        assert!(lines.len() >= 3, "{block}");
        assert_eq!(lines[0], (i + 1).to_string());
        let (start, end) = lines[1].split_once(" --> ").expect("a --> line");
        for t in [start, end] {
            let b = t.as_bytes();
            assert!(
                t.len() == 12 && b[2] == b':' && b[5] == b':' && b[8] == b',',
                "{t}"
            );
        }
        assert!(!lines[2].trim().is_empty());
    }
}

type App = Harness<'static, BackpackApp>;

/// Loads the tiny model through the path field and Load.
fn load_through_the_path_field(h: &mut App) {
    type_into(
        h,
        "Speech model path",
        &tiny_whisper().display().to_string(),
    );
    h.get_by_label("Load").click();
    wait_for(h, "the speech model", speech_ready);
    assert!(h.state().shared.speech_error.is_none());
    h.get_by_label_contains("99 languages");
}

/// Record: level, elapsed time and committed text arrive live; the file's end ends it. A click
/// on a segment's time copies it.
fn record_to_the_end(h: &mut App) -> Transcript {
    h.get_by_label("⏺ Record").click();
    h.step();
    assert!(h.state().speech.is_busy(), "Record starts a recording");
    wait_for(h, "the input level", |app| {
        app.speech
            .job()
            .is_some_and(|j| j.input.is_some() && j.elapsed_s > 0.5)
    });
    h.get_by_label_contains("Recording from speech_short.wav");
    h.get_by_label("⏹ Stop");
    wait_for(h, "the recording to finish", speech_idle);
    let recording = selected(h.state()).clone();
    assert_eq!(recording.origin, Origin::Recording);
    assert!(
        recording.title.starts_with("Recording "),
        "{}",
        recording.title
    );
    assert!(
        !recording.segments.is_empty(),
        "committed text: {recording:?}"
    );
    let first = &recording.segments[0];
    assert!(first.end >= first.start);
    h.get_all_by_label_contains(&format!("[{} → ", clock(first.start)))
        .next()
        .expect("the first segment's times")
        .click();
    h.step();
    let copied = h
        .output()
        .platform_output
        .commands
        .iter()
        .any(|c| matches!(c, egui::OutputCommand::CopyText(t) if *t == clock(first.start)));
    assert!(copied, "the time is copied");
    recording
}

/// Stop ends a recording early and keeps it; Delete removes it.
fn stop_and_delete_a_recording(h: &mut App) {
    let before = h.state().shared.store.transcripts.len();
    h.get_by_label("⏺ Record").click();
    wait_for(h, "the second recording", |app| {
        app.speech.job().is_some_and(|j| j.elapsed_s > 1.0)
    });
    h.get_by_label("⏹ Stop").click();
    h.step();
    assert!(h.state().speech.job().is_some_and(|j| j.stopping));
    wait_for(h, "the stop", speech_idle);
    let stopped = selected(h.state()).clone();
    assert!(stopped.error.is_none() && !stopped.stopped, "{stopped:?}");
    assert_eq!(h.state().shared.store.transcripts.len(), before + 1);
    h.get_by_label("Delete").click();
    h.run_steps(2);
    assert!(h.state().shared.store.transcript(stopped.id).is_none());
}

/// A file that is not audio: the error is shown, no transcript is left.
fn bad_file_shows_an_error(h: &mut App, dir: &Path) {
    let before = h.state().shared.store.transcripts.len();
    let bad = dir.join("notes.wav");
    std::fs::write(&bad, "these are words, not samples").expect("write");
    type_into(h, "Audio file path", &bad.display().to_string());
    h.get_by_label("Transcribe file").click();
    wait_for(h, "the error", |app| {
        speech_idle(app) && app.speech.error.is_some()
    });
    let error = h.state().speech.error.clone().expect("error");
    assert!(error.contains("notes.wav"), "{error}");
    h.get_by_label_contains(&error);
    assert_eq!(h.state().shared.store.transcripts.len(), before);
}

/// A file dropped on the window: segments come in with progress, window by window.
fn transcribe_a_dropped_file(h: &mut App) -> Transcript {
    let long = fixture("audio/speech_long.flac");
    h.input_mut()
        .dropped_files
        .push(Arc::new(Dropped(long.clone())));
    h.step();
    assert!(h.state().speech.is_busy(), "a dropped file is transcribed");
    wait_for(h, "the first window", |app| {
        let midway = |(done, total): (f64, f64)| done > 0.0 && done < total;
        app.speech
            .job()
            .is_some_and(|j| j.progress.is_some_and(midway))
            || speech_idle(app)
    });
    let app = h.state();
    assert!(
        app.speech.is_busy(),
        "progress is seen before the end (error: {:?}, transcript: {:?})",
        app.speech.error,
        app.speech
            .selected_id()
            .and_then(|id| app.shared.store.transcript(id))
    );
    h.get_by_label_contains("s of 48.2 s");
    wait_for(h, "the transcription", speech_idle);
    let file = selected(h.state()).clone();
    assert_eq!(file.title, "speech_long.flac");
    assert_eq!(file.file.as_deref(), Some(long.as_path()));
    assert!(
        !file.segments.is_empty() && file.language.is_some(),
        "{file:?}"
    );
    assert!((file.audio_s - 48.17).abs() < 0.1, "{}", file.audio_s);
    assert!(
        h.state().speech.error.is_none(),
        "a new job clears the old error"
    );
    file
}

/// Exports: SRT that parses, and JSON with the text and segments.
fn export(h: &App, dir: &Path, t: &Transcript) {
    let srt = dir.join("export/long.srt");
    let json = dir.join("export/long.json");
    let app = h.state();
    app.speech
        .export_transcript(&app.shared, t.id, &srt, TranscriptFormat::Srt)
        .expect("srt");
    app.speech
        .export_transcript(&app.shared, t.id, &json, TranscriptFormat::Json)
        .expect("json");
    assert_srt(
        &std::fs::read_to_string(&srt).expect("srt"),
        t.segments.len(),
    );
    let back: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parses");
    assert_eq!(back["text"], t.text());
    assert_eq!(
        back["segments"].as_array().map(Vec::len),
        Some(t.segments.len())
    );
}

#[test]
fn speech_panel_records_transcribes_exports_and_persists() {
    let dir = fresh_dir("panel");
    let mut h = harness(&dir, Some(fixture("audio/speech_short.wav")), true);
    h.get_by_label("Speech").click();
    h.run_steps(2);
    // The file is the only input, named as such.
    h.get_by_label("File: speech_short.wav (virtual microphone)");
    load_through_the_path_field(&mut h);
    let recording = record_to_the_end(&mut h);
    stop_and_delete_a_recording(&mut h);
    bad_file_shows_an_error(&mut h, &dir);
    let file = transcribe_a_dropped_file(&mut h);
    export(&h, &dir, &file);

    // Rename through the UI, and search.
    h.get_by_label("Rename").click();
    h.run_steps(2);
    type_into(&mut h, "Transcript title", " (long)");
    h.key_press(egui::Key::Enter);
    h.run_steps(2);
    assert_eq!(selected(h.state()).title, "speech_long.flac (long)");
    type_into(&mut h, "Search transcripts", "(long)");
    h.run_steps(2);
    assert!(
        h.query_by_label(&recording.title).is_none(),
        "search hides the recording"
    );
    let saved = h.state().shared.store.transcripts.clone();
    assert_eq!(saved.len(), 2);
    // Closing the window saves what changed since the last save.
    eframe::App::on_exit(h.state_mut());
    drop(h);

    // A new app over the same data dir: the transcripts, the panel, and the model again.
    let mut h = harness(&dir, Some(fixture("audio/speech_short.wav")), true);
    assert_eq!(h.state().shared.store.transcripts, saved);
    wait_for(&mut h, "the last speech model to load again", speech_ready);
    // Listed, and shown as the selected one.
    assert_eq!(h.get_all_by_label("speech_long.flac (long)").count(), 2);
    h.get_by_label(&recording.title).click();
    h.run_steps(2);
    assert_eq!(selected(h.state()).id, recording.id);
    drop(h);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn chat_dictation_fills_the_composer() {
    let dir = fresh_dir("dictation");
    let mut h = harness(&dir, Some(fixture("audio/speech_short.wav")), true);
    // Without a speech model the button says where to get one.
    h.get_by_label("🎤").click();
    h.run_steps(2);
    assert!(h.state().chat.dictation().is_none());
    h.get_by_label_contains("Load a Whisper model in Speech");
    // A Whisper folder opened like any model goes to the speech service, and to Speech.
    h.state_mut().shared.load_model(&tiny_whisper());
    assert_eq!(h.state().shared.store.state.panel, Panel::Speech);
    assert!(
        h.state().shared.model_path().is_none(),
        "the text engine is left alone"
    );
    wait_for(&mut h, "the speech model", speech_ready);
    h.get_by_label("Chat").click();
    h.run_steps(2);

    h.get_by_label("🎤").click();
    h.step();
    assert!(
        h.state().chat.dictation().is_some(),
        "the mic starts dictation"
    );
    h.run_steps(2);
    h.get_by_label_contains("Listening…");
    wait_for(&mut h, "the dictation to end", |app| {
        app.chat.dictation().is_none()
    });
    let app = h.state();
    assert!(
        !app.chat.input.trim().is_empty(),
        "committed text is in the composer"
    );
    assert!(
        app.chat.dictation_note().is_none(),
        "{:?}",
        app.chat.dictation_note()
    );
    // Dictation is the chat's: the Speech panel made no transcript of it.
    assert!(app.shared.store.transcripts.is_empty());
    drop(h);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A finished transcript in the Speech panel with the tiny model loaded, at a fixed data dir
/// (no temp paths, no timings in the picture).
#[test]
fn speech_panel_matches_snapshot() {
    let dir = PathBuf::from("/tmp/backpack-speech-snapshot");
    let _ = std::fs::remove_dir_all(&dir);
    // The model's path is shown, so it lives at a fixed path too.
    let model = dir.join("whisper/tiny-whisper");
    std::fs::create_dir_all(&model).expect("mkdir");
    for entry in std::fs::read_dir(tiny_whisper()).expect("fixture") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), model.join(entry.file_name())).expect("copy");
    }
    let mut store = Store::open(&dir);
    let mut t = Transcript::new(
        1,
        "Interview with the lighthouse keeper".into(),
        Origin::File,
    );
    t.created = 0;
    t.file = Some("/recordings/lighthouse.flac".into());
    t.model = Some(model.clone());
    t.language = Some("en".into());
    t.audio_s = 14.6;
    let lines = [
        (
            0.0,
            3.2,
            "Every night for thirty years I climbed the same hundred and twelve steps.",
        ),
        (
            3.2,
            6.8,
            "The lamp had to be wound by hand, every four hours, until dawn.",
        ),
        (
            6.8,
            10.4,
            "People ask whether it was lonely. It never was: the sea talks all night.",
        ),
        (
            10.4,
            14.6,
            "The ships would signal back, and that was enough company for me.",
        ),
    ];
    t.segments = lines
        .iter()
        .map(|&(start, end, text)| Line {
            start,
            end,
            text: text.into(),
        })
        .collect();
    store.transcripts.push(t);
    let mut older = Transcript::new(
        2,
        "Recording 2024-02-29 12:34 UTC".into(),
        Origin::Recording,
    );
    older.created = 0;
    store.transcripts.insert(0, older);
    store.state.panel = Panel::Speech;
    store.state.speech.selected_transcript = Some(1);
    store.state.speech.last_model = Some(model.clone());
    store.state.speech.recent_models = vec![model];
    store.save().expect("save");

    let mut h = harness(&dir, Some(fixture("audio/speech_short.wav")), false);
    wait_for(&mut h, "the speech model", speech_ready);
    h.run_steps(4);
    let options = SnapshotOptions::new()
        .output_path(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/snapshots"));
    h.snapshot_options("speech", &options);
    drop(h);
    let _ = std::fs::remove_dir_all(&dir);
}
