//! The FLUX.2 transformer's `config.json` (diffusers' `Flux2Transformer2DModel`).

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::Error;

/// What the transformer's shapes and constants are.
#[derive(Clone, Debug, PartialEq)]
pub struct Flux2Config {
    /// Features of a packed latent token (the VAE's channels times its 2×2 patch).
    pub in_channels: u32,
    pub out_channels: u32,
    /// Double-stream blocks, then single-stream blocks.
    pub double_layers: u32,
    pub single_layers: u32,
    pub heads: u32,
    pub head_dim: u32,
    /// The caption features' width: the text encoder's hidden size times the layers stacked.
    pub joint_attention_dim: u32,
    pub time_channels: u32,
    pub mlp_ratio: f32,
    /// RoPE channels per position axis (t, h, w, l).
    pub axes_dims: Vec<u32>,
    pub rope_theta: f32,
    pub eps: f32,
}

fn bad(message: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("FLUX.2 transformer config: {message}"))
}

/// `v[key]`, or `default` where it is absent or null; a value of the wrong type is named.
fn field<T: DeserializeOwned>(v: &Value, key: &str, default: T) -> Result<T, Error> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(x) => T::deserialize(x).map_err(|e| bad(format!("{key}: {e}"))),
    }
}

impl Flux2Config {
    /// Reads the config with diffusers' `__init__` defaults where a field is absent.
    pub fn from_json(v: &Value) -> Result<Self, Error> {
        let class: Option<String> = field(v, "_class_name", None)?;
        if let Some(class) = &class
            && class != "Flux2Transformer2DModel"
        {
            return Err(bad(format!("unsupported transformer {class}")));
        }
        let patch: u32 = field(v, "patch_size", 1)?;
        if patch != 1 {
            return Err(bad(format!(
                "patch_size {patch}: the pipeline packs 2×2 latent patches itself and runs patch size 1"
            )));
        }
        let in_channels: u32 = field(v, "in_channels", 128)?;
        let out_channels: u32 = field(v, "out_channels", in_channels)?;
        let cfg = Self {
            in_channels,
            out_channels,
            double_layers: field(v, "num_layers", 8)?,
            single_layers: field(v, "num_single_layers", 48)?,
            heads: field(v, "num_attention_heads", 48)?,
            head_dim: field(v, "attention_head_dim", 128)?,
            joint_attention_dim: field(v, "joint_attention_dim", 15360)?,
            time_channels: field(v, "timestep_guidance_channels", 256)?,
            mlp_ratio: field(v, "mlp_ratio", 3.0)?,
            axes_dims: field(v, "axes_dims_rope", vec![32, 32, 32, 32])?,
            rope_theta: field(v, "rope_theta", 2000.0)?,
            eps: field(v, "eps", 1e-6)?,
        };
        cfg.check()?;
        Ok(cfg)
    }

    fn check(&self) -> Result<(), Error> {
        let bounded = [
            ("in_channels", self.in_channels, 4096),
            ("out_channels", self.out_channels, 4096),
            ("num_layers", self.double_layers, 1024),
            ("num_single_layers", self.single_layers, 1024),
            ("num_attention_heads", self.heads, 1024),
            ("attention_head_dim", self.head_dim, 1024),
            ("joint_attention_dim", self.joint_attention_dim, 262_144),
            ("timestep_guidance_channels", self.time_channels, 65_536),
        ];
        if let Some((key, value, most)) = bounded.iter().find(|(_, v, most)| v > most) {
            return Err(bad(format!("{key} {value} is more than {most}")));
        }
        // Either kind of block may be absent (diffusers builds such a model); no width may be.
        let counts = ["num_layers", "num_single_layers"];
        let zero = bounded
            .iter()
            .find(|(key, v, _)| *v == 0 && !counts.contains(key));
        if let Some((key, _, _)) = zero {
            return Err(bad(format!("{key} is 0")));
        }
        if self.out_channels != self.in_channels {
            return Err(bad(format!(
                "out_channels {} differs from in_channels {}: the output is a velocity of the input's shape",
                self.out_channels, self.in_channels
            )));
        }
        if !self.in_channels.is_multiple_of(4) {
            return Err(bad(format!(
                "in_channels {}: a packed token holds 2×2 patches of the VAE's channels",
                self.in_channels
            )));
        }
        if !self.time_channels.is_multiple_of(2) {
            return Err(bad("timestep_guidance_channels must be even"));
        }
        let rope: u32 = self.axes_dims.iter().sum();
        if self.axes_dims.len() != 4
            || self.axes_dims.iter().any(|d| *d % 2 != 0)
            || rope != self.head_dim
        {
            return Err(bad(format!(
                "axes_dims_rope {:?}: four even sizes summing to the head size {} are needed",
                self.axes_dims, self.head_dim
            )));
        }
        let mlp = f64::from(self.dim()) * f64::from(self.mlp_ratio);
        if !(self.mlp_ratio.is_finite() && self.mlp_ratio > 0.0 && (1.0..=1e6).contains(&mlp)) {
            return Err(bad(format!("mlp_ratio {}", self.mlp_ratio)));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 1.0) {
            return Err(bad(format!("rope_theta {}", self.rope_theta)));
        }
        if !(self.eps.is_finite() && self.eps > 0.0 && self.eps < 1.0) {
            return Err(bad(format!("eps {}", self.eps)));
        }
        if u64::from(self.heads) * u64::from(self.head_dim) > 65_536 {
            return Err(bad("the model width is more than 65536"));
        }
        Ok(())
    }

    /// The width of the residual stream.
    pub fn dim(&self) -> u32 {
        self.heads * self.head_dim
    }

    /// The feed-forward's hidden width, `int(dim · mlp_ratio)` as Python truncates it.
    pub fn mlp_hidden(&self) -> u32 {
        (f64::from(self.dim()) * f64::from(self.mlp_ratio)) as u32
    }

    /// The VAE's latent channels.
    pub fn latent_channels(&self) -> u32 {
        self.in_channels / 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_and_refusals() {
        let c = Flux2Config::from_json(&json!({
            "num_attention_heads": 3, "attention_head_dim": 16, "axes_dims_rope": [4, 4, 4, 4],
            "mlp_ratio": 2.5
        }))
        .expect("config");
        assert_eq!(
            (c.dim(), c.mlp_hidden(), c.latent_channels()),
            (48, 120, 32)
        );
        for bad in [
            json!({"patch_size": 2}),
            json!({"axes_dims_rope": [32, 32, 32]}),
            json!({"in_channels": 130, "out_channels": 130}),
            json!({"in_channels": 128, "out_channels": 64}),
            json!({"mlp_ratio": -1.0}),
            json!({"num_layers": "five"}),
            json!({"_class_name": "FluxTransformer2DModel"}),
            json!({"num_attention_heads": 0}),
        ] {
            assert!(Flux2Config::from_json(&bad).is_err(), "{bad}");
        }
    }
}
