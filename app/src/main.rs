//! `backpack`: the desktop app's binary. Subcommands run the engine from the command line.

mod bench;
mod generate;

use anyhow::Result;
use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(name = "backpack", version, about = "Run AI models locally on any GPU")]
struct Cli {
    /// GPU adapter to use: a case-insensitive part of its name (also BACKPACK_ADAPTER).
    #[arg(long, global = true)]
    adapter: Option<String>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt with a local model.
    Generate(generate::GenerateArgs),
    /// Measure prefill and decode speed of a model shape with random weights.
    Bench(bench::BenchArgs),
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum DTypeArg {
    F32,
    F16,
}

impl From<DTypeArg> for backpack_engine::ops::WeightDType {
    fn from(d: DTypeArg) -> Self {
        match d {
            DTypeArg::F32 => Self::F32,
            DTypeArg::F16 => Self::F16,
        }
    }
}

/// Opens the GPU, telling the user which adapter runs the work (and warning on a CPU one).
pub fn open_gpu(adapter: Option<&str>) -> Result<backpack_engine::gpu::Gpu> {
    let gpu = backpack_engine::gpu::Gpu::headless(adapter)?;
    if gpu.is_software() {
        eprintln!(
            "warning: running on {}: no hardware GPU was found, expect it to be slow",
            gpu.describe()
        );
    } else {
        eprintln!("GPU: {}", gpu.describe());
    }
    Ok(gpu)
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Generate(args)) => generate::run(args, cli.adapter.as_deref()),
        Some(Command::Bench(args)) => bench::run(args, cli.adapter.as_deref()),
        None => {
            use clap::CommandFactory;
            Cli::command().print_help()?;
            Ok(())
        }
    }
}
