//! Seeded Gaussian noise, specified exactly so that any tool can reproduce an image from its
//! seed. It is not torch's generator (which cannot be reproduced outside torch), so the same
//! seed gives different images here and in diffusers.

/// The SplitMix64 output function (Steele, Lea & Flood 2014).
fn mix64(z: u64) -> u64 {
    let z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `len` standard normal values from `seed`.
///
/// The algorithm, exactly:
/// 1. SplitMix64 with state `s = seed`: each draw does `s = s + 0x9E3779B97F4A7C15 (mod 2⁶⁴)`
///    and returns `mix(s)`, where `mix(z)` is `z = (z ^ z>>30)·0xBF58476D1CE4E5B9;
///    z = (z ^ z>>27)·0x94D049BB133111EB; z ^ z>>31` (wrapping u64 arithmetic).
/// 2. Per pair of outputs, draw `a` then `b`; in f64, `u1 = ((a >> 11) + 1)·2⁻⁵³` (in (0, 1]),
///    `u2 = (b >> 11)·2⁻⁵³` (in [0, 1)), `r = sqrt(−2·ln u1)`, `θ = 2π·u2`.
/// 3. Emit `r·cos θ` then `r·sin θ`, each rounded to f32; for odd `len` the last sine is
///    dropped.
///
/// Bit-identical across machines wherever the platform's f64 `ln`, `cos` and `sin` agree to
/// within an f32 rounding (in practice everywhere).
pub fn gaussian_noise(seed: u64, len: usize) -> Vec<f32> {
    let mut state = seed;
    let mut next = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(state)
    };
    let mut out = Vec::with_capacity(len + 1);
    while out.len() < len {
        let u1 = ((next() >> 11) + 1) as f64 * 2f64.powi(-53);
        let u2 = (next() >> 11) as f64 * 2f64.powi(-53);
        let r = (-2.0 * u1.ln()).sqrt();
        let theta = 2.0 * std::f64::consts::PI * u2;
        out.push((r * theta.cos()) as f32);
        out.push((r * theta.sin()) as f32);
    }
    out.truncate(len);
    out
}

/// The noise injected at step `step` (the index into [`super::Schedule::steps`]) of the run
/// seeded with `seed`: `gaussian_noise(mix(seed ^ mix(step + 1)), len)`, with `mix` the
/// SplitMix64 output function described at [`gaussian_noise`]. Every step's stream differs
/// from the initial noise `gaussian_noise(seed, ..)`.
pub fn step_noise(seed: u64, step: u32, len: usize) -> Vec<f32> {
    gaussian_noise(mix64(seed ^ mix64(u64::from(step) + 1)), len)
}
