//! The hub half of the Models panel: installed models, the catalog with "fits / doesn't fit"
//! on this GPU, hub search, and the download queue.

use std::path::PathBuf;

use backpack_engine::hub::{Catalog, FitCheck, GpuBudget, RepoListing, quant_variants};
use eframe::egui;

use crate::gui::common::format_bytes;
use crate::gui::downloads::{Downloads, Job, JobState, Selection};
use crate::gui::shared::DialogKind;
use crate::gui::shared::Shared;
use crate::gui::store::Panel;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ModelsTab {
    #[default]
    Library,
    Catalog,
    Search,
    Downloads,
}

/// What the user asked for in this frame.
enum Action {
    Load(PathBuf),
    Delete(String),
    Download {
        repo: String,
        label: String,
        selection: Selection,
    },
    Search,
    Open(String),
    Pause(u64),
    Resume(u64),
    Cancel(u64),
    ClearFinished,
    ChooseFolder,
}

fn fit_badge(ui: &mut egui::Ui, fit: &FitCheck, gpu: Option<&GpuBudget>) -> bool {
    match gpu.map(|g| fit.check_gpu(g)) {
        Some(Ok(())) => {
            ui.colored_label(egui::Color32::from_rgb(90, 180, 90), "✔ fits")
                .on_hover_text(format!(
                    "{} of weights + {} of KV cache at 4096 tokens",
                    format_bytes(fit.weight_bytes),
                    format_bytes(fit.kv_cache_bytes)
                ));
            true
        }
        Some(Err(problem)) => {
            ui.colored_label(ui.visuals().warn_fg_color, "⚠ too big")
                .on_hover_text(problem.to_string());
            false
        }
        None => {
            ui.weak("no GPU to check");
            true
        }
    }
}

pub fn show(tab: &mut ModelsTab, shared: &mut Shared, ui: &mut egui::Ui) {
    let gpu = shared.gpu_budget();
    let mut actions = Vec::new();
    let Some(downloads) = shared.downloads.as_mut() else {
        ui.colored_label(ui.visuals().error_fg_color, "Downloads are unavailable.");
        return;
    };
    tab_bar(ui, tab, downloads.active());
    ui.separator();
    match tab {
        ModelsTab::Library => library(ui, downloads, &mut actions),
        ModelsTab::Catalog => catalog(ui, gpu.as_ref(), &mut actions),
        ModelsTab::Search => search(ui, downloads, gpu.as_ref(), &mut actions),
        ModelsTab::Downloads => queue(ui, downloads, &mut actions),
    }
    for action in actions {
        apply(tab, shared, action, gpu.clone(), ui.ctx());
    }
}

fn apply(
    tab: &mut ModelsTab,
    shared: &mut Shared,
    action: Action,
    gpu: Option<GpuBudget>,
    ctx: &egui::Context,
) {
    let Some(downloads) = shared.downloads.as_mut() else {
        return;
    };
    match action {
        Action::Load(path) => {
            let before = shared.store.state.panel;
            shared.load_model(&path);
            // Speech and image models take the user to their own panel; others to Chat.
            if shared.store.state.panel == before {
                shared.go_to(Panel::Chat);
            }
        }
        Action::Delete(repo) => {
            if let Err(e) = downloads.remove(&repo) {
                shared.notices.push(format!("Could not delete {repo}: {e}"));
            }
        }
        Action::Download {
            repo,
            label,
            selection,
        } => {
            downloads.start(&repo, "main", &label, selection, gpu);
            *tab = ModelsTab::Downloads;
        }
        Action::Search => downloads.search(),
        Action::Open(repo) => downloads.open_repo(&repo),
        Action::Pause(id) => downloads.pause(id),
        Action::Resume(id) => downloads.resume(id),
        Action::Cancel(id) => downloads.cancel(id),
        Action::ClearFinished => downloads.clear_finished(),
        Action::ChooseFolder => shared.open_dialog(DialogKind::ModelsFolder, "", ctx),
    }
}

fn tab_bar(ui: &mut egui::Ui, tab: &mut ModelsTab, active: usize) {
    ui.horizontal(|ui| {
        let downloads_label = if active > 0 {
            format!("Downloads ({active})")
        } else {
            "Downloads".to_owned()
        };
        for (value, label) in [
            (ModelsTab::Library, "Installed".to_owned()),
            (ModelsTab::Catalog, "Catalog".to_owned()),
            (ModelsTab::Search, "Search the hub".to_owned()),
            (ModelsTab::Downloads, downloads_label),
        ] {
            ui.selectable_value(tab, value, label);
        }
    });
}

