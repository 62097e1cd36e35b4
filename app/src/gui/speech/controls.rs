//! The top of the Speech panel: the model (picker, path, load status), language, task,
//! storage and input device.

use std::path::PathBuf;

use backpack_engine::models::whisper::{LANGUAGES, is_whisper_dir};
use eframe::egui;

use super::{Action, SpeechPanel, list_devices};
use crate::gui::common::{display_name, format_bytes};
use crate::gui::services::speech::SpeechModelState;
use crate::gui::shared::DialogKind;
use crate::gui::shared::Shared;
use crate::gui::store::speech::SpeechSettings;

pub(super) fn model_rows(
    panel: &mut SpeechPanel,
    shared: &mut Shared,
    ui: &mut egui::Ui,
    actions: &mut Vec<Action>,
) {
    ui.horizontal(|ui| {
        ui.label("Model");
        model_picker(panel, shared, ui);
        ui.add(
            egui::TextEdit::singleline(&mut panel.model_input)
                .hint_text("…or a Whisper model folder")
                .desired_width(240.0),
        )
        .on_hover_text("Speech model path");
        if ui.button("Open folder…").clicked() {
            actions.push(Action::Dialog(DialogKind::OpenSpeechModelFolder));
        }
        let path = panel.model_input.trim();
        if ui
            .add_enabled(!path.is_empty(), egui::Button::new("Load"))
            .clicked()
        {
            actions.push(Action::LoadModel(PathBuf::from(path)));
        }
    });
    ui.horizontal(|ui| model_status(shared, ui, actions));
    if let Some(error) = &shared.speech_error {
        ui.colored_label(ui.visuals().error_fg_color, error);
    }
}

/// Recent speech models, then installed Whisper models; picking one fills the path.
fn model_picker(panel: &mut SpeechPanel, shared: &Shared, ui: &mut egui::Ui) {
    let typed = PathBuf::from(panel.model_input.trim());
    let current = if panel.model_input.trim().is_empty() {
        "choose…".to_owned()
    } else {
        display_name(&typed)
    };
    egui::ComboBox::from_id_salt("speech-model")
        .selected_text(current)
        .width(180.0)
        .show_ui(ui, |ui| {
            let recent = &shared.store.state.speech.recent_models;
            // Read only while the list is open.
            let installed: Vec<(String, PathBuf)> = shared
                .downloads
                .as_ref()
                .map(|d| d.models.list())
                .unwrap_or_default()
                .into_iter()
                .map(|m| (m.repo.clone(), m.model_path()))
                .filter(|(_, p)| is_whisper_dir(p) && !recent.contains(p))
                .collect();
            let recent = recent.iter().map(|p| (display_name(p), p.clone()));
            let mut any = false;
            for (label, path) in recent.chain(installed) {
                any = true;
                let r = ui.selectable_label(path == typed, label);
                if r.on_hover_text(path.display().to_string()).clicked() {
                    panel.model_input = path.display().to_string();
                }
            }
            if !any {
                ui.weak("No Whisper models yet: download one in Models → Catalog");
            }
        })
        .response
        .on_hover_text("Speech model");
}

fn model_status(shared: &Shared, ui: &mut egui::Ui, actions: &mut Vec<Action>) {
    match &shared.speech_model {
        SpeechModelState::None => {
            ui.weak("No speech model loaded");
        }
        SpeechModelState::Loading(path) => {
            ui.spinner();
            ui.label(format!("Loading {}…", display_name(path)));
        }
        SpeechModelState::Ready { path, info } => {
            ui.label(egui::RichText::new(&info.name).strong())
                .on_hover_text(path.display().to_string());
            if ui.small_button("Unload").clicked() {
                actions.push(Action::UnloadModel);
            }
            let details = format!(
                "{:.1} M parameters · {} on the GPU · {} · {}",
                info.parameters as f64 / 1e6,
                format_bytes(info.weight_bytes + info.cache_bytes),
                info.dtype,
                if info.multilingual {
                    "99 languages"
                } else {
                    "English only"
                },
            );
            ui.add(egui::Label::new(egui::RichText::new(details).weak()).truncate());
        }
    }
}

