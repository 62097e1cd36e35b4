//! DPM-Solver++(2M) on Karras sigmas (DPMSolverMultistepScheduler), Lu et al. 2022. x is
//! variance-preserving: x = α·x0 + s·ε with α = 1/√(σ²+1), s = σ·α, and λ = ln(α/s) = −ln σ.

use super::config::{BetaSchedule, Params};
use super::spacing::{karras, sigma_to_t};
use super::train::TrainSchedule;
use super::{Schedule, StepCoefficients, no_steps, step, vp_x0};
use crate::Error;

pub(super) fn schedule(p: &Params, n: usize, begin: usize) -> Result<Schedule, Error> {
    let train = TrainSchedule::new(p, true)?;
    let last = train.sigmas.len() - 1;
    let ramp = karras(f64::from(train.sigmas[0]), f64::from(train.sigmas[last]), n);
    // Timesteps are rounded to integers, except (as diffusers does) for the cosine schedule,
    // whose fractional ones are truncated by the cast to int64.
    let round = p.beta_schedule != BetaSchedule::SquaredCosCapV2;
    let timesteps: Vec<f32> = ramp
        .iter()
        .map(|&s| {
            let t = sigma_to_t(s, &train.log_sigmas);
            (if round { t.round_ties_even() } else { t }).trunc() as f32
        })
        .collect();
    let mut sigmas: Vec<f64> = ramp.iter().map(|&s| f64::from(s as f32)).collect();
    sigmas.push(if p.final_sigma_min {
        f64::from(train.sigmas[0])
    } else {
        0.0
    });
    if begin >= n {
        return Err(no_steps(begin, n));
    }
    let steps = (begin..n)
        .map(|j| dpm_step(p, &sigmas, &timesteps, j, begin))
        .collect();
    let alpha = 1.0 / (sigmas[begin] * sigmas[begin] + 1.0).sqrt();
    Ok(Schedule {
        steps,
        init_noise_sigma: 1.0,
        img2img: Some((alpha as f32, (sigmas[begin] * alpha) as f32)),
    })
}

/// One step from σ = sigmas[j] to σ' = sigmas[j+1], h = λ' − λ = ln(σ/σ'):
/// first order x' = (s'/s)·x + α'(1 − e⁻ʰ)·D0; second order adds the difference to the
/// previous x0 prediction, D1 = (D0 − D_prev)/r with r = h_prev/h.
fn dpm_step(
    p: &Params,
    sigmas: &[f64],
    timesteps: &[f32],
    j: usize,
    begin: usize,
) -> StepCoefficients {
    let n = timesteps.len();
    let (s, next) = (sigmas[j], sigmas[j + 1]);
    let alpha = 1.0 / (s * s + 1.0).sqrt();
    let alpha_next = 1.0 / (next * next + 1.0).sqrt();
    // The first step run has no previous prediction; the last one drops to first order for
    // short schedules and whenever it ends at σ = 0 (where h is infinite).
    let first_order = j == begin
        || (j == n - 1
            && (p.euler_at_final || (p.lower_order_final && n < 15) || !p.final_sigma_min));
    let e = next / s; // e^(−h)
    let k = alpha_next * (1.0 - e);
    let (b, c) = if first_order {
        (k, 0.0)
    } else {
        let h = (s / next).ln();
        let r = (sigmas[j - 1] / s).ln() / h;
        if p.heun {
            let g = alpha_next * ((e - 1.0) / h + 1.0);
            (k + g / r, -g / r)
        } else {
            (k * (1.0 + 0.5 / r), -0.5 * k / r)
        }
    };
    step(
        timesteps[j],
        1.0,
        vp_x0(p.prediction, alpha, s * alpha),
        (next * alpha_next) / (s * alpha),
        b,
        c,
        0.0,
    )
}
