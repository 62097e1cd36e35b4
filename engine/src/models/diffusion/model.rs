//! A loaded image model: its networks on the GPU, the plans for the last image size, and the
//! defaults its scheduler config implies.

use std::path::{Path, PathBuf};

use super::flux2::{self, Flux2, Flux2Plans};
use super::generate::{Generated, ImageParams, SizedPlans, StepInfo};
use super::pipeline::{Family, Parts};
use super::scheduler::SchedulerKind;
use super::taesd::Taesd;
use super::zimage::{self, ZImage, ZImagePlans};
use crate::Error;
use crate::gpu::Gpu;
use crate::ops::WeightDType;

#[derive(Clone, Debug)]
pub struct ImageModelOptions {
    pub dtype: WeightDType,
    /// Keep the configs, use random weights (benchmarks at real shapes).
    pub random_weights: bool,
    /// A TAESD folder for full-size live previews (else a linear latent-to-RGB map).
    pub preview_decoder: Option<PathBuf>,
    /// Block-quantize a Qwen3 text encoder's matrices while loading (Z-Image), so that it
    /// and the transformer fit a smaller GPU together.
    pub text_quantize: Option<crate::load::GgmlType>,
    /// Block-quantize a diffusion transformer's linear layers while loading (Z-Image).
    pub quantize: Option<crate::load::GgmlType>,
}

impl Default for ImageModelOptions {
    fn default() -> Self {
        Self {
            dtype: WeightDType::F16,
            random_weights: false,
            preview_decoder: None,
            text_quantize: None,
            quantize: None,
        }
    }
}

/// What the model ships with, for the panel's and the CLI's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct ImageDefaults {
    pub steps: u32,
    pub guidance: f32,
    pub scheduler: SchedulerKind,
    pub width: u32,
    pub height: u32,
}

#[derive(Clone, Debug)]
pub struct ImageModelInfo {
    pub name: String,
    pub path: PathBuf,
    /// "sd" (1.x/2.x/Turbo), "sdxl", "zimage" or "flux2".
    pub family: &'static str,
    pub weight_bytes: u64,
    pub defaults: ImageDefaults,
    /// Image sides must be multiples of this.
    pub size_step: u32,
    /// The VAE's image-to-latent factor (a latent of `[1][c][h][w]` is a `w·f`×`h·f` image).
    pub latent_downscale: u32,
    /// How previews are drawn: "taesd", "linear" (a map fitted for the latent's channels) or
    /// "vae" (the pipeline's own decoder on each step's estimate, where no map fits), with the
    /// reason when a TAESD decoder was offered but could not be used.
    pub preview: String,
}

/// The networks of one pipeline kind, with the plans for the last image size.
enum Pipeline {
    Unet {
        parts: Box<Parts>,
        plans: Option<SizedPlans>,
    },
    ZImage {
        pipe: Box<ZImage>,
        plans: Option<ZImagePlans>,
    },
    Flux2 {
        pipe: Box<Flux2>,
        plans: Option<Flux2Plans>,
    },
}

pub struct DiffusionModel {
    gpu: Gpu,
    pipeline: Pipeline,
    info: ImageModelInfo,
}

/// The `_class_name` of a diffusers folder's `model_index.json`, if it has one.
fn pipeline_class(path: &Path) -> Option<String> {
    let index = crate::load::read_json(&path.join("model_index.json")).ok()?;
    index.get("_class_name")?.as_str().map(str::to_owned)
}

/// The tiny autoencoder (a `madebyollin/…` repository) whose latent space is the pipeline's
/// at `path`: its previews, when installed. A single-file checkpoint is taken for SD 1.x/2.x.
pub fn preview_decoder_repo(path: &Path) -> &'static str {
    match pipeline_class(path).as_deref() {
        Some(zimage::PIPELINE_CLASS) => "madebyollin/taef1",
        Some(flux2::PIPELINE_CLASS) => "madebyollin/taef2",
        _ if path.join("text_encoder_2").is_dir() => "madebyollin/taesdxl",
        _ => "madebyollin/taesd",
    }
}

impl DiffusionModel {
    /// Loads every network's weights onto the GPU, after checking they fit its limits. Running
    /// out of GPU memory on the way is an error that says so, not a crash.
    pub fn load(gpu: &Gpu, path: &Path, options: &ImageModelOptions) -> Result<Self, Error> {
        let oom = gpu
            .device()
            .push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let result = Self::load_inner(gpu, path, options);
        if let Some(err) = pollster::block_on(oom.pop()) {
            return Err(Error::Invalid(format!(
                "the GPU ran out of memory loading {} ({err}); f16 weights, or for Z-Image and FLUX.2 --quant q8_0 and --text-quant q8_0, take less",
                path.display()
            )));
        }
        result
    }