pub(super) fn option_rows(
    panel: &mut SpeechPanel,
    shared: &mut Shared,
    ui: &mut egui::Ui,
    actions: &mut Vec<Action>,
) {
    let multilingual = shared.speech_info().map(|i| i.multilingual);
    let virtual_input = shared.virtual_input_name();
    let settings = &mut shared.store.state.speech;
    let before = settings.clone();
    ui.horizontal(|ui| {
        ui.label("Language");
        ui.add_enabled_ui(multilingual != Some(false), |ui| {
            language_picker(ui, &mut settings.language);
        });
        ui.separator();
        ui.label("Task");
        ui.selectable_value(&mut settings.translate, false, "Transcribe");
        let can_translate = multilingual == Some(true);
        let translate = egui::Button::selectable(settings.translate, "Translate to English");
        if ui
            .add_enabled(can_translate, translate)
            .on_disabled_hover_text("Needs a multilingual model loaded")
            .clicked()
        {
            settings.translate = true;
        }
        ui.separator();
        ui.label("Storage")
            .on_hover_text("How the next speech model loaded keeps its weights");
        ui.selectable_value(&mut settings.dtype, "f16".to_owned(), "f16");
        ui.selectable_value(&mut settings.dtype, "f32".to_owned(), "f32");
    });
    let problem = ui
        .horizontal(|ui| {
            ui.label("Input");
            match &virtual_input {
                Some(name) => {
                    ui.label(name);
                    None
                }
                None => input_picker(panel, settings, ui, actions),
            }
        })
        .inner;
    if let Some(problem) = problem {
        ui.add(egui::Label::new(egui::RichText::new(problem).weak()).wrap());
    }
    if *settings != before {
        shared.store.mark_dirty();
    }
}

pub(super) fn language_name(code: Option<&str>) -> String {
    let Some(code) = code else {
        return "Auto-detect".into();
    };
    let name = LANGUAGES
        .iter()
        .find(|(c, _)| *c == code)
        .map_or(code, |(_, n)| n);
    let mut chars = name.chars();
    chars.next().map_or_else(String::new, |first| {
        first.to_uppercase().chain(chars).collect()
    })
}

fn language_picker(ui: &mut egui::Ui, language: &mut Option<String>) {
    egui::ComboBox::from_id_salt("speech-language")
        .selected_text(language_name(language.as_deref()))
        .width(130.0)
        .height(320.0)
        .show_ui(ui, |ui| {
            ui.selectable_value(language, None, "Auto-detect");
            let mut names: Vec<(String, &str)> = LANGUAGES
                .iter()
                .map(|(code, _)| (language_name(Some(code)), *code))
                .collect();
            names.sort();
            for (name, code) in names {
                ui.selectable_value(language, Some(code.to_owned()), name);
            }
        })
        .response
        .on_hover_text("Spoken language");
}

/// The input devices (listed the first time they are needed) and a way to list them again.
/// Returns why there are none, when the system said.
fn input_picker(
    panel: &mut SpeechPanel,
    settings: &mut SpeechSettings,
    ui: &mut egui::Ui,
    actions: &mut Vec<Action>,
) -> Option<String> {
    let devices = panel.devices.get_or_insert_with(list_devices);
    let problem = match devices {
        Ok(list) if !list.is_empty() => {
            let current = settings.device.as_deref().unwrap_or("Default input");
            egui::ComboBox::from_id_salt("speech-input")
                .selected_text(current)
                .width(220.0)
                .truncate()
                .show_ui(ui, |ui| {
                    ui.selectable_value(&mut settings.device, None, "Default input");
                    for name in list.iter() {
                        ui.selectable_value(&mut settings.device, Some(name.clone()), name);
                    }
                })
                .response
                .on_hover_text("Input device");
            None
        }
        Ok(_) => {
            ui.colored_label(ui.visuals().warn_fg_color, "No input devices found");
            None
        }
        Err(e) => {
            ui.colored_label(ui.visuals().warn_fg_color, "No audio input");
            Some(e.clone())
        }
    };
    if ui
        .small_button("Refresh")
        .on_hover_text("List input devices again")
        .clicked()
    {
        actions.push(Action::RefreshDevices);
    }
    problem
}
