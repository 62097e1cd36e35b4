//! What the Image panel does: generations (start, stop, and the events that bring their
//! previews and images), the start image, and gallery images (reuse, copy, save, delete).

use std::hash::{BuildHasher, RandomState};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use backpack_engine::models::diffusion::{Generated, ImageParams};
use backpack_engine::runtime::image::ImageEvent;
use eframe::{egui, wgpu};

use super::gallery::thumbnail;
use super::{ImagePanel, Job, LivePreview, MAX_BATCH, Showing, StartImage};
use crate::gui::services::image::{event_request, is_image_model};
use crate::gui::shared::Shared;
use crate::image_files::{
    init_image_floats, is_start_image, parameters_text, parse_parameters, read_png,
    read_start_image,
};

impl Job {
    fn new(request: u64, count: u32, steps: u32, width: u32, height: u32) -> Self {
        Self {
            request,
            count,
            images: 0,
            index: 0,
            step: 0,
            steps,
            elapsed_ms: 0.0,
            width,
            height,
            started: Instant::now(),
            timings: None,
            showing: Showing::Nothing,
            stopping: false,
        }
    }

    /// Seconds until the last image is done, from the time per step so far.
    pub fn seconds_left(&self) -> Option<f64> {
        if self.step == 0 {
            return None;
        }
        let per_step = self.elapsed_ms / f64::from(self.step) / 1e3;
        let later_images = self.count.saturating_sub(self.index + 1);
        let steps_left = self.steps.saturating_sub(self.step) + later_images * self.steps;
        Some(per_step * f64::from(steps_left))
    }

    /// How far the whole request is, 0 to 1.
    pub fn fraction(&self) -> f32 {
        let total = self.count.max(1) * self.steps.max(1);
        (self.index * self.steps + self.step) as f32 / total as f32
    }
}

/// A seed nobody chose: the standard library's randomly keyed hasher over the clock.
fn random_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    // Seeds other tools accept (and people read) fit in 32 bits.
    RandomState::new().hash_one(nanos) >> 32
}

impl ImagePanel {
    /// Starts a generation with the settings as they are; why not, inline, when it cannot.
    pub fn generate(&mut self, shared: &mut Shared) {
        if self.job.is_some() {
            return;
        }
        self.error = None;
        self.status = None;
        let Some(info) = shared.image_info() else {
            self.error = Some(shared.image_not_ready());
            return;
        };
        let step = info.size_step.max(1);
        let s = &mut shared.store.state.image;
        let fits = |side: u32| side > 0 && side.is_multiple_of(step);
        if !fits(s.width) || !fits(s.height) {
            self.error = Some(format!(
                "{} × {} does not suit this model: width and height must be multiples of {step}",
                s.width, s.height
            ));
            return;
        }
        if s.random_seed {
            s.seed = random_seed();
        }
        let init_image = self.start.as_ref().map(|start| {
            let floats = init_image_floats(&start.image, s.width, s.height);
            (floats, s.strength.clamp(0.01, 1.0))
        });
        let params = ImageParams {
            prompt: s.prompt.trim().to_owned(),
            negative: s.negative.trim().to_owned(),
            steps: s.steps.max(1),
            guidance: s.guidance,
            seed: s.seed,
            width: s.width,
            height: s.height,
            scheduler: s.scheduler_kind(),
            init_image,
            init_latents: None,
        };
        let (count, steps, width, height) =
            (s.batch.clamp(1, MAX_BATCH), s.steps, s.width, s.height);
        shared.store.mark_dirty();
        let Some(link) = shared.image.as_mut() else {
            self.error = Some("the image service is not running".into());
            return;
        };
        let request = link.generate(params, count);
        self.job = Some(Job::new(request, count, steps, width, height));
    }

    /// Stops the generation after its current step; finished images are kept.
    pub fn stop(&mut self, shared: &Shared) {
        if let Some(job) = &mut self.job {
            if let Some(link) = &shared.image {
                link.cancel(job.request);
            }
            job.stopping = true;
        }
    }

    /// An image event of this panel's generation (others are ignored).
    pub fn on_event(&mut self, shared: &mut Shared, event: ImageEvent, ctx: &egui::Context) {
        let Some(job) = self
            .job
            .as_mut()
            .filter(|j| Some(j.request) == event_request(&event))
        else {
            return;
        };
        match event {
            ImageEvent::Step {
                index,
                step,
                steps,
                elapsed_ms,
                preview,
                ..
            } => {
                (job.index, job.step, job.steps, job.elapsed_ms) = (index, step, steps, elapsed_ms);
                if let Some(texture) = preview {
                    job.showing = Showing::Preview;
                    self.register_preview(shared, texture);
                }
            }
            ImageEvent::Image {
                seed,
                params,
                image,
                ..
            } => self.keep_image(shared, ctx, seed, &params, &image),
            ImageEvent::Done { cancelled, .. } => self.finish(cancelled),
            ImageEvent::Error { message, .. } => {
                self.job = None;
                self.error = Some(message);
            }
            ImageEvent::Loaded(_) => {}
        }
    }

