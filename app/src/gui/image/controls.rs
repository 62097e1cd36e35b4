//! The controls column: the model (picker, path, load status), the prompts, size, steps,
//! guidance, scheduler, seed and batch, the start image for image-to-image, and Generate or
//! Stop with what went wrong or how the last run ended.

use std::path::PathBuf;

use backpack_engine::hub::InstalledModel;
use backpack_engine::models::diffusion::SchedulerKind;
use eframe::egui;

use super::{Action, ImagePanel, MAX_BATCH};
use crate::gui::common::{display_name, format_bytes};
use crate::gui::services::image::{ImageModelState, is_image_model};
use crate::gui::shared::DialogKind;
use crate::gui::shared::Shared;
use crate::gui::store::image::{ImageSettings, size_label, size_presets};
use crate::image_files::sampler_name;

pub(super) fn show(
    panel: &mut ImagePanel,
    shared: &mut Shared,
    ui: &mut egui::Ui,
    actions: &mut Vec<Action>,
) {
    egui::ScrollArea::vertical()
        .auto_shrink(false)
        .show(ui, |ui| {
            ui.add_space(6.0);
            ui.heading("Image");
            ui.add_space(4.0);
            model_rows(panel, shared, ui, actions);
            ui.separator();
            let model = shared
                .image_info()
                .map(|i| ((i.defaults.width, i.defaults.height), i.size_step));
            let family = shared.image_info().map(|i| i.family);
            let busy = panel.job.is_some();
            let settings = &mut shared.store.state.image;
            let before = settings.clone();
            prompts(ui, settings, busy, actions);
            ui.add_space(4.0);
            setting_grid(ui, settings, model, family, panel.last_seed);
            ui.add_space(4.0);
            start_image(panel, ui, settings, family == Some("flux2"), actions);
            if *settings != before {
                shared.store.mark_dirty();
            }
            ui.separator();
            run_rows(panel, ui, busy, actions);
        });
}

fn model_rows(
    panel: &mut ImagePanel,
    shared: &Shared,
    ui: &mut egui::Ui,
    actions: &mut Vec<Action>,
) {
    ui.horizontal(|ui| {
        ui.label("Model");
        model_picker(panel, shared, ui, actions);
    });
    ui.add(
        egui::TextEdit::singleline(&mut panel.model_input)
            .hint_text("…or a model folder or .safetensors file")
            .desired_width(f32::INFINITY),
    )
    .on_hover_text("Image model path");
    ui.horizontal(|ui| {
        if ui
            .button("Open folder…")
            .on_hover_text("A diffusers folder, with model_index.json")
            .clicked()
        {
            actions.push(Action::Dialog(DialogKind::OpenImageModelFolder));
        }
        if ui
            .button("Open file…")
            .on_hover_text("A single-file .safetensors checkpoint")
            .clicked()
        {
            actions.push(Action::Dialog(DialogKind::OpenImageModelFile));
        }
        let path = panel.model_input.trim();
        if ui
            .add_enabled(!path.is_empty(), egui::Button::new("Load"))
            .clicked()
        {
            actions.push(Action::LoadModel(PathBuf::from(path)));
        }
    });
    model_status(shared, ui, actions);
    if let Some(error) = &shared.image_error {
        ui.colored_label(ui.visuals().error_fg_color, error);
    }
}

/// The image models of an installed repo: a diffusers folder, or the single-file
/// checkpoints at its top level (a folder with config.json holds a text model instead).
fn image_models_in(m: &InstalledModel) -> Vec<(String, PathBuf)> {
    if is_image_model(&m.dir) {
        return vec![(m.repo.clone(), m.dir.clone())];
    }
    if m.dir.join("config.json").is_file() {
        return Vec::new();
    }
    let files = m.manifest.files.iter();
    files
        .filter(|f| f.path.ends_with(".safetensors") && !f.path.contains('/'))
        .map(|f| (format!("{}/{}", m.repo, f.path), m.dir.join(&f.path)))
        .collect()
}

/// Recent image models, then installed ones; picking one loads it.
fn model_picker(
    panel: &mut ImagePanel,
    shared: &Shared,
    ui: &mut egui::Ui,
    actions: &mut Vec<Action>,
) {
    let current = shared
        .image_model_path()
        .map_or_else(|| "choose…".to_owned(), display_name);
    egui::ComboBox::from_id_salt("image-model")
        .selected_text(current)
        .width(ui.available_width())
        .truncate()
        .show_ui(ui, |ui| {
            let recent = &shared.store.state.image.recent_models;
            // Read only while the list is open.
            let installed: Vec<(String, PathBuf)> = shared
                .downloads
                .as_ref()
                .map(|d| d.models.list())
                .unwrap_or_default()
                .iter()
                .flat_map(image_models_in)
                .filter(|(_, p)| !recent.contains(p))
                .collect();
            let recent = recent.iter().map(|p| (display_name(p), p.clone()));
            let loaded = shared.image_model_path();
            let mut any = false;
            for (label, path) in recent.chain(installed) {
                any = true;
                let r = ui.selectable_label(loaded == Some(path.as_path()), label);
                if r.on_hover_text(path.display().to_string()).clicked() {
                    panel.model_input = path.display().to_string();
                    actions.push(Action::LoadModel(path));
                }
            }
            if !any {
                ui.weak("No image models yet: download one in Models → Catalog, or open one");
            }
        })
        .response
        .on_hover_text("Image model");
}

