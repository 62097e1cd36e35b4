//! `backpack image`: a prompt to PNG files with a Stable Diffusion model.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use backpack_app::image_files::{init_image_floats, parameters_text, read_start_image, write_png};
use backpack_engine::load::SafeTensors;
use backpack_engine::models::diffusion::{
    DiffusionModel, ImageModelOptions, ImageParams, SchedulerKind,
};
use backpack_engine::remote::media::RemoteImageRequest;
use clap::{Args, ValueEnum};

use super::DTypeArg;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum SchedulerArg {
    Euler,
    #[value(name = "euler_a")]
    EulerA,
    #[value(name = "dpmpp_2m_karras")]
    DpmPp2mKarras,
    Lcm,
}

impl From<SchedulerArg> for SchedulerKind {
    fn from(s: SchedulerArg) -> Self {
        match s {
            SchedulerArg::Euler => Self::Euler,
            SchedulerArg::EulerA => Self::EulerAncestral,
            SchedulerArg::DpmPp2mKarras => Self::DpmPp2mKarras,
            SchedulerArg::Lcm => Self::Lcm,
        }
    }
}

#[derive(Args)]
pub struct ImageArgs {
    /// A diffusers folder, a single-file .safetensors checkpoint, or an installed repo id; with
    /// --endpoint, the name of one of the server's models.
    #[arg(long)]
    model: PathBuf,
    #[command(flatten)]
    remote: super::remote::RemoteArgs,
    #[arg(long)]
    prompt: String,
    /// What the image should not show (used when guidance > 1; by Z-Image when above 0).
    #[arg(long, default_value = "")]
    negative: String,
    /// Denoising steps (default: the model's, e.g. 1 for SD-Turbo).
    #[arg(long)]
    steps: Option<u32>,
    /// Classifier-free guidance scale; at most 1 disables it (default: the model's).
    #[arg(long)]
    guidance: Option<f32>,
    /// Seed of the starting noise (default: random); batch images use seed, seed+1, …
    #[arg(long)]
    seed: Option<u64>,
    #[arg(long)]
    width: Option<u32>,
    #[arg(long)]
    height: Option<u32>,
    /// Scheduler (default: the one the model ships with).
    #[arg(long, conflicts_with = "endpoint", value_enum)]
    scheduler: Option<SchedulerArg>,
    /// Start from this picture (image-to-image: PNG, JPEG or WebP), resized to the output size.
    /// FLUX.2 takes it as a reference the new image follows (its pipeline's `image`), at the
    /// picture's own size by default; --strength does not apply there.
    #[arg(long, conflicts_with = "endpoint", value_name = "IMAGE")]
    init_image: Option<PathBuf>,
    /// How much of the start image is repainted (0..1].
    #[arg(long, default_value_t = 0.75)]
    strength: f32,
    /// A safetensors file with one f32 tensor `latents` in the pipeline's own layout (SD:
    /// [1, 4, H/8, W/8]; Z-Image: [1, 16, H/8, W/8]; FLUX.2: the packed [1, 128, H/16, W/16])
    /// used in place of the seeded noise, as diffusers' `latents=`.
    #[arg(long, conflicts_with = "endpoint", value_name = "FILE")]
    init_latents: Option<PathBuf>,
    /// Images to generate.
    #[arg(long, default_value_t = 1)]
    batch: u32,
    /// Output PNG (batch images get -2, -3, … before the extension).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Storage type of the weights (arithmetic is f32 either way).
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
    /// Print one JSON line per image: out, seed, steps, width, height, ms_per_step, total_ms.
    #[arg(long)]
    json: bool,
}

