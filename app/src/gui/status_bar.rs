//! The status bar: the model (or the remote backend answering) and what it costs, the answer speed, and the GPU. The left items
//! come first; the GPU takes the room left on the right and is elided (full text on hover),
//! so the two never overlap however narrow the window.

use eframe::egui;

use super::common::{display_name, format_bytes};
use super::shared::{ModelState, Shared};

/// Room always left to the GPU item; the left items are elided before they take it.
const GPU_MIN_WIDTH: f32 = 120.0;
/// Left items that would get less room than this are left out rather than shown as "…".
const ITEM_MIN_WIDTH: f32 = 24.0;

enum Item {
    Spinner,
    Separator,
    Text(egui::WidgetText),
}

/// `remote`: the remote model answering the chat, shown in place of the local one; `speed`:
/// the chat's answer speed; `frame_ms`: UI time per frame, shown while answering.
pub fn show(
    ui: &mut egui::Ui,
    shared: &Shared,
    remote: Option<String>,
    speed: Option<String>,
    frame_ms: Option<f32>,
) {
    let mut items = match remote {
        Some(source) => vec![Item::Text(egui::RichText::new(source).strong().into())],
        None => model_items(&shared.model),
    };
    items.push(Item::Separator);
    items.extend(speed.map(|s| Item::Text(s.into())));
    items.extend(frame_ms.map(|ms| Item::Text(format!("UI {ms:.1} ms/frame").into())));
    egui::Sides::new().shrink_right().truncate().show(
        ui,
        |ui| {
            ui.set_max_width((ui.available_width() - GPU_MIN_WIDTH).max(0.0));
            ui.style_mut().wrap_mode = Some(egui::TextWrapMode::Truncate);
            for item in items {
                if ui.available_width() < ITEM_MIN_WIDTH {
                    break;
                }
                match item {
                    Item::Spinner => ui.spinner(),
                    Item::Separator => ui.separator(),
                    Item::Text(text) => ui.label(text),
                };
            }
        },
        |ui| gpu_item(ui, shared),
    );
}

fn model_items(model: &ModelState) -> Vec<Item> {
    match model {
        ModelState::None => vec![Item::Text("No model loaded".into())],
        ModelState::Loading(path) => vec![
            Item::Spinner,
            Item::Text(format!("Loading {}…", display_name(path)).into()),
        ],
        ModelState::Ready { info, .. } => vec![
            Item::Text(egui::RichText::new(&info.name).strong().into()),
            Item::Separator,
            Item::Text(
                match info.state_bytes {
                    0 => format!(
                        "Weights {} · KV cache {}",
                        format_bytes(info.weight_bytes),
                        format_bytes(info.cache_bytes)
                    ),
                    state => format!(
                        "Weights {} · KV cache {} · state {}",
                        format_bytes(info.weight_bytes),
                        format_bytes(info.cache_bytes - state),
                        format_bytes(state)
                    ),
                }
                .into(),
            ),
        ],
    }
}

fn gpu_item(ui: &mut egui::Ui, shared: &Shared) {
    match &shared.gpu {
        Some(gpu) if gpu.software => {
            let text = format!(
                "⚠ CPU adapter {} ({}): no GPU found, models run slowly",
                gpu.name, gpu.backend
            );
            ui.colored_label(ui.visuals().warn_fg_color, &text)
                .on_hover_text(text);
        }
        Some(gpu) => {
            let text = format!("GPU {} ({})", gpu.name, gpu.backend);
            ui.label(&text).on_hover_text(text);
        }
        None => {
            ui.colored_label(ui.visuals().error_fg_color, "No GPU");
        }
    }
}
