//! Latent Consistency Model sampling (LCMScheduler), Luo et al. 2023: each step predicts x0
//! with the consistency boundary condition, then re-noises it to the next timestep.

use super::config::Params;
use super::spacing::np_linspace;
use super::train::TrainSchedule;
use super::{Schedule, StepCoefficients, no_steps, step, vp_x0};
use crate::Error;

pub(super) fn schedule(p: &Params, n: usize, begin: usize) -> Result<Schedule, Error> {
    let train = TrainSchedule::new(p, false)?;
    let timesteps = timesteps(p, n)?;
    if begin >= timesteps.len() {
        return Err(no_steps(begin, timesteps.len()));
    }
    let ac = |t: usize| f64::from(train.alphas_cumprod[t]);
    let steps = (begin..timesteps.len())
        .map(|j| {
            let prev = timesteps.get(j + 1).map(|&t| ac(t));
            lcm_step(p, timesteps[j], ac(timesteps[j]), prev)
        })
        .collect();
    let a0 = ac(timesteps[begin]);
    Ok(Schedule {
        steps,
        init_noise_sigma: 1.0,
        img2img: Some((a0.sqrt() as f32, (1.0 - a0).sqrt() as f32)),
    })
}

/// The `n` timesteps: evenly picked (floor of np.linspace without endpoint) from the
/// `original_inference_steps` timesteps the model was distilled on, k−1, 2k−1, …, T−1 with
/// k = T / original_inference_steps.
fn timesteps(p: &Params, n: usize) -> Result<Vec<usize>, Error> {
    let train = p.num_train_timesteps as usize;
    let original = p.original_inference_steps as usize;
    if original == 0 || original > train {
        return Err(Error::Invalid(format!(
            "scheduler config: original_inference_steps must be between 1 and {train}, got {original}"
        )));
    }
    if n > original {
        return Err(Error::Invalid(format!(
            "LCM runs at most {original} steps (its original_inference_steps), not {n}"
        )));
    }
    let k = train / original;
    let origin: Vec<usize> = (1..=original).rev().map(|i| i * k - 1).collect();
    Ok(np_linspace(0.0, original as f64, n, false)
        .into_iter()
        .map(|i| origin[i.floor() as usize])
        .collect())
}

/// x0 = c_skip·x + c_out·x0_pred (c_skip = σ_d²/((st)²+σ_d²), c_out = st/√((st)²+σ_d²),
/// σ_d = 0.5, s = timestep_scaling), then x' = √ᾱ'·x0 + √(1−ᾱ')·noise, except after the last
/// step, which returns x0 itself.
fn lcm_step(p: &Params, t: usize, ac: f64, next_ac: Option<f64>) -> StepCoefficients {
    const SIGMA_DATA_SQ: f64 = 0.25;
    let scaled = t as f64 * p.timestep_scaling;
    let c_skip = SIGMA_DATA_SQ / (scaled * scaled + SIGMA_DATA_SQ);
    let c_out = scaled / (scaled * scaled + SIGMA_DATA_SQ).sqrt();
    let (x0_p, x0_q) = vp_x0(p.prediction, ac.sqrt(), (1.0 - ac).sqrt());
    let (b, d) = next_ac.map_or((1.0, 0.0), |a| (a.sqrt(), (1.0 - a).sqrt()));
    step(
        t as f32,
        1.0,
        (c_out * x0_p + c_skip, c_out * x0_q),
        0.0,
        b,
        0.0,
        d,
    )
}
