//! `backpack bench-speech`: encoder time per 30 s window, decode speed and (with audio) the
//! real-time factor of a whole transcription, for a Whisper model or a shape with random
//! weights.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use backpack_engine::models::whisper::{
    TranscribeOptions, Transcriber, WhisperConfig, WhisperModel, WhisperOptions,
};
use clap::Args;

use super::DTypeArg;

#[derive(Args)]
pub struct BenchSpeechArgs {
    /// A Whisper model folder (real weights).
    #[arg(long, conflicts_with = "config")]
    model: Option<PathBuf>,
    /// A Whisper config.json describing the shape; weights are random.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Also transcribe this file (greedy, with timestamps) and report the real-time factor.
    #[arg(long)]
    audio: Option<PathBuf>,
    /// Tokens decoded for the decode speed.
    #[arg(long, default_value_t = 128)]
    tokens: u32,
    #[arg(long, value_enum, default_value = "f16")]
    dtype: DTypeArg,
    /// Timed repetitions (the best is reported).
    #[arg(long, default_value_t = 3)]
    repeat: u32,
    /// Also print per-kernel GPU time of the encoder and of one decoder step (timestamp
    /// queries).
    #[arg(long)]
    profile: bool,
    /// Print the result as one JSON line.
    #[arg(long)]
    json: bool,
}

pub fn run(args: BenchSpeechArgs, adapter: Option<&str>) -> Result<()> {
    let gpu = super::open_gpu(adapter)?;
    let opts = WhisperOptions {
        dtype: args.dtype.into(),
        quantize: None,
    };
    let load_start = Instant::now();
    let mut model = match (&args.model, &args.config) {
        (Some(dir), _) => {
            let dir = super::generate::resolve_model(dir)?;
            WhisperModel::load(&gpu, &dir, &opts)?
        }
        (None, Some(config)) => {
            let cfg = WhisperConfig::from_file(config)
                .with_context(|| format!("reading {}", config.display()))?;
            WhisperModel::random(&gpu, cfg, &opts)?
        }
        (None, None) => bail!("give --model DIR or --config CONFIG"),
    };
    gpu.wait()?;
    let load = load_start.elapsed();
    // A window of speech-like noise: the encoder's cost does not depend on the content.
    let samples: Vec<f32> = (0..480_000u32)
        .map(|i| {
            ((i as f32 * 0.05).sin() + (i.wrapping_mul(2_654_435_761) >> 16) as f32 / 65_536.0
                - 0.5)
                * 0.1
        })
        .collect();
    let mel = model.mel().compute(&samples, 480_000);
    let window = mel.window(0, model.window_frames());
    model.time_encode(&window)?; // warm-up: pipelines compile on first use
    let repeat = args.repeat.max(1);
    let mut encode = Duration::MAX;
    for _ in 0..repeat {
        encode = encode.min(model.time_encode(&window)?);
    }
    let prompt: Vec<u32> = model.tokens.prompt(Some("en"), Default::default(), true);
    if args.profile {
        show_kernels("encoder", model.profile_encode()?);
        let step = model.profile_decode(&prompt, args.tokens.min(64))?;
        show_kernels("one decoder step", step);
    }
    model.time_decode(&prompt, 4)?;
    let mut decode = Duration::MAX;
    let mut prefill = Duration::MAX;
    for _ in 0..repeat {
        let (p, d) = model.time_decode(&prompt, args.tokens)?;
        prefill = prefill.min(p);
        decode = decode.min(d);
    }
    let decoded = args
        .tokens
        .min(model.config.max_target_positions - prompt.len() as u32 - 2);
    let tok_s = f64::from(decoded) / decode.as_secs_f64().max(1e-9);
    let mut rtf = None;
    if let Some(path) = &args.audio {
        let audio = backpack_engine::audio::load_file(path)?;
        let opts = TranscribeOptions {
            language: Some("en".into()),
            ..Default::default()
        }
        .without_fallback();
        let start = Instant::now();
        let t = Transcriber::new(&mut model, opts)?.run(&audio, &|| false, &mut |_| {})?;
        let secs = start.elapsed().as_secs_f64();
        rtf = Some((secs / t.audio_s.max(1e-9), t.audio_s, secs));
    }
    let info = model.info();
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "model": info.name,
                "parameters": info.parameters,
                "dtype": info.dtype,
                "adapter": gpu.describe(),
                "load_s": load.as_secs_f64(),
                "encoder_ms": encode.as_secs_f64() * 1e3,
                "prompt_tokens": prompt.len(),
                "prefill_ms": prefill.as_secs_f64() * 1e3,
                "decode_tok_s": tok_s,
                "rtf": rtf.map(|r| r.0),
                "audio_s": rtf.map(|r| r.1),
                "transcribe_s": rtf.map(|r| r.2),
            })
        );
    } else {
        println!(
            "{} ({:.0} M parameters, {}) on {}",
            info.name,
            info.parameters as f64 / 1e6,
            info.dtype,
            gpu.describe()
        );
        println!(
            "encoder: {:.2} ms per 30 s window",
            encode.as_secs_f64() * 1e3
        );
        println!(
            "decoder: prompt of {} tokens in {:.2} ms, {tok_s:.1} tokens/s",
            prompt.len(),
            prefill.as_secs_f64() * 1e3
        );
        if let Some((rtf, audio_s, secs)) = rtf {
            println!(
                "transcription: {audio_s:.1} s of audio in {secs:.2} s, real-time factor {rtf:.4}"
            );
        }
    }
    Ok(())
}

/// Prints per-kernel GPU times, the costliest first.
fn show_kernels(what: &str, mut timings: Vec<backpack_engine::gpu::KernelTiming>) {
    timings.sort_by(|a, b| b.total_ns.total_cmp(&a.total_ns));
    eprintln!("{what} kernels (GPU time):");
    for t in &timings {
        eprintln!("{:>10.3} ms {:>4}×  {}", t.total_ns / 1e6, t.calls, t.label);
    }
}
