//! `backpack`: the desktop app's binary. Without a subcommand it opens the window; subcommands
//! run the engine from the command line.

mod bench;
mod bench_gemm;
mod bench_image;
mod bench_speech;
mod generate;
mod image_cmd;
mod listen;
mod models_cmd;
mod remote_cmd;
mod selftest_cmd;
mod serve_cmd;
mod transcribe;

use anyhow::Result;
use clap::{Parser, Subcommand, ValueEnum};

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
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt with a local model (or a remote one, --endpoint).
    Generate(generate::GenerateArgs),
    /// Serve a model over an OpenAI-compatible HTTP API (chat and text completions).
    Serve(serve_cmd::ServeArgs),
    /// Measure prefill and decode speed of a model shape with random weights.
    Bench(bench::BenchArgs),
    /// The model library: list, search the hub, download (verified, resumable), remove.
    Models(models_cmd::ModelsArgs),
    /// Measure a Whisper model's encoder and decoder speed (real or random weights).
    BenchSpeech(bench_speech::BenchSpeechArgs),
    /// Live captions from a microphone (or an audio file played in real time).
    Listen(listen::ListenArgs),
    /// Transcribe (or translate) an audio file with a Whisper model.
    Transcribe(transcribe::TranscribeArgs),
    /// Generate images from a prompt with a Stable Diffusion model.
    Image(image_cmd::ImageArgs),
    /// Measure an image model's text encoder, UNet step and VAE speed at real shapes.
    BenchImage(bench_image::BenchImageArgs),
    /// Measure the prompt product (tensor-core and SIMT tiles) at model shapes.
    BenchGemm(bench_gemm::BenchGemmArgs),
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum DTypeArg {
    F32,
    F16,
}

/// How the KV cache stores keys and values.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum KvCacheArg {
    F32,
    F16,
    /// int8 blocks of 32 with a scale each: about half the memory of f16.
    #[value(name = "q8_0")]
    Q8_0,
}

impl From<KvCacheArg> for backpack_engine::ops::KvDType {
    fn from(d: KvCacheArg) -> Self {
        match d {
            KvCacheArg::F32 => Self::F32,
            KvCacheArg::F16 => Self::F16,
            KvCacheArg::Q8_0 => Self::Q8_0,
        }
    }
}

impl From<DTypeArg> for backpack_engine::ops::WeightDType {
    fn from(d: DTypeArg) -> Self {
        match d {
            DTypeArg::F32 => Self::F32,
            DTypeArg::F16 => Self::F16,
        }
    }
}

/// `--quant`: block-quantize weight matrices while loading, or store them as f16.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum QuantArg {
    #[value(name = "q8_0")]
    Q8_0,
    #[value(name = "q4_0")]
    Q4_0,
    #[value(name = "q4_k")]
    Q4K,
    F16,
}

impl QuantArg {
    /// The block format, if any (f16 is a plain dtype).
    pub fn block_format(self) -> Option<backpack_engine::load::GgmlType> {
        use backpack_engine::load::GgmlType;
        match self {
            Self::Q8_0 => Some(GgmlType::Q8_0),
            Self::Q4_0 => Some(GgmlType::Q4_0),
            Self::Q4K => Some(GgmlType::Q4K),
            Self::F16 => None,
        }
    }
}

/// Opens the GPU, telling the user which adapter runs the work (and warning on a CPU one).
/// How `generate` and `serve` load a text model from their flags (`--quant f16` stores the
/// matrices as f16 whatever `--dtype` says).
pub fn model_options(
    dtype: DTypeArg,
    quant: Option<QuantArg>,
    context: Option<u32>,
    kv_cache: Option<KvCacheArg>,
    f16_prompt_weights: bool,
) -> backpack_engine::models::ModelOptions {
    backpack_engine::models::ModelOptions {
        dtype: match quant {
            Some(QuantArg::F16) => backpack_engine::ops::WeightDType::F16,
            _ => dtype.into(),
        },
        quantize: quant.and_then(QuantArg::block_format),
        context,
        kv_cache: kv_cache.map(Into::into),
        f16_prompt_weights,
        ..Default::default()
    }
}

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
    if cli.self_test {
        return selftest_cmd::run(cli.adapter.as_deref());
    }
    match cli.command {
        Some(Command::Generate(args)) => generate::run(args, cli.adapter.as_deref()),
        Some(Command::Serve(args)) => serve_cmd::run(args, cli.adapter.as_deref()),
        Some(Command::Bench(args)) => bench::run(args, cli.adapter.as_deref()),
        Some(Command::Models(args)) => models_cmd::run(args, cli.adapter.as_deref()),
        Some(Command::BenchSpeech(args)) => bench_speech::run(args, cli.adapter.as_deref()),
        Some(Command::Listen(args)) => listen::run(args, cli.adapter.as_deref()),
        Some(Command::Transcribe(args)) => transcribe::run(args, cli.adapter.as_deref()),
        Some(Command::Image(args)) => image_cmd::run(args, cli.adapter.as_deref()),
        Some(Command::BenchImage(args)) => bench_image::run(args, cli.adapter.as_deref()),
        Some(Command::BenchGemm(args)) => bench_gemm::run(args, cli.adapter.as_deref()),
        None => {
            if let Some(path) = cli.audio_input.as_deref().filter(|p| !p.is_file()) {
                anyhow::bail!("--audio-input {}: no such audio file", path.display());
            }
            let model = cli
                .model
                .as_deref()
                .map(generate::resolve_model)
                .transpose()?;
            let config = backpack_app::gui::AppConfig {
                data_dir: cli
                    .data_dir
                    .unwrap_or_else(backpack_app::gui::store::default_data_dir),
                model,
                frame_stats: std::env::var_os("BACKPACK_FRAME_STATS").is_some(),
                hub_endpoint: None,
                models_dir: None,
                audio_input: cli.audio_input,
            };
            backpack_app::run_gui(config, cli.adapter.as_deref())
        }
    }
}
