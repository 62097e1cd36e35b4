//! The real app struct driven through its UI with egui_kittest on the GPU (lavapipe in CI):
//! a tiny fixture model streams into the transcript, Stop, Regenerate and Edit work,
//! conversations survive a restart, a broken model shows an error and the app keeps working,
//! the status bar's items never overlap, a remote backend added in Settings answers in the chat,
//! the server switch in Settings serves the loaded model, and the main views match committed
//! snapshots (tests/snapshots).

#[path = "support/fake_hub.rs"]
mod fake_hub;
#[path = "support/fake_openai.rs"]
mod fake_openai;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use backpack_app::gui::services;
use backpack_app::gui::services::remote::{ModelList, RemoteModelRef};
use backpack_app::gui::store::{AnswerStats, Conversation, Message, Preset, Store};
use backpack_app::gui::{AppConfig, BackpackApp, ModelState};
use eframe::{egui, egui_wgpu, wgpu};
use egui_kittest::kittest::Queryable;
use egui_kittest::{Harness, SnapshotOptions};

fn fixture_model(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/models")
        .join(name)
}

fn fresh_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("backpack-ui-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A harness around the real app, on a wgpu device created the way the app creates its own.
/// `any_text`: the transcript holds whatever a random-weight model writes, including characters
/// the fonts bundled for tests lack (the app itself falls back to system fonts).
fn harness(
    data_dir: &Path,
    model: Option<PathBuf>,
    any_text: bool,
) -> Harness<'static, BackpackApp> {
    harness_with(
        AppConfig {
            data_dir: data_dir.to_owned(),
            model,
            // No test reaches the internet: the hub is a closed local port unless a test
            // starts a stand-in.
            hub_endpoint: Some("http://127.0.0.1:9".into()),
            models_dir: Some(data_dir.join("models")),
            frame_stats: false,
            audio_input: None,
            other_tools: Default::default(),
        },
        any_text,
    )
}

fn harness_with(config: AppConfig, any_text: bool) -> Harness<'static, BackpackApp> {
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
    builder
        .with_size(egui::vec2(1100.0, 720.0))
        .with_render_cursor(false)
        .wgpu_setup(setup.into())
        .build_eframe(move |cc| BackpackApp::new(cc, config))
}

/// Runs frames until `done` holds (the engine works in the background meanwhile).
fn wait_for(h: &mut Harness<'_, BackpackApp>, what: &str, done: impl Fn(&BackpackApp) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(180);
    while !done(h.state()) {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        h.step();
        std::thread::sleep(Duration::from_millis(5));
    }
    h.step();
}

fn model_ready(app: &BackpackApp) -> bool {
    matches!(app.shared.model, ModelState::Ready { .. })
}

fn idle(app: &BackpackApp) -> bool {
    !app.chat.is_busy()
}

fn selected(app: &BackpackApp) -> &Conversation {
    app.chat
        .selected(&app.shared)
        .expect("a conversation is selected")
}

/// Greedy sampling with at most `max_tokens` for the selected conversation: quick, repeatable.
fn greedy(h: &mut Harness<'_, BackpackApp>, max_tokens: u32) {
    let app = h.state_mut();
    let id = app.chat.selected_id().expect("selected");
    let conv = app.shared.store.conversation_mut(id).expect("conversation");
    conv.sampling = Preset::Precise.sampling();
    conv.sampling.max_tokens = max_tokens;
}

fn type_into(h: &mut Harness<'_, BackpackApp>, label: &str, text: &str) {
    h.get_by_label(label).focus();
    h.step();
    h.get_by_label(label).type_text(text);
    h.step();
}

