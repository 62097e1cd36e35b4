//! Where the inference steps fall: diffusers' timestep spacings, Karras/exponential sigma
//! ramps and the sigma → timestep inverse, built on the numpy routines diffusers calls. Each
//! numpy routine is reproduced down to its arithmetic order, since timesteps must come out
//! identical (np.arange's length, np.round's ties to even and np.linspace's endpoint all show
//! up in real schedules).

use super::config::{Params, Spacing};

/// `np.linspace(start, stop, num, endpoint)` in f64.
pub(super) fn np_linspace(start: f64, stop: f64, num: usize, endpoint: bool) -> Vec<f64> {
    let div = if endpoint { num.saturating_sub(1) } else { num };
    let delta = stop - start;
    let mut y: Vec<f64> = (0..num).map(|i| i as f64).collect();
    if div > 0 {
        let step = delta / div as f64;
        for v in &mut y {
            *v = if step == 0.0 {
                *v / div as f64 * delta
            } else {
                *v * step
            };
        }
    } else {
        for v in &mut y {
            *v *= delta;
        }
    }
    for v in &mut y {
        *v += start;
    }
    if endpoint && num > 1 {
        y[num - 1] = stop;
    }
    y
}

/// `np.arange(start, stop, step)` for floats: its length is `ceil((stop − start) / step)`, and
/// element i is `start + i·(first step as actually rounded)`.
fn np_arange(start: f64, stop: f64, step: f64) -> Vec<f64> {
    let len = ((stop - start) / step).ceil().max(0.0) as usize;
    let delta = (start + step) - start;
    (0..len)
        .map(|i| {
            if i == 0 {
                start
            } else {
                start + i as f64 * delta
            }
        })
        .collect()
}

/// `np.interp(x, arange(len(fp)), fp)`: linear interpolation, clamped at both ends.
pub(super) fn np_interp(x: f64, fp: &[f32]) -> f64 {
    let last = fp.len() - 1;
    if x.is_nan() {
        return x;
    }
    if x <= 0.0 {
        return f64::from(fp[0]);
    }
    if x >= last as f64 {
        return f64::from(fp[last]);
    }
    let j = x.floor() as usize;
    let (lo, hi) = (f64::from(fp[j]), f64::from(fp[j + 1]));
    (hi - lo) * (x - j as f64) + lo
}

/// Euler's timesteps for `n` steps (float32, descending), from the config's spacing.
pub(super) fn euler_timesteps(p: &Params, n: usize) -> Vec<f32> {
    let train = p.num_train_timesteps as usize;
    match p.spacing {
        Spacing::Linspace => np_linspace(0.0, (train - 1) as f64, n, true)
            .into_iter()
            .rev()
            .map(|t| t as f32)
            .collect(),
        Spacing::Leading => {
            let ratio = train / n;
            (0..n)
                .rev()
                .map(|i| (i * ratio) as f32 + p.steps_offset as f32)
                .collect()
        }
        // np.arange may give one timestep more than asked (and then a last one of −1): kept,
        // as diffusers runs it.
        Spacing::Trailing => np_arange(train as f64, 0.0, -(train as f64 / n as f64))
            .into_iter()
            .map(|t| t.round_ties_even() as f32 - 1.0)
            .collect(),
    }
}

/// Karras et al. 2022 (EDM) noise levels: `n` points evenly spaced in σ^(1/7).
pub(super) fn karras(sigma_min: f64, sigma_max: f64, n: usize) -> Vec<f64> {
    const RHO: f64 = 7.0;
    let min_inv = sigma_min.powf(1.0 / RHO);
    let max_inv = sigma_max.powf(1.0 / RHO);
    np_linspace(0.0, 1.0, n, true)
        .into_iter()
        .map(|r| (max_inv + r * (min_inv - max_inv)).powf(RHO))
        .collect()
}

/// `n` noise levels evenly spaced in ln σ.
pub(super) fn exponential(sigma_min: f64, sigma_max: f64, n: usize) -> Vec<f64> {
    np_linspace(sigma_max.ln(), sigma_min.ln(), n, true)
        .into_iter()
        .map(f64::exp)
        .collect()
}

/// diffusers' `_sigma_to_t`: the fractional training timestep whose σ is `sigma`, by linear
/// interpolation in ln σ between the neighbouring training timesteps (clamped to the ends).
pub(super) fn sigma_to_t(sigma: f64, log_sigmas: &[f32]) -> f64 {
    let log_sigma = sigma.max(1e-10).ln();
    // The last training timestep whose ln σ is at most ln `sigma` (0 when there is none).
    let count = log_sigmas
        .iter()
        .rposition(|&l| log_sigma - f64::from(l) >= 0.0)
        .unwrap_or(0);
    let low = count.min(log_sigmas.len() - 2);
    let (lo, hi) = (log_sigmas[low], log_sigmas[low + 1]);
    // `lo − hi` is a float32 difference in numpy too.
    let w = ((f64::from(lo) - log_sigma) / f64::from(lo - hi)).clamp(0.0, 1.0);
    (1.0 - w) * low as f64 + w * (low + 1) as f64
}
