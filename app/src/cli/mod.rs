//! The subcommands, one file each (`backpack generate` is `generate.rs`), and the flags they
//! share: weight and cache storage, on-load quantization, opening the GPU.

pub mod bench;
pub mod bench_batch;
pub mod bench_gemm;
pub mod bench_image;
pub mod bench_speculative;
pub mod bench_speech;
mod frame_probe;
pub mod generate;
pub mod image;
pub mod listen;
pub mod models;
pub mod remote;
pub mod self_test;
pub mod serve;
pub mod transcribe;

use std::path::PathBuf;

use anyhow::Result;
use clap::{Subcommand, ValueEnum};

#[derive(Subcommand)]
pub enum Command {
    /// Generate text from a prompt with a local model (or a remote one, --endpoint).
    Generate(generate::GenerateArgs),
    /// Serve a model over an OpenAI-compatible HTTP API (chat and text completions).
    Serve(serve::ServeArgs),
    /// Measure prefill and decode speed of a model shape with random weights.
    Bench(bench::BenchArgs),
    /// The model library: list, search the hub, download (verified, resumable), remove.
    Models(models::ModelsArgs),
    /// Measure a Whisper model's encoder and decoder speed (real or random weights).
    BenchSpeech(bench_speech::BenchSpeechArgs),
    /// Live captions from a microphone (or an audio file played in real time).
    Listen(listen::ListenArgs),
    /// Transcribe (or translate) an audio file with a Whisper model.
    Transcribe(transcribe::TranscribeArgs),
    /// Generate images from a prompt with a Stable Diffusion model.
    Image(image::ImageArgs),
    /// Measure an image model's text encoder, UNet step and VAE speed at real shapes.
    BenchImage(bench_image::BenchImageArgs),
    /// Measure the prompt product (tensor-core and SIMT tiles) at model shapes.
    BenchGemm(bench_gemm::BenchGemmArgs),
}

impl Command {
    /// Runs the subcommand on the GPU adapter named by `adapter` (or the default one).
    pub fn run(self, adapter: Option<&str>) -> Result<()> {
        match self {
            Self::Generate(args) => generate::run(args, adapter),
            Self::Serve(args) => serve::run(args, adapter),
            Self::Bench(args) => bench::run(args, adapter),
            Self::Models(args) => models::run(args, adapter),
            Self::BenchSpeech(args) => bench_speech::run(args, adapter),
            Self::Listen(args) => listen::run(args, adapter),
            Self::Transcribe(args) => transcribe::run(args, adapter),
            Self::Image(args) => image::run(args, adapter),
            Self::BenchImage(args) => bench_image::run(args, adapter),
            Self::BenchGemm(args) => bench_gemm::run(args, adapter),
        }
    }
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

/// Speculative decoding's flags (`generate`, `serve`).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct SpeculateArgs {
    /// Speculative decoding with a small draft model that shares the model's tokenizer (a
    /// folder, a .gguf file or an installed repo id): it guesses --speculate tokens a round
    /// and the model checks them in one pass. Answers are unchanged; only speed differs.
    #[arg(long)]
    pub draft_model: Option<PathBuf>,
    /// Speculative decoding: guess up to N tokens a round (1 to 7) and check them in one
    /// pass of the model. Without --draft-model the guesses are copied from the context
    /// (prompt lookup: edits, summaries, repeated records). Default with --draft-model: 5.
    /// Each round takes as many as have paid off so far, and none while guessing does not.
    #[arg(long, value_name = "N")]
    pub speculate: Option<u32>,
}

impl SpeculateArgs {
    /// What the flags ask for, with the draft model's repo id resolved.
    pub fn speculation(&self) -> Result<Option<backpack_engine::models::speculate::Speculation>> {
        use backpack_engine::models::speculate::Speculation;
        let draft = match &self.draft_model {
            Some(d) => Some(generate::resolve_model(d)?),
            None => None,
        };
        Ok(match (draft, self.speculate) {
            (None, None) => None,
            (draft, tokens) => Some(Speculation {
                tokens: tokens.unwrap_or(DEFAULT_DRAFTS),
                draft,
                paced: true,
            }),
        })
    }
}

/// Drafts a round when --draft-model is given alone.
const DEFAULT_DRAFTS: u32 = 5;

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