fn model_status(shared: &Shared, ui: &mut egui::Ui, actions: &mut Vec<Action>) {
    match &shared.image_model {
        ImageModelState::None => {
            ui.weak("No image model loaded");
        }
        ImageModelState::Loading(path) => {
            ui.horizontal(|ui| {
                ui.spinner();
                ui.label(format!("Loading {}…", display_name(path)));
            });
        }
        ImageModelState::Ready { path, info } => {
            ui.horizontal(|ui| {
                ui.label(egui::RichText::new(&info.name).strong())
                    .on_hover_text(path.display().to_string());
                if ui.small_button("Unload").clicked() {
                    actions.push(Action::UnloadModel);
                }
            });
            let family = match info.family {
                "sdxl" => "SDXL",
                "zimage" => "Z-Image",
                "flux2" => "FLUX.2",
                _ => "SD",
            };
            let d = &info.defaults;
            let steps = match d.steps {
                1 => "1 step".to_owned(),
                n => format!("{n} steps"),
            };
            let details = format!(
                "{family} · {} on the GPU · {} × {}, {steps}",
                format_bytes(info.weight_bytes),
                d.width,
                d.height,
            );
            ui.add(egui::Label::new(egui::RichText::new(details).weak()).wrap());
        }
    }
}

fn prompts(ui: &mut egui::Ui, s: &mut ImageSettings, busy: bool, actions: &mut Vec<Action>) {
    let l = ui.label("Prompt");
    let r = ui
        .add(
            egui::TextEdit::multiline(&mut s.prompt)
                .hint_text("What to draw, e.g. a lighthouse at dawn, oil painting")
                .desired_rows(3)
                .desired_width(f32::INFINITY),
        )
        .labelled_by(l.id);
    let submit = ui.input(|i| i.modifiers.command && i.key_pressed(egui::Key::Enter));
    if r.has_focus() && submit && !busy {
        actions.push(Action::Generate);
    }
    let l = ui.label("Negative prompt");
    ui.add(
        egui::TextEdit::multiline(&mut s.negative)
            .hint_text("What to avoid")
            .desired_rows(1)
            .desired_width(f32::INFINITY),
    )
    .labelled_by(l.id);
}

/// Size, steps, guidance, scheduler, seed and batch. `model`: the loaded model's default
/// size and size step; `family`: the loaded model's. Diffusion transformers (Z-Image, FLUX.2)
/// step with their own flow-matching Euler, so there is no scheduler to pick.
fn setting_grid(
    ui: &mut egui::Ui,
    s: &mut ImageSettings,
    model: Option<((u32, u32), u32)>,
    family: Option<&str>,
    last_seed: Option<u64>,
) {
    let flow_matching = matches!(family, Some("zimage" | "flux2"));
    egui::Grid::new("image-settings")
        .num_columns(2)
        .spacing([8.0, 4.0])
        .show(ui, |ui| {
            let l = ui.label("Size");
            size_picker(ui, s, model).labelled_by(l.id);
            ui.end_row();
            let l = ui.label("Steps");
            ui.add(egui::Slider::new(&mut s.steps, 1..=150))
                .labelled_by(l.id)
                .on_hover_text("Denoising steps: more is slower and finer");
            ui.end_row();
            let l = ui.label("Guidance");
            // Z-Image guides at any scale above 0; Stable Diffusion and FLUX.2 only above 1
            // (and the distilled FLUX.2 klein never).
            let unguided = if family == Some("zimage") {
                "0"
            } else {
                "0 or 1"
            };
            ui.add(egui::Slider::new(&mut s.guidance, 0.0..=20.0).step_by(0.1))
                .labelled_by(l.id)
                .on_hover_text(format!(
                    "How closely to follow the prompt ({unguided}: no guidance, twice as fast)"
                ));
            ui.end_row();
            let l = ui.label("Scheduler");
            if flow_matching {
                ui.label("Flow matching (Euler)")
                    .labelled_by(l.id)
                    .on_hover_text("This model steps with the scheduler it was trained for");
            } else {
                scheduler_picker(ui, s).labelled_by(l.id);
            }
            ui.end_row();
            let l = ui.label("Seed");
            seed_row(ui, s, last_seed, l.id);
            ui.end_row();
            let l = ui.label("Images");
            ui.add(egui::Slider::new(&mut s.batch, 1..=MAX_BATCH))
                .labelled_by(l.id)
                .on_hover_text("Images per Generate, with seeds counting up from the seed");
            ui.end_row();
        });
}

