//! Euler and Euler Ancestral (EulerDiscreteScheduler, EulerAncestralDiscreteScheduler): ODE
//! steps in the σ parameterisation, x = x0 + σ·ε.

use super::config::{Params, SigmaSpacing, Spacing};
use super::spacing::{euler_timesteps, exponential, karras, np_interp, sigma_to_t};
use super::train::{TrainSchedule, torch_linspace};
use super::{Schedule, StepCoefficients, no_steps, sigma_x0, step};
use crate::Error;

pub(super) fn schedule(
    p: &Params,
    ancestral: bool,
    n: usize,
    begin: usize,
) -> Result<Schedule, Error> {
    let train = TrainSchedule::new(p, true)?;
    let (timesteps, sigmas) = if ancestral {
        let timesteps = euler_timesteps(p, n);
        let mut sigmas: Vec<f32> = timesteps
            .iter()
            .map(|&t| np_interp(f64::from(t), &train.sigmas) as f32)
            .collect();
        sigmas.push(0.0);
        (timesteps, sigmas)
    } else {
        plan(p, &train, n)
    };
    if begin >= timesteps.len() {
        return Err(no_steps(begin, timesteps.len()));
    }
    let max = sigmas.iter().copied().fold(0f32, f32::max);
    let init_noise_sigma = match p.spacing {
        Spacing::Linspace | Spacing::Trailing => max,
        // x_T of "leading" schedules also carries the unit variance of the image.
        Spacing::Leading => (max * max + 1.0).sqrt(),
    };
    let steps = (begin..timesteps.len())
        .map(|j| euler_step(p, ancestral, timesteps[j], sigmas[j], sigmas[j + 1]))
        .collect();
    Ok(Schedule {
        steps,
        init_noise_sigma,
        img2img: Some((1.0, sigmas[begin])),
    })
}

/// EulerDiscreteScheduler.set_timesteps: the timesteps and the n+1 sigmas (float32).
fn plan(p: &Params, train: &TrainSchedule, n: usize) -> (Vec<f32>, Vec<f32>) {
    let mut timesteps = euler_timesteps(p, n);
    let mut sigmas: Vec<f64> = if p.log_linear {
        let last = train.log_sigmas.len() - 1;
        torch_linspace(train.log_sigmas[last], train.log_sigmas[0], n + 1)
            .into_iter()
            .map(|l| f64::from(l.exp()))
            .collect()
    } else {
        timesteps
            .iter()
            .map(|&t| np_interp(f64::from(t), &train.sigmas))
            .collect()
    };
    if p.sigma_spacing != SigmaSpacing::Timesteps {
        let min = p.sigma_min.unwrap_or(sigmas[sigmas.len() - 1]);
        let max = p.sigma_max.unwrap_or(sigmas[0]);
        sigmas = match p.sigma_spacing {
            SigmaSpacing::Karras => karras(min, max, n),
            _ => exponential(min, max, n),
        };
        // Fractional timesteps: Euler does not round them (DPM does).
        timesteps = sigmas
            .iter()
            .map(|&s| sigma_to_t(s, &train.log_sigmas) as f32)
            .collect();
    }
    sigmas.push(if p.final_sigma_min {
        f64::from(train.sigmas[0])
    } else {
        0.0
    });
    let sigmas: Vec<f32> = sigmas.into_iter().map(|s| s as f32).collect();
    if p.continuous_timesteps {
        timesteps = sigmas[..sigmas.len() - 1]
            .iter()
            .map(|s| 0.25 * s.ln())
            .collect();
    }
    (timesteps, sigmas)
}

/// x ← x + (σ_down − σ)·(x − x0)/σ, plus σ_up·noise for the ancestral sampler, where the step
/// to σ_next is split into a deterministic part down to σ_down = σ_next²/σ and fresh noise
/// σ_up = σ_next·√(σ² − σ_next²)/σ (so σ_down² + σ_up² = σ_next²). diffusers gets σ_down as
/// √(σ_next² − σ_up²) in float32, which cancels to rounding noise when σ ≫ σ_next (the
/// σ = 4096 of zero-terminal-SNR schedules); the closed form here is the exact value.
fn euler_step(p: &Params, ancestral: bool, t: f32, sigma: f32, next: f32) -> StepCoefficients {
    let (s, sn) = (f64::from(sigma), f64::from(next));
    let (down, up) = if ancestral {
        (sn * sn / s, sn * (s * s - sn * sn).max(0.0).sqrt() / s)
    } else {
        (sn, 0.0)
    };
    let ratio = down / s;
    step(
        t,
        1.0 / (s * s + 1.0).sqrt(),
        sigma_x0(p.prediction, s),
        ratio,
        1.0 - ratio,
        0.0,
        up,
    )
}
