//! The chat panel: conversation list with search, the transcript (Markdown, streaming), per
//! conversation system prompt, model and sampling, a context meter, and the composer.

use eframe::egui;
use egui_commonmark::CommonMarkViewer;

use super::dialogs::DialogKind;
use super::store::{Preset, Role};
use super::{BackpackApp, ModelState, display_name};

/// What a click asked for; applied after the frame's widgets are laid out.
enum Action {
    New,
    Select(u64),
    StartRename(u64),
    FinishRename,
    Delete(u64),
    Export(DialogKind),
    Send,
    Stop,
    Regenerate(u64),
    StartEdit(u64, usize),
    CancelEdit,
    Resend(u64, usize),
    Copy(String),
    DropOldest(u64),
    LoadModel(std::path::PathBuf),
    OpenModel,
    DismissError,
}

pub fn show(app: &mut BackpackApp, ui: &mut egui::Ui) {
    let mut actions = Vec::new();
    egui::Panel::left("conversations")
        .default_size(230.0)
        .min_size(160.0)
        .show(ui, |ui| conversation_list(app, ui, &mut actions));
    egui::Panel::bottom("composer").show(ui, |ui| composer(app, ui, &mut actions));
    egui::CentralPanel::default().show(ui, |ui| {
        header(app, ui, &mut actions);
        transcript(app, ui, &mut actions);
    });
    let ctx = ui.ctx().clone();
    for action in actions {
        apply(app, action, &ctx);
    }
}

fn apply(app: &mut BackpackApp, action: Action, ctx: &egui::Context) {
    match action {
        Action::New => {
            app.new_conversation();
        }
        Action::Select(id) => {
            app.store.state.selected_conversation = Some(id);
            app.editing = None;
            app.store.mark_dirty();
        }
        Action::StartRename(id) => {
            let title = app
                .store
                .conversation(id)
                .map(|c| c.title.clone())
                .unwrap_or_default();
            app.renaming = Some((id, title));
        }
        Action::FinishRename => {
            if let Some((id, title)) = app.renaming.take()
                && let Some(c) = app.store.conversation_mut(id)
                && !title.trim().is_empty()
            {
                c.title = title.trim().to_owned();
                app.store.mark_dirty();
            }
        }
        Action::Delete(id) => app.delete_conversation(id),
        Action::Export(kind) => app.open_dialog(kind, ctx),
        Action::Send => app.submit_input(),
        Action::Stop => app.stop(),
        Action::Regenerate(id) => app.regenerate(id),
        Action::StartEdit(id, index) => {
            let text = app
                .store
                .conversation(id)
                .and_then(|c| c.messages.get(index))
                .map(|m| m.content.clone())
                .unwrap_or_default();
            app.editing = Some((id, index, text));
        }
        Action::CancelEdit => app.editing = None,
        Action::Resend(id, index) => {
            if let Some((_, _, text)) = app.editing.clone() {
                app.edit_and_resend(id, index, &text);
            }
        }
        Action::Copy(text) => ctx.copy_text(text),
        Action::DropOldest(id) => app.drop_oldest_and_retry(id),
        Action::LoadModel(path) => app.load_model(&path),
        Action::OpenModel => app.open_dialog(DialogKind::OpenModelFile, ctx),
        Action::DismissError => app.model_error = None,
    }
}

fn conversation_list(app: &mut BackpackApp, ui: &mut egui::Ui, actions: &mut Vec<Action>) {
    ui.add_space(6.0);
    if ui
        .add_sized([ui.available_width(), 28.0], egui::Button::new("New chat"))
        .clicked()
    {
        actions.push(Action::New);
    }
    ui.add_space(4.0);
    ui.add(
        egui::TextEdit::singleline(&mut app.search)
            .hint_text("Search chats")
            .desired_width(f32::INFINITY),
    )
    .on_hover_text("Search chats");
    ui.add_space(4.0);
    let selected = app.selected_id();
    egui::ScrollArea::vertical()
        .auto_shrink(false)
        .show(ui, |ui| {
            // Newest first.
            for conv in app.store.conversations.iter().rev() {
                if !conv.matches(&app.search) {
                    continue;
                }
                if let Some((id, title)) = &mut app.renaming
                    && *id == conv.id
                {
                    let r = ui.add(
                        egui::TextEdit::singleline(title)
                            .desired_width(f32::INFINITY)
                            .hint_text("Chat title"),
                    );
                    r.request_focus();
                    let r = r.on_hover_text("Chat title");
                    if r.lost_focus() || ui.input(|i| i.key_pressed(egui::Key::Enter)) {
                        actions.push(Action::FinishRename);
                    }
                    continue;
                }
                let is_selected = selected == Some(conv.id);
                let r = ui.add_sized(
                    [ui.available_width(), 24.0],
                    egui::Button::selectable(is_selected, conv.title.as_str()),
                );
                if r.clicked() {
                    actions.push(Action::Select(conv.id));
                }
                if r.double_clicked() {
                    actions.push(Action::StartRename(conv.id));
                }
                r.context_menu(|ui| {
                    if ui.button("Rename").clicked() {
                        actions.push(Action::StartRename(conv.id));
                    }
                    if ui.button("Export as Markdown…").clicked() {
                        actions.push(Action::Export(DialogKind::ExportMarkdown(conv.id)));
                    }
                    if ui.button("Export as JSON…").clicked() {
                        actions.push(Action::Export(DialogKind::ExportJson(conv.id)));
                    }
                    if ui.button("Delete").clicked() {
                        actions.push(Action::Delete(conv.id));
                    }
                });
            }
        });
}