#[test]
fn chat_streams_stops_regenerates_edits_and_persists() {
    let dir = fresh_dir("chat");
    let mut h = harness(&dir, Some(fixture_model("tiny-qwen2")), true);
    wait_for(&mut h, "the model to load", model_ready);
    assert!(h.state().shared.model_error.is_none());
    greedy(&mut h, 24);

    // Type a prompt and press Send: tokens stream into the transcript.
    type_into(&mut h, "Message", "Hello, how are you?");
    h.get_by_label("Send").click();
    h.step();
    assert!(h.state().chat.is_busy(), "Send starts an answer");
    wait_for(&mut h, "the answer", idle);
    {
        let conv = selected(h.state());
        assert_eq!(conv.messages.len(), 2);
        assert_eq!(conv.messages[0].content, "Hello, how are you?");
        assert_eq!(conv.title, "Hello, how are you?");
        let answer = &conv.messages[1];
        let stats = answer.stats.as_ref().expect("stats under the answer");
        assert!(stats.tokens > 0 && !answer.content.is_empty());
        assert!(stats.tokens_per_s > 0.0);
        assert_eq!(conv.context_used, Some(stats.prompt_tokens + stats.tokens));
    }
    // The stats line is shown under the answer.
    h.get_by_label_contains("tokens/s ·");

    // A long answer, watched while it streams, then stopped.
    greedy(&mut h, 200);
    type_into(&mut h, "Message", "Tell me a long story.");
    h.key_press(egui::Key::Enter);
    h.step();
    assert!(h.state().chat.is_busy(), "Enter sends");
    wait_for(&mut h, "streaming to start", |app| {
        app.chat.generation().is_some_and(|g| g.tokens >= 3)
    });
    let streamed = selected(h.state()).messages[3].content.len();
    wait_for(&mut h, "the transcript to grow", |app| {
        selected(app).messages[3].content.len() > streamed || idle(app)
    });
    assert!(
        h.state().chat.is_busy(),
        "the transcript grows while the answer streams"
    );
    h.get_by_label("Stop").click();
    wait_for(&mut h, "the stop", idle);
    {
        let answer = &selected(h.state()).messages[3];
        let stats = answer.stats.as_ref().expect("stats");
        assert_eq!(stats.stop, "stopped");
        assert!(stats.tokens < 200, "stopped early: {} tokens", stats.tokens);
    }

    // Regenerate replaces the stopped answer with a complete one.
    h.get_by_label("Regenerate").click();
    h.step();
    assert!(h.state().chat.is_busy(), "Regenerate starts an answer");
    wait_for(&mut h, "the regenerated answer", idle);
    {
        let conv = selected(h.state());
        assert_eq!(conv.messages.len(), 4);
        let stats = conv.messages[3].stats.as_ref().expect("stats");
        assert_ne!(stats.stop, "stopped");
    }

    // Edit the first user message and resend from there: later turns are dropped.
    h.get_all_by_label("Edit")
        .next()
        .expect("an Edit button")
        .click();
    h.run_steps(2);
    h.get_by_label("Edit the message").focus();
    h.step();
    h.get_by_label("Edit the message").type_text(" Briefly.");
    h.step();
    h.get_by_label("Save & resend").click();
    h.step();
    wait_for(&mut h, "the answer to the edited message", idle);
    let conversation = {
        let conv = selected(h.state());
        assert_eq!(conv.messages.len(), 2);
        assert_eq!(conv.messages[0].content, "Hello, how are you? Briefly.");
        assert!(conv.messages[1].stats.is_some());
        conv.clone()
    };
    // Exports: Markdown with the transcript, JSON that reads back as the same conversation.
    let md = dir.join("export/chat.md");
    let json = dir.join("export/chat.json");
    let app = h.state();
    app.chat
        .export_conversation(&app.shared, conversation.id, &md, false)
        .expect("markdown");
    app.chat
        .export_conversation(&app.shared, conversation.id, &json, true)
        .expect("json");
    let text = std::fs::read_to_string(&md).expect("md");
    assert!(
        text.contains("## User\n\nHello, how are you? Briefly."),
        "{text}"
    );
    let back: Conversation =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parses");
    assert_eq!(back, conversation);
    h.step();
    drop(h);

    // A new app instance over the same data dir has the conversation and the last model.
    let mut h = harness(&dir, None, true);
    assert_eq!(
        h.state().shared.store.conversation(conversation.id),
        Some(&conversation)
    );
    wait_for(&mut h, "the last model to load again", model_ready);
    h.get_by_label("Hello, how are you? Briefly.");

    // A broken model file: the error shows up in the UI, and the app keeps working.
    let broken = dir.join("broken.gguf");
    std::fs::write(&broken, b"GGUF\x03\x00\x00\x00 not really a model").expect("write");
    h.get_by_label("Models").click();
    h.run_steps(2);
    type_into(&mut h, "Model path", &broken.display().to_string());
    h.get_by_label("Load").click();
    wait_for(&mut h, "the load error", |app| {
        app.shared.model_error.is_some()
    });
    let error = h.state().shared.model_error.clone().expect("error");
    assert!(error.contains("broken.gguf"), "{error}");
    h.get_by_label_contains(&error);
    h.get_all_by_label("Use")
        .next()
        .expect("a recent model")
        .click();
    wait_for(&mut h, "the good model", model_ready);
    h.get_by_label("Chat").click();
    h.run_steps(2);
    h.get_by_label("New chat").click();
    h.run_steps(2);
    greedy(&mut h, 8);
    type_into(&mut h, "Message", "Still there?");
    h.get_by_label("Send").click();
    h.step();
    wait_for(&mut h, "an answer after the error", idle);
    assert!(selected(h.state()).messages[1].stats.is_some());
    assert_eq!(h.state().shared.store.conversations.len(), 2);
    drop(h);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn overflowing_prompt_offers_to_drop_old_turns() {
    let dir = fresh_dir("overflow");
    let mut h = harness(&dir, None, true);
    h.state_mut().shared.store.state.load.context = Some(48);
    h.state_mut()
        .shared
        .load_model(&fixture_model("tiny-qwen2"));
    wait_for(&mut h, "the model to load", model_ready);
    greedy(&mut h, 4);
    {
        let app = h.state_mut();
        let id = app.chat.selected_id().expect("selected");
        let conv = app.shared.store.conversation_mut(id).expect("conversation");
        for i in 0..3 {
            conv.messages
                .push(Message::user(&format!("The quick brown fox number {i}.")));
            let mut answer = Message::assistant();
            answer.content = "It jumps over the lazy dog again and again.".into();
            conv.messages.push(answer);
        }
    }
    type_into(&mut h, "Message", "And then?");
    h.get_by_label("Send").click();
    wait_for(&mut h, "the overflow", |app| {
        app.chat.overflow().is_some() && idle(app)
    });
    h.get_by_label_contains("context holds 48");
    h.get_by_label("Drop oldest turns and retry").click();
    h.step();
    wait_for(&mut h, "the retried answer", |app| {
        idle(app) && app.chat.overflow().is_none()
    });
    let conv = selected(h.state());
    assert!(conv.messages.len() < 8, "old turns were dropped");
    assert_eq!(conv.messages[conv.messages.len() - 2].content, "And then?");
    assert!(conv.messages.last().expect("answer").stats.is_some());
    drop(h);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A data dir at a fixed path holding one finished conversation, so the images are the same
/// on every run (no timings, no temp paths).
fn snapshot_data_dir() -> PathBuf {
    // A fixed path, since the Settings view shows it.
    let dir = PathBuf::from("/tmp/backpack-ui-snapshots");
    let _ = std::fs::remove_dir_all(&dir);
    let mut store = Store::open(&dir);
    let mut conv = Conversation::new(1, Preset::Balanced.sampling(), None);
    conv.title = "Reverse a string in Rust".into();
    conv.created = 0;
    conv.messages
        .push(Message::user("How do I reverse a string in Rust?"));
    let mut answer = Message::assistant();
    answer.content = "Collect the characters in reverse order:\n\n```rust\nfn reverse(s: &str) -> String {\n    s.chars().rev().collect()\n}\n```\n\nThis reverses **Unicode scalar values**; for grapheme clusters use the `unicode-segmentation` crate.".into();
    answer.stats = Some(AnswerStats {
        prompt_tokens: 31,
        tokens: 58,
        ttft_ms: 12.0,
        tokens_per_s: 412.5,
        stop: "end of text".into(),
    });
    conv.messages.push(answer);
    conv.context_used = Some(89);
    store.conversations.push(conv);
    store.state.selected_conversation = Some(1);
    store.save().expect("save");
    dir
}

#[test]
fn main_views_match_snapshots() {
    let dir = snapshot_data_dir();
    let mut h = harness(&dir, None, false);
    let options = SnapshotOptions::new()
        .output_path(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/snapshots"));
    h.run_steps(4);
    h.snapshot_options("chat", &options);
    h.get_by_label("Models").click();
    h.run_steps(4);
    h.snapshot_options("models", &options);
    h.get_by_label("Catalog").click();
    h.run_steps(4);
    h.snapshot_options("models_catalog", &options);
    h.get_by_label("Installed").click();
    h.run_steps(2);
    h.get_by_label("Settings").click();
    h.run_steps(4);
    h.snapshot_options("settings", &options);
    h.state_mut()
        .shared
        .load_model(&fixture_model("tiny-qwen2"));
    wait_for(&mut h, "the model to load", model_ready);
    h.get_by_label("Models").click();
    h.run_steps(4);
    h.snapshot_options("models_loaded", &options);
    drop(h);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn models_panel_searches_downloads_with_progress_and_uses_the_model() {
    use fake_hub::{FakeFile, FakeHub, FakeRepo, Fault};
    let gguf = std::fs::read(fixture_model("tiny-llama-spm.gguf")).expect("fixture");
    let size = gguf.len();
    let hub = FakeHub::start(vec![FakeRepo {
        id: "tiny/spm-GGUF".into(),
        commit: "5eed000000000000000000000000000000000003".into(),
        gated: false,
        files: vec![FakeFile::new("tiny-spm-Q8_0.gguf", gguf, true)],
    }]);
    // Slow enough to watch the progress bar, and one dropped connection to resume from.
    hub.fault(Fault::Slow {
        file: "tiny-spm-Q8_0.gguf".into(),
        chunk: 8 << 10,
        every: Duration::from_millis(15),
    });
    hub.fault(Fault::Drop {
        file: "tiny-spm-Q8_0.gguf".into(),
        after: 50_000,
        times: 1,
    });
    let dir = fresh_dir("downloads");
    let mut h = harness_with(
        AppConfig {
            data_dir: dir.clone(),
            model: None,
            hub_endpoint: Some(hub.url.clone()),
            models_dir: Some(dir.join("models")),
            frame_stats: false,
            audio_input: None,
            other_tools: Default::default(),
        },
        true,
    );
    h.get_by_label("Models").click();
    h.run_steps(2);
    h.get_by_label("Search the hub").click();
    h.run_steps(2);
    type_into(&mut h, "Search text", "spm");
    h.get_by_label("Search").click();
    wait_for(&mut h, "search results", |app| {
        app.shared
            .downloads
            .as_ref()
            .is_some_and(|d| d.results.as_ref().is_ok_and(|r| !r.is_empty()))
    });
    h.get_by_label("tiny/spm-GGUF").click();
    wait_for(&mut h, "the repo listing", |app| {
        app.shared
            .downloads
            .as_ref()
            .is_some_and(|d| d.listing.as_ref().is_some_and(|l| l.is_ok()))
    });
    h.run_steps(2);
    h.get_by_label("Download Q8_0").click();
    wait_for(&mut h, "download progress", |app| {
        app.shared.downloads.as_ref().is_some_and(|d| {
            d.jobs
                .first()
                .and_then(|j| j.progress.as_ref())
                .is_some_and(|p| p.done > 0 && (p.done as usize) < size)
        })
    });
    h.run_steps(2);
    // The queue shows the bar with bytes, speed and the way to pause or cancel.
    h.get_by_label_contains("KiB of");
    h.get_by_label("Pause");
    h.get_by_label("Cancel");
    wait_for(&mut h, "the verified download", |app| {
        app.shared.downloads.as_ref().is_some_and(|d| {
            d.jobs
                .first()
                .is_some_and(|j| matches!(j.state, backpack_app::gui::downloads::JobState::Done(_)))
        })
    });
    h.run_steps(2);
    h.get_by_label("Use").click();
    wait_for(&mut h, "the downloaded model", model_ready);
    assert!(h.state().shared.model_error.is_none());
    // Installed, and listed for the chat's model picker.
    let installed = h
        .state()
        .shared
        .downloads
        .as_ref()
        .map(|d| d.models.list())
        .unwrap_or_default();
    assert_eq!(installed.len(), 1);
    assert_eq!(installed[0].repo, "tiny/spm-GGUF");
    drop(h);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A model another tool put in its Hugging Face cache shows under "Found on this machine" and
/// loads in place with one click.
#[test]
fn models_panel_uses_models_found_on_this_machine() {
    let dir = fresh_dir("found");
    let snapshot = dir.join("hf/hub/models--tiny--cached-GGUF/snapshots/0123abcd");
    std::fs::create_dir_all(&snapshot).expect("mkdir");
    let file = snapshot.join("tiny-spm-Q8_0.gguf");
    std::fs::copy(fixture_model("tiny-llama-spm.gguf"), &file).expect("copy");
    let mut h = harness_with(
        AppConfig {
            data_dir: dir.clone(),
            model: None,
            hub_endpoint: Some("http://127.0.0.1:9".into()),
            models_dir: Some(dir.join("models")),
            frame_stats: false,
            audio_input: None,
            other_tools: backpack_engine::hub::SearchRoots {
                hf_cache: Some(dir.join("hf/hub")),
                ..Default::default()
            },
        },
        true,
    );
    h.get_by_label("Models").click();
    h.run_steps(2);
    h.get_by_label("Found on this machine");
    h.get_by_label("tiny/cached-GGUF/tiny-spm-Q8_0.gguf");
    h.get_by_label("Use").click();
    wait_for(&mut h, "the found model", model_ready);
    assert!(h.state().shared.model_error.is_none());
    assert!(!dir.join("models").exists(), "used in place, not copied");
    drop(h);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A copy of fixture `name` in `dir` under the name `as_name` (a model's name is its folder's).
fn fixture_copy(name: &str, dir: &Path, as_name: &str) -> PathBuf {
    let to = dir.join(as_name);
    std::fs::create_dir_all(&to).expect("mkdir");
    for entry in std::fs::read_dir(fixture_model(name)).expect("fixture") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), to.join(entry.file_name())).expect("copy");
    }
    to
}

/// The status bar's items never overlap: a long model name, its sizes and the last answer's
/// speed on the left, the GPU (on a machine without one, a long warning) on the right. At
/// 1400×900 the GPU text is elided where it used to be drawn over the speed; at 700 the left
/// items are elided too, before they take the room kept for the GPU.
#[test]
fn status_bar_items_never_overlap() {
    let dir = fresh_dir("status");
    let model = fixture_copy(
        "tiny-qwen2",
        &dir.join("copies"),
        "DeepSeek-R1-Distill-Llama-70B-Instruct-abliterated-v2-Q4_K_M-imatrix",
    );
    let mut h = harness(&dir, Some(model), true);
    wait_for(&mut h, "the model to load", model_ready);
    greedy(&mut h, 8);
    type_into(&mut h, "Message", "Hi");
    h.get_by_label("Send").click();
    h.step();
    wait_for(&mut h, "the answer", idle);
    let gpu = {
        let g = h.state().shared.gpu.as_ref().expect("a GPU");
        format!("{} ({})", g.name, g.backend)
    };
    let mut whole_speed = None;
    for width in [2400.0, 1400.0, 700.0] {
        h.set_size(egui::vec2(width, 900.0));
        h.run_steps(3);
        let rect = |label: &str| h.query_by_label_contains(label).map(|n| n.rect());
        let adapter = rect(&gpu).expect("the GPU is shown");
        let speed = rect("Last answer");
        let left = [
            ("name", rect("DeepSeek-R1")),
            ("sizes", rect("Weights ")),
            ("speed", speed),
        ];
        for (what, r) in left {
            // At 700 the last items may be left out for want of room.
            let Some(r) = r else {
                assert!(width < 1400.0 && what != "name", "at {width}: no {what}");
                continue;
            };
            assert!(
                !r.intersects(adapter),
                "at {width}: the {what} {r:?} overlaps the GPU {adapter:?}"
            );
        }
        assert!(
            adapter.width() >= 100.0 && adapter.max.x <= width,
            "at {width}: the GPU {adapter:?} is hidden or off the window"
        );
        // Nothing on the left gives way while there is room for it.
        if width >= 1400.0 {
            let speed = speed.expect("the speed").width();
            let whole = *whole_speed.get_or_insert(speed);
            assert_eq!(speed, whole, "at {width}: the speed is cut");
        }
    }
    drop(h);
    let _ = std::fs::remove_dir_all(&dir);
}

fn remote_models_ready(app: &BackpackApp) -> bool {
    let lists = app.shared.remote.as_ref().map(|r| r.models.get("lab"));
    matches!(lists, Some(Some(ModelList::Ready(m))) if !m.is_empty())
}

#[test]
fn chat_answers_from_a_remote_backend() {
    use fake_openai::{Config, FakeOpenAi, Fault};
    let server = FakeOpenAi::start(Config {
        key: Some("sk-ui".into()),
        ..Default::default()
    });
    let answer = server.config.lock().expect("config").answer();
    let dir = fresh_dir("remote");
    let mut h = harness(&dir, None, true);

    // Settings → Backends: the server, with its key; its models are listed.
    h.get_by_label("Settings").click();
    h.run_steps(2);
    type_into(&mut h, "Backend name", "lab");
    type_into(&mut h, "Backend URL", &server.base);
    type_into(&mut h, "Backend API key", "sk-ui");
    h.get_by_label("Add backend").click();
    h.step();
    wait_for(&mut h, "the backend's models", remote_models_ready);
    h.get_by_label("1 model");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let saved = std::fs::metadata(dir.join("backends.json")).expect("saved");
        assert_eq!(
            saved.permissions().mode() & 0o777,
            0o600,
            "the key is private"
        );
    }

    // The chat's picker lists the remote model; the answer streams from it.
    h.get_by_label("Chat").click();
    h.run_steps(2);
    h.get_by_label("Model for this chat").click();
    h.run_steps(2);
    h.get_by_label("big-model (remote)").click();
    h.run_steps(2);
    let wanted = RemoteModelRef {
        backend: "lab".into(),
        model: "big-model".into(),
    };
    assert_eq!(selected(h.state()).remote.as_ref(), Some(&wanted));
    type_into(&mut h, "Message", "Hello there");
    h.get_by_label("Send").click();
    h.step();
    assert!(h.state().chat.is_busy(), "Send starts a remote answer");
    wait_for(&mut h, "the remote answer", idle);
    {
        let conv = selected(h.state());
        assert_eq!(conv.messages.len(), 2);
        let m = &conv.messages[1];
        assert_eq!(m.content, answer);
        assert_eq!(m.error, None);
        let stats = m.stats.as_ref().expect("stats");
        assert_eq!((stats.prompt_tokens, stats.tokens), (17, 5));
    }
    h.get_by_label_contains("Remote: big-model on lab");
    let sent = server
        .last("POST /v1/chat/completions")
        .expect("a chat request");
    assert!(sent.contains("Hello there"), "{sent}");

    // Regenerate asks again; a busy server's 429 is shown under the answer.
    h.get_by_label("Regenerate").click();
    h.step();
    wait_for(&mut h, "the regenerated answer", idle);
    assert_eq!(selected(h.state()).messages.len(), 2);
    server.set_fault(Fault::RateLimited);
    type_into(&mut h, "Message", "Again");
    h.get_by_label("Send").click();
    h.step();
    wait_for(&mut h, "the refused answer", idle);
    let error = selected(h.state()).messages[3].error.clone();
    assert!(
        error.as_deref().is_some_and(|e| e.contains("429")),
        "{error:?}"
    );

    // Stop ends a stalled stream and keeps what came.
    server.set_fault(Fault::Stall {
        pieces: 1,
        pause: Duration::from_secs(30),
    });
    h.get_by_label("Regenerate").click();
    h.step();
    wait_for(&mut h, "the first piece", |app| {
        app.chat.generation().is_some_and(|g| g.tokens >= 1)
    });
    h.get_by_label("Stop").click();
    wait_for(&mut h, "the stop", idle);
    {
        let m = &selected(h.state()).messages[3];
        assert_eq!(m.content, "Grüße");
        assert_eq!(m.stats.as_ref().map(|s| s.stop.as_str()), Some("stopped"));
    }
    server.set_fault(Fault::None);

    // After a restart the backend and the conversation's remote model are still there.
    drop(h);
    let mut h = harness(&dir, None, true);
    wait_for(&mut h, "the backend's models", remote_models_ready);
    assert_eq!(selected(h.state()).remote.as_ref(), Some(&wanted));
    drop(h);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn settings_runs_the_server_over_the_loaded_model() {
    use backpack_engine::remote::chat::RemoteInput;
    use backpack_engine::remote::{ChatParams, Endpoint, RemoteClient};
    let dir = fresh_dir("server");
    let mut h = harness(&dir, Some(fixture_model("tiny-qwen2")), true);
    wait_for(&mut h, "the model to load", model_ready);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    h.state_mut().shared.store.state.server_port = Some(port);
    h.get_by_label("Settings").click();
    h.run_steps(2);
    type_into(
        &mut h,
        "Server API key: required as Authorization: Bearer when set",
        "sk-app",
    );
    // Below the fold: clicked through accessibility, as a screen reader would.
    h.get_by_label("Serve the OpenAI API").click_accesskit();
    let deadline = Instant::now() + Duration::from_secs(120);
    let url = format!("http://127.0.0.1:{port}/v1");
    while h.query_by_label_contains(&format!("at {url}")).is_none() {
        assert!(Instant::now() < deadline, "the server did not start");
        assert!(
            h.query_by_label_contains("listening on").is_none(),
            "bind failed"
        );
        h.step();
        std::thread::sleep(Duration::from_millis(20));
    }
    h.get_by_label_contains("Serving tiny-qwen2");

    // The app's own remote client talks to it, with the key; the window stays responsive.
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let client = RemoteClient::new(Endpoint::new(&url, Some("sk-app".into())).expect("url"))
        .expect("client");
    let models = runtime.block_on(client.models()).expect("models");
    assert_eq!(models[0].id, "tiny-qwen2");
    let messages = [backpack_engine::load::ChatMessage::new("user", "Hi")];
    let params = ChatParams {
        max_tokens: Some(4),
        temperature: Some(0.0),
        ..Default::default()
    };
    let answer = runtime
        .block_on(client.stream(
            "tiny-qwen2",
            RemoteInput::Chat(&messages),
            &params,
            &|| false,
            &mut |_| {},
        ))
        .expect("an answer");
    assert_eq!(answer.completion_tokens, 4);
    // The chat loads another model: the server serves it from then on.
    h.state_mut()
        .shared
        .load_model(&fixture_model("tiny-llama"));
    wait_for(
        &mut h,
        "the second model to load",
        |app| matches!(&app.shared.model, ModelState::Ready { info, .. } if info.name == "tiny-llama"),
    );
    h.run_steps(2);
    h.get_by_label_contains("Serving tiny-llama");
    let models = runtime.block_on(client.models()).expect("models");
    assert_eq!(models[0].id, "tiny-llama");
    let keyless = RemoteClient::new(Endpoint::new(&url, None).expect("url")).expect("client");
    let refused = runtime.block_on(keyless.models());
    assert!(
        matches!(
            refused,
            Err(backpack_engine::remote::RemoteError::Unauthorized { .. })
        ),
        "{refused:?}"
    );

    // Off: the port is released.
    // Below the fold: clicked through accessibility, as a screen reader would.
    h.get_by_label("Serve the OpenAI API").click_accesskit();
    h.run_steps(2);
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
        assert!(Instant::now() < deadline, "the server did not stop");
        h.step();
        std::thread::sleep(Duration::from_millis(50));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let key = std::fs::metadata(dir.join("server-key")).expect("key saved");
        assert_eq!(key.permissions().mode() & 0o777, 0o600);
    }
    drop(h);
    let _ = std::fs::remove_dir_all(&dir);
}
