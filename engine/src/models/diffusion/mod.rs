//! Image generation with latent diffusion. UNet pipelines (Stable Diffusion 1.x/2.x, SD-Turbo,
//! SDXL, SDXL-Turbo): prompt → CLIP tokens → text encoder(s) → UNet denoising loop driven by a
//! scheduler → VAE decoder → RGB. Diffusion-transformer pipelines (`zimage/`, `flux2/`):
//! prompt → Qwen3 hidden states → transformer under flow matching → VAE decoder → RGB.
//! Activations are channel-last (`[height·width][channels]`) so every layer is a matrix
//! product over pixels; weights are stored f16 (or f32), arithmetic is f32.

mod blocks;
mod clip;
pub mod clip_tokenizer;
mod conditioning;
pub mod config;
mod flow_loop;
pub mod flux2;
mod generate;
mod graph;
mod layers;
mod model;
mod pipeline;
pub mod preview_maps;
mod qwen_text;
mod rope_table;
pub mod scheduler;
pub mod single_file;
mod stages;
pub mod taesd;
mod unet;
mod vae;
pub mod zimage;

use std::path::Path;

pub use generate::{
    Generated, ImageParams, SizedPlans, StepInfo, Timings, nchw_to_nhwc, nhwc_to_nchw,
};
pub use model::{
    DiffusionModel, ImageDefaults, ImageModelInfo, ImageModelOptions, preview_decoder_repo,
};
pub use pipeline::{Family, Parts};
pub use scheduler::SchedulerKind;

/// A diffusers folder (with `model_index.json`) or a single-file `.safetensors` checkpoint.
pub fn is_image_model(path: &Path) -> bool {
    if path.is_dir() {
        return path.join("model_index.json").is_file();
    }
    path.is_file()
        && path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("safetensors"))
}
