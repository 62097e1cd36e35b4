//! Small helpers and widgets more than one panel uses.

use std::path::Path;

use backpack_engine::load::ReasoningEffort;
use eframe::egui;

use super::store::{Preset, Sampling};
pub use crate::units::format_bytes;

pub fn display_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// One "key: value" row of a two-column grid.
pub fn info_row(ui: &mut egui::Ui, key: &str, value: String) {
    ui.label(key);
    ui.label(value);
    ui.end_row();
}

/// Preset buttons, then sliders for one set of sampling settings (a chat's, or the defaults
/// for new chats). A preset keeps the max tokens and seed already chosen.
pub fn sampling_editor(ui: &mut egui::Ui, s: &mut Sampling, context: Option<u32>) {
    ui.horizontal(|ui| {
        ui.label("Preset");
        let current = Preset::matching(s);
        for preset in Preset::ALL {
            if ui
                .selectable_label(current == Some(preset), preset.name())
                .clicked()
            {
                let keep = (s.max_tokens, s.seed, s.thinking, s.reasoning_effort);
                *s = preset.sampling();
                (s.max_tokens, s.seed, s.thinking, s.reasoning_effort) = keep;
            }
        }
    });
    sampling_controls(ui, s, context);
}

fn sampling_controls(ui: &mut egui::Ui, s: &mut Sampling, context: Option<u32>) {
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
            let l = ui.label("Thinking");
            ui.checkbox(&mut s.thinking, "Think before answering")
                .labelled_by(l.id)
                .on_hover_text(
                    "Reasoning models with a thinking switch (Qwen3, Qwen3.5) write their reasoning first, \
                     shown folded; off answers directly",
                );
            ui.end_row();
            let l = ui.label("Reasoning effort");
            ui.horizontal(|ui| {
                for (effort, name) in [
                    (None, "Default"),
                    (Some(ReasoningEffort::Low), "Low"),
                    (Some(ReasoningEffort::Medium), "Medium"),
                    (Some(ReasoningEffort::High), "High"),
                ] {
                    ui.selectable_value(&mut s.reasoning_effort, effort, name)
                        .labelled_by(l.id);
                }
            })
            .response
            .on_hover_text(
                "How long models whose chat template takes it (GPT-OSS) reason before answering; \
                 Default leaves it to the template",
            );
            ui.end_row();
        });
}