    fn load_inner(gpu: &Gpu, path: &Path, options: &ImageModelOptions) -> Result<Self, Error> {
        let class = path.is_dir().then(|| pipeline_class(path)).flatten();
        match class.as_deref() {
            Some(zimage::PIPELINE_CLASS) => return Self::load_zimage(gpu, path, options),
            Some(flux2::PIPELINE_CLASS) => return Self::load_flux2(gpu, path, options),
            _ => {}
        }
        let mut parts = Parts::open(path, options.dtype, options.random_weights)?;
        check_fit(gpu, parts.weight_bytes())?;
        // A preview decoder that cannot be used leaves the linear previews: it is an extra.
        let latent = (parts.unet.config.in_channels, parts.downscale());
        let (taesd, preview) = preview_decoder(options, latent, "linear");
        parts.taesd = taesd;
        let defaults = defaults(&parts);
        let size_step = 8 * parts.downscale();
        // Planning the smallest image loads every weight now, so a missing or malformed
        // tensor is reported at load time, not at the first image.
        let mut plans = None;
        let halvings = parts.unet.config.levels.len().saturating_sub(1) as u32;
        let smallest = (1u32 << halvings).max(8) * parts.downscale();
        parts.plans_for(gpu, &mut plans, smallest, smallest)?;
        drop(plans);
        gpu.finish_uploads()?;
        let info = ImageModelInfo {
            name: parts.name.clone(),
            path: path.to_owned(),
            family: match parts.family {
                Family::Sd => "sd",
                Family::Sdxl => "sdxl",
            },
            weight_bytes: parts.unet.weights.bytes
                + parts.vae.weights.bytes
                + parts.text.net.weights.bytes
                + parts.text_2.as_ref().map_or(0, |t| t.net.weights.bytes),
            defaults,
            size_step,
            latent_downscale: parts.downscale(),
            preview,
        };
        Ok(Self {
            gpu: gpu.clone(),
            pipeline: Pipeline::Unet {
                parts: Box::new(parts),
                plans: None,
            },
            info,
        })
    }

    fn load_zimage(gpu: &Gpu, path: &Path, options: &ImageModelOptions) -> Result<Self, Error> {
        let mut pipe = ZImage::open(gpu, path, options, &|bytes| check_fit(gpu, bytes))?;
        // Without a tiny decoder: the linear map fitted for these latents, else the VAE.
        let channels = pipe.transformer.config.in_channels;
        let fallback = if super::preview_maps::for_channels(channels).is_some() {
            "linear"
        } else {
            "vae"
        };
        let latent = (pipe.transformer.config.in_channels, pipe.downscale());
        let (taesd, preview) = preview_decoder(options, latent, fallback);
        pipe.taesd = taesd;
        // The smallest image loads the transformer's and the VAE's weights now, so a missing
        // or malformed tensor is reported at load time, not at the first image.
        let mut plans = None;
        let side = pipe.size_step();
        pipe.plans_for(gpu, &mut plans, side, side)?;
        pipe.warm_transformer(gpu, &mut plans)?;
        drop(plans);
        gpu.finish_uploads()?;
        let weight_bytes =
            pipe.transformer.weights.bytes + pipe.vae.weights.bytes + pipe.text.weight_bytes();
        // diffusers' pipeline defaults: 50 steps at guidance 5; the distilled Turbo takes 9
        // steps without guidance (its model card's settings).
        let (steps, guidance) = if pipe.turbo { (9, 0.0) } else { (50, 5.0) };
        let info = ImageModelInfo {
            name: pipe.name.clone(),
            path: path.to_owned(),
            family: "zimage",
            weight_bytes,
            defaults: ImageDefaults {
                steps,
                guidance,
                scheduler: SchedulerKind::Euler,
                width: pipe.native_side,
                height: pipe.native_side,
            },
            size_step: pipe.size_step(),
            latent_downscale: pipe.downscale(),
            preview,
        };
        Ok(Self {
            gpu: gpu.clone(),
            pipeline: Pipeline::ZImage {
                pipe: Box::new(pipe),
                plans: None,
            },
            info,
        })
    }

