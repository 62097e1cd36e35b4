//! Settings → Backends: OpenAI-compatible servers (vLLM, TGI, SGLang, llama.cpp, Ollama, another
//! Backpack) whose models appear in the chat's model picker, marked as remote.

use eframe::egui;

use crate::gui::services::remote::{Backend, ModelList};
use crate::gui::shared::Shared;

/// The "add a backend" form.
#[derive(Default)]
pub struct BackendForm {
    name: String,
    url: String,
    key: String,
    error: Option<String>,
}

enum BackendAction {
    Refresh(String),
    Remove(String),
    Edit(Backend),
}

impl BackendForm {
    pub fn show(&mut self, ui: &mut egui::Ui, shared: &mut Shared) {
        ui.group(|ui| {
            ui.label(egui::RichText::new("Backends").strong());
            ui.weak(
                "OpenAI-compatible servers for models too big for this GPU. Their models appear in the chat's model picker, marked as remote. API keys are kept readable by you only.",
            );
            let Some(remote) = &mut shared.remote else {
                ui.colored_label(ui.visuals().error_fg_color, "Remote backends are unavailable.");
                return;
            };
            let mut action = None;
            egui::Grid::new("backends")
                .num_columns(4)
                .striped(true)
                .show(ui, |ui| {
                    for b in &remote.backends {
                        ui.label(egui::RichText::new(&b.name).strong());
                        ui.label(&b.url);
                        status(ui, remote.models.get(&b.name));
                        ui.horizontal(|ui| {
                            if ui.small_button("Refresh").clicked() {
                                action = Some(BackendAction::Refresh(b.name.clone()));
                            }
                            if ui.small_button("Edit").clicked() {
                                action = Some(BackendAction::Edit(b.clone()));
                            }
                            if ui.small_button("Remove").clicked() {
                                action = Some(BackendAction::Remove(b.name.clone()));
                            }
                        });
                        ui.end_row();
                    }
                });
            match action {
                Some(BackendAction::Refresh(name)) => remote.refresh(&name),
                Some(BackendAction::Remove(name)) => self.error = remote.remove(&name).err(),
                Some(BackendAction::Edit(b)) => {
                    self.name = b.name;
                    self.url = b.url;
                    self.key = b.api_key.unwrap_or_default();
                }
                None => {}
            }
            if self.form(ui) {
                let backend = Backend {
                    name: self.name.trim().to_owned(),
                    url: self.url.trim().to_owned(),
                    api_key: Some(self.key.trim().to_owned()).filter(|k| !k.is_empty()),
                };
                match remote.add(backend) {
                    Ok(()) => *self = Self::default(),
                    Err(e) => self.error = Some(e),
                }
            }
            if let Some(e) = &self.error {
                ui.colored_label(ui.visuals().error_fg_color, e);
            }
        });
    }

    /// The input row; true when Add was pressed.
    fn form(&mut self, ui: &mut egui::Ui) -> bool {
        let mut add = false;
        ui.horizontal_wrapped(|ui| {
            ui.add(
                egui::TextEdit::singleline(&mut self.name)
                    .hint_text("Name")
                    .desired_width(110.0),
            )
            .on_hover_text("Backend name");
            ui.add(
                egui::TextEdit::singleline(&mut self.url)
                    .hint_text("http://server:8000/v1")
                    .desired_width(220.0),
            )
            .on_hover_text("Backend URL");
            ui.add(
                egui::TextEdit::singleline(&mut self.key)
                    .password(true)
                    .hint_text("API key (optional)")
                    .desired_width(160.0),
            )
            .on_hover_text("Backend API key");
            let ready = !self.name.trim().is_empty() && !self.url.trim().is_empty();
            add = ui
                .add_enabled(ready, egui::Button::new("Add backend"))
                .clicked();
        });
        add
    }
}

fn status(ui: &mut egui::Ui, list: Option<&ModelList>) {
    match list {
        None | Some(ModelList::Loading) => {
            ui.weak("Listing models…");
        }
        Some(ModelList::Ready(models)) => {
            let text = match models.len() {
                1 => "1 model".to_owned(),
                n => format!("{n} models"),
            };
            ui.label(text).on_hover_text(models.join("\n"));
        }
        Some(ModelList::Failed(e)) => {
            ui.colored_label(ui.visuals().error_fg_color, "Unreachable")
                .on_hover_text(e);
        }
    }
}
