//! The Image panel driven through the real app with egui_kittest on the GPU (lavapipe in CI).
//! A tiny random-weight SD-Turbo pipeline draws 64×64 noise quickly; what is checked is how
//! step previews, images, Stop and errors reach the UI, the PNG files of the gallery with their
//! parameters, and the gallery after a restart.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use backpack_app::gui::services;
use backpack_app::gui::{AppConfig, BackpackApp, ImageModelState};
use backpack_app::image_files::read_png;
use eframe::egui::accesskit::Role;
use eframe::{egui, egui_wgpu, wgpu};
use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;
// Only its folder copy is used here.
#[allow(dead_code)]
#[path = "support/temp_dir.rs"]
mod temp_dir;
use temp_dir::copy_dir;

type App = Harness<'static, BackpackApp>;

const PROMPT: &str = "a lighthouse at dawn";

fn tiny_sd_turbo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/models/tiny-sd-turbo")
}

fn fresh_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("backpack-image-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The real app on a wgpu device made the way the app makes its own.
fn harness(data_dir: &Path) -> App {
    let config = AppConfig {
        data_dir: data_dir.to_owned(),
        model: None,
        frame_stats: false,
        hub_endpoint: Some("http://127.0.0.1:9".into()),
        models_dir: Some(data_dir.join("models")),
        audio_input: None,
        other_tools: Default::default(),
    };
    let egui_wgpu::WgpuSetup::CreateNew(mut setup) = egui_kittest::wgpu::default_wgpu_setup()
    else {
        panic!("kittest's default setup creates a device");
    };
    setup.instance_descriptor.flags = wgpu::InstanceFlags::empty();
    setup.device_descriptor = Arc::new(services::text::device_descriptor);
    Harness::builder()
        .with_size(egui::vec2(1100.0, 720.0))
        .with_render_cursor(false)
        .wgpu_setup(setup.into())
        .build_eframe(move |cc| BackpackApp::new(cc, config))
}

/// Runs frames until `done` holds (the image service works in the background meanwhile).
fn wait_for(h: &mut App, what: &str, done: impl Fn(&BackpackApp) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !done(h.state()) {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        h.step();
        std::thread::sleep(Duration::from_millis(5));
    }
    h.step();
}

fn image_ready(app: &BackpackApp) -> bool {
    matches!(app.shared.image_model, ImageModelState::Ready { .. })
}

fn image_idle(app: &BackpackApp) -> bool {
    !app.image.is_busy()
}

fn type_into(h: &mut App, label: &str, text: &str) {
    h.get_by_label(label).focus();
    h.step();
    h.get_by_label(label).type_text(text);
    h.step();
}

fn set_steps(h: &mut App, steps: u32) {
    h.get_by_role_and_label(Role::Slider, "Steps")
        .set_value_accesskit(f64::from(steps));
    h.run_steps(2);
    assert_eq!(h.state().shared.store.state.image.steps, steps);
}

fn pngs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir.join("images")) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "png"))
        .collect();
    files.sort();
    files
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

/// Generate before any model says so; then the tiny model loads through the path field, and
/// its default size is the one chosen.
fn load_the_model(h: &mut App) {
    h.get_by_label("Generate").click();
    h.run_steps(2);
    h.get_by_label_contains("Load an image model first");
    type_into(
        h,
        "Image model path",
        &tiny_sd_turbo().display().to_string(),
    );
    h.get_by_label("Load").click();
    wait_for(h, "the image model", image_ready);
    assert!(h.state().shared.image_error.is_none());
    let s = &h.state().shared.store.state.image;
    assert_eq!((s.width, s.height), (64, 64), "the model's default size");
    h.get_by_value("64 × 64 (default)");
    assert!(
        h.state().image.error.is_none(),
        "loading clears the old error"
    );
}

