//! The selected transcript: its title and commands, what it is, and its segments with their
//! times (a click copies one), the partial text of a recording dimmer after them.

use eframe::egui;

use super::list::export_menu;
use super::{Action, Job, SpeechPanel};
use crate::gui::common::display_name;
use crate::gui::shared::Shared;
use crate::gui::store::speech::{Origin, Transcript, clock};

pub(super) fn show(
    panel: &SpeechPanel,
    shared: &Shared,
    ui: &mut egui::Ui,
    actions: &mut Vec<Action>,
) {
    let Some(t) = panel.selected.and_then(|id| shared.store.transcript(id)) else {
        ui.add_space(24.0);
        ui.vertical_centered(|ui| {
            ui.weak(
                "Record, or open an audio file (or drop one on the window), to make a transcript.",
            );
        });
        return;
    };
    let job = panel.job.as_ref().filter(|j| j.transcript == t.id);
    title_row(ui, t, actions);
    ui.weak(describe(t, job));
    if let Some(error) = &t.error {
        ui.colored_label(ui.visuals().error_fg_color, error);
    }
    ui.add_space(4.0);
    egui::ScrollArea::vertical()
        .auto_shrink(false)
        .stick_to_bottom(true)
        .show(ui, |ui| segments(ui, t, job, actions));
}

fn title_row(ui: &mut egui::Ui, t: &Transcript, actions: &mut Vec<Action>) {
    // The buttons keep their room; a long title is cut short.
    egui::Sides::new().shrink_left().truncate().show(
        ui,
        |ui| {
            ui.add(egui::Label::new(egui::RichText::new(&t.title).heading()).truncate());
        },
        |ui| {
            if ui.button("Delete").clicked() {
                actions.push(Action::Delete(t.id));
            }
            export_menu(ui, t.id, actions);
            if ui.button("Rename").clicked() {
                actions.push(Action::StartRename(t.id));
            }
            if ui
                .add_enabled(!t.segments.is_empty(), egui::Button::new("Copy all"))
                .on_hover_text("Copy the whole text")
                .clicked()
            {
                actions.push(Action::Copy(t.text()));
            }
        },
    );
}

/// Where the audio came from, its language and length, the model, and how it ended.
fn describe(t: &Transcript, job: Option<&Job>) -> String {
    let mut parts = vec![match (&t.origin, &t.file) {
        (Origin::File, Some(file)) => display_name(file),
        (Origin::File, None) => "Audio file".into(),
        (Origin::Recording, _) => "Recording".into(),
    }];
    if let Some(code) = &t.language {
        parts.push(super::controls::language_name(Some(code)));
    }
    match job {
        Some(j) if j.origin == Origin::Recording => parts.push("recording…".into()),
        Some(_) => parts.push("transcribing…".into()),
        None if t.audio_s > 0.0 => parts.push(format!("{:.1} s of audio", t.audio_s)),
        None => {}
    }
    if let Some(model) = &t.model {
        parts.push(display_name(model));
    }
    if t.stopped {
        parts.push("stopped before the end".into());
    }
    parts.join(" · ")
}

fn segments(ui: &mut egui::Ui, t: &Transcript, job: Option<&Job>, actions: &mut Vec<Action>) {
    for line in &t.segments {
        ui.horizontal_top(|ui| {
            let stamp = format!("[{} → {}]", clock(line.start), clock(line.end));
            let r = ui
                .add(egui::Button::new(egui::RichText::new(stamp).monospace().weak()).frame(false))
                .on_hover_text("Copy the time");
            if r.clicked() {
                actions.push(Action::Copy(clock(line.start)));
            }
            ui.add(egui::Label::new(&line.text).wrap().selectable(true));
        });
    }
    let partial = job
        .map(|j| (j.partial.trim(), j.partial_span))
        .filter(|(p, _)| !p.is_empty());
    if let Some((partial, (start, end))) = partial {
        ui.horizontal_top(|ui| {
            let stamp = format!("[{} → {}]", clock(start), clock(end));
            let stamp = egui::RichText::new(stamp).monospace().weak();
            ui.add_enabled(false, egui::Button::new(stamp).frame(false));
            ui.add(egui::Label::new(egui::RichText::new(partial).weak().italics()).wrap());
        });
    }
    if t.segments.is_empty() && partial.is_none() {
        ui.add_space(12.0);
        ui.weak(match job {
            Some(j) if j.origin == Origin::Recording => {
                "Listening… speak, and the text appears here."
            }
            Some(_) => "Transcribing… segments appear here as they finish.",
            None => "No speech was recognized.",
        });
    }
}
