//! The Image panel: an image model (diffusers folder or single-file checkpoint), the prompt
//! and every setting of the next image, image-to-image from a start picture; Generate shows
//! each denoising step's preview as it arrives (a GPU texture the engine draws into), then the
//! image; and the gallery of every image made, kept as PNG files with their parameters in
//! `<data dir>/images`.

mod canvas;
mod controls;
mod gallery;
mod jobs;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use backpack_engine::models::diffusion::Timings;
use eframe::{egui, wgpu};

use super::shared::DialogKind;
use super::shared::Shared;
pub use crate::gui::store::image::ImageSettings;
use crate::image_files::DecodedImage;
pub use gallery::{GalleryItem, ItemInfo};

/// The most images one Generate makes.
pub const MAX_BATCH: u32 = 16;

/// What the canvas shows while a generation runs.
pub enum Showing {
    /// Nothing yet (the prompt is being encoded).
    Nothing,
    /// The live preview of the current step.
    Preview,
    /// The image just finished.
    Image(egui::TextureHandle),
}

/// A generation under way.
pub struct Job {
    pub request: u64,
    /// Images asked for, and finished so far.
    pub count: u32,
    pub images: u32,
    /// Which image (from 0) and step (from 1) the latest event was about.
    pub index: u32,
    pub step: u32,
    pub steps: u32,
    /// Milliseconds the current image has taken so far.
    pub elapsed_ms: f64,
    pub width: u32,
    pub height: u32,
    pub started: Instant,
    pub timings: Option<Timings>,
    pub showing: Showing,
    /// Stop was pressed; the service is finishing its step.
    pub stopping: bool,
}

/// The picture image-to-image starts from.
pub struct StartImage {
    pub path: PathBuf,
    image: DecodedImage,
    thumb: egui::TextureHandle,
}

/// The texture the engine draws each step's preview into, registered with the renderer.
struct LivePreview {
    texture: wgpu::Texture,
    id: egui::TextureId,
    /// The step last painted: (request, image, step).
    painted: Option<(u64, u32, u32)>,
}

pub struct ImagePanel {
    /// The model path typed or picked.
    model_input: String,
    gallery: gallery::Gallery,
    selected: Option<u64>,
    /// The selected image at full size, by gallery id (read when first shown).
    view: Option<(u64, Result<egui::TextureHandle, String>)>,
    start: Option<StartImage>,
    job: Option<Job>,
    preview: Option<LivePreview>,
    /// The seed of the last image made.
    pub last_seed: Option<u64>,
    /// How the last generation ended.
    pub status: Option<String>,
    /// What went wrong with the last generation or file.
    pub error: Option<String>,
    /// Step previews painted on the canvas so far.
    pub previews_shown: u64,
    /// The last model is loaded when the panel is first shown, not at start: image models
    /// are large and many sessions never draw.
    shown_once: bool,
}

/// What a click asked for; applied after the frame's widgets are laid out.
enum Action {
    LoadModel(PathBuf),
    UnloadModel,
    Dialog(DialogKind),
    Generate,
    Stop,
    Select(u64),
    Reuse(u64),
    UseAsStart(u64),
    Copy(u64),
    Delete(u64),
    OpenFolder,
    ClearStart,
    DismissError,
}

impl ImagePanel {
    pub fn new(shared: &Shared, ctx: &egui::Context) -> Self {
        let model_input = shared
            .store
            .state
            .image
            .last_model
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let gallery = gallery::Gallery::open(shared.config.data_dir.join("images"), ctx);
        let selected = gallery.items().first().map(|i| i.id);
        Self {
            model_input,
            gallery,
            selected,
            view: None,
            start: None,
            job: None,
            preview: None,
            last_seed: None,
            status: None,
            error: None,
            previews_shown: 0,
            shown_once: false,
        }
    }

