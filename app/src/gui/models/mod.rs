//! The Models panel: open a model (file dialog or a typed path), how it is loaded (dtype,
//! on-load quantization, context length), what is loaded and what it costs on the GPU, the
//! models used recently, and the hub: installed models, catalog, search and downloads.

mod hub;

use std::path::PathBuf;

use eframe::egui;

use super::common::{display_name, format_bytes, info_row};
use super::shared::DialogKind;
use super::shared::{ModelState, Shared};
use super::store::LoadSettings;

pub use hub::ModelsTab;

#[derive(Default)]
pub struct ModelsPanel {
    /// The typed model path.
    path_input: String,
    /// Which part of the hub column is shown.
    pub tab: ModelsTab,
}

/// What a click asked for; applied after the frame's widgets are laid out.
enum Action {
    Load(PathBuf),
    Dialog(DialogKind),
    Unload,
    Forget(PathBuf),
}

impl ModelsPanel {
    pub fn show(&mut self, shared: &mut Shared, ui: &mut egui::Ui) {
        let mut actions = Vec::new();
        egui::CentralPanel::default().show(ui, |ui| {
            egui::ScrollArea::vertical()
                .auto_shrink(false)
                .show(ui, |ui| {
                    ui.heading("Models");
                    ui.add_space(4.0);
                    self.open_rows(ui, &mut actions);
                    if let Some(error) = &shared.model_error {
                        ui.colored_label(ui.visuals().error_fg_color, error);
                    }
                    ui.add_space(8.0);

                    // Left: what is loaded and how; right: the hub.
                    ui.columns(2, |cols| {
                        let ui = &mut cols[0];
                        loaded_model(ui, &shared.model, &mut actions);
                        ui.add_space(8.0);
                        let state = &mut shared.store.state;
                        if loading_options(ui, &mut state.load, &state.recent_models) {
                            shared.store.mark_dirty();
                        }
                        ui.add_space(8.0);
                        recent_models(ui, &shared.store.state.recent_models, &mut actions);
                        hub::show(&mut self.tab, shared, &mut cols[1]);
                    });
                });
        });
        for action in actions {
            match action {
                Action::Load(path) => shared.load_model(&path),
                Action::Dialog(kind) => shared.open_dialog(kind, "", ui.ctx()),
                Action::Unload => shared.unload_model(),
                Action::Forget(path) => {
                    shared.store.state.recent_models.retain(|p| *p != path);
                    shared.store.mark_dirty();
                }
            }
        }
    }

    /// The file dialogs and the typed path.
    fn open_rows(&mut self, ui: &mut egui::Ui, actions: &mut Vec<Action>) {
        ui.horizontal(|ui| {
            if ui
                .button("Open model…")
                .on_hover_text("A .gguf file")
                .clicked()
            {
                actions.push(Action::Dialog(DialogKind::OpenModelFile));
            }
            if ui
                .button("Open model folder…")
                .on_hover_text("A Hugging Face folder: config.json, *.safetensors, tokenizer.json")
                .clicked()
            {
                actions.push(Action::Dialog(DialogKind::OpenModelFolder));
            }
        });
        ui.horizontal(|ui| {
            let r = ui
                .add(
                    egui::TextEdit::singleline(&mut self.path_input)
                        .hint_text("…or paste a path to a model folder or .gguf file")
                        .desired_width(420.0),
                )
                .on_hover_text("Model path");
            let enter = r.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter));
            let path = self.path_input.trim();
            if (ui
                .add_enabled(!path.is_empty(), egui::Button::new("Load"))
                .clicked()
                || enter)
                && !path.is_empty()
            {
                actions.push(Action::Load(PathBuf::from(path)));
            }
        });
    }
}

fn loaded_model(ui: &mut egui::Ui, model: &ModelState, actions: &mut Vec<Action>) {
    ui.group(|ui| {
        ui.label(egui::RichText::new("Loaded model").strong());
        match model {
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
                    info_row(ui, "Name", info.name.clone());
                    ui.label("Path");
                    ui.label(display_name(path))
                        .on_hover_text(path.display().to_string());
                    ui.end_row();
                    info_row(ui, "Architecture", info.architecture.clone());
                    let mut parameters = format!("{:.1} M", info.parameters as f64 / 1e6);
                    if info.active_parameters < info.parameters {
                        parameters.push_str(&format!(
                            ", {:.1} M a token",
                            info.active_parameters as f64 / 1e6
                        ));
                    }
                    info_row(ui, "Parameters", parameters);
                    info_row(ui, "Weights on the GPU", format_bytes(info.weight_bytes));
                    info_row(
                        ui,
                        "KV cache",
                        format_bytes(info.cache_bytes - info.state_bytes),
                    );
                    if info.state_bytes > 0 {
                        info_row(
                            ui,
                            "Recurrent state",
                            format!("{} at any context", format_bytes(info.state_bytes)),
                        );
                    }
                    info_row(ui, "Context", format!("{} tokens", info.context));
                    info_row(ui, "Storage", info.dtype.clone());
                    let template = if info.has_chat_template {
                        "yes"
                    } else {
                        "no (plain transcript)"
                    };
                    info_row(ui, "Chat template", template.into());
                });
                if ui.button("Unload").clicked() {
                    actions.push(Action::Unload);
                }
            }
        }
    });
}