/// `latents` from a safetensors file, with the image size it implies.
fn read_latents(path: &Path, downscale: u32) -> Result<(Vec<f32>, u32, u32)> {
    let st = SafeTensors::open_files(&[path.to_owned()])
        .with_context(|| format!("reading {}", path.display()))?;
    let view = st
        .get("latents")
        .with_context(|| format!("{}: no tensor named latents", path.display()))?;
    let &[1, _, h, w] = view.shape else {
        bail!(
            "{}: latents has shape {:?}, expected [1, channels, height, width]",
            path.display(),
            view.shape
        );
    };
    Ok((view.to_f32(), w as u32 * downscale, h as u32 * downscale))
}

fn output_path(out: Option<&Path>, seed: u64, index: u32) -> PathBuf {
    let base = out.map_or_else(
        || PathBuf::from(format!("backpack-{seed}.png")),
        Path::to_owned,
    );
    if index == 0 {
        return base;
    }
    let stem = base
        .file_stem()
        .map_or_else(|| "image".into(), |s| s.to_string_lossy().into_owned());
    let ext = base
        .extension()
        .map_or_else(|| "png".into(), |e| e.to_string_lossy().into_owned());
    base.with_file_name(format!("{stem}-{}.{ext}", index + 1))
}

/// Images from `--endpoint`'s model, written as the server encoded them.
fn run_remote(args: &ImageArgs, url: &str) -> Result<()> {
    let size = match (args.width, args.height) {
        (None, None) => None,
        (w, h) => Some((w.or(h).unwrap_or(512), h.or(w).unwrap_or(512))),
    };
    let request = RemoteImageRequest {
        prompt: args.prompt.clone(),
        negative: Some(args.negative.clone()).filter(|n| !n.is_empty()),
        n: args.batch.max(1),
        size,
        steps: args.steps,
        guidance: args.guidance,
        seed: args.seed,
    };
    let started = Instant::now();
    let seed = args.seed.unwrap_or_else(random_seed);
    let model = args.model.to_string_lossy();
    let written = super::remote::images(&args.remote, url, &model, &request, |index| {
        output_path(args.out.as_deref(), seed, index)
    })?;
    let total_ms = started.elapsed().as_secs_f64() * 1e3;
    for (index, (out, size)) in (0u64..).zip(written) {
        let (width, height) = size.unzip();
        eprintln!("{}: from {url} in {total_ms:.0} ms", out.display());
        if args.json {
            let line = serde_json::json!({
                "out": out,
                "seed": args.seed.map(|s| s.wrapping_add(index)),
                "steps": args.steps,
                "width": width,
                "height": height,
                "ms_per_step": null,
                "total_ms": total_ms,
            });
            println!("{line}");
        }
    }
    Ok(())
}