    fn load_flux2(gpu: &Gpu, path: &Path, options: &ImageModelOptions) -> Result<Self, Error> {
        let mut pipe = Flux2::open(gpu, path, options, &|bytes| check_fit(gpu, bytes))?;
        // The tiny decoder reads the unpacked latents (still normalised, as TAEF2 takes them).
        let latent = (pipe.transformer.config.latent_channels(), pipe.downscale());
        let (taesd, preview) = preview_decoder(options, latent, pipe.preview_kind());
        pipe.taesd = taesd;
        // The smallest image loads the transformer's and the VAE's weights now.
        let mut plans = None;
        let side = pipe.size_step();
        pipe.plans_for(gpu, &mut plans, side, side)?;
        pipe.warm_transformer(gpu, &mut plans)?;
        drop(plans);
        gpu.finish_uploads()?;
        let weight_bytes =
            pipe.transformer.weights.bytes + pipe.vae.weights.bytes + pipe.text.weight_bytes();
        // The distilled klein's model card: 4 steps, guidance 1 (none); the base model takes
        // the pipeline's defaults, 50 steps at guidance 4.
        let (steps, guidance) = if pipe.distilled { (4, 1.0) } else { (50, 4.0) };
        let info = ImageModelInfo {
            name: pipe.name.clone(),
            path: path.to_owned(),
            family: "flux2",
            weight_bytes,
            defaults: ImageDefaults {
                steps,
                guidance,
                scheduler: SchedulerKind::Euler,
                width: pipe.native_side,
                height: pipe.native_side,
            },
            size_step: pipe.size_step(),
            latent_downscale: pipe.size_step(),
            preview,
        };
        Ok(Self {
            gpu: gpu.clone(),
            pipeline: Pipeline::Flux2 {
                pipe: Box::new(pipe),
                plans: None,
            },
            info,
        })
    }

    /// The UNet pipeline's parts and plans, for what only UNet pipelines do.
    fn unet(&mut self) -> Result<(&mut Parts, &mut Option<SizedPlans>), Error> {
        match &mut self.pipeline {
            Pipeline::Unet { parts, plans } => Ok((parts, plans)),
            Pipeline::ZImage { .. } | Pipeline::Flux2 { .. } => Err(Error::Invalid(format!(
                "{} is a diffusion-transformer pipeline, without a UNet",
                self.info.name
            ))),
        }
    }

    pub fn info(&self) -> &ImageModelInfo {
        &self.info
    }

    /// Generates one image; `on_step` returns false to stop (then None is returned).
    pub fn generate(
        &mut self,
        params: &ImageParams,
        preview: bool,
        on_step: impl FnMut(StepInfo) -> bool,
    ) -> Result<Option<Generated>, Error> {
        if !params.width.is_multiple_of(self.info.size_step)
            || !params.height.is_multiple_of(self.info.size_step)
        {
            return Err(Error::Invalid(format!(
                "{}×{}: width and height must be multiples of {}",
                params.width, params.height, self.info.size_step
            )));
        }
        // A size's plans allocate its activations: too large an image runs out of memory there.
        let oom = self
            .gpu
            .device()
            .push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let result = match &mut self.pipeline {
            Pipeline::Unet { parts, plans } => {
                parts.generate(&self.gpu, plans, params, preview, on_step)
            }
            Pipeline::ZImage { pipe, plans } => {
                pipe.generate(&self.gpu, plans, params, preview, on_step)
            }
            Pipeline::Flux2 { pipe, plans } => {
                pipe.generate(&self.gpu, plans, params, preview, on_step)
            }
        };
        if let Some(err) = pollster::block_on(oom.pop()) {
            // The plans made before the failure are incomplete: the next image makes them anew.
            match &mut self.pipeline {
                Pipeline::Unet { plans, .. } => *plans = None,
                Pipeline::ZImage { plans, .. } => *plans = None,
                Pipeline::Flux2 { plans, .. } => *plans = None,
            }
            return Err(Error::Invalid(format!(
                "the GPU ran out of memory for a {}×{} image ({err}); a smaller size takes less",
                params.width, params.height
            )));
        }
        result
    }

    /// The texture the previews of the current size are drawn into.
    /// (It builds the size's plans: running out of GPU memory there is an error that says so.)
    pub fn preview_texture(&mut self, width: u32, height: u32) -> Result<wgpu::Texture, Error> {
        let gpu = self.gpu.clone();
        let oom = gpu
            .device()
            .push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let result = self.preview_texture_inner(width, height);
        if let Some(err) = pollster::block_on(oom.pop()) {
            match &mut self.pipeline {
                Pipeline::Unet { plans, .. } => *plans = None,
                Pipeline::ZImage { plans, .. } => *plans = None,
                Pipeline::Flux2 { plans, .. } => *plans = None,
            }
            return Err(Error::Invalid(format!(
                "the GPU ran out of memory for a {width}×{height} image ({err}); a smaller size takes less"
            )));
        }
        result
    }

