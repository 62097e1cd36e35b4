//! `backpack bench-image`: speed of an image model's parts at real shapes with random weights
//! (or real ones): text encoder(s), one UNet or transformer step, VAE decode, a whole 1-step
//! image and a whole image of `--steps` steps.

use std::path::PathBuf;

use anyhow::{Context, Result};
use backpack_engine::gpu::Gpu;
use backpack_engine::models::diffusion::{DiffusionModel, ImageModelOptions, ImageParams};
use clap::Args;

use super::DTypeArg;
use super::frame_probe::FrameProbe;

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
    /// Also generate one image of --steps steps while a stand-in for a window's frames (a
    /// small submission every 1/60 s) waits its turn on the queue: once with the engine's
    /// submissions unpaced, once paced as in the app's window; prints the frames' waits.
    #[arg(long)]
    frame_probe: bool,
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
        if args.frame_probe {
            probe_frames(&gpu, &mut model, &params(args.steps.max(1)))?;
        }
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

/// Images of `params` with the frame probe running: unpaced, then paced as the window paces
/// its device (the first paced image measures each kernel, the second is cut by what it
/// measured), then one paced image without the probe (the pacing's own cost).
fn probe_frames(gpu: &Gpu, model: &mut DiffusionModel, params: &ImageParams) -> Result<()> {
    let budget = backpack_app::gui::services::text::WINDOW_PART_BUDGET;
    let runs = [
        (None, true),
        (Some(budget), true),
        (Some(budget), true),
        (Some(budget), false),
    ];
    for (pacing, probed) in runs {
        gpu.pace_parts(pacing);
        let probe = probed.then(|| FrameProbe::start(gpu));
        let image = model.generate(params, false, |_| true);
        let waits = probe.map(FrameProbe::finish);
        let image = image?.context("stopped")?;
        let how = match pacing {
            None => "unpaced".to_owned(),
            Some(b) => format!("paced at {} ms a part", b.as_millis()),
        };
        let t = &image.timings;
        let timings = format!(
            "image {:.1} ms (text {:.1}, steps {:.1} each, decode {:.1})",
            t.total_ms, t.text_ms, t.ms_per_step, t.vae_ms
        );
        let Some(waits) = waits else {
            println!(
                "a {}-step image ({how}), no frames: {timings}",
                params.steps
            );
            continue;
        };
        println!(
            "frames during a {}-step image ({how}): {} frames, each waited p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; {timings}",
            params.steps, waits.frames, waits.p50, waits.p99, waits.max
        );
        let longest: Vec<String> = waits
            .longest
            .iter()
            .map(|(at, wait)| format!("{wait:.1} ms at {at:.0} ms"))
            .collect();
        println!("  longest waits: {}", longest.join(", "));
    }
    gpu.pace_parts(None);
    Ok(())
}
