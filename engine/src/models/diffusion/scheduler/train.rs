//! The training noise schedule: betas → ᾱ (alphas_cumprod) → σ = √((1−ᾱ)/ᾱ). diffusers keeps
//! these in float32 tensors, so they are computed here in f32 the way torch does (cumulative
//! products accumulate in f64, as torch's CPU kernel does), keeping every schedule derived from
//! them within an ulp or so of diffusers'.

use super::config::{BetaSchedule, Params};
use crate::Error;

pub(super) struct TrainSchedule {
    pub alphas_cumprod: Vec<f32>,
    /// σ per training timestep, ascending in t.
    pub sigmas: Vec<f32>,
    /// `ln σ` in f32, as numpy's `np.log` of the float32 array gives it.
    pub log_sigmas: Vec<f32>,
}

impl TrainSchedule {
    /// `clamp_terminal`: with zero-terminal-SNR betas ᾱ_T is 0 (σ infinite); the sigma-based
    /// schedulers (Euler, DPM) set it to 2⁻²⁴ so σ_max is 4096, LCM leaves it at 0.
    pub fn new(p: &Params, clamp_terminal: bool) -> Result<Self, Error> {
        let n = p.num_train_timesteps as usize;
        if n < 2 {
            return Err(Error::Invalid(format!(
                "scheduler config: num_train_timesteps must be at least 2, got {n}"
            )));
        }
        let mut betas = match &p.trained_betas {
            Some(b) if b.len() != n => {
                return Err(Error::Invalid(format!(
                    "scheduler config: trained_betas has {} entries but num_train_timesteps is {n}",
                    b.len()
                )));
            }
            Some(b) => b.clone(),
            None => match p.beta_schedule {
                BetaSchedule::Linear => torch_linspace(p.beta_start as f32, p.beta_end as f32, n),
                BetaSchedule::ScaledLinear => {
                    torch_linspace(p.beta_start.sqrt() as f32, p.beta_end.sqrt() as f32, n)
                        .into_iter()
                        .map(|b| b * b)
                        .collect()
                }
                BetaSchedule::SquaredCosCapV2 => cosine_betas(n),
            },
        };
        if p.rescale_zero_snr {
            betas = rescale_zero_terminal_snr(&betas);
        }
        let mut alphas_cumprod = cumprod(betas.iter().map(|b| 1.0 - b));
        if p.rescale_zero_snr && clamp_terminal {
            alphas_cumprod[n - 1] = 2f32.powi(-24);
        }
        let sigmas: Vec<f32> = alphas_cumprod
            .iter()
            .map(|&a| ((1.0 - a) / a).sqrt())
            .collect();
        let log_sigmas = sigmas.iter().map(|s| s.ln()).collect();
        Ok(Self {
            alphas_cumprod,
            sigmas,
            log_sigmas,
        })
    }
}

/// `torch.linspace(start, end, n, dtype=float32)` on the CPU: the step is rounded to f32, the
/// first half counts up from `start` and the second half down from `end`, each element one
/// fused multiply-add (the compiler contracts torch's `start + step * i`).
pub(super) fn torch_linspace(start: f32, end: f32, n: usize) -> Vec<f32> {
    if n == 1 {
        return vec![start];
    }
    let step = (end - start) / (n - 1) as f32;
    let half = n / 2;
    (0..n)
        .map(|i| {
            if i < half {
                step.mul_add(i as f32, start)
            } else {
                (-step).mul_add((n - 1 - i) as f32, end)
            }
        })
        .collect()
}

/// torch's float32 `cumprod` on the CPU: the running product is kept in f64.
fn cumprod(values: impl Iterator<Item = f32>) -> Vec<f32> {
    let mut product = 1f64;
    values
        .map(|v| {
            product *= f64::from(v);
            product as f32
        })
        .collect()
}

/// `betas_for_alpha_bar` with the cosine ᾱ of improved DDPM, betas capped at 0.999.
fn cosine_betas(n: usize) -> Vec<f32> {
    let alpha_bar = |t: f64| {
        ((t + 0.008) / 1.008 * std::f64::consts::PI / 2.0)
            .cos()
            .powi(2)
    };
    (0..n)
        .map(|i| {
            let t1 = i as f64 / n as f64;
            let t2 = (i + 1) as f64 / n as f64;
            (1.0 - alpha_bar(t2) / alpha_bar(t1)).min(0.999) as f32
        })
        .collect()
}

/// Lin et al. 2023, "Common Diffusion Noise Schedules and Sample Steps are Flawed": shifts
/// √ᾱ so the last timestep has zero SNR while the first keeps its value.
fn rescale_zero_terminal_snr(betas: &[f32]) -> Vec<f32> {
    let sqrt_ac: Vec<f32> = cumprod(betas.iter().map(|b| 1.0 - b))
        .into_iter()
        .map(f32::sqrt)
        .collect();
    let (first, last) = (sqrt_ac[0], sqrt_ac[sqrt_ac.len() - 1]);
    let scale = first / (first - last);
    let ac: Vec<f32> = sqrt_ac
        .iter()
        .map(|s| {
            let s = (s - last) * scale;
            s * s
        })
        .collect();
    let mut out = Vec::with_capacity(ac.len());
    out.push(1.0 - ac[0]);
    out.extend(ac.windows(2).map(|w| 1.0 - w[1] / w[0]));
    out
}
