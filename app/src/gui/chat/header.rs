//! Above the transcript: the conversation's title and commands, its model and context meter,
//! its system prompt and sampling, and what went wrong last.

use std::path::PathBuf;

use eframe::egui;

use super::{Action, ChatPanel};
use crate::gui::common::{display_name, sampling_editor};
use crate::gui::services::remote::{ModelList, RemoteModelRef};
use crate::gui::shared::DialogKind;
use crate::gui::shared::Shared;
use crate::gui::store::Conversation;

/// What the header shows besides the conversation, read before the conversation is borrowed.
struct HeaderInfo {
    /// The model's context length, when one is loaded.
    context: Option<u32>,
    /// Its recurrent states' bytes (linear-attention layers), the same at any context.
    state_bytes: Option<u64>,
    loaded: Option<PathBuf>,
    recent: Vec<PathBuf>,
    models: Option<backpack_engine::hub::Library>,
    /// Tokens of the answer streaming into this conversation.
    live_tokens: Option<usize>,
    /// Each remote backend's models, by backend name.
    remote: Vec<(String, ModelList)>,
}

pub(super) fn show(
    panel: &mut ChatPanel,
    shared: &mut Shared,
    ui: &mut egui::Ui,
    actions: &mut Vec<Action>,
) {
    let Some(id) = panel.selected else {
        return;
    };
    let cx = HeaderInfo {
        context: shared.model_info().map(|i| i.context),
        state_bytes: shared.model_info().map(|i| i.state_bytes),
        loaded: shared.model_path().map(std::path::Path::to_owned),
        recent: shared.store.state.recent_models.clone(),
        models: shared.downloads.as_ref().map(|d| d.models.clone()),
        live_tokens: panel
            .active
            .as_ref()
            .filter(|g| g.conversation == id)
            .map(|g| g.tokens),
        remote: shared
            .remote
            .as_ref()
            .map(|r| {
                let names = r.backends.iter().map(|b| b.name.clone());
                names
                    .map(|n| {
                        let list = r.models.get(&n).cloned().unwrap_or(ModelList::Loading);
                        (n, list)
                    })
                    .collect()
            })
            .unwrap_or_default(),
    };
    let Some(conv) = shared.store.conversation_mut(id) else {
        return;
    };
    let before = (
        conv.system_prompt.clone(),
        conv.sampling.clone(),
        conv.model.clone(),
        conv.remote.clone(),
    );
    title_row(ui, &conv.title, id, &mut panel.show_settings, actions);
    ui.horizontal(|ui| {
        model_picker(ui, conv, &cx, actions);
        context_meter(ui, conv, &cx);
    });
    if panel.show_settings {
        ui.group(|ui| {
            ui.label("System prompt");
            ui.add(
                egui::TextEdit::multiline(&mut conv.system_prompt)
                    .hint_text("Instructions for the model in this chat")
                    .desired_rows(2)
                    .desired_width(f32::INFINITY),
            )
            .on_hover_text("System prompt");
            sampling_editor(ui, &mut conv.sampling, cx.context);
        });
    }
    let after = (
        conv.system_prompt.clone(),
        conv.sampling.clone(),
        conv.model.clone(),
        conv.remote.clone(),
    );
    if before != after {
        shared.store.mark_dirty();
    }
    if cx.live_tokens.is_some() {
        ui.ctx()
            .request_repaint_after(std::time::Duration::from_millis(250));
    }
    ui.separator();
    problems(panel, shared, ui, id, actions);
}

fn title_row(
    ui: &mut egui::Ui,
    title: &str,
    id: u64,
    show_settings: &mut bool,
    actions: &mut Vec<Action>,
) {
    ui.horizontal(|ui| {
        ui.heading(title);
        ui.with_layout(egui::Layout::right_to_left(egui::Align::Center), |ui| {
            if ui.button("Delete").clicked() {
                actions.push(Action::Delete(id));
            }
            ui.menu_button("Export", |ui| {
                if ui.button("Markdown…").clicked() {
                    actions.push(Action::Export(DialogKind::ExportMarkdown(id)));
                    ui.close();
                }
                if ui.button("JSON…").clicked() {
                    actions.push(Action::Export(DialogKind::ExportJson(id)));
                    ui.close();
                }
            });
            if ui.button("Rename").clicked() {
                actions.push(Action::StartRename(id));
            }
            ui.toggle_value(show_settings, "Chat settings");
        });
    });
}

/// The conversation's model: recent and installed models, or a file; and a button to load the
/// one the conversation was held with when another is loaded.
fn model_picker(
    ui: &mut egui::Ui,
    conv: &mut Conversation,
    cx: &HeaderInfo,
    actions: &mut Vec<Action>,
) {
    ui.label("Model");
    let current = match &conv.remote {
        Some(remote) => format!("{} (remote)", remote.label()),
        None => conv
            .model
            .as_deref()
            .or(cx.loaded.as_deref())
            .map_or_else(|| "none".to_owned(), display_name),
    };
    egui::ComboBox::from_id_salt("conversation-model")
        .selected_text(current)
        .width(260.0)
        .show_ui(ui, |ui| model_choices(ui, conv, cx, actions))
        .response
        .on_hover_text("Model for this chat");
    if let (Some(wanted), false) = (&conv.model, conv.model == cx.loaded)
        && conv.remote.is_none()
        && wanted.exists()
        && ui
            .button(format!("Load {}", display_name(wanted)))
            .on_hover_text("This chat was held with another model")
            .clicked()
    {
        actions.push(Action::LoadModel(wanted.clone()));
    }
}