fn size_picker(
    ui: &mut egui::Ui,
    s: &mut ImageSettings,
    model: Option<((u32, u32), u32)>,
) -> egui::Response {
    let current = (s.width, s.height);
    let (default, step) = model.unzip();
    let mut presets = size_presets(default.unwrap_or((512, 512)), step.unwrap_or(64));
    if !presets.contains(&current) {
        // A size reused from an image keeps its place in the list.
        presets.insert(0, current);
    }
    egui::ComboBox::from_id_salt("image-size")
        .selected_text(size_label(current, default))
        .show_ui(ui, |ui| {
            for size in presets {
                let r = ui.selectable_label(size == current, size_label(size, default));
                if r.clicked() {
                    (s.width, s.height) = size;
                }
            }
        })
        .response
}

fn scheduler_picker(ui: &mut egui::Ui, s: &mut ImageSettings) -> egui::Response {
    let current = s.scheduler_kind();
    egui::ComboBox::from_id_salt("image-scheduler")
        .selected_text(sampler_name(current))
        .show_ui(ui, |ui| {
            for kind in SchedulerKind::ALL {
                if ui
                    .selectable_label(kind == current, sampler_name(kind))
                    .clicked()
                {
                    s.scheduler = kind.name().into();
                }
            }
        })
        .response
}

fn seed_row(ui: &mut egui::Ui, s: &mut ImageSettings, last_seed: Option<u64>, label: egui::Id) {
    ui.horizontal(|ui| {
        ui.checkbox(&mut s.random_seed, "Random")
            .on_hover_text("A new seed for every Generate; untick to keep one");
        ui.add_enabled(
            !s.random_seed,
            egui::DragValue::new(&mut s.seed).range(0..=u64::from(u32::MAX)),
        )
        .labelled_by(label)
        .on_hover_text("The seed of the next image (with Random, the last one drawn)");
        if let Some(seed) = last_seed
            && ui
                .small_button("Reuse")
                .on_hover_text(format!("Keep the last image's seed, {seed}"))
                .clicked()
        {
            s.seed = seed;
            s.random_seed = false;
        }
    });
}

/// Image-to-image: the start picture (dropped on the panel or chosen) and the strength. For
/// FLUX.2 (`reference`) the picture is a reference the new image follows, without a strength.
fn start_image(
    panel: &ImagePanel,
    ui: &mut egui::Ui,
    s: &mut ImageSettings,
    reference: bool,
    actions: &mut Vec<Action>,
) {
    if reference {
        ui.label(egui::RichText::new("Reference image").strong())
            .on_hover_text("FLUX.2 draws a new image that follows this one (editing)");
    } else {
        ui.label(egui::RichText::new("Start image").strong())
            .on_hover_text("Image-to-image: start from a picture instead of noise");
    }
    let Some(start) = &panel.start else {
        ui.horizontal_wrapped(|ui| {
            ui.weak("None: drop a picture on the panel, or");
            if ui.button("Choose…").clicked() {
                actions.push(Action::Dialog(DialogKind::OpenStartImage));
            }
        });
        return;
    };
    ui.horizontal(|ui| {
        let [w, h] = start.thumb.size().map(|v| v as f32);
        let size = egui::vec2(64.0, 64.0 * h / w.max(1.0));
        ui.add(egui::Image::new(egui::load::SizedTexture::new(
            start.thumb.id(),
            size,
        )));
        ui.vertical(|ui| {
            ui.add(egui::Label::new(display_name(&start.path)).truncate());
            ui.weak(format!("{} × {}", start.image.width, start.image.height));
            if ui.small_button("Clear").clicked() {
                actions.push(Action::ClearStart);
            }
        });
    });
    if reference {
        return;
    }
    ui.horizontal(|ui| {
        let l = ui.label("Strength");
        ui.add(egui::Slider::new(&mut s.strength, 0.05..=1.0).step_by(0.05))
            .labelled_by(l.id)
            .on_hover_text("How much of the start image is redrawn (1: all of it)");
    });
}

/// Generate or Stop, then the error or how the last run ended.
fn run_rows(panel: &ImagePanel, ui: &mut egui::Ui, busy: bool, actions: &mut Vec<Action>) {
    let size = egui::vec2(ui.available_width(), 32.0);
    if busy {
        let stopping = panel.job.as_ref().is_some_and(|j| j.stopping);
        if ui
            .add_enabled(!stopping, egui::Button::new("Stop").min_size(size))
            .on_hover_text("Stop after the current step")
            .clicked()
        {
            actions.push(Action::Stop);
        }
    } else if ui
        .add(egui::Button::new(egui::RichText::new("Generate").strong()).min_size(size))
        .on_hover_text("Ctrl+Enter in the prompt")
        .clicked()
    {
        actions.push(Action::Generate);
    }
    if let Some(error) = &panel.error {
        ui.horizontal_wrapped(|ui| {
            ui.colored_label(ui.visuals().error_fg_color, error);
            if ui.small_button("Dismiss").clicked() {
                actions.push(Action::DismissError);
            }
        });
    }
    if let Some(status) = &panel.status {
        ui.weak(status);
    }
}
