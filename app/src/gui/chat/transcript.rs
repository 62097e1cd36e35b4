//! The transcript (Markdown answers, the one streaming, tool calls laid out, an inline editor
//! for a user message) and the composer with its dictation button.

use std::time::Instant;

use backpack_engine::models::tool_calls::{ParsedCall, ToolFormat};
use eframe::egui;
use egui_commonmark::{CommonMarkCache, CommonMarkViewer};

use super::{Action, ChatPanel};
use crate::gui::shared::{ModelState, Shared};
use crate::gui::store::{Message, Role};

/// Where a message stands, for its buttons and stats line.
struct MessageView<'a> {
    conversation: u64,
    index: usize,
    /// Its answer is streaming: (tokens, first token, started).
    streaming: Option<(usize, Option<Instant>, Instant)>,
    /// The last message, with no answer streaming anywhere: it may be regenerated.
    can_regenerate: bool,
    /// The text being edited, when this user message is.
    editing: Option<&'a mut String>,
    /// How the loaded model writes tool calls, to show them apart from the text.
    tool_format: Option<ToolFormat>,
}

pub(super) fn show(
    panel: &mut ChatPanel,
    shared: &Shared,
    ui: &mut egui::Ui,
    actions: &mut Vec<Action>,
) {
    let Some(id) = panel.selected else {
        return;
    };
    let Some(conv) = shared.store.conversation(id) else {
        return;
    };
    let active = panel
        .active
        .as_ref()
        .filter(|g| g.conversation == id)
        .map(|g| (g.message, g.tokens, g.first_token, g.started));
    let busy = panel.active.is_some();
    let model_ready = matches!(shared.model, ModelState::Ready { .. });
    let tool_format = match &shared.model {
        ModelState::Ready { info, .. } => Some(info.tool_format),
        _ => None,
    };
    let ChatPanel {
        editing, md_cache, ..
    } = panel;
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
                let view = MessageView {
                    conversation: id,
                    index: i,
                    streaming: active.filter(|a| a.0 == i).map(|a| (a.1, a.2, a.3)),
                    can_regenerate: i == last && !busy,
                    editing: match editing {
                        Some((eid, eindex, text)) if *eid == id && *eindex == i => Some(text),
                        _ => None,
                    },
                    tool_format,
                };
                message(ui, m, view, md_cache, actions);
                ui.add_space(6.0);
            }
        });
}

fn message(
    ui: &mut egui::Ui,
    m: &Message,
    view: MessageView<'_>,
    md_cache: &mut CommonMarkCache,
    actions: &mut Vec<Action>,
) {
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
            let (id, i) = (view.conversation, view.index);
            if let Some(text) = view.editing {
                editor(ui, text, id, i, actions);
                return;
            }
            match m.role {
                Role::User => {
                    ui.add(egui::Label::new(&m.content).selectable(true));
                }
                Role::Assistant if m.content.is_empty() && view.streaming.is_some() => {
                    ui.weak("…");
                }
                Role::Assistant => {
                    let (thinking, answer) = split_thinking(&m.content);
                    if let Some(thinking) = thinking {
                        let title = if thinking.finished {
                            "Thought"
                        } else {
                            "Thinking…"
                        };
                        egui::CollapsingHeader::new(egui::RichText::new(title).weak())
                            .id_salt(("thinking", id, i))
                            .default_open(false)
                            .show(ui, |ui| {
                                ui.add(
                                    egui::Label::new(
                                        egui::RichText::new(thinking.text.trim()).weak(),
                                    )
                                    .selectable(true),
                                );
                            });
                    }
                    let (text, calls) = match view.tool_format {
                        Some(format) => format.parse(answer, &[]),
                        None => (answer.to_owned(), Vec::new()),
                    };
                    CommonMarkViewer::new().show_with_id(
                        egui::Id::unique(("message", id, i)),
                        ui,
                        md_cache,
                        &text,
                    );
                    for call in &calls {
                        tool_call(ui, call);
                    }
                }
            }
            if let Some(error) = &m.error {
                ui.colored_label(ui.visuals().error_fg_color, error);
            }
            ui.horizontal(|ui| footer(ui, m, &view, actions));
        });
}

/// A call the model made, as the function's name and its arguments laid out as JSON (the app
/// runs no tools: an answer that calls one ends there).
fn tool_call(ui: &mut egui::Ui, call: &ParsedCall) {
    egui::Frame::group(ui.style()).show(ui, |ui| {
        ui.set_width(ui.available_width());
        ui.label(egui::RichText::new(format!("Tool call: {}", call.name)).strong());
        let arguments = serde_json::to_string_pretty(&call.arguments)
            .unwrap_or_else(|_| call.arguments.to_string());
        ui.add(egui::Label::new(egui::RichText::new(arguments).monospace()).selectable(true));
    });
}

/// The reasoning a thinking model (Qwen3, DeepSeek-R1 distills) writes between `<think>` and
/// `</think>` before its answer, shown folded.
struct Thinking<'a> {
    text: &'a str,
    /// `</think>` has arrived (else the model is still thinking).
    finished: bool,
}

/// Splits a reply into its leading thinking part, if any, and the answer.
fn split_thinking(content: &str) -> (Option<Thinking<'_>>, &str) {
    let Some(rest) = content.trim_start().strip_prefix("<think>") else {
        return (None, content);
    };
    match rest.split_once("</think>") {
        Some((text, answer)) => (
            Some(Thinking {
                text,
                finished: true,
            }),
            answer.trim_start(),
        ),
        None => (
            Some(Thinking {
                text: rest,
                finished: false,
            }),
            "",
        ),
    }
}

