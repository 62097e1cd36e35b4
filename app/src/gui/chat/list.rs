//! The conversation list: new chat, search, and each conversation with rename, export and
//! delete.

use eframe::egui;

use super::{Action, ChatPanel};
use crate::gui::shared::DialogKind;
use crate::gui::shared::Shared;
use crate::gui::store::Conversation;

pub(super) fn show(
    panel: &mut ChatPanel,
    shared: &Shared,
    ui: &mut egui::Ui,
    actions: &mut Vec<Action>,
) {
    ui.add_space(6.0);
    if ui
        .add_sized([ui.available_width(), 28.0], egui::Button::new("New chat"))
        .clicked()
    {
        actions.push(Action::New);
    }
    ui.add_space(4.0);
    ui.add(
        egui::TextEdit::singleline(&mut panel.search)
            .hint_text("Search chats")
            .desired_width(f32::INFINITY),
    )
    .on_hover_text("Search chats");
    ui.add_space(4.0);
    egui::ScrollArea::vertical()
        .auto_shrink(false)
        .show(ui, |ui| {
            // Newest first.
            for conv in shared.store.conversations.iter().rev() {
                if !conv.matches(&panel.search) {
                    continue;
                }
                match &mut panel.renaming {
                    Some((id, title)) if *id == conv.id => rename_field(ui, title, actions),
                    _ => entry(ui, conv, panel.selected == Some(conv.id), actions),
                }
            }
        });
}

fn rename_field(ui: &mut egui::Ui, title: &mut String, actions: &mut Vec<Action>) {
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
}

fn entry(ui: &mut egui::Ui, conv: &Conversation, selected: bool, actions: &mut Vec<Action>) {
    let r = ui.add_sized(
        [ui.available_width(), 24.0],
        egui::Button::selectable(selected, conv.title.as_str()),
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