/// Two steps: a preview is painted before the image, which lands in the gallery and on disk
/// with its parameters.
fn generate_an_image(h: &mut App, dir: &Path) {
    set_steps(h, 2);
    type_into(h, "Prompt", PROMPT);
    h.get_by_label("Generate").click();
    h.step();
    assert!(h.state().image.is_busy(), "Generate starts a generation");
    wait_for(h, "the image", image_idle);
    let image = &h.state().image;
    assert!(image.error.is_none(), "{:?}", image.error);
    assert!(image.previews_shown >= 1, "a step's preview was painted");
    assert_eq!(image.gallery().len(), 1);
    let status = image.status.clone().unwrap_or_default();
    assert!(status.starts_with("1 image in"), "{status}");
    let files = pngs(dir);
    assert_eq!(files.len(), 1, "{files:?}");
    assert_eq!(image.images_dir(), dir.join("images"));
    assert_eq!(image.gallery()[0].path, files[0]);
    let png = read_png(&files[0]).expect("a readable PNG");
    assert_eq!((png.width, png.height), (64, 64));
    let parameters = png.parameters.expect("a parameters chunk");
    assert!(parameters.starts_with(PROMPT), "{parameters}");
    assert!(parameters.contains("Steps: 2,"), "{parameters}");
    let seed = image.last_seed.expect("the seed used");
    assert!(
        parameters.contains(&format!("Seed: {seed},")),
        "{parameters}"
    );
    // The new image is the one shown, with its parameters.
    assert_eq!(image.selected_id(), Some(image.gallery()[0].id));
    h.get_by_label_contains("Steps: 2, Sampler:");
}

/// Reuse parameters puts the prompt back and fixes the seed.
fn reuse_parameters(h: &mut App) {
    type_into(h, "Prompt", ", stormy");
    assert_ne!(h.state().shared.store.state.image.prompt, PROMPT);
    h.get_by_label("Reuse parameters").click();
    h.run_steps(2);
    let s = &h.state().shared.store.state.image;
    assert_eq!(s.prompt, PROMPT);
    assert!(!s.random_seed);
    assert_eq!(Some(s.seed), h.state().image.last_seed);
}

/// A size the model cannot make is refused inline, and nothing starts.
fn bad_size_shows_an_error(h: &mut App) {
    h.state_mut().shared.store.state.image.width = 72;
    h.get_by_label("Generate").click();
    h.run_steps(2);
    assert!(image_idle(h.state()));
    let error = h.state().image.error.clone().expect("an error");
    assert!(error.contains("multiples of 64"), "{error}");
    h.get_by_label_contains("multiples of 64");
    h.state_mut().shared.store.state.image.width = 64;
}

/// Stop after the first of many steps: stopped, and no image is added.
fn stop_a_long_generation(h: &mut App, dir: &Path) {
    set_steps(h, 150);
    h.get_by_label("Generate").click();
    wait_for(h, "the first step", |app| {
        app.image.job().is_some_and(|j| j.step >= 1)
    });
    h.get_by_label("Stop").click();
    h.step();
    assert!(h.state().image.job().is_none_or(|j| j.stopping));
    wait_for(h, "the stop", image_idle);
    let image = &h.state().image;
    assert_eq!(image.status.as_deref(), Some("Stopped"));
    assert_eq!(image.gallery().len(), 1);
    assert_eq!(pngs(dir).len(), 1);
}

/// A PNG dropped on the window becomes the start image; Clear removes it.
fn drop_a_start_image(h: &mut App, png: &Path) {
    h.input_mut()
        .dropped_files
        .push(Arc::new(Dropped(png.to_owned())));
    h.run_steps(2);
    assert_eq!(h.state().image.start_image(), Some(png));
    h.get_by_role_and_label(Role::Slider, "Strength");
    h.get_by_label("Clear").click();
    h.run_steps(2);
    assert!(h.state().image.start_image().is_none());
}

