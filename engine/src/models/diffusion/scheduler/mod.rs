//! Diffusion schedulers as per-step coefficients. diffusers' Euler, Euler Ancestral, DPM++ 2M
//! Karras and LCM are reproduced here on the CPU, but instead of stepping tensors they reduce
//! every step to a handful of scalars, and the GPU applies them elementwise over the latent x:
//!
//! ```text
//! model_input = c_in · x                      (the UNet runs on it at `timestep`)
//! denoised    = p · x + q · out               (out: the guided UNet output; x0, also the preview)
//! x           ← a · x + b · denoised + c · prev_denoised + d · noise
//! prev_denoised ← denoised
//! ```
//!
//! Each scheduler's update is linear in x, the model output, the previous x0 prediction and
//! fresh noise, so this form is exact, not an approximation. `x` lives in the space of the
//! scheduler it came from: σ-scaled for Euler (x = x0 + σ·ε), variance-preserving for DPM and
//! LCM (x = α·x0 + σ·ε); only `init_noise_sigma` and `img2img` need to know.

mod config;
mod dpm;
mod embedding;
mod euler;
mod flow;
mod lcm;
mod noise;
mod spacing;
mod train;

#[cfg(test)]
mod tests;

use std::fmt;
use std::str::FromStr;

pub use config::SchedulerConfig;
pub use embedding::timestep_embedding;
pub use flow::{FlowMatchConfig, flow_step, linear_sigmas};
pub use noise::{gaussian_noise, step_noise};

use crate::Error;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SchedulerKind {
    /// Euler (diffusers' EulerDiscreteScheduler, k-diffusion's `sample_euler`).
    Euler,
    /// Euler Ancestral: Euler to a lower σ, then fresh noise back up to the next σ.
    EulerAncestral,
    /// DPM-Solver++(2M) on Karras sigmas (DPMSolverMultistepScheduler with
    /// `use_karras_sigmas`, `algorithm_type = "dpmsolver++"`, `solver_order = 2`).
    DpmPp2mKarras,
    /// Latent Consistency Model sampling (LCMScheduler): few steps, each one a full x0
    /// prediction re-noised to the next timestep.
    Lcm,
}

impl SchedulerKind {
    pub const ALL: [Self; 4] = [
        Self::Euler,
        Self::EulerAncestral,
        Self::DpmPp2mKarras,
        Self::Lcm,
    ];

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Euler => "euler",
            Self::EulerAncestral => "euler_a",
            Self::DpmPp2mKarras => "dpmpp_2m_karras",
            Self::Lcm => "lcm",
        }
    }
}

impl fmt::Display for SchedulerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SchedulerKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        Self::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|k| k.name()).collect();
                Error::Invalid(format!(
                    "unknown scheduler {s:?} (known: {})",
                    names.join(", ")
                ))
            })
    }
}

/// One denoising step; see the module documentation for how the GPU applies it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepCoefficients {
    /// The timestep the UNet is conditioned on (fractional for Euler with Karras sigmas or
    /// linspace spacing; `0.25·ln σ` with `timestep_type = "continuous"`).
    pub timestep: f32,
    pub c_in: f32,
    pub p: f32,
    pub q: f32,
    pub a: f32,
    pub b: f32,
    pub c: f32,
    pub d: f32,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    pub steps: Vec<StepCoefficients>,
    /// Text-to-image: x_0 = init_noise_sigma · noise (diffusers' `init_noise_sigma`: the
    /// largest σ of the schedule, √(σ²+1) with "leading" spacing; 1 for DPM and LCM).
    pub init_noise_sigma: f32,
    /// Image-to-image: x_0 = img_a · image_latent + img_b · noise (`scheduler.add_noise` at the
    /// first kept timestep).
    pub img2img: Option<(f32, f32)>,
}