fn model_choices(
    ui: &mut egui::Ui,
    conv: &mut Conversation,
    cx: &HeaderInfo,
    actions: &mut Vec<Action>,
) {
    // Read only while the list is open.
    let installed = cx.models.as_ref().map(|l| l.list()).unwrap_or_default();
    for path in &cx.recent {
        let is_loaded = cx.loaded.as_deref() == Some(path.as_path());
        if ui
            .selectable_label(is_loaded && conv.remote.is_none(), display_name(path))
            .on_hover_text(path.display().to_string())
            .clicked()
        {
            conv.model = Some(path.clone());
            conv.remote = None;
            if !is_loaded {
                actions.push(Action::LoadModel(path.clone()));
            }
        }
    }
    let installed: Vec<_> = installed
        .iter()
        .map(|m| (m.repo.clone(), m.model_path()))
        .filter(|(_, p)| !cx.recent.contains(p))
        .collect();
    if !installed.is_empty() {
        ui.separator();
        ui.weak("Installed");
    }
    for (repo, path) in installed {
        if ui.selectable_label(false, repo).clicked() {
            conv.model = Some(path.clone());
            conv.remote = None;
            actions.push(Action::LoadModel(path));
        }
    }
    remote_choices(ui, conv, &cx.remote);
    ui.separator();
    if ui.button("Open model…").clicked() {
        actions.push(Action::OpenModel);
    }
}

/// Each remote backend's models, marked as remote (Settings → Backends adds backends).
fn remote_choices(ui: &mut egui::Ui, conv: &mut Conversation, remote: &[(String, ModelList)]) {
    for (backend, list) in remote {
        ui.separator();
        ui.weak(format!("Remote: {backend}"));
        match list {
            ModelList::Loading => {
                ui.weak("Listing models…");
            }
            ModelList::Failed(e) => {
                ui.colored_label(ui.visuals().error_fg_color, "Unreachable")
                    .on_hover_text(e);
            }
            ModelList::Ready(models) if models.is_empty() => {
                ui.weak("No models");
            }
            ModelList::Ready(models) => {
                for model in models {
                    let choice = RemoteModelRef {
                        backend: backend.clone(),
                        model: model.clone(),
                    };
                    let selected = conv.remote.as_ref() == Some(&choice);
                    if ui
                        .selectable_label(selected, format!("{model} (remote)"))
                        .on_hover_text(format!("{model} on {backend}"))
                        .clicked()
                    {
                        conv.remote = Some(choice);
                    }
                }
            }
        }
    }
}

/// What the last answer left in the context, plus what is streaming.
fn context_meter(ui: &mut egui::Ui, conv: &Conversation, cx: &HeaderInfo) {
    // A remote model's context is the server's business.
    let Some(context) = cx.context.filter(|_| conv.remote.is_none()) else {
        return;
    };
    let used = conv.context_used.unwrap_or(0) + cx.live_tokens.unwrap_or(0);
    let fraction = (used as f32 / context.max(1) as f32).min(1.0);
    let bar = egui::ProgressBar::new(fraction)
        .desired_width(200.0)
        .text(format!("{used} / {context} tokens"));
    let mut hover = String::from(
        "Tokens in the model's context after the last answer. When a prompt no longer fits, the oldest turns can be dropped.",
    );
    if let Some(state) = cx.state_bytes.filter(|&b| b > 0) {
        hover.push_str(&format!(
            "\n\nIts linear-attention layers keep {} of state whatever the context; only its attention layers' KV cache grows with it.",
            crate::units::format_bytes(state)
        ));
    }
    ui.add(bar).on_hover_text(hover);
}

/// The last model error, and an overflowing prompt with the way out.
fn problems(
    panel: &ChatPanel,
    shared: &Shared,
    ui: &mut egui::Ui,
    id: u64,
    actions: &mut Vec<Action>,
) {
    if let Some(error) = &shared.model_error {
        ui.horizontal(|ui| {
            ui.colored_label(ui.visuals().error_fg_color, error);
            if ui.small_button("Dismiss").clicked() {
                actions.push(Action::DismissError);
            }
        });
    }
    if let Some(o) = panel.overflow.as_ref().filter(|o| o.conversation == id) {
        ui.horizontal_wrapped(|ui| {
            ui.colored_label(
                ui.visuals().warn_fg_color,
                format!(
                    "This conversation needs {} tokens but the model's context holds {}.",
                    o.tokens, o.capacity
                ),
            );
            if ui.button("Drop oldest turns and retry").clicked() {
                actions.push(Action::DropOldest(id));
            }
        });
    }
}
