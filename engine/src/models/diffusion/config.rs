//! The parts of diffusers' `config.json` files (UNet, VAE, CLIP text encoder) that decide the
//! networks' shapes, with diffusers' defaults for fields a file leaves out.

use serde_json::Value;

use crate::Error;

fn bad(what: &str, message: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("{what} config: {message}"))
}

fn u32_field(v: &Value, key: &str, default: Option<u32>, what: &str) -> Result<u32, Error> {
    match v.get(key) {
        Some(Value::Number(n)) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| bad(what, format!("{key} = {n} is not a count"))),
        None | Some(Value::Null) => default.ok_or_else(|| bad(what, format!("{key} is missing"))),
        Some(other) => Err(bad(what, format!("{key} = {other} is not a number"))),
    }
}

fn f32_field(v: &Value, key: &str, default: f32) -> f32 {
    v.get(key)
        .and_then(Value::as_f64)
        .map_or(default, |x| x as f32)
}

fn bool_field(v: &Value, key: &str, default: bool) -> bool {
    v.get(key).and_then(Value::as_bool).unwrap_or(default)
}

fn str_field<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

/// A per-level list, or one number for every level.
fn per_level(
    v: &Value,
    key: &str,
    levels: usize,
    default: Option<u32>,
    what: &str,
) -> Result<Vec<u32>, Error> {
    match v.get(key) {
        Some(Value::Array(items)) => {
            let list: Option<Vec<u32>> = items
                .iter()
                .map(|i| i.as_u64().and_then(|n| u32::try_from(n).ok()))
                .collect();
            let list = list.ok_or_else(|| bad(what, format!("{key} holds a non-count")))?;
            if list.len() != levels {
                return Err(bad(
                    what,
                    format!("{key} has {} entries for {levels} levels", list.len()),
                ));
            }
            Ok(list)
        }
        _ => Ok(vec![u32_field(v, key, default, what)?; levels]),
    }
}

fn strings(v: &Value, key: &str, what: &str) -> Result<Vec<String>, Error> {
    v.get(key)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|s| s.as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .ok_or_else(|| bad(what, format!("{key} is missing")))
}

/// One resolution level of the UNet's down (and mirrored up) path.
#[derive(Clone, Debug, PartialEq)]
pub struct UnetLevel {
    pub channels: u32,
    /// Transformer blocks after each ResNet (0: a plain down/up block).
    pub depth: u32,
    pub heads: u32,
}

#[derive(Clone, Debug, PartialEq)]
pub struct UnetConfig {
    pub in_channels: u32,
    pub out_channels: u32,
    pub levels: Vec<UnetLevel>,
    /// Transformer depth of each up level (listed from the lowest resolution).
    pub up_depths: Vec<u32>,
    pub layers_per_block: u32,
    /// Transformer blocks of the mid block.
    pub mid_depth: u32,
    pub cross_attention_dim: u32,
    pub norm_groups: u32,
    pub norm_eps: f32,
    pub linear_projection: bool,
    pub flip_sin_to_cos: bool,
    pub freq_shift: f32,
    /// SDXL's added conditioning: the time-id embedding width and the projected input width.
    pub text_time: Option<(u32, u32)>,
    pub sample_size: u32,
}

