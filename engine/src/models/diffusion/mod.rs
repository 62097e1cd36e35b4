//! Image generation with latent diffusion (Stable Diffusion 1.x/2.x, SD-Turbo, SDXL, SDXL-Turbo):
//! prompt → CLIP tokens → text encoder(s) → UNet denoising loop driven by a scheduler → VAE
//! decoder → RGB. Activations are channel-last (`[height·width][channels]`) so every layer is a
//! matrix product over pixels; weights are stored f16 (or f32), arithmetic is f32.

mod blocks;
mod clip;
pub mod clip_tokenizer;
mod conditioning;
pub mod config;
mod generate;
mod graph;
mod layers;
mod model;
mod pipeline;
pub mod scheduler;
pub mod single_file;
mod stages;
pub mod taesd;
mod unet;
mod vae;

pub use generate::{
    Generated, ImageParams, SizedPlans, StepInfo, Timings, nchw_to_nhwc, nhwc_to_nchw,
};
pub use model::{DiffusionModel, ImageDefaults, ImageModelInfo, ImageModelOptions};
pub use pipeline::{Family, Parts};
pub use scheduler::SchedulerKind;