fn library(ui: &mut egui::Ui, downloads: &mut Downloads, actions: &mut Vec<Action>) {
    ui.horizontal(|ui| {
        ui.label(format!(
            "Models folder: {}",
            downloads.models.root.display()
        ));
        if ui.button("Change…").clicked() {
            actions.push(Action::ChooseFolder);
        }
    });
    let installed = downloads.installed().to_vec();
    if installed.is_empty() {
        ui.weak("No models downloaded yet: see Catalog or Search the hub.");
    }
    for m in installed {
        ui.horizontal(|ui| {
            if ui.button("Use").clicked() {
                actions.push(Action::Load(m.model_path()));
            }
            if ui.button("Delete").clicked() {
                actions.push(Action::Delete(m.repo.clone()));
            }
            ui.label(egui::RichText::new(&m.repo).strong());
            ui.weak(format_bytes(m.size));
        });
    }
    let found = downloads.found().to_vec();
    if !found.is_empty() {
        ui.add_space(8.0);
        ui.label(egui::RichText::new("Found on this machine").strong())
            .on_hover_text("Models other tools downloaded; used where they are, not copied");
    }
    for m in found {
        ui.horizontal(|ui| {
            if ui.button("Use").clicked() {
                actions.push(Action::Load(m.path.clone()));
            }
            ui.label(&m.name)
                .on_hover_text(m.path.display().to_string());
            ui.weak(format!("{} · {}", format_bytes(m.size), m.source.label()));
        });
    }
}

fn catalog(ui: &mut egui::Ui, gpu: Option<&GpuBudget>, actions: &mut Vec<Action>) {
    for entry in Catalog::builtin().models {
        ui.group(|ui| {
            ui.set_width(ui.available_width());
            ui.horizontal(|ui| {
                ui.label(egui::RichText::new(&entry.name).strong());
                ui.weak(format!("{} · {}", entry.parameters_label(), entry.license));
                if entry.gated {
                    ui.colored_label(ui.visuals().warn_fg_color, "needs a hub token")
                        .on_hover_text(
                            "Accept the license on the hub, then enter your token in Settings",
                        );
                }
            });
            for variant in &entry.variants {
                let fit = entry.estimate(variant);
                ui.horizontal(|ui| {
                    ui.label(&variant.label);
                    ui.weak(format!("≈{}", format_bytes(fit.download_bytes)));
                    let fits = fit_badge(ui, &fit, gpu);
                    if ui
                        .add_enabled(fits, egui::Button::new("Download"))
                        .on_hover_text(format!("{} from {}", variant.label, variant.repo))
                        .clicked()
                    {
                        actions.push(Action::Download {
                            repo: variant.repo.clone(),
                            label: format!("{} {}", entry.name, variant.label),
                            selection: Selection::Patterns(variant.files.clone()),
                        });
                    }
                });
            }
        });
    }
}

fn search(
    ui: &mut egui::Ui,
    downloads: &mut Downloads,
    gpu: Option<&GpuBudget>,
    actions: &mut Vec<Action>,
) {
    ui.horizontal(|ui| {
        let r = ui
            .add(
                egui::TextEdit::singleline(&mut downloads.search_text)
                    .hint_text("Search the hub, e.g. qwen gguf")
                    .desired_width(320.0),
            )
            .on_hover_text("Search text");
        let enter = r.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter));
        if ui.button("Search").clicked() || enter {
            actions.push(Action::Search);
        }
        if downloads.searching {
            ui.spinner();
        }
    });
    match &downloads.results {
        Err(e) => {
            ui.colored_label(ui.visuals().error_fg_color, e);
        }
        Ok(results) => {
            for m in results {
                ui.horizontal(|ui| {
                    if ui.link(&m.id).clicked() {
                        actions.push(Action::Open(m.id.clone()));
                    }
                    ui.weak(format!("{} downloads", m.downloads.unwrap_or(0)));
                    if m.gated {
                        ui.colored_label(ui.visuals().warn_fg_color, "gated");
                    }
                });
            }
        }
    }
    if let Some(repo) = &downloads.listing_pending {
        ui.horizontal(|ui| {
            ui.spinner();
            ui.label(format!("Listing {repo}…"));
        });
    }
    match &downloads.listing {
        Some(Err(e)) => {
            ui.colored_label(ui.visuals().error_fg_color, e);
        }
        Some(Ok((listing, fit))) => repo_listing(ui, listing, fit, gpu, actions),
        None => {}
    }
}

