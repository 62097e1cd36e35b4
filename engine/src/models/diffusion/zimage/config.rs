//! The Z-Image transformer's `config.json` (diffusers' `ZImageTransformer2DModel`).

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::Error;

/// What the transformer's shapes and constants are.
#[derive(Clone, Debug, PartialEq)]
pub struct ZImageConfig {
    /// Pixels a patch token covers along each side of the latent.
    pub patch: u32,
    pub in_channels: u32,
    pub dim: u32,
    pub layers: u32,
    pub refiner_layers: u32,
    pub heads: u32,
    pub norm_eps: f32,
    /// The caption features' width (the text encoder's hidden size).
    pub cap_feat_dim: u32,
    pub rope_theta: f32,
    /// The timestep is multiplied by this before its sinusoidal embedding.
    pub t_scale: f32,
    /// RoPE channels per position axis (caption index, height, width), halved into pairs.
    pub axes_dims: Vec<u32>,
}

/// The modulation vector's width: `min(dim, 256)`.
pub const ADALN_DIM: u32 = 256;
/// The timestep MLP's hidden width.
pub const TIME_HIDDEN: u32 = 1024;
/// The sinusoidal embedding's width.
pub const TIME_FREQUENCIES: u32 = 256;
/// Caption and image token counts are padded to a multiple of this.
pub const SEQ_MULTIPLE: u32 = 32;

fn bad(message: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("Z-Image transformer config: {message}"))
}

/// `v[key]`, or `default` where it is absent or null; a value of the wrong type is named.
fn field<T: DeserializeOwned>(v: &Value, key: &str, default: T) -> Result<T, Error> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(x) => T::deserialize(x).map_err(|e| bad(format!("{key}: {e}"))),
    }
}

/// The fields read, with diffusers' defaults for `ZImageTransformer2DModel.__init__` (the
/// published 6B's shape).
struct Raw {
    all_patch_size: Vec<u32>,
    all_f_patch_size: Vec<u32>,
    in_channels: u32,
    dim: u32,
    n_layers: u32,
    n_refiner_layers: u32,
    n_heads: u32,
    n_kv_heads: u32,
    norm_eps: f32,
    qk_norm: bool,
    cap_feat_dim: u32,
    rope_theta: f32,
    t_scale: f32,
    axes_dims: Vec<u32>,
    axes_lens: Vec<u32>,
}

impl Raw {
    fn read(v: &Value) -> Result<Self, Error> {
        let heads = field(v, "n_heads", 30)?;
        Ok(Self {
            all_patch_size: field(v, "all_patch_size", vec![2])?,
            all_f_patch_size: field(v, "all_f_patch_size", vec![1])?,
            in_channels: field(v, "in_channels", 16)?,
            dim: field(v, "dim", 3840)?,
            n_layers: field(v, "n_layers", 30)?,
            n_refiner_layers: field(v, "n_refiner_layers", 2)?,
            n_heads: heads,
            n_kv_heads: field(v, "n_kv_heads", heads)?,
            norm_eps: field(v, "norm_eps", 1e-5)?,
            qk_norm: field(v, "qk_norm", true)?,
            cap_feat_dim: field(v, "cap_feat_dim", 2560)?,
            rope_theta: field(v, "rope_theta", 256.0)?,
            t_scale: field(v, "t_scale", 1000.0)?,
            axes_dims: field(v, "axes_dims", vec![32, 48, 48])?,
            axes_lens: field(v, "axes_lens", vec![1024, 512, 512])?,
        })
    }
}

