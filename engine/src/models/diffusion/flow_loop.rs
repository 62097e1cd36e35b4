//! The denoising loop the diffusion transformers share: flow-matching Euler steps along the
//! model's velocity on the GPU (one submission a step, with its progress reported), then the
//! VAE decoder's pixels as sRGB bytes.

use std::sync::Arc;
use std::time::Instant;

use super::generate::nchw_to_nhwc;
use super::generate::{Generated, ImageParams, StepInfo, Timings};
use super::scheduler::{flow_step, gaussian_noise};
use super::vae::VaePlan;
use crate::Error;
use crate::gpu::{Gpu, Recorder, StorageBuffer};
use crate::ops::{Denoise, DenoiseBuffers, DenoiseParams};

/// The most steps an image takes.
pub const MAX_STEPS: u32 = 1000;

/// Refuses a step count outside 1..=[`MAX_STEPS`].
pub fn check_steps(steps: u32) -> Result<(), Error> {
    if (1..=MAX_STEPS).contains(&steps) {
        return Ok(());
    }
    Err(Error::Invalid(format!(
        "{steps} steps: 1 to {MAX_STEPS} are possible"
    )))
}

/// One loop: the sigmas it walks (each step from one to the next, the last 0), the values the
/// update touches, the guidance scale the guide pass applies (`neg + g·(pos − neg)`), and
/// whether the model's output is the negated velocity (Z-Image's convention).
pub struct FlowSteps<'a> {
    pub sigmas: &'a [f32],
    pub values: u32,
    pub guidance: f32,
    pub negated_velocity: bool,
}

/// A zeroed f32 buffer of `floats` values (at least one).
pub fn zeros(gpu: &Gpu, label: &str, floats: u32) -> Result<Arc<StorageBuffer>, Error> {
    Ok(Arc::new(gpu.storage(label, u64::from(floats.max(1)) * 4)?))
}

/// The buffers one image's loop works on (`values` each; the model's input may hold more, a
/// reference image's tokens after the latent) and the update passes over them.
pub struct FlowBuffers {
    pub latents: Arc<StorageBuffer>,
    pub model_in: Arc<StorageBuffer>,
    pub model_out: Arc<StorageBuffer>,
    pub uncond_out: Arc<StorageBuffer>,
    /// Each step's clean estimate (what previews draw).
    pub denoised: Arc<StorageBuffer>,
    pub denoise: Denoise,
}

impl FlowBuffers {
    pub fn new(gpu: &Gpu, values: u32, model_in_values: u32) -> Result<Self, Error> {
        let latents = zeros(gpu, "latents", values)?;
        let model_in = zeros(gpu, "transformer input", model_in_values.max(values))?;
        let model_out = zeros(gpu, "transformer output", values)?;
        let uncond_out = zeros(gpu, "unconditional output", values)?;
        let denoised = zeros(gpu, "denoised", values)?;
        let prev = zeros(gpu, "previous denoised", values)?;
        let noise = zeros(gpu, "step noise", values)?;
        let denoise = Denoise::new(
            gpu,
            values,
            &DenoiseBuffers {
                latents: &latents,
                model_out: &model_out,
                uncond: &uncond_out,
                model_in: &model_in,
                denoised: &denoised,
                prev_denoised: &prev,
                noise: &noise,
            },
        )?;
        Ok(Self {
            latents,
            model_in,
            model_out,
            uncond_out,
            denoised,
            denoise,
        })
    }
}

/// The starting noise, channel-last: `params.init_latents` (diffusers' `[1][c][h][w]`, checked
/// against that shape) or seeded Gaussian noise.
pub fn start_noise(params: &ImageParams, (c, h, w): (u32, u32, u32)) -> Result<Vec<f32>, Error> {
    let n = h * w * c;
    let noise = match &params.init_latents {
        Some(l) if l.len() == n as usize => l.clone(),
        Some(l) => {
            return Err(Error::Invalid(format!(
                "init latents hold {} values; a {}×{} image needs [1, {c}, {h}, {w}] = {n}",
                l.len(),
                params.width,
                params.height
            )));
        }
        None => gaussian_noise(params.seed, n as usize),
    };
    Ok(nchw_to_nhwc(&noise, c as usize))
}