    fn preview_texture_inner(&mut self, width: u32, height: u32) -> Result<wgpu::Texture, Error> {
        let gpu = self.gpu.clone();
        match &mut self.pipeline {
            Pipeline::ZImage { pipe, plans } => {
                return pipe.preview_texture(&gpu, plans, width, height);
            }
            Pipeline::Flux2 { pipe, plans } => {
                return pipe.preview_texture(&gpu, plans, width, height);
            }
            Pipeline::Unet { .. } => {}
        }
        let (parts, plans) = self.unet()?;
        parts.plans_for(&gpu, plans, width, height)?;
        let plans = plans
            .as_mut()
            .ok_or_else(|| Error::Invalid("no plans".into()))?;
        parts.preview_texture(&gpu, plans)
    }

    /// The UNet's conditioning for `prompt` (see [`Parts::text_conditioning`]).
    pub fn text_conditioning(
        &mut self,
        prompt: &str,
        size: (u32, u32),
    ) -> Result<(Vec<f32>, Option<Vec<f32>>), Error> {
        let gpu = self.gpu.clone();
        self.unet()?.0.text_conditioning(&gpu, prompt, size)
    }

    /// One UNet call on a `[1][c][h][w]` latent (see [`Parts::unet_once`]).
    pub fn unet_once(
        &mut self,
        latent: &[f32],
        hw: (u32, u32),
        t: f32,
        context: &[f32],
        added: Option<&[f32]>,
    ) -> Result<Vec<f32>, Error> {
        let gpu = self.gpu.clone();
        let (parts, plans) = self.unet()?;
        parts.unet_once(&gpu, plans, latent, hw, t, context, added)
    }

    /// Diffusion transformers: the caption features for `prompt`, `[tokens][width]`, and the
    /// token count (Z-Image: the prompt's; FLUX.2: padded to 512, three layers side by side).
    pub fn caption_features(&mut self, prompt: &str) -> Result<(Vec<f32>, u32), Error> {
        match &mut self.pipeline {
            Pipeline::ZImage { pipe, .. } => pipe.caption(prompt),
            Pipeline::Flux2 { pipe, .. } => pipe.caption(prompt),
            Pipeline::Unet { .. } => Err(Error::Invalid(
                "caption features are a diffusion transformer's".into(),
            )),
        }
    }

    /// One transformer call on a `[1][c][h][w]` latent with caption features: Z-Image's at
    /// model time `t` (0 is noise), FLUX.2's packed latent at sigma `t` (1 is noise).
    pub fn transformer_once(
        &mut self,
        latent: &[f32],
        hw: (u32, u32),
        t: f32,
        caption: &[f32],
    ) -> Result<Vec<f32>, Error> {
        match &mut self.pipeline {
            Pipeline::ZImage { pipe, plans } => {
                pipe.transformer_once(&self.gpu, plans, latent, hw, t, caption)
            }
            Pipeline::Flux2 { pipe, plans } => {
                pipe.transformer_once(&self.gpu, plans, latent, hw, t, caption)
            }
            Pipeline::Unet { .. } => Err(Error::Invalid(
                "this pipeline has a UNet, not a transformer".into(),
            )),
        }
    }

    /// The VAE decoder on a `[1][c][h][w]` latent: `[1][3][8h][8w]` in −1..1.
    pub fn decode_latents(&mut self, latent: &[f32], hw: (u32, u32)) -> Result<Vec<f32>, Error> {
        match &mut self.pipeline {
            Pipeline::Unet { parts, plans } => parts.decode_latents(&self.gpu, plans, latent, hw),
            Pipeline::ZImage { pipe, plans } => pipe.decode_latents(&self.gpu, plans, latent, hw),
            Pipeline::Flux2 { pipe, plans } => pipe.decode_latents(&self.gpu, plans, latent, hw),
        }
    }

    /// The VAE encoder's scaled latent mean for a `[1][3][H][W]` image in −1..1.
    pub fn encode_image(&mut self, image: &[f32], hw: (u32, u32)) -> Result<Vec<f32>, Error> {
        let gpu = self.gpu.clone();
        let (parts, plans) = self.unet()?;
        parts.encode_image(&gpu, plans, image, hw)
    }

