//! The denoising loop the diffusion transformers share: flow-matching Euler steps along the
//! model's velocity on the GPU (one submission a step, with its progress reported), then the
//! VAE decoder's pixels as sRGB bytes.

use std::time::Instant;

use super::generate::{Generated, ImageParams, StepInfo, Timings};
use super::scheduler::flow_step;
use super::vae::VaePlan;
use crate::Error;
use crate::gpu::{Gpu, Recorder};
use crate::ops::{Denoise, DenoiseParams};

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
