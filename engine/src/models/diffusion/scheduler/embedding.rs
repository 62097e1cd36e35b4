//! Sinusoidal timestep embeddings, as the UNet's time embedding and SDXL's size/crop
//! conditioning (`add_time_ids`) take them.

/// diffusers' `get_timestep_embedding(t, dim, flip_sin_to_cos, downscale_freq_shift)` with
/// `max_period = 10000` and `scale = 1`: frequencies `exp(−ln(10000)·i / (dim/2 − shift))`,
/// then `[sin(t·f), cos(t·f)]` (cosines first when flipped), zero-padded to an odd `dim`.
/// Computed in f32 in torch's order of operations, so it matches diffusers to an ulp or two of
/// the angle.
pub fn timestep_embedding(
    t: f32,
    dim: usize,
    flip_sin_to_cos: bool,
    downscale_freq_shift: f32,
) -> Vec<f32> {
    let half = dim / 2;
    let log_max = -(10000f64.ln()) as f32;
    let denominator = (half as f64 - f64::from(downscale_freq_shift)) as f32;
    let angles: Vec<f32> = (0..half)
        .map(|i| t * (log_max * i as f32 / denominator).exp())
        .collect();
    let sin = angles.iter().map(|a| a.sin());
    let cos = angles.iter().map(|a| a.cos());
    let mut out: Vec<f32> = if flip_sin_to_cos {
        cos.chain(sin).collect()
    } else {
        sin.chain(cos).collect()
    };
    out.resize(dim, 0.0);
    out
}
