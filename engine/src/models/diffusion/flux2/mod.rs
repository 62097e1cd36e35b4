//! FLUX.2 [klein] (diffusers' `Flux2KleinPipeline`): prompt → Qwen3's chat template (thinking
//! off), padded to 512 tokens → the encoder's states after layers 9, 18 and 27 side by side →
//! a double- then single-stream diffusion transformer over 2×2-packed latent tokens, driven by
//! flow-matching Euler steps → the latents de-normalised by the VAE's batch-norm statistics →
//! the 32-channel VAE → RGB. A start image is a reference, as the pipeline's `image` is: its
//! tokens join the sequence at t = 10 and steer the new image.

mod config;
mod generate;
mod layout;
mod plans;
mod transformer;

use std::path::Path;

pub use config::Flux2Config;
pub use generate::empirical_mu;
pub use plans::Flux2Plans;

use super::config::VaeConfig;
use super::model::ImageModelOptions;
use super::pipeline::{
    Network, component_config, display_name, native_side, network, networks_bytes, open_component,
    tensors_bytes,
};
use super::qwen_text::QwenTextEncoder;
use super::scheduler::FlowMatchConfig;
use crate::Error;
use crate::gpu::Gpu;
use crate::load::{LoadError, SafeTensors};
use crate::ops::WeightDType;

pub const PIPELINE_CLASS: &str = "Flux2KleinPipeline";

/// The text encoder's layers whose outputs are stacked (the pipeline's default
/// `text_encoder_out_layers`; transformers' `hidden_states[k]`, the stream after k layers).
pub const TEXT_LAYERS: [usize; 3] = [9, 18, 27];

/// A loaded FLUX.2 klein pipeline (its plans are built per image size).
pub struct Flux2 {
    pub text: QwenTextEncoder,
    pub transformer: Network<Flux2Config>,
    pub vae: Network<VaeConfig>,
    pub scheduler: FlowMatchConfig,
    pub dtype: WeightDType,
    pub name: String,
    /// Step-distilled weights (`is_distilled` in `model_index.json`): no guidance.
    pub distilled: bool,
    /// `[2][in_channels]`: the batch norm's σ (`sqrt(running_var + eps)`), then its means.
    pub latent_stats: Vec<f32>,
    /// The image side the VAE was trained for, the default size.
    pub native_side: u32,
    /// A tiny autoencoder for this latent space (taef2), for full-size live previews.
    pub taesd: Option<super::taesd::Taesd>,
}

/// `bn.running_mean` and `bn.running_var` of the VAE as `[σ…, mean…]` over `features`
/// (random weights: the identity).
fn latent_stats(vae: &Network<VaeConfig>, features: u32, eps: f32) -> Result<Vec<f32>, Error> {
    let n = features as usize;
    let Some(st) = &vae.files else {
        let mut stats = vec![1.0; n];
        stats.resize(2 * n, 0.0);
        return Ok(stats);
    };
    let read = |name: &str| -> Result<Vec<f32>, Error> {
        let values = st.get(name)?.to_f32();
        if values.len() != n {
            return Err(LoadError::ShapeMismatch {
                name: name.to_owned(),
                actual: vec![values.len()],
                expected: vec![n],
            }
            .into());
        }
        Ok(values)
    };
    let mean = read("bn.running_mean")?;
    let var = read("bn.running_var")?;
    let mut stats: Vec<f32> = var.iter().map(|v| (v + eps).max(0.0).sqrt()).collect();
    stats.extend(mean);
    if stats.iter().any(|v| !v.is_finite()) {
        return Err(Error::Invalid(
            "vae: bn.running_mean or bn.running_var holds values that are not finite".into(),
        ));
    }
    Ok(stats)
}

/// Refuses a tokenizer configured to pad on the left: the captions are the padded prompt's
/// states, and with the padding first every real token would sit at another position.
fn check_padding_side(root: &Path) -> Result<(), Error> {
    let path = root.join("tokenizer").join("tokenizer_config.json");
    let side = crate::load::read_json(&path).ok().and_then(|v| {
        v.get("padding_side")
            .and_then(|s| s.as_str().map(str::to_owned))
    });
    match side.as_deref() {
        None | Some("right") => Ok(()),
        Some(other) => Err(Error::Invalid(format!(
            "{}: padding_side {other:?}: FLUX.2 captions are read with the padding after the prompt (\"right\")",
            path.display()
        ))),
    }
}

/// `model_index.json`'s `is_distilled` (false where absent, as the pipeline's default).
fn is_distilled(root: &Path) -> bool {
    crate::load::read_json(&root.join("model_index.json"))
        .ok()
        .and_then(|v| v.get("is_distilled").and_then(serde_json::Value::as_bool))
        .unwrap_or(false)
}