/// The schedule for `steps` denoising steps; with `strength` (0..=1), image-to-image as
/// diffusers' StableDiffusionImg2ImgPipeline runs it: the schedule for `steps` is computed,
/// only its last `floor(steps·strength)` steps run, and the image is noised to the first of
/// them.
pub fn schedule(
    config: &SchedulerConfig,
    kind: SchedulerKind,
    steps: u32,
    strength: Option<f32>,
) -> Result<Schedule, Error> {
    let params = config.params(kind)?;
    if steps == 0 {
        return Err(Error::Invalid(
            "the number of steps must be at least 1".into(),
        ));
    }
    if steps > params.num_train_timesteps {
        return Err(Error::Invalid(format!(
            "{steps} steps is more than the {} timesteps the model was trained with",
            params.num_train_timesteps
        )));
    }
    let n = steps as usize;
    let begin = match strength {
        Some(strength) => img2img_start(n, strength)?,
        None => 0,
    };
    let mut schedule = match kind {
        SchedulerKind::Euler => euler::schedule(&params, false, n, begin)?,
        SchedulerKind::EulerAncestral => euler::schedule(&params, true, n, begin)?,
        SchedulerKind::DpmPp2mKarras => dpm::schedule(&params, n, begin)?,
        SchedulerKind::Lcm => lcm::schedule(&params, n, begin)?,
    };
    if strength.is_none() {
        schedule.img2img = None;
    }
    check_finite(&schedule, kind)?;
    Ok(schedule)
}

/// The index of the first step image-to-image runs (`get_timesteps`' `t_start`).
fn img2img_start(steps: usize, strength: f32) -> Result<usize, Error> {
    if !(0.0..=1.0).contains(&strength) {
        return Err(Error::Invalid(format!(
            "strength must be between 0 and 1, got {strength}"
        )));
    }
    // The decimal the user wrote, as Python would hold it: 0.7f32 widened is 0.69999998…,
    // and 10 × that would truncate to 6 steps where diffusers runs 7.
    let exact: f64 = strength.to_string().parse().unwrap_or(f64::from(strength));
    let kept = ((steps as f64 * exact) as usize).min(steps);
    if kept == 0 {
        return Err(Error::Invalid(format!(
            "strength {strength} with {steps} steps leaves no step to run (image-to-image runs \
             floor(steps × strength) of them); raise the strength or the steps"
        )));
    }
    Ok(steps - kept)
}

/// The step at `begin` must exist: a strength leaving no step is caught earlier, so this only
/// guards the schedulers' own lengths.
fn no_steps(begin: usize, len: usize) -> Error {
    Error::Invalid(format!(
        "image-to-image would start at step {begin} of a {len}-step schedule"
    ))
}

fn check_finite(schedule: &Schedule, kind: SchedulerKind) -> Result<(), Error> {
    let bad = |x: f32| !x.is_finite();
    for (i, s) in schedule.steps.iter().enumerate() {
        let values = [s.timestep, s.c_in, s.p, s.q, s.a, s.b, s.c, s.d];
        if values.into_iter().any(bad) {
            return Err(Error::Invalid(format!(
                "the scheduler config gives {kind} a non-finite coefficient at step {i}: {s:?}"
            )));
        }
    }
    let img = schedule.img2img.map_or([0.0; 2], |(a, b)| [a, b]);
    if bad(schedule.init_noise_sigma) || img.into_iter().any(bad) {
        return Err(Error::Invalid(format!(
            "the scheduler config gives {kind} a non-finite initial noise scale"
        )));
    }
    Ok(())
}

/// (p, q) of `x0 = p·x + q·out` for a model in the σ parameterisation (x = x0 + σ·ε, Euler).
fn sigma_x0(prediction: config::Prediction, sigma: f64) -> (f64, f64) {
    let norm = sigma * sigma + 1.0;
    match prediction {
        config::Prediction::Epsilon => (1.0, -sigma),
        config::Prediction::Velocity => (1.0 / norm, -sigma / norm.sqrt()),
        config::Prediction::Sample => (0.0, 1.0),
    }
}

/// (p, q) of `x0 = p·x + q·out` for a variance-preserving x = α·x0 + s·ε (DPM, LCM).
fn vp_x0(prediction: config::Prediction, alpha: f64, s: f64) -> (f64, f64) {
    match prediction {
        config::Prediction::Epsilon => (1.0 / alpha, -s / alpha),
        config::Prediction::Velocity => (alpha, -s),
        config::Prediction::Sample => (0.0, 1.0),
    }
}

/// Builds a step from f64 coefficients.
fn step(
    timestep: f32,
    c_in: f64,
    (p, q): (f64, f64),
    a: f64,
    b: f64,
    c: f64,
    d: f64,
) -> StepCoefficients {
    StepCoefficients {
        timestep,
        c_in: c_in as f32,
        p: p as f32,
        q: q as f32,
        a: a as f32,
        b: b as f32,
        c: c as f32,
        d: d as f32,
    }
}