/// The start image in −1..1 (`[height][width][3]`), checked against the image's size.
pub fn start_pixels(params: &ImageParams) -> Result<Option<Vec<f32>>, Error> {
    let Some((pixels, _)) = &params.init_image else {
        return Ok(None);
    };
    let expected = (params.width * params.height * 3) as usize;
    if pixels.len() != expected {
        return Err(Error::Invalid(format!(
            "the start image has {} values, {expected} expected",
            pixels.len()
        )));
    }
    Ok(Some(pixels.iter().map(|v| v * 2.0 - 1.0).collect()))
}

/// Runs the steps: `prepare` hears each step's sigma (to write the model's time), `record`
/// records the step's one submission; `on_step` hears after each and returns false to stop.
/// Returns the milliseconds the steps took, or None when stopped.
pub fn run_steps(
    gpu: &Gpu,
    denoise: &Denoise,
    steps: &FlowSteps<'_>,
    started: Instant,
    mut prepare: impl FnMut(f32),
    mut record: impl FnMut(&mut Recorder<'_>),
    on_step: &mut impl FnMut(StepInfo) -> bool,
) -> Result<Option<f64>, Error> {
    let steps_start = Instant::now();
    let count = steps.sigmas.len().saturating_sub(1) as u32;
    for (i, pair) in steps.sigmas.windows(2).enumerate() {
        let (sigma, next) = (pair[0], pair[1]);
        prepare(sigma);
        let s = flow_step(sigma, next, steps.negated_velocity);
        let update = DenoiseParams {
            n: steps.values,
            c_in: 1.0,
            guidance: steps.guidance,
            p: s.p,
            q: s.q,
            a: s.a,
            b: s.b,
            ..Default::default()
        };
        denoise.set(gpu, &update);
        let mut rec = Recorder::in_parts(gpu);
        record(&mut rec);
        rec.submit();
        gpu.wait()?;
        let info = StepInfo {
            step: i as u32 + 1,
            steps: count,
            elapsed_ms: started.elapsed().as_secs_f64() * 1e3,
        };
        if !on_step(info) {
            return Ok(None);
        }
    }
    Ok(Some(steps_start.elapsed().as_secs_f64() * 1e3))
}

/// Runs `record` (which ends in `decoder`) and reads its pixels, −1..1, as sRGB bytes.
pub fn decode_to_srgb(
    gpu: &Gpu,
    decoder: &VaePlan,
    pixels: u32,
    record: impl FnOnce(&mut Recorder<'_>),
) -> Result<Vec<u8>, Error> {
    let mut rec = Recorder::in_parts(gpu);
    record(&mut rec);
    decoder.plan.encode(&mut rec);
    rec.submit();
    let image: Vec<f32> = gpu.read(&decoder.out.buffer, 0, u64::from(pixels) * 3)?;
    Ok(to_srgb(&image))
}

/// Values in −1..1 as bytes.
pub fn to_srgb(image: &[f32]) -> Vec<u8> {
    image
        .iter()
        .map(|v| ((v / 2.0 + 0.5).clamp(0.0, 1.0) * 255.0).round() as u8)
        .collect()
}

/// The finished image with its timings: `text_ms` before the steps, the steps' `steps_ms`
/// over `steps`, the decode since `decode_start`, all since `started`.
pub fn finished(
    params: &ImageParams,
    rgb: Vec<u8>,
    (text_ms, steps_ms, steps): (f64, f64, u32),
    decode_start: Instant,
    started: Instant,
) -> Generated {
    Generated {
        width: params.width,
        height: params.height,
        rgb,
        timings: Timings {
            text_ms,
            steps_ms,
            ms_per_step: steps_ms / f64::from(steps.max(1)),
            vae_ms: decode_start.elapsed().as_secs_f64() * 1e3,
            total_ms: started.elapsed().as_secs_f64() * 1e3,
        },
    }
}