fn editor(ui: &mut egui::Ui, text: &mut String, id: u64, i: usize, actions: &mut Vec<Action>) {
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
}

/// The stats line and the message's buttons.
fn footer(ui: &mut egui::Ui, m: &Message, view: &MessageView<'_>, actions: &mut Vec<Action>) {
    if let Some(s) = &m.stats {
        ui.weak(format!(
            "{} tokens · TTFT {:.0} ms · {:.1} tokens/s · {}",
            s.tokens, s.ttft_ms, s.tokens_per_s, s.stop
        ));
    } else if let Some((tokens, first, started)) = view.streaming {
        let ttft = first.map(|f| f.duration_since(started));
        ui.weak(match ttft {
            Some(t) => format!("{tokens} tokens · TTFT {:.0} ms", t.as_secs_f64() * 1e3),
            None => "reading the prompt…".into(),
        });
    }
    let streaming = view.streaming.is_some();
    if !streaming && !m.content.is_empty() && ui.small_button("Copy").clicked() {
        actions.push(Action::Copy(m.content.clone()));
    }
    if m.role == Role::User && !streaming && ui.small_button("Edit").clicked() {
        actions.push(Action::StartEdit(view.conversation, view.index));
    }
    if m.role == Role::Assistant && view.can_regenerate && ui.small_button("Regenerate").clicked() {
        actions.push(Action::Regenerate(view.conversation));
    }
}

pub(super) fn composer(
    panel: &mut ChatPanel,
    shared: &Shared,
    ui: &mut egui::Ui,
    actions: &mut Vec<Action>,
) {
    ui.add_space(6.0);
    let line = panel.dictation.is_some() || panel.dictation_note.is_some();
    if line != std::mem::replace(&mut panel.dictation_line, line) {
        // The panel takes its new height on the next frame; don't wait for input to draw it.
        ui.ctx().request_repaint();
    }
    dictation_line(panel, ui, actions);
    let busy = panel.active.is_some();
    ui.horizontal(|ui| {
        let button_width = 84.0;
        let mic_width = 36.0;
        let edit = egui::TextEdit::multiline(&mut panel.input)
            .hint_text("Message the model (Enter sends, Shift+Enter adds a line)")
            .desired_rows(2)
            .desired_width(ui.available_width() - button_width - mic_width - 16.0)
            // Only Shift+Enter inserts a newline; plain Enter sends.
            .return_key(egui::KeyboardShortcut::new(
                egui::Modifiers::SHIFT,
                egui::Key::Enter,
            ))
            .id_salt("composer");
        let response = ui.add(edit).on_hover_text("Message");
        if std::mem::take(&mut panel.focus_composer) {
            response.request_focus();
        }
        let enter = response.has_focus()
            && ui.input(|i| i.key_pressed(egui::Key::Enter) && !i.modifiers.shift);
        mic_button(panel, shared, ui, mic_width, actions);
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

/// Starts or stops dictation; lit while dictating.
fn mic_button(
    panel: &ChatPanel,
    shared: &Shared,
    ui: &mut egui::Ui,
    width: f32,
    actions: &mut Vec<Action>,
) {
    let dictating = panel.dictation.is_some();
    let hint = if dictating {
        "Stop dictating (the last words are kept)".to_owned()
    } else if shared.speech_info().is_some() {
        "Dictate: speak, and the words are added to the message".to_owned()
    } else {
        format!("Dictate: {}", shared.speech_not_ready())
    };
    let mic = egui::Button::new(egui::RichText::new("🎤").size(18.0)).selected(dictating);
    if ui
        .add_sized([width, 36.0], mic)
        .on_hover_text(hint)
        .clicked()
    {
        actions.push(Action::Dictate);
    }
}

/// While dictating, the words not yet committed; otherwise why dictation stopped.
fn dictation_line(panel: &ChatPanel, ui: &mut egui::Ui, actions: &mut Vec<Action>) {
    if let Some(d) = &panel.dictation {
        let status = if d.stopping {
            "Finishing…"
        } else {
            "Listening…"
        };
        ui.horizontal(|ui| {
            ui.colored_label(ui.visuals().error_fg_color, "⏺");
            ui.weak(status);
            if !d.partial.trim().is_empty() {
                let partial = egui::RichText::new(d.partial.trim()).weak().italics();
                ui.add(egui::Label::new(partial).truncate());
            }
        });
    } else if let Some(note) = &panel.dictation_note {
        ui.horizontal(|ui| {
            ui.colored_label(ui.visuals().warn_fg_color, note);
            if ui.small_button("Dismiss").clicked() {
                actions.push(Action::DismissDictationNote);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::split_thinking;

    #[test]
    fn thinking_is_split_from_the_answer() {
        let (t, a) = split_thinking("<think>\nweigh it\n</think>\n\nYes.");
        let t = t.expect("thinking");
        assert_eq!((t.text, t.finished, a), ("\nweigh it\n", true, "Yes."));
        let (t, a) = split_thinking("<think>still going");
        let t = t.expect("thinking");
        assert_eq!((t.text, t.finished, a), ("still going", false, ""));
        let (t, a) = split_thinking("No <think> here");
        assert!(t.is_none());
        assert_eq!(a, "No <think> here");
    }
}
