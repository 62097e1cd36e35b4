//! The desktop app as a library, so tests can drive the real app struct (`gui::BackpackApp`)
//! without a window.

pub mod gui;
pub mod hub;
pub mod image_files;
pub mod serve;
pub mod units;

use anyhow::anyhow;
use eframe::egui;
use gui::{AppConfig, BackpackApp, store::Store};

/// Opens the window and runs until it is closed.
pub fn run_gui(config: AppConfig, adapter: Option<&str>) -> anyhow::Result<()> {
    let saved_size = Store::open(&config.data_dir).state.window_size;
    let viewport = egui::ViewportBuilder::default()
        .with_title("Backpack")
        .with_app_id("backpack")
        .with_inner_size(saved_size.unwrap_or([1100.0, 720.0]))
        .with_min_inner_size([640.0, 420.0]);
    let viewport = match eframe::icon_data::from_png_bytes(include_bytes!(
        "../../assets/icons/backpack-256.png"
    )) {
        Ok(icon) => viewport.with_icon(icon),
        Err(_) => viewport,
    };
    let mut options = eframe::NativeOptions {
        viewport,
        renderer: eframe::Renderer::Wgpu,
        persist_window: false,
        ..Default::default()
    };
    options.wgpu_options.wgpu_setup = gui::services::text::wgpu_setup(adapter);
    eframe::run_native(
        "backpack",
        options,
        Box::new(move |cc| Ok(Box::new(BackpackApp::new(cc, config)))),
    )
    .map_err(|e| anyhow!("the window could not be opened: {e}"))
}
