//! Under the settings: Record/Stop, opening a file, and how the job is going (a level meter
//! while recording, progress and time left while transcribing a file), and the last error.

use std::path::PathBuf;

use eframe::egui;

use super::jobs::SILENCE_DB;
use super::{Action, Job, SpeechPanel};
use crate::gui::shared::DialogKind;
use crate::gui::shared::Shared;
use crate::gui::store::speech::{Origin, clock};

pub(super) fn job_rows(
    panel: &mut SpeechPanel,
    shared: &Shared,
    ui: &mut egui::Ui,
    actions: &mut Vec<Action>,
) {
    let ready = shared.speech_info().is_some();
    ui.horizontal(|ui| {
        let size = egui::vec2(110.0, 30.0);
        match &panel.job {
            Some(job) => {
                let label = if job.stopping {
                    "Stopping…"
                } else {
                    "⏹ Stop"
                };
                let stop = egui::Button::new(label).min_size(size);
                if ui.add_enabled(!job.stopping, stop).clicked() {
                    actions.push(Action::Stop);
                }
            }
            None => {
                let record = egui::Button::new("⏺ Record").min_size(size);
                if ui
                    .add_enabled(ready, record)
                    .on_hover_text("Live captions from the input until Stop")
                    .on_disabled_hover_text(shared.speech_not_ready())
                    .clicked()
                {
                    actions.push(Action::Record);
                }
            }
        }
        ui.separator();
        if ui
            .add_enabled(ready, egui::Button::new("Open audio file…"))
            .on_hover_text("WAV, FLAC, MP3, Ogg/Vorbis or M4A/AAC; or drop files on the window")
            .on_disabled_hover_text(shared.speech_not_ready())
            .clicked()
        {
            actions.push(Action::Dialog(DialogKind::OpenAudioFile));
        }
        let r = ui
            .add(
                egui::TextEdit::singleline(&mut panel.file_input)
                    .hint_text("…or an audio file path")
                    .desired_width(220.0),
            )
            .on_hover_text("Audio file path");
        let enter = r.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter));
        let path = panel.file_input.trim();
        let go = ui
            .add_enabled(
                ready && !path.is_empty(),
                egui::Button::new("Transcribe file"),
            )
            .clicked();
        if (go || enter) && ready && !path.is_empty() {
            actions.push(Action::Transcribe(PathBuf::from(path)));
        }
    });
    match &panel.job {
        Some(job) if job.origin == Origin::Recording => recording_status(ui, job),
        Some(job) => file_status(ui, job),
        None => {}
    }
    if let Some(error) = &panel.error {
        ui.horizontal(|ui| {
            ui.colored_label(ui.visuals().error_fg_color, error);
            if ui.small_button("Dismiss").clicked() {
                actions.push(Action::DismissError);
            }
        });
    }
}

fn waiting(ui: &mut egui::Ui, job: &Job) -> bool {
    if job.input.is_some() || job.progress.is_some() {
        return false;
    }
    ui.horizontal(|ui| {
        ui.spinner();
        ui.label(if job.origin == Origin::File {
            "Reading the audio…"
        } else {
            "Opening the input…"
        });
    });
    true
}

/// The input, a level meter, the time recorded, and how far captions lag behind.
fn recording_status(ui: &mut egui::Ui, job: &Job) {
    if waiting(ui, job) {
        return;
    }
    ui.horizontal(|ui| {
        ui.colored_label(ui.visuals().error_fg_color, "⏺");
        ui.label(format!(
            "Recording from {}",
            job.input.as_deref().unwrap_or("the input")
        ));
        let fraction = (job.level_db - SILENCE_DB) / -SILENCE_DB;
        ui.add(
            egui::ProgressBar::new(fraction.clamp(0.0, 1.0))
                .desired_width(160.0)
                .text(format!("{:.0} dB", job.level_db)),
        )
        .on_hover_text("Input level");
        ui.monospace(clock(job.elapsed_s));
        if job.lag_s > 1.0 {
            ui.colored_label(
                ui.visuals().warn_fg_color,
                format!("captions {:.1} s behind", job.lag_s),
            )
            .on_hover_text("Transcription is slower than real time on this GPU");
        }
    });
}

/// Seconds transcribed of the file's total, and an estimate of the time left.
fn file_status(ui: &mut egui::Ui, job: &Job) {
    if waiting(ui, job) {
        return;
    }
    let (done, total) = job.progress.unwrap_or((0.0, 0.0));
    let fraction = if total > 0.0 { done / total } else { 0.0 };
    let elapsed = job.started.elapsed().as_secs_f64();
    let left = if done > 0.0 && total > done {
        format!(" · about {:.0} s left", elapsed * (total - done) / done)
    } else {
        String::new()
    };
    ui.add(
        egui::ProgressBar::new(fraction as f32)
            .desired_width(ui.available_width().min(480.0))
            .text(format!("{done:.1} s of {total:.1} s{left}")),
    )
    .on_hover_text("Transcription progress");
}
