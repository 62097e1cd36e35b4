//! `backpack`: the desktop app's binary. Without a subcommand it opens the window; with one it
//! runs the engine from the command line (`cli/`, a file per subcommand).

// On Windows a GUI-subsystem app, so that a double-click opens no console window; the CLI
// attaches to the console it is run from (`attach_parent_console`).
#![cfg_attr(windows, windows_subsystem = "windows")]

mod cli;

use anyhow::Result;
use clap::Parser;

#[derive(Parser)]
#[command(
    name = "backpack",
    version,
    about = "Run AI models locally on any GPU",
    long_about = "Run AI models locally on any GPU. Without a subcommand, opens the app window."
)]
struct Cli {
    /// GPU adapter to use: a case-insensitive part of its name (also BACKPACK_ADAPTER).
    #[arg(long, global = true)]
    adapter: Option<String>,
    /// Open the window with this model loaded (an HF folder, a .gguf file, a folder with one, or
    /// an installed repo id).
    #[arg(long)]
    model: Option<std::path::PathBuf>,
    /// Check the GPU (adapter, kernels against CPU references) and list audio inputs, then exit.
    #[arg(long)]
    self_test: bool,
    /// Where settings and conversations are kept (default: the platform data dir, or
    /// BACKPACK_DATA_DIR).
    #[arg(long)]
    data_dir: Option<std::path::PathBuf>,
    /// Use this audio file, played in real time, as the window's only audio input (a virtual
    /// microphone for recording and dictation).
    #[arg(long, value_name = "FILE")]
    audio_input: Option<std::path::PathBuf>,
    #[command(subcommand)]
    command: Option<cli::Command>,
}

/// Windows: with arguments, write to the console the app was started from (a GUI-subsystem
/// process gets none of its own). Without one (a double-click) there is none to attach to.
#[cfg(windows)]
#[allow(unsafe_code)]
fn attach_parent_console() {
    if std::env::args_os().len() > 1 {
        // SAFETY: AttachConsole takes a process id and touches no memory of ours.
        unsafe {
            windows_sys::Win32::System::Console::AttachConsole(
                windows_sys::Win32::System::Console::ATTACH_PARENT_PROCESS,
            );
        }
    }
}

fn main() -> Result<()> {
    #[cfg(windows)]
    attach_parent_console();
    let args = Cli::parse();
    if args.self_test {
        return cli::self_test::run(args.adapter.as_deref());
    }
    match args.command {
        Some(command) => command.run(args.adapter.as_deref()),
        None => {
            if let Some(path) = args.audio_input.as_deref().filter(|p| !p.is_file()) {
                anyhow::bail!("--audio-input {}: no such audio file", path.display());
            }
            let model = args
                .model
                .as_deref()
                .map(cli::generate::resolve_model)
                .transpose()?;
            let config = backpack_app::gui::AppConfig {
                data_dir: args
                    .data_dir
                    .unwrap_or_else(backpack_app::gui::store::default_data_dir),
                model,
                frame_stats: std::env::var_os("BACKPACK_FRAME_STATS").is_some(),
                hub_endpoint: None,
                models_dir: None,
                audio_input: args.audio_input,
                other_tools: backpack_engine::hub::SearchRoots::from_env(),
            };
            backpack_app::run_gui(config, args.adapter.as_deref())
        }
    }
}