impl UnetConfig {
    pub fn from_json(v: &Value) -> Result<Self, Error> {
        let what = "unet";
        let n = v
            .get("block_out_channels")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        let channels = per_level(v, "block_out_channels", n, None, what)?;
        let n = channels.len();
        if n == 0 {
            return Err(bad(what, "block_out_channels is empty"));
        }
        let down = strings(v, "down_block_types", what)?;
        let up = strings(v, "up_block_types", what)?;
        if down.len() != n || up.len() != n {
            return Err(bad(
                what,
                "block type lists do not match block_out_channels",
            ));
        }
        for t in down.iter().chain(&up) {
            if !matches!(
                t.as_str(),
                "CrossAttnDownBlock2D" | "DownBlock2D" | "CrossAttnUpBlock2D" | "UpBlock2D"
            ) {
                return Err(bad(what, format!("unsupported block type {t}")));
            }
        }
        let mid = str_field(v, "mid_block_type").unwrap_or("UNetMidBlock2DCrossAttn");
        if mid != "UNetMidBlock2DCrossAttn" {
            return Err(bad(what, format!("unsupported mid block {mid}")));
        }
        let depths = per_level(v, "transformer_layers_per_block", n, Some(1), what)?;
        // diffusers' naming quirk: `attention_head_dim` holds the head count unless
        // `num_attention_heads` is given.
        let heads = if v.get("num_attention_heads").is_some_and(|h| !h.is_null()) {
            per_level(v, "num_attention_heads", n, None, what)?
        } else {
            per_level(v, "attention_head_dim", n, Some(8), what)?
        };
        let levels: Vec<UnetLevel> = (0..n)
            .map(|i| UnetLevel {
                channels: channels[i],
                depth: if down[i].starts_with("CrossAttn") {
                    depths[i]
                } else {
                    0
                },
                heads: heads[i],
            })
            .collect();
        let up_depths: Vec<u32> = match v.get("reverse_transformer_layers_per_block") {
            Some(Value::Array(rows)) => rows
                .iter()
                .map(|r| {
                    r.as_array()
                        .and_then(|a| a.first())
                        .and_then(Value::as_u64)
                        .unwrap_or(1) as u32
                })
                .collect(),
            _ => depths.iter().rev().copied().collect(),
        };
        let up_depths = up_depths
            .into_iter()
            .zip(&up)
            .map(|(d, t)| if t.starts_with("CrossAttn") { d } else { 0 })
            .collect();
        let text_time = match str_field(v, "addition_embed_type") {
            None => None,
            Some("text_time") => Some((
                u32_field(v, "addition_time_embed_dim", None, what)?,
                u32_field(v, "projection_class_embeddings_input_dim", None, what)?,
            )),
            Some(other) => {
                return Err(bad(
                    what,
                    format!("unsupported addition_embed_type {other}"),
                ));
            }
        };
        if let Some(t) = str_field(v, "class_embed_type") {
            return Err(bad(what, format!("unsupported class_embed_type {t}")));
        }
        Ok(Self {
            in_channels: u32_field(v, "in_channels", Some(4), what)?,
            out_channels: u32_field(v, "out_channels", Some(4), what)?,
            levels,
            up_depths,
            layers_per_block: u32_field(v, "layers_per_block", Some(2), what)?,
            mid_depth: depths[n - 1],
            cross_attention_dim: u32_field(v, "cross_attention_dim", Some(1280), what)?,
            norm_groups: u32_field(v, "norm_num_groups", Some(32), what)?,
            norm_eps: f32_field(v, "norm_eps", 1e-5),
            linear_projection: bool_field(v, "use_linear_projection", false),
            flip_sin_to_cos: bool_field(v, "flip_sin_to_cos", true),
            freq_shift: f32_field(v, "freq_shift", 0.0),
            text_time,
            sample_size: u32_field(v, "sample_size", Some(64), what)?,
        })
    }

