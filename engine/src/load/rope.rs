//! Rotary position embeddings as configs describe them: the base, and the scaling
//! (`linear`, `llama3`, per-frequency factors from GGUF) that turns it into the inverse
//! frequencies the RoPE kernels rotate by.

use serde_json::Value;

use super::config::SpecError;

#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    Linear {
        factor: f32,
    },
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position_embeddings: f32,
    },
    /// One divisor per frequency (GGUF's `rope_freqs.weight`, how llama.cpp stores Llama 3.x
    /// scaling).
    Factors(Vec<f32>),
    /// Phi-3.5 / Phi-4-mini: one divisor per frequency from `short` while the sequence fits
    /// `original` positions, from `long` once a forward pass reaches past them (transformers
    /// switches per forward: a prompt longer than `original` is long throughout, a shorter one
    /// switches while decoding); cos and sin are scaled by `attention_factor`.
    LongRope {
        short: Vec<f32>,
        long: Vec<f32>,
        original: u32,
        attention_factor: f32,
    },
    /// YaRN (GPT-OSS): frequencies with wavelengths beyond the `beta_slow`…`beta_fast`
    /// rotations over `original` positions are divided by `factor`, those within blend the two
    /// on a linear ramp; cos and sin are scaled by `attention_factor`.
    Yarn {
        factor: f32,
        beta_fast: f32,
        beta_slow: f32,
        original: f32,
        truncate: bool,
        attention_factor: f32,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct RopeSpec {
    pub theta: f32,
    pub scaling: RopeScaling,
}

impl RopeSpec {
    /// Longrope's long-context inverse frequencies, the length they take over after, and
    /// the cos/sin scale.
    pub fn longrope(&self, head_dim: u32) -> Option<(Vec<f32>, u32, f32)> {
        let RopeScaling::LongRope {
            ref long,
            original,
            attention_factor,
            ..
        } = self.scaling
        else {
            return None;
        };
        let long = RopeSpec {
            theta: self.theta,
            scaling: RopeScaling::Factors(long.clone()),
        };
        Some((long.inv_freq(head_dim), original, attention_factor))
    }

    /// The factor transformers scales cos and sin by (1 but for YaRN; longrope's applies to
    /// its long table, see [`RopeSpec::longrope`]).
    pub fn attention_factor(&self) -> f32 {
        match self.scaling {
            RopeScaling::Yarn {
                attention_factor, ..
            } => attention_factor,
            _ => 1.0,
        }
    }

    /// Inverse frequencies for a head of `head_dim`, as transformers computes them (f32).
    pub fn inv_freq(&self, head_dim: u32) -> Vec<f32> {
        let base: Vec<f32> = (0..head_dim / 2)
            .map(|i| 1.0 / self.theta.powf((2 * i) as f32 / head_dim as f32))
            .collect();
        match self.scaling {
            RopeScaling::None => base,
            RopeScaling::Linear { factor } => base.iter().map(|f| f / factor).collect(),
            RopeScaling::Factors(ref factors)
            | RopeScaling::LongRope {
                short: ref factors, ..
            } => base
                .iter()
                .zip(factors.iter().chain(std::iter::repeat(&1.0)))
                .map(|(f, d)| f / d)
                .collect(),
            RopeScaling::Yarn {
                factor,
                beta_fast,
                beta_slow,
                original,
                truncate,
                ..
            } => yarn_inv_freq(
                &base,
                self.theta,
                head_dim,
                factor,
                (beta_fast, beta_slow),
                original,
                truncate,
            ),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: old,
            } => {
                let low_freq_wavelen = old / low_freq_factor;
                let high_freq_wavelen = old / high_freq_factor;
                base.iter()
                    .map(|&f| {
                        let wavelen = 2.0 * std::f32::consts::PI / f;
                        if wavelen < high_freq_wavelen {
                            f
                        } else if wavelen > low_freq_wavelen {
                            f / factor
                        } else {
                            let smooth = (old / wavelen - low_freq_factor)
                                / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect()
            }
        }
    }
}

/// YaRN's inverse frequencies as transformers' `_compute_yarn_parameters` computes them: the
/// correction range of dims from the rotation counts (f64, as Python's math does), then a
/// linear ramp (f32) between extrapolated and interpolated frequencies.
fn yarn_inv_freq(
    base: &[f32],
    theta: f32,
    head_dim: u32,
    factor: f32,
    (beta_fast, beta_slow): (f32, f32),
    original: f32,
    truncate: bool,
) -> Vec<f32> {
    let dim = f64::from(head_dim);
    let correction_dim = |rotations: f32| {
        dim * (f64::from(original) / (f64::from(rotations) * 2.0 * std::f64::consts::PI)).ln()
            / (2.0 * f64::from(theta).ln())
    };
    let (mut low, mut high) = (correction_dim(beta_fast), correction_dim(beta_slow));
    if truncate {
        low = low.floor();
        high = high.ceil();
    }
    let low = low.max(0.0) as f32;
    let mut high = high.min(dim - 1.0) as f32;
    if low == high {
        high += 0.001;
    }
    (0..base.len())
        .map(|i| {
            let positional = theta.powf((2 * i) as f32 / head_dim as f32);
            let extrapolated = 1.0 / positional;
            let interpolated = 1.0 / (factor * positional);
            let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
            let keep = 1.0 - ramp;
            interpolated * (1.0 - keep) + extrapolated * keep
        })
        .collect()
}

fn opt_f32(c: &Value, key: &str) -> Option<f32> {
    c.get(key).and_then(Value::as_f64).map(|v| v as f32)
}

/// The RoPE of a config: `rope_parameters` (transformers 5) or `rope_theta` with an optional
/// `rope_scaling` object (older configs).
pub(super) fn rope_spec(c: &Value) -> Result<RopeSpec, SpecError> {
    // Newer configs put everything under rope_parameters; older ones use rope_theta plus an
    // optional rope_scaling object.
    let params = c.get("rope_parameters").filter(|v| v.is_object());
    let scaling = params.or_else(|| c.get("rope_scaling").filter(|v| v.is_object()));
    let theta = params
        .and_then(|p| opt_f32(p, "rope_theta"))
        .or_else(|| opt_f32(c, "rope_theta"))
        .unwrap_or(10_000.0);
    rope_with(scaling, theta, c)
}

/// A RoPE of base `theta` scaled as the `rope_type` (or `type`) object `scaling` of the model
/// config `config` says.
pub(super) fn rope_with(
    scaling: Option<&Value>,
    theta: f32,
    config: &Value,
) -> Result<RopeSpec, SpecError> {
    let scaling = scaling.cloned().unwrap_or(Value::Null);
    let theta = opt_f32(&scaling, "rope_theta").unwrap_or(theta);
    let kind = scaling
        .get("rope_type")
        .or_else(|| scaling.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let factor = || {
        opt_f32(&scaling, "factor")
            .filter(|f| *f > 0.0)
            .ok_or_else(|| SpecError::Invalid(format!("rope scaling {kind:?} needs a factor")))
    };
    let scaling = match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: factor()? },
        "llama3" => RopeScaling::Llama3 {
            factor: factor()?,
            low_freq_factor: opt_f32(&scaling, "low_freq_factor").unwrap_or(1.0),
            high_freq_factor: opt_f32(&scaling, "high_freq_factor").unwrap_or(4.0),
            original_max_position_embeddings: opt_f32(&scaling, "original_max_position_embeddings")
                .unwrap_or(8192.0),
        },
        "longrope" | "su" => longrope(&scaling, config)?,
        "yarn" => yarn(&scaling, config)?,
        other => {
            return Err(SpecError::Invalid(format!(
                "rope scaling type {other:?} is not supported (supported: default, linear, llama3, longrope, yarn)"
            )));
        }
    };
    Ok(RopeSpec { theta, scaling })
}

/// Longrope as transformers reads it: the original length from the scaling object or the config,
/// the default attention factor from how far `max_position_embeddings` stretches it.
fn longrope(scaling: &Value, config: &Value) -> Result<RopeScaling, SpecError> {
    let factors = |key: &str| -> Result<Vec<f32>, SpecError> {
        let list = scaling
            .get(key)
            .and_then(Value::as_array)
            .ok_or_else(|| SpecError::Invalid(format!("longrope needs {key}")))?;
        list.iter()
            .map(|v| v.as_f64().map(|f| f as f32).filter(|f| *f > 0.0))
            .collect::<Option<Vec<f32>>>()
            .ok_or_else(|| SpecError::Invalid(format!("longrope {key} holds a non-positive value")))
    };
    let (short, long) = (factors("short_factor")?, factors("long_factor")?);
    let max_positions = opt_f32(config, "max_position_embeddings");
    let from_config = opt_f32(config, "original_max_position_embeddings");
    let original = from_config
        .or_else(|| opt_f32(scaling, "original_max_position_embeddings"))
        .or(max_positions)
        .filter(|o| *o >= 1.0)
        .ok_or_else(|| {
            SpecError::Invalid("longrope needs original_max_position_embeddings".into())
        })?;
    let factor = match (from_config, max_positions) {
        (Some(o), Some(m)) => m / o,
        _ => opt_f32(scaling, "factor").unwrap_or(1.0),
    };
    let attention_factor = opt_f32(scaling, "attention_factor").unwrap_or(if factor <= 1.0 {
        1.0
    } else {
        (1.0 + factor.ln() / original.ln()).sqrt()
    });
    Ok(RopeScaling::LongRope {
        short,
        long,
        original: original as u32,
        attention_factor,
    })
}

/// YaRN as transformers reads it: `original_max_position_embeddings` (else the config's
/// `max_position_embeddings`), `factor` (else the ratio of the two), the attention factor from
/// `mscale` / `mscale_all_dim` where both are given, else 0.1·ln(factor) + 1; `truncate`
/// defaults to true.
fn yarn(scaling: &Value, config: &Value) -> Result<RopeScaling, SpecError> {
    let max_positions = opt_f32(config, "max_position_embeddings");
    let original = opt_f32(scaling, "original_max_position_embeddings")
        .or(max_positions)
        .filter(|o| *o >= 1.0)
        .ok_or_else(|| SpecError::Invalid("yarn needs original_max_position_embeddings".into()))?;
    let factor = opt_f32(scaling, "factor")
        .or(max_positions.map(|m| m / original))
        .filter(|f| *f > 0.0)
        .ok_or_else(|| SpecError::Invalid("yarn needs a factor".into()))?;
    let mscale = |scale: f32, m: f32| {
        if scale <= 1.0 {
            1.0
        } else {
            0.1 * m * scale.ln() + 1.0
        }
    };
    let attention_factor = match (
        opt_f32(scaling, "attention_factor"),
        opt_f32(scaling, "mscale").filter(|m| *m != 0.0),
        opt_f32(scaling, "mscale_all_dim").filter(|m| *m != 0.0),
    ) {
        (Some(a), ..) => a,
        (None, Some(m), Some(all)) => mscale(factor, m) / mscale(factor, all),
        _ => mscale(factor, 1.0),
    };
    let positive = |key: &str, default: f32| {
        opt_f32(scaling, key)
            .filter(|v| *v != 0.0)
            .unwrap_or(default)
    };
    Ok(RopeScaling::Yarn {
        factor,
        beta_fast: positive("beta_fast", 32.0),
        beta_slow: positive("beta_slow", 1.0),
        original,
        truncate: scaling
            .get("truncate")
            .and_then(Value::as_bool)
            .unwrap_or(true),
        attention_factor,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_frequencies_follow_the_three_bands() {
        let spec = RopeSpec {
            theta: 10000.0,
            scaling: RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 32.0,
            },
        };
        let plain = RopeSpec {
            theta: 10000.0,
            scaling: RopeScaling::None,
        };
        let scaled = spec.inv_freq(16);
        let base = plain.inv_freq(16);
        // Highest frequency (wavelength 2π < 8) untouched; lowest divided by the factor.
        assert_eq!(scaled[0], base[0]);
        assert!((scaled[7] - base[7] / 8.0).abs() < 1e-12);
        // Something in between is smoothed strictly between the two.
        assert!(
            scaled
                .iter()
                .zip(&base)
                .any(|(s, b)| *s < *b && *s > *b / 8.0)
        );
    }
}