#[test]
fn image_panel_generates_stops_and_keeps_a_gallery() {
    let dir = fresh_dir("panel");
    let mut h = harness(&dir);
    h.get_by_label("Image").click();
    h.run_steps(2);
    load_the_model(&mut h);
    generate_an_image(&mut h, &dir);
    reuse_parameters(&mut h);
    bad_size_shows_an_error(&mut h);
    stop_a_long_generation(&mut h, &dir);
    let png = pngs(&dir).remove(0);
    drop_a_start_image(&mut h, &png);
    eframe::App::on_exit(h.state_mut());
    drop(h);

    // A new app over the same data dir lists the image, parameters and all.
    let mut h = harness(&dir);
    wait_for(&mut h, "the gallery to be read", |app| {
        app.image
            .gallery()
            .first()
            .is_some_and(|i| i.info.is_some())
    });
    let gallery = h.state().image.gallery();
    assert_eq!(gallery.len(), 1);
    assert_eq!(gallery[0].path, png);
    let info = gallery[0].info.clone().expect("read").expect("readable");
    assert!(info.parameters.is_some_and(|p| p.starts_with(PROMPT)));
    assert_eq!(h.state().shared.store.state.image.prompt, PROMPT);
    drop(h);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A diffusion-transformer pipeline in the same panel: its defaults (the VAE's native size,
/// its steps and guidance) are taken, the scheduler is its own, each step paints a preview
/// through its VAE, and the image lands in the gallery with its parameters. Returns the
/// harness, the image made and the data dir.
fn draws_a_transformer_pipeline(fixture: &str, family: &str) -> (App, PathBuf, PathBuf) {
    let dir = fresh_dir(fixture);
    let mut h = harness(&dir);
    h.get_by_label("Image").click();
    h.run_steps(2);
    let model = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/models")
        .join(fixture);
    type_into(&mut h, "Image model path", &model.display().to_string());
    h.get_by_label("Load").click();
    wait_for(&mut h, "the image model", image_ready);
    assert!(h.state().shared.image_error.is_none());
    h.get_by_label_contains(&format!("{family} ·"));
    h.get_by_label("Flow matching (Euler)");
    let s = &h.state().shared.store.state.image;
    assert_eq!((s.width, s.height), (32, 32), "the VAE's sample size");
    set_steps(&mut h, 2);
    type_into(&mut h, "Prompt", PROMPT);
    h.get_by_label("Generate").click();
    h.step();
    wait_for(&mut h, "the image", image_idle);
    let image = &h.state().image;
    assert!(image.error.is_none(), "{:?}", image.error);
    assert!(image.previews_shown >= 1, "a step's preview was painted");
    let files = pngs(&dir);
    assert_eq!(files.len(), 1, "{files:?}");
    let png = read_png(&files[0]).expect("a readable PNG");
    assert_eq!((png.width, png.height), (32, 32));
    let parameters = png.parameters.expect("a parameters chunk");
    assert!(parameters.starts_with(PROMPT), "{parameters}");
    assert!(
        parameters.contains(&format!("Model: {fixture}")),
        "{parameters}"
    );
    let made = files[0].clone();
    (h, made, dir)
}

#[test]
fn image_panel_draws_z_image_with_previews() {
    let (mut h, _, dir) = draws_a_transformer_pipeline("tiny-zimage", "Z-Image");
    eframe::App::on_exit(h.state_mut());
    drop(h);
    let _ = std::fs::remove_dir_all(&dir);
}

/// FLUX.2 takes a dropped picture as a reference (no strength) and draws with it.
#[test]
fn image_panel_draws_flux2_with_a_reference() {
    let (mut h, made, dir) = draws_a_transformer_pipeline("tiny-flux2", "FLUX.2");
    h.input_mut()
        .dropped_files
        .push(Arc::new(Dropped(made.clone())));
    h.run_steps(2);
    assert_eq!(h.state().image.start_image(), Some(made.as_path()));
    h.get_by_label("Reference image");
    assert!(
        h.query_by_label("Strength").is_none(),
        "a reference has no strength"
    );
    h.get_by_label("Generate").click();
    h.step();
    wait_for(&mut h, "the image", image_idle);
    let image = &h.state().image;
    assert!(image.error.is_none(), "{:?}", image.error);
    assert_eq!(
        pngs(&dir).len(),
        2,
        "the referenced image joins the gallery"
    );
    eframe::App::on_exit(h.state_mut());
    drop(h);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The Image panel with the tiny model loaded and a prompt typed, at a fixed data dir (no temp
/// paths and no timings in the picture).
#[test]
fn image_panel_matches_snapshot() {
    let dir = PathBuf::from("/tmp/backpack-image-snapshot");
    let _ = std::fs::remove_dir_all(&dir);
    // The model's path is shown, so it lives at a fixed path too.
    let model = dir.join("diffusion/tiny-sd-turbo");
    copy_dir(&tiny_sd_turbo(), &model);
    // The prompt is set before start: a focused text field would draw a blinking caret.
    let mut store = backpack_app::gui::store::Store::open(&dir);
    store.state.image.prompt = PROMPT.into();
    store.save().expect("save");
    let mut h = harness(&dir);
    h.get_by_label("Image").click();
    h.run_steps(2);
    type_into(&mut h, "Image model path", &model.display().to_string());
    h.get_by_label("Load").click();
    wait_for(&mut h, "the image model", image_ready);
    h.run_steps(4);
    let options = egui_kittest::SnapshotOptions::new()
        .output_path(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/snapshots"));
    h.snapshot_options("image", &options);
    drop(h);
    let _ = std::fs::remove_dir_all(&dir);
}