/// One repo's weights: each GGUF quantization, and the safetensors files, with a fit badge.
fn repo_listing(
    ui: &mut egui::Ui,
    listing: &RepoListing,
    fit: &FitCheck,
    gpu: Option<&GpuBudget>,
    actions: &mut Vec<Action>,
) {
    ui.group(|ui| {
        ui.set_width(ui.available_width());
        ui.label(egui::RichText::new(&listing.repo).strong());
        ui.weak(format!(
            "{} files, {} in all, commit {}",
            listing.files.len(),
            format_bytes(listing.total_size()),
            &listing.commit[..listing.commit.len().min(12)]
        ));
        let variants = quant_variants(&listing.files);
        for (label, files) in &variants {
            let size: u64 = files.iter().map(|f| f.size).sum();
            let scale = size as f64 / fit.weight_bytes.max(1) as f64;
            let variant_fit = FitCheck {
                download_bytes: size,
                weight_bytes: size,
                kv_cache_bytes: fit.kv_cache_bytes,
                largest_tensor: fit.largest_tensor.map(|t| (t as f64 * scale) as u64),
            };
            ui.horizontal(|ui| {
                ui.label(label);
                ui.weak(format_bytes(size));
                let fits = fit_badge(ui, &variant_fit, gpu);
                if ui
                    .add_enabled(fits, egui::Button::new(format!("Download {label}")))
                    .clicked()
                {
                    actions.push(Action::Download {
                        repo: listing.repo.clone(),
                        label: format!("{} {label}", listing.repo),
                        selection: Selection::Quant(label.clone()),
                    });
                }
            });
        }
        let safetensors = listing
            .files
            .iter()
            .any(|f| f.path.ends_with(".safetensors"));
        if safetensors {
            ui.horizontal(|ui| {
                ui.label("safetensors");
                ui.weak(format_bytes(fit.download_bytes));
                let fits = fit_badge(ui, fit, gpu);
                if ui
                    .add_enabled(fits, egui::Button::new("Download model files"))
                    .clicked()
                {
                    actions.push(Action::Download {
                        repo: listing.repo.clone(),
                        label: listing.repo.clone(),
                        selection: Selection::Default,
                    });
                }
            });
        }
        if variants.is_empty() && !safetensors {
            ui.weak("No safetensors or GGUF weights in this repo.");
        }
    });
}

/// The download queue.
fn queue(ui: &mut egui::Ui, downloads: &Downloads, actions: &mut Vec<Action>) {
    if downloads.jobs.is_empty() {
        ui.weak("Nothing downloading.");
    }
    for job in &downloads.jobs {
        ui.group(|ui| {
            ui.set_width(ui.available_width());
            job_view(ui, downloads, job, actions);
        });
    }
    if downloads.jobs.iter().any(|j| {
        matches!(
            j.state,
            JobState::Done(_) | JobState::Failed(_) | JobState::Cancelled
        )
    }) && ui.button("Clear finished").clicked()
    {
        actions.push(Action::ClearFinished);
    }
}

fn job_view(ui: &mut egui::Ui, downloads: &Downloads, job: &Job, actions: &mut Vec<Action>) {
    ui.horizontal(|ui| {
        ui.label(egui::RichText::new(&job.label).strong());
        ui.weak(match &job.state {
            JobState::Preparing => "checking…".to_owned(),
            JobState::Running => "downloading".to_owned(),
            JobState::Paused => "paused".to_owned(),
            JobState::Done(_) => "done, verified".to_owned(),
            JobState::Failed(_) => "failed".to_owned(),
            JobState::Cancelled => "cancelled".to_owned(),
        });
    });
    if let (Some(p), Some(total)) = (&job.progress, job.total()) {
        let fraction = p.done as f32 / total.max(1) as f32;
        let eta = p
            .eta
            .filter(|_| job.state == JobState::Running)
            .map_or_else(String::new, |e| format!(" · {} s left", e.as_secs()));
        ui.add(egui::ProgressBar::new(fraction).text(format!(
            "{} of {} · {}/s{eta}",
            format_bytes(p.done),
            format_bytes(total),
            format_bytes(p.bytes_per_s as u64)
        )));
    }
    if let Some(note) = &job.note {
        ui.weak(note);
    }
    if let JobState::Failed(e) = &job.state {
        ui.colored_label(ui.visuals().error_fg_color, e);
    }
    ui.horizontal(|ui| match &job.state {
        JobState::Running | JobState::Preparing => {
            if ui.button("Pause").clicked() {
                actions.push(Action::Pause(job.id));
            }
            if ui.button("Cancel").clicked() {
                actions.push(Action::Cancel(job.id));
            }
        }
        JobState::Paused => {
            if ui.button("Resume").clicked() {
                actions.push(Action::Resume(job.id));
            }
            if ui.button("Cancel").clicked() {
                actions.push(Action::Cancel(job.id));
            }
        }
        JobState::Done(dir) if ui.button("Use").clicked() => {
            let path = downloads
                .models
                .find(&job.repo)
                .map_or_else(|| dir.clone(), |m| m.model_path());
            actions.push(Action::Load(path));
        }
        _ => {}
    });
}