    /// GPU time per kernel of one UNet (or transformer) call and one VAE decode at
    /// `width`×`height`.
    pub fn profile(
        &mut self,
        width: u32,
        height: u32,
    ) -> Result<Vec<(&'static str, Vec<crate::gpu::KernelTiming>)>, Error> {
        let gpu = self.gpu.clone();
        let no_plans = || Error::Invalid("no plans".into());
        match &mut self.pipeline {
            Pipeline::ZImage { pipe, plans } => {
                pipe.plans_for(&gpu, plans, width, height)?;
                return pipe.profile(&gpu, plans.as_ref().ok_or_else(no_plans)?);
            }
            Pipeline::Flux2 { pipe, plans } => {
                pipe.plans_for(&gpu, plans, width, height)?;
                return pipe.profile(&gpu, plans.as_ref().ok_or_else(no_plans)?);
            }
            Pipeline::Unet { .. } => {}
        }
        let (parts, plans) = self.unet()?;
        parts.plans_for(&gpu, plans, width, height)?;
        let plans = plans
            .as_ref()
            .ok_or_else(|| Error::Invalid("no plans".into()))?;
        parts.profile(&gpu, plans)
    }

    /// Activation bytes of the current size's plans.
    pub fn activation_bytes(&self) -> u64 {
        match &self.pipeline {
            Pipeline::Unet { plans, .. } => plans.as_ref().map_or(0, |p| p.activation_bytes),
            Pipeline::ZImage { plans, .. } => plans.as_ref().map_or(0, |p| p.activation_bytes),
            Pipeline::Flux2 { plans, .. } => plans.as_ref().map_or(0, |p| p.activation_bytes),
        }
    }
}

/// diffusers' defaults: the UNet's sample size; few-step models (trailing spacing, as
/// SD-Turbo and SDXL-Turbo ship) one step without guidance, LCM four, others 50 steps with
/// the pipeline's guidance.
fn defaults(parts: &Parts) -> ImageDefaults {
    let side = parts.unet.config.sample_size * parts.downscale();
    let kind = parts.scheduler.default_kind();
    let turbo = parts.scheduler.timestep_spacing() == "trailing";
    let (steps, guidance) = match (kind, turbo, parts.family) {
        (SchedulerKind::Lcm, _, _) => (4, 1.0),
        (_, true, _) => (1, 0.0),
        (_, false, Family::Sdxl) => (50, 5.0),
        (_, false, Family::Sd) => (50, 7.5),
    };
    ImageDefaults {
        steps,
        guidance,
        scheduler: kind,
        width: side,
        height: side,
    }
}

/// The tiny decoder `options` name, when it decodes latents of `(channels, downscale)`, and
/// how previews will be drawn: "taesd", or `fallback` with the reason the decoder was left
/// out (it is an extra: a decoder that cannot be used never fails the load).
fn preview_decoder(
    options: &ImageModelOptions,
    (channels, downscale): (u32, u32),
    fallback: &str,
) -> (Option<Taesd>, String) {
    let Some(dir) = &options.preview_decoder else {
        return (None, fallback.to_owned());
    };
    match Taesd::open(dir) {
        Ok(taesd)
            if taesd.config.upscale() == downscale && taesd.config.latent_channels == channels =>
        {
            (Some(taesd), "taesd".to_owned())
        }
        Ok(taesd) => {
            let why = format!(
                "{} decodes {} channels {}× smaller, this model's latents have {channels} channels {downscale}× smaller",
                dir.display(),
                taesd.config.latent_channels,
                taesd.config.upscale()
            );
            (None, format!("{fallback} ({why})"))
        }
        Err(e) => (None, format!("{fallback} ({e})")),
    }
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// Refuses weights the adapter cannot hold, before loading: a tensor beyond its largest
/// binding, or more than the memory there is (system memory on adapters that share it; the
/// free memory a discrete GPU's driver reports). Where nothing is reported, running out is an
/// allocation error while loading.
fn check_fit(gpu: &Gpu, (needed, largest): (u64, u64)) -> Result<(), Error> {
    let caps = gpu.caps();
    let adapter = &gpu.info().name;
    if largest > caps.max_storage_binding {
        return Err(Error::Invalid(format!(
            "the model's largest tensor takes {}, but {adapter} binds at most {} per buffer",
            gib(largest),
            gib(caps.max_storage_binding)
        )));
    }
    let shared = matches!(
        gpu.info().device_type,
        wgpu::DeviceType::Cpu | wgpu::DeviceType::IntegratedGpu
    );
    if shared
        && let Some(memory) = crate::hub::system_memory()
        && needed > memory / 10 * 9
    {
        return Err(Error::Invalid(format!(
            "the model needs {} for its weights, but {adapter} has {} of memory",
            gib(needed),
            gib(memory)
        )));
    }
    if !shared
        && let Some(free) = gpu.free_memory()
        && needed > free
    {
        return Err(Error::Invalid(format!(
            "the model needs {} for its weights, but {adapter} has {} free",
            gib(needed),
            gib(free)
        )));
    }
    Ok(())
}