pub fn run(args: ImageArgs, adapter: Option<&str>) -> Result<()> {
    if let Some(url) = &args.remote.endpoint {
        return run_remote(&args, url);
    }
    let model_path = super::generate::resolve_model(&args.model)?;
    if !(args.strength > 0.0 && args.strength <= 1.0) {
        bail!("--strength must be in (0, 1], not {}", args.strength);
    }
    let gpu = super::open_gpu(adapter)?;
    let started = Instant::now();
    let options = ImageModelOptions {
        dtype: args.dtype.into(),
        random_weights: false,
        preview_decoder: None,
        text_quantize: args.text_quant.and_then(super::QuantArg::block_format),
        quantize: args.quant.and_then(super::QuantArg::block_format),
    };
    let mut model = DiffusionModel::load(&gpu, &model_path, &options)
        .with_context(|| format!("loading {}", model_path.display()))?;
    let info = model.info().clone();
    eprintln!(
        "loaded {} ({}, {:.0} MiB of weights) in {:.2} s",
        info.name,
        info.family,
        info.weight_bytes as f64 / f64::from(1u32 << 20),
        started.elapsed().as_secs_f64()
    );
    if matches!(info.family, "zimage" | "flux2")
        && let Some(kind) = args.scheduler.map(SchedulerKind::from)
        && kind != SchedulerKind::Euler
    {
        bail!(
            "{} steps with flow-matching Euler; --scheduler {kind} is for Stable Diffusion pipelines",
            info.name
        );
    }
    let downscale = info.latent_downscale;
    let latents = args
        .init_latents
        .as_deref()
        .map(|p| read_latents(p, downscale))
        .transpose()?;
    let start = args
        .init_image
        .as_deref()
        .map(read_start_image)
        .transpose()?;
    let (width, height) = match (&latents, &start, args.width, args.height) {
        (Some((_, w, h)), _, None, None) => (*w, *h),
        // FLUX.2 draws at its reference's size, as its pipeline does.
        (None, Some(image), None, None) if info.family == "flux2" => {
            reference_size((image.width, image.height), info.size_step)
        }
        (_, _, w, h) => (
            w.unwrap_or(info.defaults.width),
            h.unwrap_or(info.defaults.height),
        ),
    };
    let init_image = start.map(|image| (init_image_floats(&image, width, height), args.strength));
    let seed = args.seed.unwrap_or_else(random_seed);
    let params = ImageParams {
        prompt: args.prompt.clone(),
        negative: args.negative.clone(),
        steps: args.steps.unwrap_or(info.defaults.steps),
        guidance: args.guidance.unwrap_or(info.defaults.guidance),
        seed,
        width,
        height,
        scheduler: args.scheduler.map_or(info.defaults.scheduler, Into::into),
        init_image,
        init_latents: latents.map(|(l, _, _)| l),
    };
    for index in 0..args.batch.max(1) {
        let mut p = params.clone();
        p.seed = seed.wrapping_add(u64::from(index));
        let image = model
            .generate(&p, false, |s| {
                if !args.json {
                    eprint!("\rstep {}/{}", s.step, s.steps);
                }
                true
            })?
            .context("generation stopped")?;
        if !args.json {
            eprintln!();
        }
        let out = output_path(args.out.as_deref(), seed, index);
        write_png(
            &out,
            image.width,
            image.height,
            &image.rgb,
            &parameters_text(&p, &info.name),
        )?;
        let t = image.timings;
        eprintln!(
            "{}: {}×{}, seed {}, {} steps at {:.1} ms/step, text {:.1} ms, VAE {:.1} ms, {:.0} ms in all",
            out.display(),
            image.width,
            image.height,
            p.seed,
            p.steps,
            t.ms_per_step,
            t.text_ms,
            t.vae_ms,
            t.total_ms
        );
        if args.json {
            let line = serde_json::json!({
                "out": out,
                "seed": p.seed,
                "steps": p.steps,
                "width": image.width,
                "height": image.height,
                "ms_per_step": t.ms_per_step,
                "total_ms": t.total_ms,
            });
            println!("{line}");
        }
    }
    Ok(())
}

/// A reference picture's size as `Flux2KleinPipeline` takes it: scaled to at most 1024² pixels
/// (keeping its aspect), then each side rounded down to a multiple of `step` (at least one).
fn reference_size((w, h): (u32, u32), step: u32) -> (u32, u32) {
    let area = f64::from(w) * f64::from(h);
    let scale = if area > 1024.0 * 1024.0 {
        (1024.0 * 1024.0 / area).sqrt()
    } else {
        1.0
    };
    let side = |v: u32| (((f64::from(v) * scale) as u32) / step * step).max(step);
    (side(w), side(h))
}

/// A seed from the clock, when none is given (printed with the result, so it can be reused).
fn random_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    (nanos as u64 ^ (nanos >> 64) as u64) % 4_294_967_296
}

#[cfg(test)]
mod tests {
    use super::reference_size;

    #[test]
    fn references_keep_their_size_within_a_megapixel() {
        assert_eq!(reference_size((1000, 700), 16), (992, 688));
        // 2048×1536 scales by √(1/3) to 1182×886, then rounds down to multiples of 16.
        assert_eq!(reference_size((2048, 1536), 16), (1168, 880));
        assert_eq!(reference_size((5, 5), 16), (16, 16));
    }
}
