//! `backpack bench-image`: speed of an image model's parts at real shapes with random weights
//! (or real ones): text encoder(s), one UNet or transformer step, VAE decode, a whole 1-step
//! image and a whole image of `--steps` steps.

use std::path::PathBuf;

use anyhow::{Context, Result};
use backpack_engine::models::diffusion::{DiffusionModel, ImageModelOptions, ImageParams};
use clap::Args;

use super::DTypeArg;

#[derive(Args)]
pub struct BenchImageArgs {
    /// A diffusers folder: its configs give the shapes (weights are random unless --real).
    #[arg(long)]
    config: PathBuf,
    /// Image sides to measure (square).
    #[arg(long = "size", default_values_t = [512])]
    sizes: Vec<u32>,
    /// Timed runs per measurement (the median is reported).
    #[arg(long, default_value_t = 5)]
    runs: u32,
    /// Steps of the run that times the UNet or transformer (and the whole image).
    #[arg(long, default_value_t = 4)]
    steps: u32,
    #[arg(long, value_enum, default_value = "f16")]
    dtype: DTypeArg,
    /// Block-quantize a Qwen3 text encoder's matrices while loading (Z-Image: q8_0 or q4_k
    /// to fit a 12–16 GB GPU).
    #[arg(long, value_enum)]
    text_quant: Option<super::QuantArg>,
    /// Block-quantize a diffusion transformer's linear layers while loading (Z-Image: q8_0
    /// halves the transformer's memory).
    #[arg(long, value_enum)]
    quant: Option<super::QuantArg>,
    /// Load the folder's weights instead of random ones.
    #[arg(long)]
    real: bool,
    /// Print one JSON line per size.
    #[arg(long)]
    json: bool,
    /// Print the GPU time of each kernel of one UNet (or transformer) call and one VAE decode.
    #[arg(long)]
    profile: bool,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

pub fn run(args: BenchImageArgs, adapter: Option<&str>) -> Result<()> {
    let gpu = super::open_gpu(adapter)?;
    let options = ImageModelOptions {
        dtype: args.dtype.into(),
        random_weights: !args.real,
        preview_decoder: None,
        text_quantize: args.text_quant.and_then(super::QuantArg::block_format),
        quantize: args.quant.and_then(super::QuantArg::block_format),
    };
    let mut model = DiffusionModel::load(&gpu, &args.config, &options)
        .with_context(|| format!("loading {}", args.config.display()))?;
    let info = model.info().clone();
    eprintln!(
        "{} ({}): {:.0} MiB of weights",
        info.name,
        info.family,
        info.weight_bytes as f64 / f64::from(1u32 << 20)
    );
    let denoiser = if matches!(info.family, "zimage" | "flux2") {
        "transformer"
    } else {
        "UNet"
    };
    for &size in &args.sizes {
        let params = |steps: u32| ImageParams {
            prompt: "a lighthouse on a cliff at sunset, oil painting".into(),
            negative: String::new(),
            steps,
            guidance: 0.0,
            seed: 1,
            width: size,
            height: size,
            scheduler: info.defaults.scheduler,
            init_image: None,
            init_latents: None,
        };
        // Warm-up: plans, pipelines and first-touch allocations.
        model.generate(&params(1), false, |_| true)?;
        let (mut text, mut vae, mut whole, mut step, mut total) =
            (vec![], vec![], vec![], vec![], vec![]);
        for _ in 0..args.runs.max(1) {
            let one = model
                .generate(&params(1), false, |_| true)?
                .context("stopped")?;
            text.push(one.timings.text_ms);
            vae.push(one.timings.vae_ms);
            whole.push(one.timings.total_ms);
            let many = model
                .generate(&params(args.steps.max(1)), false, |_| true)?
                .context("stopped")?;
            step.push(many.timings.ms_per_step);
            total.push(many.timings.total_ms);
        }
        let (text, step, vae, whole) = (median(text), median(step), median(vae), median(whole));
        let many = median(total);
        println!(
            "{size}×{size}: text encoder {text:.1} ms, {denoiser} step {step:.1} ms, VAE decode {vae:.1} ms, 1-step image {whole:.1} ms, {} steps {many:.1} ms ({:.0} MiB of activations)",
            args.steps.max(1),
            model.activation_bytes() as f64 / f64::from(1u32 << 20)
        );
        if args.profile {
            for (what, mut timings) in model.profile(size, size)? {
                timings.sort_by(|a, b| b.total_ns.total_cmp(&a.total_ns));
                let total: f64 = timings.iter().map(|t| t.total_ns).sum();
                eprintln!("{what} kernels ({:.2} ms of GPU time):", total / 1e6);
                for t in timings.iter().take(25) {
                    eprintln!("{:>10.3} ms {:>5}×  {}", t.total_ns / 1e6, t.calls, t.label);
                }
            }
        }
        if args.json {
            let line = serde_json::json!({
                "model": info.name,
                "size": size,
                "text_encoder_ms": text,
                "unet_step_ms": step,
                "step_ms": step,
                "steps": args.steps.max(1),
                "image_ms": many,
                "vae_decode_ms": vae,
                "image_1step_ms": whole,
                "adapter": gpu.info().name,
            });
            println!("{line}");
        }
    }
    Ok(())
}