    pub fn show(&mut self, shared: &mut Shared, ui: &mut egui::Ui) {
        let ctx = ui.ctx().clone();
        self.gallery.poll(&ctx);
        self.on_first_show(shared);
        let mut actions = Vec::new();
        egui::Panel::left("image-controls")
            .default_size(300.0)
            .min_size(240.0)
            .show(ui, |ui| controls::show(self, shared, ui, &mut actions));
        egui::Panel::right("image-gallery")
            .default_size(230.0)
            .min_size(120.0)
            .show(ui, |ui| gallery::show(self, ui, &mut actions));
        egui::CentralPanel::default().show(ui, |ui| canvas::show(self, ui, &mut actions));
        if self.job.is_some() {
            // The time left moves between steps.
            ctx.request_repaint_after(Duration::from_millis(250));
        }
        for action in actions {
            self.apply(shared, action, &ctx);
        }
    }

    fn on_first_show(&mut self, shared: &mut Shared) {
        if self.model_input.is_empty()
            && let Some(path) = shared.image_model_path()
        {
            // Loaded from elsewhere (`--model`, the library): show which.
            self.model_input = path.display().to_string();
        }
        if std::mem::replace(&mut self.shown_once, true) || shared.image_model_path().is_some() {
            return;
        }
        let last = shared.store.state.image.last_model.clone();
        if let Some(path) = last.filter(|p| p.exists()) {
            shared.load_image_model(&path);
        }
    }

    fn apply(&mut self, shared: &mut Shared, action: Action, ctx: &egui::Context) {
        match action {
            Action::LoadModel(path) => self.load_model(shared, path),
            Action::UnloadModel => shared.unload_image_model(),
            Action::Dialog(kind) => {
                let name = match kind {
                    DialogKind::SaveImageAs(id) => self.file_stem(id),
                    _ => String::new(),
                };
                shared.open_dialog(kind, &name, ctx);
            }
            Action::Generate => self.generate(shared),
            Action::Stop => self.stop(shared),
            Action::Select(id) => self.selected = Some(id),
            Action::Reuse(id) => self.reuse(shared, id),
            Action::UseAsStart(id) => {
                if let Some(path) = self.gallery.get(id).map(|i| i.path.clone()) {
                    self.set_start_image(ctx, &path);
                }
            }
            Action::Copy(id) => self.copy(id, ctx),
            Action::Delete(id) => self.delete(id),
            Action::OpenFolder => {
                if let Err(e) = gallery::open_folder(self.gallery.dir()) {
                    self.error = Some(format!("The images folder could not be opened: {e}"));
                }
            }
            Action::ClearStart => self.start = None,
            Action::DismissError => self.error = None,
        }
    }

    /// A model finished loading: what kept the last Generate from starting is moot.
    pub fn on_model_loaded(&mut self) {
        self.error = None;
    }

    /// Loads an image model (and shows it in the path field).
    pub fn load_model(&mut self, shared: &mut Shared, path: PathBuf) {
        self.model_input = path.display().to_string();
        shared.load_image_model(&path);
    }

    /// The generation under way.
    pub fn job(&self) -> Option<&Job> {
        self.job.as_ref()
    }

    pub fn is_busy(&self) -> bool {
        self.job.is_some()
    }

    /// The images made, newest first.
    pub fn gallery(&self) -> &[GalleryItem] {
        self.gallery.items()
    }

    /// Where the images are kept.
    pub fn images_dir(&self) -> &Path {
        self.gallery.dir()
    }

    pub fn selected_id(&self) -> Option<u64> {
        self.selected
    }

    /// The start image's file, when image-to-image is on.
    pub fn start_image(&self) -> Option<&Path> {
        self.start.as_ref().map(|s| s.path.as_path())
    }

    /// A file name for saving image `id`, without extension.
    fn file_stem(&self, id: u64) -> String {
        self.gallery
            .get(id)
            .and_then(|i| i.path.file_stem())
            .map_or_else(|| "image".into(), |s| s.to_string_lossy().into_owned())
    }
}