impl Flux2 {
    /// Opens a diffusers folder whose `model_index.json` names `Flux2KleinPipeline`.
    /// `fit` hears the weights' bytes (and the largest tensor's) before any is uploaded.
    pub fn open(
        gpu: &Gpu,
        root: &Path,
        options: &ImageModelOptions,
        fit: &dyn Fn((u64, u64)) -> Result<(), Error>,
    ) -> Result<Self, Error> {
        let (dtype, random) = (options.dtype, options.random_weights);
        let named = |what: &str, e: Error| -> Error {
            Error::Invalid(format!("{}: {what}: {e}", root.display()))
        };
        let config = Flux2Config::from_json(&component_config(root, "transformer", "config.json")?)
            .map_err(|e| named("transformer/config.json", e))?;
        let vae_json = component_config(root, "vae", "config.json")?;
        let vae_config =
            VaeConfig::from_json(&vae_json).map_err(|e| named("vae/config.json", e))?;
        let Some(bn_eps) = vae_config.batch_norm_eps else {
            return Err(named(
                "vae/config.json",
                Error::Invalid("FLUX.2 takes an AutoencoderKLFlux2 VAE".into()),
            ));
        };
        if vae_config.latent_channels != config.latent_channels() {
            return Err(named(
                "vae/config.json",
                Error::Invalid(format!(
                    "{} latent channels, but the transformer's tokens pack {}",
                    vae_config.latent_channels,
                    config.latent_channels()
                )),
            ));
        }
        let scheduler = FlowMatchConfig::from_json(&component_config(
            root,
            "scheduler",
            "scheduler_config.json",
        )?)
        .map_err(|e| named("scheduler/scheduler_config.json", e))?;
        let transformer_files = if random {
            None
        } else {
            Some(layout::transformer_weights(
                &root.join("transformer"),
                &config,
            )?)
        };
        let vae_files = if random {
            None
        } else {
            let dir = root.join("vae");
            if !dir.is_dir() {
                return Err(LoadError::Missing { path: dir }.into());
            }
            Some(open_component(&dir, "diffusion_pytorch_model")?)
        };
        let joint = config.joint_attention_dim;
        let in_channels = config.in_channels;
        let size_step = vae_config.downscale() * 2;
        let mut transformer = network(config, transformer_files, 3);
        transformer.quantize = options.quantize;
        let vae = network(vae_config, vae_files, 4);
        let latent_stats = latent_stats(&vae, in_channels, bn_eps).map_err(|e| named("vae", e))?;
        // Checked before the text encoder uploads anything, from the files' sizes.
        let (bytes, largest) = networks_bytes(&transformer, &vae, dtype);
        let text_bytes = if random {
            0
        } else {
            let st = SafeTensors::open_dir(&root.join("text_encoder"))?;
            tensors_bytes(&st, dtype, options.text_quantize).0
        };
        check_padding_side(root)?;
        fit((bytes + text_bytes, largest))?;
        let text = QwenTextEncoder::open(gpu, root, dtype, options.text_quantize, random)?;
        let deepest = TEXT_LAYERS[TEXT_LAYERS.len() - 1];
        let stacked = text.hidden() * TEXT_LAYERS.len() as u32;
        if stacked != joint || (text.layers() as usize) < deepest {
            return Err(named(
                "text_encoder/config.json",
                Error::Invalid(format!(
                    "a text encoder of width {} and {} layers; the transformer takes the states after layers {TEXT_LAYERS:?} side by side, {joint} wide",
                    text.hidden(),
                    text.layers()
                )),
            ));
        }
        Ok(Self {
            text,
            transformer,
            vae,
            scheduler,
            dtype,
            name: display_name(root),
            distilled: is_distilled(root),
            latent_stats,
            native_side: native_side(&vae_json, size_step),
            taesd: None,
        })
    }

    /// The VAE's image-to-latent factor.
    pub fn downscale(&self) -> u32 {
        self.vae.config.downscale()
    }

    /// Image sides must be multiples of this: the VAE's factor times the 2×2 packing.
    pub fn size_step(&self) -> u32 {
        self.downscale() * 2
    }

    /// Bytes the weights take on the GPU, and the largest tensor's.
    pub fn weight_bytes(&self) -> (u64, u64) {
        let (bytes, largest) = networks_bytes(&self.transformer, &self.vae, self.dtype);
        (bytes + self.text.weight_bytes(), largest)
    }

    /// The caption for `prompt`: the chat-templated prompt (thinking off) padded to 512 tokens,
    /// and the encoder's states after [`TEXT_LAYERS`] side by side, `[512][3·hidden]`.
    pub fn caption(&mut self, prompt: &str) -> Result<(Vec<f32>, u32), Error> {
        let ids = self.text.tokens(prompt, false)?;
        let padded = self.text.padded(&ids);
        let states = self
            .text
            .hidden_states_at(&padded, ids.len(), &TEXT_LAYERS)?;
        Ok((states, padded.len() as u32))
    }
}
