//! The Settings panel: appearance, default sampling for new chats, the GPU in use, remote
//! backends ([`backends`]), the local server switch ([`server`]), the hub token, and where
//! data is kept.

mod backends;
mod server;

use eframe::egui;

use super::common::{format_bytes, info_row, sampling_editor};
use super::services::text::GpuSummary;
use super::shared::Shared;

#[derive(Default)]
pub struct SettingsPanel {
    /// The hub token being typed; cleared once saved.
    token_input: String,
    backends: backends::BackendForm,
    server: server::ServerSwitch,
}

impl SettingsPanel {
    pub fn show(&mut self, shared: &mut Shared, ui: &mut egui::Ui) {
        egui::CentralPanel::default().show(ui, |ui| {
            egui::ScrollArea::vertical()
                .auto_shrink(false)
                .show(ui, |ui| {
                    ui.heading("Settings");
                    ui.add_space(4.0);
                    appearance(ui, shared);
                    ui.add_space(8.0);
                    ui.group(|ui| {
                        ui.label(egui::RichText::new("Sampling for new chats").strong());
                        let sampling = &mut shared.store.state.default_sampling;
                        let before = sampling.clone();
                        sampling_editor(ui, sampling, None);
                        if *sampling != before {
                            shared.store.mark_dirty();
                        }
                    });
                    ui.add_space(8.0);
                    ui.group(|ui| {
                        ui.label(egui::RichText::new("GPU").strong());
                        match &shared.gpu {
                            Some(g) => gpu_info(ui, g),
                            None => {
                                let error = shared.engine_error.as_deref().unwrap_or("No GPU");
                                ui.colored_label(ui.visuals().error_fg_color, error);
                            }
                        }
                    });
                    ui.add_space(8.0);
                    self.backends.show(ui, shared);
                    ui.add_space(8.0);
                    self.server.show(ui, shared);
                    ui.add_space(8.0);
                    self.hub_token(ui, shared);
                    ui.add_space(8.0);
                    ui.group(|ui| {
                        ui.label(egui::RichText::new("Data").strong());
                        ui.label(format!(
                            "Settings, conversations and transcripts are kept in {}",
                            shared.store.dir().display()
                        ));
                    });
                });
        });
    }

    /// Stops the local server, if it runs (the app is closing).
    pub fn stop_server(&mut self) {
        self.server.stop();
    }

    fn hub_token(&mut self, ui: &mut egui::Ui, shared: &mut Shared) {
        ui.group(|ui| {
            ui.label(egui::RichText::new("Hugging Face Hub").strong());
            ui.weak("A token opens gated models (after you accept their license on the hub). It is kept readable by you only.");
            let mut save = false;
            ui.horizontal(|ui| {
                let r = ui
                    .add(
                        egui::TextEdit::singleline(&mut self.token_input)
                            .password(true)
                            .hint_text("hf_…")
                            .desired_width(280.0),
                    )
                    .on_hover_text("Hub token");
                let typed = !self.token_input.trim().is_empty();
                save = ui
                    .add_enabled(typed, egui::Button::new("Save token"))
                    .clicked()
                    || (r.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter)));
            });
            if save && !self.token_input.trim().is_empty() {
                let token = std::mem::take(&mut self.token_input);
                save_token(shared, &token);
            }
        });
    }
}

fn appearance(ui: &mut egui::Ui, shared: &mut Shared) {
    ui.group(|ui| {
        ui.label(egui::RichText::new("Appearance").strong());
        let mut dark = shared.store.state.dark_mode;
        ui.horizontal(|ui| {
            ui.selectable_value(&mut dark, true, "Dark");
            ui.selectable_value(&mut dark, false, "Light");
        });
        if dark != shared.store.state.dark_mode {
            shared.store.state.dark_mode = dark;
            ui.ctx().set_theme(if dark {
                egui::Theme::Dark
            } else {
                egui::Theme::Light
            });
            shared.store.mark_dirty();
        }
    });
}

fn gpu_info(ui: &mut egui::Ui, g: &GpuSummary) {
    if g.software {
        ui.colored_label(
            ui.visuals().warn_fg_color,
            "⚠ This is a CPU (software) adapter: no GPU driver was found, so models run slowly.",
        );
    }
    egui::Grid::new("gpu-info").num_columns(2).show(ui, |ui| {
        info_row(ui, "Adapter", g.name.clone());
        info_row(ui, "Backend", g.backend.clone());
        info_row(ui, "Type", g.device_type.clone());
        info_row(ui, "Driver", g.driver.clone());
        let features = format!(
            "f16 {} · subgroups {}",
            if g.shader_f16 { "yes" } else { "no" },
            if g.subgroups { "yes" } else { "no" }
        );
        info_row(ui, "Features", features);
        info_row(ui, "Largest buffer", format_bytes(g.max_buffer));
        info_row(ui, "Largest binding", format_bytes(g.max_binding));
    });
    ui.weak("The window and the models share this one device.");
}

/// Saves a hub token (owner-only) and uses it from now on.
fn save_token(shared: &mut Shared, token: &str) {
    let config = &shared.config;
    let path = crate::hub::token_path(&config.data_dir);
    let result = backpack_engine::hub::store_token(&path, token)
        .map_err(anyhow::Error::from)
        .and_then(|()| crate::hub::client_for(&config.data_dir, config.hub_endpoint.clone()));
    match result {
        Ok(client) => {
            if let Some(d) = &mut shared.downloads {
                d.set_client(Ok(client));
            }
            shared.notices.push("Hub token saved.".into());
        }
        Err(e) => shared
            .notices
            .push(format!("Could not save the token: {e:#}")),
    }
}
