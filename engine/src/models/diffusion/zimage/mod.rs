//! Z-Image and Z-Image-Turbo (diffusers' `ZImagePipeline`): prompt → Qwen3's chat template →
//! the encoder's second-to-last hidden states → a single-stream diffusion transformer driven
//! by flow-matching Euler steps → the 16-channel Flux VAE → RGB.

mod config;
mod generate;
mod original_layout;
mod plans;
mod rope;
mod transformer;

use std::path::Path;

pub use config::ZImageConfig;
pub use plans::ZImagePlans;

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

pub const PIPELINE_CLASS: &str = "ZImagePipeline";

/// A loaded Z-Image pipeline (its plans are built per image size and caption length).
pub struct ZImage {
    pub text: QwenTextEncoder,
    pub transformer: Network<ZImageConfig>,
    pub vae: Network<VaeConfig>,
    pub scheduler: FlowMatchConfig,
    pub dtype: WeightDType,
    pub name: String,
    /// Few-step distilled weights (Turbo, by its folder's name): no guidance by default.
    pub turbo: bool,
    /// A tiny autoencoder for this latent space (taef1), for cheaper live previews.
    pub taesd: Option<super::taesd::Taesd>,
    /// The image side the VAE was trained for (its `sample_size`; 1024 where it says none),
    /// the default size.
    pub native_side: u32,
}

/// Whether the folder is the distilled Turbo model. No config says so, so its name does: any
/// part of the path, since a Hugging Face cache keeps the repository's name above a snapshot
/// folder named by its revision (`models--Tongyi-MAI--Z-Image-Turbo/snapshots/<hash>`).
fn names_turbo(root: &Path) -> bool {
    root.components().any(|c| {
        c.as_os_str()
            .to_string_lossy()
            .to_ascii_lowercase()
            .contains("turbo")
    })
}

impl ZImage {
    /// Opens a diffusers folder whose `model_index.json` names `ZImagePipeline`.
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
        let transformer_config =
            ZImageConfig::from_json(&component_config(root, "transformer", "config.json")?)
                .map_err(|e| named("transformer/config.json", e))?;
        let vae_json = component_config(root, "vae", "config.json")?;
        let vae_config =
            VaeConfig::from_json(&vae_json).map_err(|e| named("vae/config.json", e))?;
        let size_step = vae_config.downscale() * transformer_config.patch;
        let scheduler = FlowMatchConfig::from_json(&component_config(
            root,
            "scheduler",
            "scheduler_config.json",
        )?)
        .map_err(|e| named("scheduler/scheduler_config.json", e))?;
        if vae_config.latent_channels != transformer_config.in_channels {
            return Err(named(
                "vae/config.json",
                Error::Invalid(format!(
                    "{} latent channels, but the transformer takes {}",
                    vae_config.latent_channels, transformer_config.in_channels
                )),
            ));
        }
        let files = |which: &str| -> Result<_, Error> {
            if random {
                return Ok(None);
            }
            let dir = root.join(which);
            if !dir.is_dir() {
                return Err(LoadError::Missing { path: dir }.into());
            }
            Ok(Some(open_component(&dir, "diffusion_pytorch_model")?))
        };
        let transformer_files = if random {
            None
        } else {
            let patch = transformer_config.patch;
            Some(original_layout::transformer_weights(
                &root.join("transformer"),
                patch,
            )?)
        };
        let name = display_name(root);
        let cap_feat_dim = transformer_config.cap_feat_dim;
        let mut transformer = network(transformer_config, transformer_files, 3);
        transformer.quantize = options.quantize;
        let vae = network(vae_config, files("vae")?, 4);
        // Checked before the text encoder uploads anything, from the files' sizes.
        let (bytes, largest) = networks_bytes(&transformer, &vae, dtype);
        let text_bytes = if random {
            0
        } else {
            let st = SafeTensors::open_dir(&root.join("text_encoder"))?;
            tensors_bytes(&st, dtype, options.text_quantize).0
        };
        fit((bytes + text_bytes, largest))?;
        let text = QwenTextEncoder::open(gpu, root, dtype, options.text_quantize, random)?;
        if text.hidden() != cap_feat_dim || text.layers() < 2 {
            return Err(named(
                "text_encoder/config.json",
                Error::Invalid(format!(
                    "a text encoder of width {} and {} layers, but the transformer takes captions of width {}",
                    text.hidden(),
                    text.layers(),
                    cap_feat_dim
                )),
            ));
        }
        Ok(Self {
            text,
            transformer,
            vae,
            scheduler,
            dtype,
            turbo: names_turbo(root),
            name,
            taesd: None,
            native_side: native_side(&vae_json, size_step),
        })
    }

    /// The VAE's image-to-latent factor.
    pub fn downscale(&self) -> u32 {
        self.vae.config.downscale()
    }

    /// Image sides must be multiples of this: the VAE's factor times the patch side.
    pub fn size_step(&self) -> u32 {
        self.downscale() * self.transformer.config.patch
    }

    /// Bytes the weights take on the GPU, and the largest tensor's: the transformer's and the
    /// VAE's from their files (a quantized transformer's matrices at their block size), the
    /// text encoder's as uploaded.
    pub fn weight_bytes(&self) -> (u64, u64) {
        let (bytes, largest) = networks_bytes(&self.transformer, &self.vae, self.dtype);
        (bytes + self.text.weight_bytes(), largest)
    }

    /// The caption features for `prompt`: the encoder's second-to-last hidden states over the
    /// chat-templated prompt (thinking on, as the pipeline renders it), `[tokens][hidden]`.
    pub fn caption(&mut self, prompt: &str) -> Result<(Vec<f32>, u32), Error> {
        let ids = self.text.tokens(prompt, true)?;
        let depth = self.text.layers() - 1;
        let states = self.text.hidden_states(&ids, depth)?;
        Ok((states, ids.len() as u32))
    }
}

#[cfg(test)]
mod tests {
    use super::names_turbo;
    use std::path::Path;

    #[test]
    fn turbo_is_read_from_any_part_of_the_path() {
        assert!(names_turbo(Path::new("/models/Tongyi-MAI--Z-Image-Turbo")));
        assert!(names_turbo(Path::new(
            "/hf/hub/models--Tongyi-MAI--Z-Image-Turbo/snapshots/5f1c2a"
        )));
        assert!(!names_turbo(Path::new(
            "/hf/hub/models--Tongyi-MAI--Z-Image/snapshots/5f1c2a"
        )));
    }
}
