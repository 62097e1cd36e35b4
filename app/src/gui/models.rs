//! The Models panel: open a model (file dialog or a typed path), how it is loaded (dtype,
//! on-load quantization, context length), what is loaded and what it costs on the GPU, the
//! models used recently, and the hub: installed models, catalog, search and downloads.

use std::path::PathBuf;

use eframe::egui;

use super::dialogs::DialogKind;
use super::{BackpackApp, ModelState, display_name, format_bytes};

pub fn show(app: &mut BackpackApp, ui: &mut egui::Ui) {
    let mut load: Option<PathBuf> = None;
    let mut dialog: Option<DialogKind> = None;
    let mut unload = false;
    let mut forget: Option<PathBuf> = None;
    egui::CentralPanel::default().show(ui, |ui| {
        egui::ScrollArea::vertical()
            .auto_shrink(false)
            .show(ui, |ui| {
                ui.heading("Models");
                ui.add_space(4.0);
                ui.horizontal(|ui| {
                    if ui
                        .button("Open model…")
                        .on_hover_text("A .gguf file")
                        .clicked()
                    {
                        dialog = Some(DialogKind::OpenModelFile);
                    }
                    if ui
                        .button("Open model folder…")
                        .on_hover_text(
                            "A Hugging Face folder: config.json, *.safetensors, tokenizer.json",
                        )
                        .clicked()
                    {
                        dialog = Some(DialogKind::OpenModelFolder);
                    }
                });
                ui.horizontal(|ui| {
                    let r = ui
                        .add(
                            egui::TextEdit::singleline(&mut app.model_path_input)
                                .hint_text("…or paste a path to a model folder or .gguf file")
                                .desired_width(420.0),
                        )
                        .on_hover_text("Model path");
                    let enter = r.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter));
                    let path = app.model_path_input.trim();
                    if (ui
                        .add_enabled(!path.is_empty(), egui::Button::new("Load"))
                        .clicked()
                        || enter)
                        && !path.is_empty()
                    {
                        load = Some(PathBuf::from(path));
                    }
                });
                if let Some(error) = &app.model_error {
                    ui.colored_label(ui.visuals().error_fg_color, error);
                }
                ui.add_space(8.0);

                // Left: what is loaded and how; right: the hub.
                ui.columns(2, |cols| {
                    let ui = &mut cols[0];
                    ui.group(|ui| {
                        ui.label(egui::RichText::new("Loaded model").strong());
                        match &app.model {
                            ModelState::None => {
                                ui.weak("None");
                            }
                            ModelState::Loading(path) => {
                                ui.horizontal(|ui| {
                                    ui.spinner();
                                    ui.label(format!("Loading {}…", path.display()));
                                });
                            }
                            ModelState::Ready { path, info } => {
                                egui::Grid::new("model-info").num_columns(2).show(ui, |ui| {
                                    super::info_row(ui, "Name", info.name.clone());
                                    ui.label("Path");
                                    ui.label(display_name(path))
                                        .on_hover_text(path.display().to_string());
                                    ui.end_row();
                                    super::info_row(ui, "Architecture", info.architecture.clone());
                                    super::info_row(
                                        ui,
                                        "Parameters",
                                        format!("{:.1} M", info.parameters as f64 / 1e6),
                                    );
                                    super::info_row(
                                        ui,
                                        "Weights on the GPU",
                                        format_bytes(info.weight_bytes),
                                    );
                                    super::info_row(ui, "KV cache", format_bytes(info.cache_bytes));
                                    super::info_row(
                                        ui,
                                        "Context",
                                        format!("{} tokens", info.context),
                                    );
                                    super::info_row(ui, "Storage", info.dtype.clone());
                                    super::info_row(
                                        ui,
                                        "Chat template",
                                        if info.has_chat_template {
                                            "yes"
                                        } else {
                                            "no (plain transcript)"
                                        }
                                        .into(),
                                    );
                                });
                                if ui.button("Unload").clicked() {
                                    unload = true;
                                }
                            }
                        }
                    });
                    ui.add_space(8.0);

                    ui.group(|ui| {
                        ui.label(egui::RichText::new("Loading options").strong());
                        ui.weak("Apply to the next model loaded.");
                        let load_settings = &mut app.store.state.load;
                        let before = load_settings.clone();
                        ui.horizontal(|ui| {
                            ui.label("Storage");
                            ui.selectable_value(&mut load_settings.dtype, "f16".to_owned(), "f16");
                            ui.selectable_value(&mut load_settings.dtype, "f32".to_owned(), "f32");
                        });
                        ui.horizontal(|ui| {
                            ui.label("Quantize on load");
                            for (value, label) in [
                                (None, "off"),
                                (Some("q8_0"), "Q8_0"),
                                (Some("q4_k"), "Q4_K"),
                                (Some("q4_0"), "Q4_0"),
                            ] {
                                let value = value.map(str::to_owned);
                                ui.selectable_value(&mut load_settings.quant, value, label);
                            }
                        })
                        .response
                        .on_hover_text(
                            "Safetensors weights only; GGUF files keep their own quantization",
                        );
                        ui.horizontal(|ui| {
                            let mut custom = load_settings.context.is_some();
                            ui.checkbox(&mut custom, "Context length");
                            if custom {
                                let value = load_settings.context.get_or_insert(4096);
                                ui.add(egui::DragValue::new(value).range(16..=131_072).speed(64))
                                    .on_hover_text("Context length in tokens");
                            } else {
                                load_settings.context = None;
                                ui.weak("default (4096, capped by the model)");
                            }
                        });
                        if *load_settings != before {
                            app.store.mark_dirty();
                        }
                    });
                    ui.add_space(8.0);

                    ui.group(|ui| {
                        ui.label(egui::RichText::new("Recent models").strong());
                        if app.store.state.recent_models.is_empty() {
                            ui.weak("None yet");
                        }
                        for path in &app.store.state.recent_models {
                            ui.horizontal(|ui| {
                                let exists = path.exists();
                                if ui.add_enabled(exists, egui::Button::new("Use")).clicked() {
                                    load = Some(path.clone());
                                }
                                if ui.small_button("Forget").clicked() {
                                    forget = Some(path.clone());
                                }
                                ui.label(display_name(path))
                                    .on_hover_text(path.display().to_string());
                                if !exists {
                                    ui.colored_label(ui.visuals().warn_fg_color, "missing");
                                }
                            });
                        }
                    });
                    let ui = &mut cols[1];
                    super::hub_views::show(app, ui);
                });
            });
    });
    if let Some(kind) = dialog {
        app.open_dialog(kind, ui.ctx());
    }
    if let Some(path) = load {
        app.load_model(&path);
    }
    if unload {
        app.unload_model();
    }
    if let Some(path) = forget {
        app.store.state.recent_models.retain(|p| *p != path);
        app.store.mark_dirty();
    }
}