/// How the next model is loaded. True when a setting changed.
fn loading_options(ui: &mut egui::Ui, load: &mut LoadSettings, recent: &[PathBuf]) -> bool {
    let before = load.clone();
    ui.group(|ui| {
        ui.label(egui::RichText::new("Loading options").strong());
        ui.weak("Apply to the next model loaded.");
        ui.horizontal(|ui| {
            ui.label("Storage");
            ui.selectable_value(&mut load.dtype, "f16".to_owned(), "f16");
            ui.selectable_value(&mut load.dtype, "f32".to_owned(), "f32");
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
                ui.selectable_value(&mut load.quant, value, label);
            }
        })
        .response
        .on_hover_text("Safetensors weights only; GGUF files keep their own quantization");
        ui.checkbox(&mut load.kv_q8, "Q8_0 KV cache").on_hover_text(
            "Keys and values as int8 blocks: about half the memory of f16 for long contexts \
             (heads of a multiple of 32 dims)",
        );
        ui.checkbox(&mut load.f16_prompt_weights, "f16 copies for prompts")
            .on_hover_text(
                "Quantized models keep an f16 copy of their weight matrices for reading                  prompts: prompts run about 10 % faster on GPUs with tensor cores, and the                  weights take 2 bytes per weight more GPU memory",
            );
        speculation_options(ui, load, recent);
        ui.horizontal(|ui| {
            let mut custom = load.context.is_some();
            ui.checkbox(&mut custom, "Context length");
            if custom {
                let value = load.context.get_or_insert(4096);
                ui.add(egui::DragValue::new(value).range(16..=131_072).speed(64))
                    .on_hover_text("Context length in tokens");
            } else {
                load.context = None;
                ui.weak("default (4096, capped by the model)");
            }
        });
    });
    *load != before
}

/// Speculative decoding: off, or drafts a round from the conversation or a draft model.
fn speculation_options(ui: &mut egui::Ui, load: &mut LoadSettings, recent: &[PathBuf]) {
    ui.horizontal(|ui| {
        let mut on = load.speculate.is_some();
        ui.checkbox(&mut on, "Speculative decoding").on_hover_text(
            "Guess a few tokens ahead and check them in one pass of the model: the same \
             answers; with f16 weights faster when the guesses are mostly right (text being \
             copied or edited), with block-quantized weights slower for now",
        );
        if !on {
            load.speculate = None;
            return;
        }
        let drafts = load.speculate.get_or_insert(5);
        ui.add(egui::DragValue::new(drafts).range(1..=16))
            .on_hover_text("Tokens guessed a round");
        let name = |p: &Option<PathBuf>| match p {
            Some(p) => display_name(p),
            None => "copied from the conversation".to_owned(),
        };
        egui::ComboBox::from_id_salt("draft model")
            .selected_text(name(&load.draft_model))
            .show_ui(ui, |ui| {
                ui.selectable_value(&mut load.draft_model, None, name(&None));
                for path in recent {
                    let value = Some(path.clone());
                    let label = name(&value);
                    ui.selectable_value(&mut load.draft_model, value, label);
                }
            })
            .response
            .on_hover_text("Where guesses come from: the conversation itself, or a small model sharing the loaded model's tokenizer");
    });
}

fn recent_models(ui: &mut egui::Ui, recent: &[PathBuf], actions: &mut Vec<Action>) {
    ui.group(|ui| {
        ui.label(egui::RichText::new("Recent models").strong());
        if recent.is_empty() {
            ui.weak("None yet");
        }
        for path in recent {
            ui.horizontal(|ui| {
                let exists = path.exists();
                if ui.add_enabled(exists, egui::Button::new("Use")).clicked() {
                    actions.push(Action::Load(path.clone()));
                }
                if ui.small_button("Forget").clicked() {
                    actions.push(Action::Forget(path.clone()));
                }
                ui.label(display_name(path))
                    .on_hover_text(path.display().to_string());
                if !exists {
                    ui.colored_label(ui.visuals().warn_fg_color, "missing");
                }
            });
        }
    });
}