    pub fn time_embed_dim(&self) -> u32 {
        self.levels[0].channels * 4
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct VaeConfig {
    pub in_channels: u32,
    pub out_channels: u32,
    pub latent_channels: u32,
    pub channels: Vec<u32>,
    pub layers_per_block: u32,
    pub norm_groups: u32,
    pub scaling_factor: f32,
    pub shift_factor: f32,
    pub post_quant_conv: bool,
    pub quant_conv: bool,
    pub mid_attention: bool,
    /// FLUX.2's VAE (`AutoencoderKLFlux2`): its latents, packed 2×2, are normalised by the
    /// running statistics of a batch norm (`bn`) with this epsilon instead of a scale and shift.
    pub batch_norm_eps: Option<f32>,
}

impl VaeConfig {
    pub fn from_json(v: &Value) -> Result<Self, Error> {
        let what = "vae";
        let n = v
            .get("block_out_channels")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        if n == 0 {
            return Err(bad(what, "block_out_channels is missing"));
        }
        // Each level halves the image; more than eight would leave no pixels of any image.
        if n > 8 {
            return Err(bad(what, format!("{n} levels in block_out_channels")));
        }
        let class = str_field(v, "_class_name").unwrap_or("AutoencoderKL");
        let flux2 = class == "AutoencoderKLFlux2";
        if class != "AutoencoderKL" && !flux2 {
            return Err(bad(what, format!("unsupported autoencoder {class}")));
        }
        let batch_norm_eps = if flux2 {
            let patch: Vec<u64> = v
                .get("patch_size")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_u64).collect())
                .unwrap_or_else(|| vec![2, 2]);
            if patch != [2, 2] {
                return Err(bad(
                    what,
                    format!("patch_size {patch:?}: FLUX.2 packs 2×2 patches"),
                ));
            }
            let eps = f32_field(v, "batch_norm_eps", 1e-4);
            if !(eps.is_finite() && eps > 0.0) {
                return Err(bad(what, format!("batch_norm_eps {eps}")));
            }
            Some(eps)
        } else {
            None
        };
        // FLUX.2's VAE has no scale or shift of its own: the batch norm takes their place.
        let default_scale = if flux2 { 1.0 } else { 0.18215 };
        Ok(Self {
            in_channels: u32_field(v, "in_channels", Some(3), what)?,
            out_channels: u32_field(v, "out_channels", Some(3), what)?,
            latent_channels: u32_field(v, "latent_channels", Some(4), what)?,
            channels: per_level(v, "block_out_channels", n, None, what)?,
            layers_per_block: u32_field(v, "layers_per_block", Some(2), what)?,
            norm_groups: u32_field(v, "norm_num_groups", Some(32), what)?,
            scaling_factor: f32_field(v, "scaling_factor", default_scale),
            shift_factor: f32_field(v, "shift_factor", 0.0),
            post_quant_conv: bool_field(v, "use_post_quant_conv", true),
            quant_conv: bool_field(v, "use_quant_conv", true),
            mid_attention: bool_field(v, "mid_block_add_attention", true),
            batch_norm_eps,
        })
    }

    /// How many times the image side is halved into the latent.
    pub fn downscale(&self) -> u32 {
        1 << (self.channels.len() - 1)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClipAct {
    QuickGelu,
    Gelu,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ClipConfig {
    pub vocab: u32,
    pub hidden: u32,
    pub intermediate: u32,
    pub layers: u32,
    pub heads: u32,
    pub positions: u32,
    pub act: ClipAct,
    pub eps: f32,
    /// CLIPTextModelWithProjection's output width.
    pub projection: Option<u32>,
    pub eos_token_id: u32,
}

impl ClipConfig {
    pub fn from_json(v: &Value) -> Result<Self, Error> {
        let what = "text encoder";
        let arch = v
            .get("architectures")
            .and_then(Value::as_array)
            .and_then(|a| a.first())
            .and_then(Value::as_str)
            .unwrap_or("CLIPTextModel");
        let with_projection = match arch {
            "CLIPTextModel" => false,
            "CLIPTextModelWithProjection" => true,
            other => return Err(bad(what, format!("unsupported text encoder {other}"))),
        };
        let act = match str_field(v, "hidden_act").unwrap_or("quick_gelu") {
            "quick_gelu" => ClipAct::QuickGelu,
            "gelu" => ClipAct::Gelu,
            other => return Err(bad(what, format!("unsupported activation {other}"))),
        };
        Ok(Self {
            vocab: u32_field(v, "vocab_size", Some(49408), what)?,
            hidden: u32_field(v, "hidden_size", Some(512), what)?,
            intermediate: u32_field(v, "intermediate_size", Some(2048), what)?,
            layers: u32_field(v, "num_hidden_layers", Some(12), what)?,
            heads: u32_field(v, "num_attention_heads", Some(8), what)?,
            positions: u32_field(v, "max_position_embeddings", Some(77), what)?,
            act,
            eps: f32_field(v, "layer_norm_eps", 1e-5),
            projection: if with_projection {
                Some(u32_field(v, "projection_dim", Some(512), what)?)
            } else {
                None
            },
            eos_token_id: u32_field(v, "eos_token_id", Some(2), what)?,
        })
    }
}
