//! The Settings panel: appearance, default sampling for new chats, the GPU in use, and where
//! data is kept.

use eframe::egui;

use super::store::Preset;
use super::{BackpackApp, format_bytes};

pub fn show(app: &mut BackpackApp, ui: &mut egui::Ui) {
    egui::CentralPanel::default().show(ui, |ui| {
        egui::ScrollArea::vertical().auto_shrink(false).show(ui, |ui| {
            ui.heading("Settings");
            ui.add_space(4.0);

            ui.group(|ui| {
                ui.label(egui::RichText::new("Appearance").strong());
                let mut dark = app.store.state.dark_mode;
                ui.horizontal(|ui| {
                    ui.selectable_value(&mut dark, true, "Dark");
                    ui.selectable_value(&mut dark, false, "Light");
                });
                if dark != app.store.state.dark_mode {
                    app.store.state.dark_mode = dark;
                    ui.ctx().set_theme(if dark {
                        egui::Theme::Dark
                    } else {
                        egui::Theme::Light
                    });
                    app.store.mark_dirty();
                }
            });
            ui.add_space(8.0);

            ui.group(|ui| {
                ui.label(egui::RichText::new("Sampling for new chats").strong());
                let sampling = &mut app.store.state.default_sampling;
                let before = sampling.clone();
                ui.horizontal(|ui| {
                    ui.label("Preset");
                    let current = Preset::matching(sampling);
                    for preset in Preset::ALL {
                        if ui
                            .selectable_label(current == Some(preset), preset.name())
                            .clicked()
                        {
                            let keep = (sampling.max_tokens, sampling.seed);
                            *sampling = preset.sampling();
                            (sampling.max_tokens, sampling.seed) = keep;
                        }
                    }
                });
                super::chat::sampling_controls(ui, sampling, None);
                if *sampling != before {
                    app.store.mark_dirty();
                }
            });
            ui.add_space(8.0);

            ui.group(|ui| {
                ui.label(egui::RichText::new("GPU").strong());
                match &app.engine {
                    Some(engine) => {
                        let g = &engine.gpu;
                        if g.software {
                            ui.colored_label(
                                ui.visuals().warn_fg_color,
                                "⚠ This is a CPU (software) adapter: no GPU driver was found, so models run slowly.",
                            );
                        }
                        egui::Grid::new("gpu-info").num_columns(2).show(ui, |ui| {
                            super::info_row(ui, "Adapter", g.name.clone());
                            super::info_row(ui, "Backend", g.backend.clone());
                            super::info_row(ui, "Type", g.device_type.clone());
                            super::info_row(ui, "Driver", g.driver.clone());
                            super::info_row(
                                ui,
                                "Features",
                                format!(
                                    "f16 {} · subgroups {}",
                                    if g.shader_f16 { "yes" } else { "no" },
                                    if g.subgroups { "yes" } else { "no" }
                                ),
                            );
                            super::info_row(ui, "Largest buffer", format_bytes(g.max_buffer));
                            super::info_row(ui, "Largest binding", format_bytes(g.max_binding));
                        });
                        ui.weak("The window and the models share this one device.");
                    }
                    None => {
                        ui.colored_label(
                            ui.visuals().error_fg_color,
                            app.engine_error.as_deref().unwrap_or("No GPU"),
                        );
                    }
                }
            });
            ui.add_space(8.0);

            ui.group(|ui| {
                ui.label(egui::RichText::new("Hugging Face Hub").strong());
                ui.weak("A token opens gated models (after you accept their license on the hub). It is kept readable by you only.");
                let mut save = false;
                ui.horizontal(|ui| {
                    let r = ui
                        .add(
                            egui::TextEdit::singleline(&mut app.token_input)
                                .password(true)
                                .hint_text("hf_…")
                                .desired_width(280.0),
                        )
                        .on_hover_text("Hub token");
                    save = ui
                        .add_enabled(!app.token_input.trim().is_empty(), egui::Button::new("Save token"))
                        .clicked()
                        || (r.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter)));
                });
                if save && !app.token_input.trim().is_empty() {
                    let token = std::mem::take(&mut app.token_input);
                    app.save_token(&token);
                }
            });
            ui.add_space(8.0);

            ui.group(|ui| {
                ui.label(egui::RichText::new("Data").strong());
                ui.label(format!(
                    "Settings and conversations are kept in {}",
                    app.store.dir().display()
                ));
            });
        });
    });
}