    /// Has the renderer draw `texture`, once per texture: the engine redraws the same one
    /// every step of an image size.
    fn register_preview(&mut self, shared: &Shared, texture: wgpu::Texture) {
        if self.preview.as_ref().is_some_and(|p| p.texture == texture) {
            return;
        }
        let Some(render) = &shared.render_state else {
            return;
        };
        let view = texture.create_view(&wgpu::TextureViewDescriptor::default());
        let mut renderer = render.renderer.write();
        if let Some(old) = self.preview.take() {
            renderer.free_texture(&old.id);
        }
        let id = renderer.register_native_texture(&render.device, &view, wgpu::FilterMode::Linear);
        self.preview = Some(LivePreview {
            texture,
            id,
            painted: None,
        });
    }

    /// A finished image: saved to the gallery, selected, and shown.
    fn keep_image(
        &mut self,
        shared: &Shared,
        ctx: &egui::Context,
        seed: u64,
        params: &ImageParams,
        image: &Arc<Generated>,
    ) {
        let model = shared.image_info().map(|i| i.name.clone());
        let text = parameters_text(params, model.as_deref().unwrap_or("unknown"));
        let size = [image.width as usize, image.height as usize];
        let texture = ctx.load_texture(
            format!("image-{seed}"),
            egui::ColorImage::from_rgb(size, &image.rgb),
            egui::TextureOptions::LINEAR,
        );
        match self.gallery.add(ctx, image, seed, &text) {
            Ok(id) => {
                self.selected = Some(id);
                self.view = Some((id, Ok(texture.clone())));
            }
            Err(e) => self.error = Some(format!("The image could not be saved: {e:#}")),
        }
        self.last_seed = Some(seed);
        if let Some(job) = &mut self.job {
            job.images += 1;
            job.timings = Some(image.timings);
            job.showing = Showing::Image(texture);
        }
    }

    fn finish(&mut self, cancelled: bool) {
        let Some(job) = self.job.take() else { return };
        let images = match job.images {
            1 => "1 image".to_owned(),
            n => format!("{n} images"),
        };
        self.status = Some(if cancelled {
            match job.images {
                0 => "Stopped".to_owned(),
                _ => format!("Stopped after {images}"),
            }
        } else {
            let seconds = job.started.elapsed().as_secs_f64();
            let per_step = job
                .timings
                .map(|t| format!(" ({:.0} ms per step)", t.ms_per_step))
                .unwrap_or_default();
            format!("{images} in {seconds:.1} s{per_step}")
        });
    }

    /// Reads `path` as the start image for image-to-image.
    pub fn set_start_image(&mut self, ctx: &egui::Context, path: &Path) {
        if !is_start_image(path) {
            self.error = Some(format!(
                "{} is not a PNG, JPEG or WebP image",
                path.display()
            ));
            return;
        }
        match read_start_image(path) {
            Ok(image) => {
                let thumb = ctx.load_texture(
                    "start-image",
                    thumbnail(&image.rgb, image.width, image.height),
                    egui::TextureOptions::LINEAR,
                );
                self.start = Some(StartImage {
                    path: path.to_owned(),
                    image,
                    thumb,
                });
                self.error = None;
            }
            Err(e) => self.error = Some(format!("{e:#}")),
        }
    }

    /// Files dropped on the window: an image model is loaded, a picture becomes the start image.
    pub fn open_dropped(&mut self, shared: &mut Shared, ctx: &egui::Context, paths: Vec<PathBuf>) {
        for path in paths {
            if is_image_model(&path) {
                self.load_model(shared, path);
            } else {
                self.set_start_image(ctx, &path);
            }
        }
    }

    /// Fills the settings from gallery image `id`'s parameters.
    pub(super) fn reuse(&mut self, shared: &mut Shared, id: u64) {
        let text = self
            .gallery
            .get(id)
            .and_then(|i| i.info.as_ref())
            .and_then(|i| i.as_ref().ok())
            .and_then(|i| i.parameters.clone());
        match text {
            Some(text) => {
                shared.store.state.image.reuse(&parse_parameters(&text));
                shared.store.mark_dirty();
            }
            None => self.error = Some("This image carries no parameters".into()),
        }
    }

    /// Puts gallery image `id` on the clipboard.
    pub(super) fn copy(&mut self, id: u64, ctx: &egui::Context) {
        let Some(item) = self.gallery.get(id) else {
            return;
        };
        match read_png(&item.path) {
            Ok(png) => ctx.copy_image(egui::ColorImage::from_rgb(
                [png.width as usize, png.height as usize],
                &png.rgb,
            )),
            Err(e) => self.error = Some(format!("{e:#}")),
        }
    }

    /// Deletes gallery image `id` and its file; the next one is selected.
    pub(super) fn delete(&mut self, id: u64) {
        let next = self.gallery.neighbor(id);
        if let Err(e) = self.gallery.remove(id) {
            self.error = Some(format!("{e:#}"));
            return;
        }
        if self.selected == Some(id) {
            self.selected = next;
        }
        if self.view.as_ref().is_some_and(|(v, _)| *v == id) {
            self.view = None;
        }
    }

    /// Saves a copy of gallery image `id` where the dialog said, with a notice either way.
    pub fn finish_save_as(&self, shared: &mut Shared, id: u64, path: &Path) {
        let Some(item) = self.gallery.get(id) else {
            return;
        };
        let notice = match std::fs::copy(&item.path, path) {
            Ok(_) => format!("Saved to {}", path.display()),
            Err(e) => format!("Saving {} failed: {e}", path.display()),
        };
        shared.notices.push(notice);
    }
}
