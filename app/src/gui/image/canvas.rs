//! The canvas: while generating, the progress and each step's preview (the engine's texture at
//! latent resolution, scaled up to the image's size), then the image; otherwise the selected
//! gallery image with its parameters and what can be done with it.

use eframe::egui;

use super::gallery::GalleryItem;
use super::{Action, ImagePanel, Job, Showing};
use crate::gui::common::display_name;
use crate::gui::shared::DialogKind;
use crate::image_files::read_png;

/// Small images are enlarged at most this much to fill the canvas.
const MAX_ZOOM: f32 = 4.0;
/// Room kept under a gallery image for its parameters and buttons.
const DETAILS_HEIGHT: f32 = 150.0;

pub(super) fn show(panel: &mut ImagePanel, ui: &mut egui::Ui, actions: &mut Vec<Action>) {
    if panel.job.is_some() {
        job_view(panel, ui);
        return;
    }
    let Some(id) = panel.selected.filter(|id| panel.gallery.get(*id).is_some()) else {
        ui.add_space(24.0);
        ui.vertical_centered(|ui| {
            ui.weak("Describe an image and press Generate: it appears here, then in the gallery.");
        });
        return;
    };
    ensure_view(panel, id, ui.ctx());
    let Some(item) = panel.gallery.get(id) else {
        return;
    };
    let room = ui.available_size() - egui::vec2(0.0, DETAILS_HEIGHT);
    match panel.view.as_ref().map(|(_, v)| v) {
        Some(Ok(texture)) => {
            let [w, h] = texture.size().map(|v| v as f32);
            picture(ui, texture.id(), egui::vec2(w, h), room);
        }
        Some(Err(e)) => {
            ui.colored_label(ui.visuals().error_fg_color, e);
        }
        None => {}
    }
    ui.add_space(6.0);
    details(ui, item, actions);
}

/// Reads gallery image `id` at full size when it is not the one already shown.
fn ensure_view(panel: &mut ImagePanel, id: u64, ctx: &egui::Context) {
    if panel.view.as_ref().is_some_and(|(v, _)| *v == id) {
        return;
    }
    let Some(item) = panel.gallery.get(id) else {
        return;
    };
    let texture = read_png(&item.path)
        .map(|png| {
            let size = [png.width as usize, png.height as usize];
            ctx.load_texture(
                format!("view-{id}"),
                egui::ColorImage::from_rgb(size, &png.rgb),
                egui::TextureOptions::LINEAR,
            )
        })
        .map_err(|e| format!("{e:#}"));
    panel.view = Some((id, texture));
}

/// Progress, then the live preview or the image just made.
fn job_view(panel: &mut ImagePanel, ui: &mut egui::Ui) {
    let Some(job) = &panel.job else { return };
    ui.add(
        egui::ProgressBar::new(job.fraction())
            .text(progress_text(job))
            .animate(true),
    );
    ui.add_space(6.0);
    let size = egui::vec2(job.width as f32, job.height as f32);
    let room = ui.available_size();
    match &job.showing {
        Showing::Nothing => {
            ui.horizontal(|ui| {
                ui.spinner();
                ui.weak("Reading the prompt…");
            });
        }
        Showing::Image(texture) => picture(ui, texture.id(), size, room),
        Showing::Preview => {
            let Some(preview) = &mut panel.preview else {
                return;
            };
            picture(ui, preview.id, size, room);
            let key = (job.request, job.index, job.step);
            if preview.painted != Some(key) {
                preview.painted = Some(key);
                panel.previews_shown += 1;
            }
        }
    }
}

/// "Image 2/4 · step 7/20 · about 3 s left".
fn progress_text(job: &Job) -> String {
    let mut parts = Vec::new();
    if job.count > 1 {
        parts.push(format!("Image {}/{}", job.index + 1, job.count));
    }
    if job.step == 0 {
        parts.push("starting…".to_owned());
    } else {
        parts.push(format!("step {}/{}", job.step, job.steps));
    }
    if job.stopping {
        parts.push("stopping…".to_owned());
    } else if let Some(left) = job.seconds_left() {
        parts.push(format!("about {} left", duration(left)));
    }
    parts.join(" · ")
}

fn duration(seconds: f64) -> String {
    let s = seconds.ceil() as u64;
    if s < 60 {
        format!("{s} s")
    } else {
        format!("{} min {:02} s", s / 60, s % 60)
    }
}

/// `texture` drawn at `size` fitted into `room` (enlarged up to [`MAX_ZOOM`]), centred.
fn picture(ui: &mut egui::Ui, texture: egui::TextureId, size: egui::Vec2, room: egui::Vec2) {
    let size = size.max(egui::vec2(1.0, 1.0));
    let scale = (room.x / size.x).min(room.y / size.y).clamp(0.05, MAX_ZOOM);
    let image = egui::Image::new(egui::load::SizedTexture::new(texture, size * scale));
    ui.vertical_centered(|ui| {
        ui.add(image);
    });
}

/// The parameters of a gallery image and its commands.
fn details(ui: &mut egui::Ui, item: &GalleryItem, actions: &mut Vec<Action>) {
    let info = item.info.as_ref().and_then(|i| i.as_ref().ok());
    let has_parameters = info.is_some_and(|i| i.parameters.is_some());
    ui.horizontal_wrapped(|ui| {
        if ui
            .add_enabled(has_parameters, egui::Button::new("Reuse parameters"))
            .on_hover_text("Fill the prompt and settings from this image")
            .clicked()
        {
            actions.push(Action::Reuse(item.id));
        }
        if ui
            .button("Use as start image")
            .on_hover_text("Image-to-image from this picture")
            .clicked()
        {
            actions.push(Action::UseAsStart(item.id));
        }
        if ui.button("Copy").on_hover_text("Copy the image").clicked() {
            actions.push(Action::Copy(item.id));
        }
        if ui.button("Save as…").clicked() {
            actions.push(Action::Dialog(DialogKind::SaveImageAs(item.id)));
        }
        if ui.button("Delete").clicked() {
            actions.push(Action::Delete(item.id));
        }
    });
    let mut about = display_name(&item.path);
    if let Some(i) = info {
        about.push_str(&format!(" · {} × {}", i.width, i.height));
    }
    ui.weak(about);
    egui::ScrollArea::vertical()
        .id_salt("image-parameters")
        .auto_shrink([false, true])
        .show(ui, |ui| match info.and_then(|i| i.parameters.as_deref()) {
            Some(text) => {
                let text = egui::RichText::new(text).monospace();
                ui.add(egui::Label::new(text).wrap().selectable(true));
            }
            None => {
                ui.weak("No parameters are stored in this file.");
            }
        });
}