fn header(app: &mut BackpackApp, ui: &mut egui::Ui, actions: &mut Vec<Action>) {
    let Some(id) = app.selected_id() else {
        return;
    };
    let context = app.model_info().map(|i| i.context);
    let loaded = app.model_path().map(std::path::Path::to_owned);
    let recent = app.store.state.recent_models.clone();
    let models = app.downloads.as_ref().map(|d| d.models.clone());
    let generating = app.active.as_ref().is_some_and(|g| g.conversation == id);
    let live_tokens = app
        .active
        .as_ref()
        .filter(|g| g.conversation == id)
        .map_or(0, |g| g.tokens);
    let Some(conv) = app.store.conversation_mut(id) else {
        return;
    };
    let before = (
        conv.system_prompt.clone(),
        conv.sampling.clone(),
        conv.model.clone(),
    );
    ui.horizontal(|ui| {
        ui.heading(&conv.title);
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
            ui.toggle_value(&mut app.show_chat_settings, "Chat settings");
        });
    });
    ui.horizontal(|ui| {
        ui.label("Model");
        let current = conv
            .model
            .as_deref()
            .or(loaded.as_deref())
            .map_or_else(|| "none".to_owned(), display_name);
        egui::ComboBox::from_id_salt("conversation-model")
            .selected_text(current)
            .width(260.0)
            .show_ui(ui, |ui| {
                // Read only while the list is open.
                let installed = models.as_ref().map(|l| l.list()).unwrap_or_default();
                for path in &recent {
                    let is_loaded = loaded.as_deref() == Some(path.as_path());
                    if ui
                        .selectable_label(is_loaded, display_name(path))
                        .on_hover_text(path.display().to_string())
                        .clicked()
                        && !is_loaded
                    {
                        conv.model = Some(path.clone());
                        actions.push(Action::LoadModel(path.clone()));
                    }
                }
                let installed: Vec<_> = installed
                    .iter()
                    .map(|m| (m.repo.clone(), m.model_path()))
                    .filter(|(_, p)| !recent.contains(p))
                    .collect();
                if !installed.is_empty() {
                    ui.separator();
                    ui.weak("Installed");
                }
                for (repo, path) in installed {
                    if ui.selectable_label(false, repo).clicked() {
                        conv.model = Some(path.clone());
                        actions.push(Action::LoadModel(path));
                    }
                }
                ui.separator();
                if ui.button("Open model…").clicked() {
                    actions.push(Action::OpenModel);
                }
            })
            .response
            .on_hover_text("Model for this chat");
        if let (Some(wanted), false) = (&conv.model, conv.model == loaded)
            && wanted.exists()
            && ui
                .button(format!("Load {}", display_name(wanted)))
                .on_hover_text("This chat was held with another model")
                .clicked()
        {
            actions.push(Action::LoadModel(wanted.clone()));
        }
        // The context meter: what the last answer left in the context, plus what is streaming.
        if let Some(context) = context {
            let used = conv.context_used.unwrap_or(0) + live_tokens;
            let fraction = (used as f32 / context.max(1) as f32).min(1.0);
            let bar = egui::ProgressBar::new(fraction)
                .desired_width(200.0)
                .text(format!("{used} / {context} tokens"));
            ui.add(bar).on_hover_text(
                "Tokens in the model's context after the last answer. When a prompt no longer fits, the oldest turns can be dropped.",
            );
        }
    });
    if app.show_chat_settings {
        ui.group(|ui| {
            ui.label("System prompt");
            ui.add(
                egui::TextEdit::multiline(&mut conv.system_prompt)
                    .hint_text("Instructions for the model in this chat")
                    .desired_rows(2)
                    .desired_width(f32::INFINITY),
            )
            .on_hover_text("System prompt");
            ui.horizontal(|ui| {
                ui.label("Preset");
                let current = Preset::matching(&conv.sampling);
                for preset in Preset::ALL {
                    if ui
                        .selectable_label(current == Some(preset), preset.name())
                        .clicked()
                    {
                        let keep = (conv.sampling.max_tokens, conv.sampling.seed);
                        conv.sampling = preset.sampling();
                        (conv.sampling.max_tokens, conv.sampling.seed) = keep;
                    }
                }
            });
            sampling_controls(ui, &mut conv.sampling, context);
        });
    }
    let changed = before
        != (
            conv.system_prompt.clone(),
            conv.sampling.clone(),
            conv.model.clone(),
        );
    if changed {
        app.store.mark_dirty();
    }
    if generating {
        ui.ctx()
            .request_repaint_after(std::time::Duration::from_millis(250));
    }
    ui.separator();
    if let Some(error) = &app.model_error {
        ui.horizontal(|ui| {
            ui.colored_label(ui.visuals().error_fg_color, error);
            if ui.small_button("Dismiss").clicked() {
                actions.push(Action::DismissError);
            }
        });
    }
    if let Some(o) = app.overflow.as_ref().filter(|o| o.conversation == id) {
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

/// Sliders for one set of sampling settings (shared with the Settings panel's defaults).
pub fn sampling_controls(ui: &mut egui::Ui, s: &mut super::store::Sampling, context: Option<u32>) {
    egui::Grid::new(ui.next_auto_id())
        .num_columns(2)
        .spacing([12.0, 4.0])
        .show(ui, |ui| {
            let l = ui.label("Temperature");
            ui.add(egui::Slider::new(&mut s.temperature, 0.0..=2.0).step_by(0.05))
                .labelled_by(l.id)
                .on_hover_text("0 always picks the most likely token");
            ui.end_row();
            let l = ui.label("Top-p");
            ui.add(egui::Slider::new(&mut s.top_p, 0.05..=1.0).step_by(0.01))
                .labelled_by(l.id);
            ui.end_row();
            let l = ui.label("Top-k");
            ui.add(egui::Slider::new(&mut s.top_k, 0..=200))
                .labelled_by(l.id)
                .on_hover_text("0 turns top-k off");
            ui.end_row();
            let l = ui.label("Repetition penalty");
            ui.add(egui::Slider::new(&mut s.repeat_penalty, 1.0..=2.0).step_by(0.01))
                .labelled_by(l.id);
            ui.end_row();
            let l = ui.label("Max new tokens");
            ui.add(egui::Slider::new(
                &mut s.max_tokens,
                1..=context.unwrap_or(8192).max(16),
            ))
            .labelled_by(l.id);
            ui.end_row();
            let l = ui.label("Seed");
            ui.horizontal(|ui| {
                let mut fixed = s.seed.is_some();
                if ui.checkbox(&mut fixed, "Fixed").changed() {
                    s.seed = fixed.then_some(0);
                }
                if let Some(seed) = &mut s.seed {
                    ui.add(egui::DragValue::new(seed)).labelled_by(l.id);
                } else {
                    ui.weak("new for every answer");
                }
            });
            ui.end_row();
        });
}

fn transcript(app: &mut BackpackApp, ui: &mut egui::Ui, actions: &mut Vec<Action>) {
    let Some(id) = app.selected_id() else {
        return;
    };
    let active = app
        .active
        .as_ref()
        .filter(|g| g.conversation == id)
        .map(|g| (g.message, g.tokens, g.first_token, g.started));
    let busy = app.active.is_some();
    let model_ready = matches!(app.model, ModelState::Ready { .. });
    let BackpackApp {
        store,
        editing,
        md_cache,
        ..
    } = app;
    let Some(conv) = store.conversation(id) else {
        return;
    };
    let last = conv.messages.len().saturating_sub(1);
    egui::ScrollArea::vertical()
        .auto_shrink(false)
        .stick_to_bottom(true)
        .show(ui, |ui| {
            if conv.messages.is_empty() {
                ui.add_space(24.0);
                ui.vertical_centered(|ui| {
                    ui.weak(if model_ready {
                        "Type a message below to start."
                    } else {
                        "Open a model in Models, then type a message below."
                    });
                });
            }
            for (i, m) in conv.messages.iter().enumerate() {
                let streaming = active.is_some_and(|a| a.0 == i);
                let fill = match m.role {
                    Role::User => ui.visuals().faint_bg_color,
                    Role::Assistant => ui.visuals().panel_fill,
                };
                egui::Frame::new()
                    .fill(fill)
                    .inner_margin(8.0)
                    .corner_radius(6.0)
                    .show(ui, |ui| {
                        ui.set_width(ui.available_width());
                        ui.label(
                            egui::RichText::new(match m.role {
                                Role::User => "You",
                                Role::Assistant => "Assistant",
                            })
                            .strong(),
                        );
                        if let Some((eid, eindex, text)) = editing.as_mut()
                            && *eid == id
                            && *eindex == i
                        {
                            ui.add(
                                egui::TextEdit::multiline(text)
                                    .desired_width(f32::INFINITY)
                                    .hint_text("Edit the message"),
                            )
                            .on_hover_text("Edit the message");
                            ui.horizontal(|ui| {
                                if ui.button("Save & resend").clicked() {
                                    actions.push(Action::Resend(id, i));
                                }
                                if ui.button("Cancel").clicked() {
                                    actions.push(Action::CancelEdit);
                                }
                            });
                            return;
                        }
                        match m.role {
                            Role::User => {
                                ui.add(egui::Label::new(&m.content).selectable(true));
                            }
                            Role::Assistant if m.content.is_empty() && streaming => {
                                ui.weak("…");
                            }
                            Role::Assistant => {
                                CommonMarkViewer::new().show_with_id(
                                    egui::Id::unique(("message", id, i)),
                                    ui,
                                    md_cache,
                                    &m.content,
                                );
                            }
                        }
                        if let Some(error) = &m.error {
                            ui.colored_label(ui.visuals().error_fg_color, error);
                        }
                        ui.horizontal(|ui| {
                            if let Some(s) = &m.stats {
                                ui.weak(format!(
                                    "{} tokens · TTFT {:.0} ms · {:.1} tokens/s · {}",
                                    s.tokens, s.ttft_ms, s.tokens_per_s, s.stop
                                ));
                            } else if let Some((_, tokens, first, started)) =
                                active.filter(|_| streaming)
                            {
                                let ttft = first.map(|f| f.duration_since(started));
                                ui.weak(match ttft {
                                    Some(t) => format!(
                                        "{tokens} tokens · TTFT {:.0} ms",
                                        t.as_secs_f64() * 1e3
                                    ),
                                    None => "reading the prompt…".into(),
                                });
                            }
                            if !streaming
                                && !m.content.is_empty()
                                && ui.small_button("Copy").clicked()
                            {
                                actions.push(Action::Copy(m.content.clone()));
                            }
                            if m.role == Role::User
                                && !streaming
                                && ui.small_button("Edit").clicked()
                            {
                                actions.push(Action::StartEdit(id, i));
                            }
                            if m.role == Role::Assistant
                                && i == last
                                && !busy
                                && ui.small_button("Regenerate").clicked()
                            {
                                actions.push(Action::Regenerate(id));
                            }
                        });
                    });
                ui.add_space(6.0);
            }
        });
}

fn composer(app: &mut BackpackApp, ui: &mut egui::Ui, actions: &mut Vec<Action>) {
    ui.add_space(6.0);
    let busy = app.active.is_some();
    ui.horizontal(|ui| {
        let button_width = 84.0;
        let edit = egui::TextEdit::multiline(&mut app.input)
            .hint_text("Message the model (Enter sends, Shift+Enter adds a line)")
            .desired_rows(2)
            .desired_width(ui.available_width() - button_width - 8.0)
            // Only Shift+Enter inserts a newline; plain Enter sends.
            .return_key(egui::KeyboardShortcut::new(
                egui::Modifiers::SHIFT,
                egui::Key::Enter,
            ))
            .id_salt("composer");
        let response = ui.add(edit).on_hover_text("Message");
        if std::mem::take(&mut app.focus_composer) {
            response.request_focus();
        }
        let enter = response.has_focus()
            && ui.input(|i| i.key_pressed(egui::Key::Enter) && !i.modifiers.shift);
        if busy {
            if ui
                .add_sized([button_width, 36.0], egui::Button::new("Stop"))
                .clicked()
            {
                actions.push(Action::Stop);
            }
        } else if ui
            .add_sized([button_width, 36.0], egui::Button::new("Send"))
            .clicked()
            || enter
        {
            actions.push(Action::Send);
        }
    });
    ui.add_space(6.0);
}