impl ZImageConfig {
    pub fn from_json(v: &Value) -> Result<Self, Error> {
        let class: Option<String> = field(v, "_class_name", None)?;
        if let Some(class) = &class
            && class != "ZImageTransformer2DModel"
        {
            return Err(bad(format!("unsupported transformer {class}")));
        }
        let siglip: Option<u32> = field(v, "siglip_feat_dim", None)?;
        let raw = Raw::read(v)?;
        if siglip.is_some() {
            return Err(bad(
                "siglip_feat_dim is set: the Omni variant's image conditioning is not supported",
            ));
        }
        if !raw.qk_norm {
            return Err(bad("qk_norm false is not supported"));
        }
        // A checkpoint may list several patch sizes; the pipeline always runs 2 (with a frame
        // patch of 1), which must be among them.
        let pairs = raw.all_patch_size.iter().zip(&raw.all_f_patch_size);
        let Some(patch) = pairs
            .filter(|(_, f)| **f == 1)
            .map(|(p, _)| *p)
            .find(|p| *p == 2)
        else {
            return Err(bad(format!(
                "all_patch_size {:?} with all_f_patch_size {:?}: the pipeline runs patch size 2 with frame patch 1",
                raw.all_patch_size, raw.all_f_patch_size
            )));
        };
        let bounded = [
            ("in_channels", raw.in_channels, 1024),
            ("dim", raw.dim, 65_536),
            ("n_heads", raw.n_heads, 1024),
            ("n_layers", raw.n_layers, 1024),
            ("n_refiner_layers", raw.n_refiner_layers, 1024),
            ("cap_feat_dim", raw.cap_feat_dim, 65_536),
        ];
        if let Some((key, value, most)) = bounded.iter().find(|(_, v, most)| v > most) {
            return Err(bad(format!("{key} {value} is more than {most}")));
        }
        let positive = [
            ("in_channels", raw.in_channels),
            ("dim", raw.dim),
            ("n_heads", raw.n_heads),
            ("cap_feat_dim", raw.cap_feat_dim),
        ];
        if let Some((key, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(bad(format!("{key} must be positive")));
        }
        if !raw.dim.is_multiple_of(raw.n_heads) || raw.n_kv_heads != raw.n_heads {
            return Err(bad(format!(
                "dim {} over n_heads {} (n_kv_heads {}): equal head counts dividing dim are needed",
                raw.dim, raw.n_heads, raw.n_kv_heads
            )));
        }
        let head_dim = raw.dim / raw.n_heads;
        if raw.axes_dims.iter().sum::<u32>() != head_dim
            || raw.axes_dims.iter().any(|d| d % 2 == 1)
            || raw.axes_dims.len() != 3
            || raw.axes_lens.len() != 3
        {
            return Err(bad(format!(
                "axes_dims {:?} must be three even sizes adding up to the head size {head_dim}",
                raw.axes_dims
            )));
        }
        Ok(Self {
            patch,
            in_channels: raw.in_channels,
            dim: raw.dim,
            layers: raw.n_layers,
            refiner_layers: raw.n_refiner_layers,
            heads: raw.n_heads,
            norm_eps: raw.norm_eps,
            cap_feat_dim: raw.cap_feat_dim,
            rope_theta: raw.rope_theta,
            t_scale: raw.t_scale,
            axes_dims: raw.axes_dims,
        })
    }

    pub fn head_dim(&self) -> u32 {
        self.dim / self.heads
    }

    /// The feed-forward's hidden width: `int(dim / 3 · 8)`.
    pub fn ffn_hidden(&self) -> u32 {
        (f64::from(self.dim) / 3.0 * 8.0) as u32
    }

    /// The modulation vector's width.
    pub fn adaln_dim(&self) -> u32 {
        self.dim.min(ADALN_DIM)
    }

    /// Features per patch token.
    pub fn patch_features(&self) -> u32 {
        self.patch * self.patch * self.in_channels
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_are_the_published_shape() {
        let c = ZImageConfig::from_json(&json!({})).expect("defaults");
        assert_eq!(
            (c.dim, c.heads, c.head_dim(), c.layers),
            (3840, 30, 128, 30)
        );
        assert_eq!(c.ffn_hidden(), 10240);
        assert_eq!(c.patch_features(), 64);
    }

    #[test]
    fn refuses_what_it_cannot_run() {
        let err = |v: Value| {
            ZImageConfig::from_json(&v)
                .expect_err("refused")
                .to_string()
        };
        assert!(err(json!({ "siglip_feat_dim": 1152 })).contains("Omni"));
        assert!(err(json!({ "axes_dims": [32, 48, 40] })).contains("axes_dims"));
        assert!(err(json!({ "dim": 100, "n_heads": 3 })).contains("n_heads"));
        assert!(err(json!({ "n_layers": "many" })).contains("n_layers"));
        assert!(err(json!({ "dim": 0 })).contains("dim"));
        assert!(err(json!({ "all_patch_size": [4] })).contains("patch size 2"));
        assert!(err(json!({ "dim": 1_000_000 })).contains("dim"));
        // Several patch sizes: the pipeline's 2 is the one run.
        let c = ZImageConfig::from_json(
            &json!({ "all_patch_size": [4, 2], "all_f_patch_size": [1, 1] }),
        )
        .expect("2 is listed");
        assert_eq!(c.patch, 2);
        assert!(err(json!({ "_class_name": "FluxTransformer2DModel" })).contains("Flux"));
    }
}
