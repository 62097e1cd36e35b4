//! The transcript list: search, and each transcript with rename, export and delete.

use eframe::egui;

use super::{Action, SpeechPanel};
use crate::gui::shared::DialogKind;
use crate::gui::shared::Shared;
use crate::gui::store::speech::{Transcript, TranscriptFormat};

pub(super) fn show(
    panel: &mut SpeechPanel,
    shared: &Shared,
    ui: &mut egui::Ui,
    actions: &mut Vec<Action>,
) {
    ui.add_space(6.0);
    ui.add(
        egui::TextEdit::singleline(&mut panel.search)
            .hint_text("Search transcripts")
            .desired_width(f32::INFINITY),
    )
    .on_hover_text("Search transcripts");
    ui.add_space(4.0);
    egui::ScrollArea::vertical()
        .auto_shrink(false)
        .show(ui, |ui| {
            if shared.store.transcripts.is_empty() {
                ui.weak("Recordings and transcribed files appear here.");
            }
            // Newest first.
            for t in shared.store.transcripts.iter().rev() {
                if !t.matches(&panel.search) {
                    continue;
                }
                match &mut panel.renaming {
                    Some((id, title)) if *id == t.id => rename_field(ui, title, actions),
                    _ => entry(ui, t, panel.selected == Some(t.id), actions),
                }
            }
        });
}

fn rename_field(ui: &mut egui::Ui, title: &mut String, actions: &mut Vec<Action>) {
    let r = ui.add(
        egui::TextEdit::singleline(title)
            .desired_width(f32::INFINITY)
            .hint_text("Transcript title"),
    );
    r.request_focus();
    let r = r.on_hover_text("Transcript title");
    if r.lost_focus() || ui.input(|i| i.key_pressed(egui::Key::Enter)) {
        actions.push(Action::FinishRename);
    }
}

fn entry(ui: &mut egui::Ui, t: &Transcript, selected: bool, actions: &mut Vec<Action>) {
    let r = ui.add_sized(
        [ui.available_width(), 24.0],
        egui::Button::selectable(selected, t.title.as_str()).truncate(),
    );
    if r.clicked() {
        actions.push(Action::Select(t.id));
    }
    if r.double_clicked() {
        actions.push(Action::StartRename(t.id));
    }
    r.context_menu(|ui| {
        if ui.button("Rename").clicked() {
            actions.push(Action::StartRename(t.id));
        }
        export_menu(ui, t.id, actions);
        if ui.button("Delete").clicked() {
            actions.push(Action::Delete(t.id));
        }
    });
}

/// One entry per export format, each asking where to save.
pub(super) fn export_menu(ui: &mut egui::Ui, id: u64, actions: &mut Vec<Action>) {
    ui.menu_button("Export", |ui| {
        for format in TranscriptFormat::ALL {
            let label = format!("{} (.{})…", format.name(), format.extension());
            if ui.button(label).clicked() {
                actions.push(Action::Dialog(DialogKind::ExportTranscript(id, format)));
                ui.close();
            }
        }
    });
}
