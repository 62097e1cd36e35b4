//! RoPE angle tables for diffusion transformers: each token's position ids, one per axis,
//! turned into `(cos, sin)` pairs for [`crate::ops::head_rope`].

/// `(cos, sin)` of every token's angles, `[tokens][head_dim / 2][2]`: axis a contributes
/// `axes_dims[a] / 2` angles `position · θ^(−2j / axes_dims[a])`. The frequencies and products
/// are taken in f64, as diffusers does; `round_angle` rounds the angle to f32 before its cosine
/// and sine (Z-Image's complex-number form), else they are taken in f64 too (FLUX.2's).
pub fn rope_table<const AXES: usize>(
    ids: &[[u32; AXES]],
    axes_dims: &[u32],
    theta: f32,
    round_angle: bool,
) -> Vec<f32> {
    let theta = f64::from(theta);
    let freqs: Vec<(usize, f64)> = axes_dims
        .iter()
        .enumerate()
        .flat_map(|(axis, &d)| {
            (0..d / 2).map(move |j| (axis, 1.0 / theta.powf(f64::from(2 * j) / f64::from(d))))
        })
        .collect();
    let mut table = Vec::with_capacity(ids.len() * freqs.len() * 2);
    for id in ids {
        for &(axis, f) in &freqs {
            let angle = f64::from(id.get(axis).copied().unwrap_or(0)) * f;
            if round_angle {
                let angle = angle as f32;
                table.push(angle.cos());
                table.push(angle.sin());
            } else {
                table.push(angle.cos() as f32);
                table.push(angle.sin() as f32);
            }
        }
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn angles_per_axis() {
        let t = rope_table(&[[2, 3, 5]], &[2, 4, 2], 256.0, true);
        // Axis 0: one angle 2·1; axis 1: 3·1 and 3·256^(−1/2); axis 2: 5·1.
        let angles = [2.0f32, 3.0, 3.0 / 16.0, 5.0];
        assert_eq!(t.len(), 8);
        for (i, a) in angles.iter().enumerate() {
            assert!((t[2 * i] - a.cos()).abs() < 1e-6 && (t[2 * i + 1] - a.sin()).abs() < 1e-6);
        }
    }
}
