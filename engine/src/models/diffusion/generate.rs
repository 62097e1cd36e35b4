//! One image: text conditioning, the denoising loop (UNet, guidance and the scheduler's update
//! on the GPU, one submission per step with a preview), then the VAE decoder.

use std::sync::Arc;
use std::time::Instant;

use super::graph::{Builder, Plan};
use super::pipeline::{Family, Parts};
use super::scheduler::{
    Schedule, SchedulerKind, gaussian_noise, schedule, step_noise, timestep_embedding,
};
use super::unet::{UnetIo, UnetPlan, build_unet};
use super::vae::{VaePlan, build_decoder, build_encoder};
use crate::Error;
use crate::gpu::{Gpu, Recorder, StorageBuffer};
use crate::ops::{Denoise, DenoiseBuffers, DenoiseParams, Preview, PreviewSource};

/// What to generate.
#[derive(Clone, Debug)]
pub struct ImageParams {
    pub prompt: String,
    pub negative: String,
    pub steps: u32,
    pub guidance: f32,
    pub seed: u64,
    pub width: u32,
    pub height: u32,
    pub scheduler: SchedulerKind,
    /// Image-to-image: the start image `[height][width][3]` in 0..1 and the strength.
    pub init_image: Option<(Vec<f32>, f32)>,
    /// `[1][4][h/8][w/8]` (diffusers' layout) used in place of the seeded noise.
    pub init_latents: Option<Vec<f32>>,
}

/// Where a step stands, for progress and previews.
#[derive(Clone, Copy, Debug)]
pub struct StepInfo {
    pub step: u32,
    pub steps: u32,
    pub elapsed_ms: f64,
}

/// A finished image.
#[derive(Clone, Debug)]
pub struct Generated {
    pub width: u32,
    pub height: u32,
    /// `[height][width][3]` sRGB bytes.
    pub rgb: Vec<u8>,
    pub timings: Timings,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Timings {
    pub text_ms: f64,
    pub steps_ms: f64,
    pub ms_per_step: f64,
    pub vae_ms: f64,
    pub total_ms: f64,
}

/// Plans and buffers for one image size, kept while the size stays.
pub struct SizedPlans {
    pub width: u32,
    pub height: u32,
    pub(super) unet: UnetPlan,
    pub(super) decoder: VaePlan,
    pub(super) encoder: Option<VaePlan>,
    pub(super) io: UnetIo,
    pub(super) latents: Arc<StorageBuffer>,
    pub(super) uncond_out: Arc<StorageBuffer>,
    pub(super) denoised: Arc<StorageBuffer>,
    pub(super) prev_denoised: Arc<StorageBuffer>,
    pub(super) noise: Arc<StorageBuffer>,
    pub(super) image_in: Arc<StorageBuffer>,
    pub(super) denoise: Denoise,
    pub(super) context_cond: Arc<StorageBuffer>,
    pub(super) context_uncond: Arc<StorageBuffer>,
    pub(super) added_cond: Option<Arc<StorageBuffer>>,
    pub(super) added_uncond: Option<Arc<StorageBuffer>>,
    /// The preview texture, the pass that draws it, and the TAESD decoder feeding it.
    pub(super) preview: Option<(wgpu::Texture, Preview, Option<Plan>)>,
    pub activation_bytes: u64,
}

pub(super) const CONTEXT_TOKENS: u32 = 77;

/// Dispatches a profile times (two timestamps each, 4096 per query set).
pub(super) const MAX_PROFILED_DISPATCHES: u32 = 2048;

fn zeros(gpu: &Gpu, label: &str, floats: u32) -> Result<Arc<StorageBuffer>, Error> {
    Ok(Arc::new(gpu.storage(label, u64::from(floats.max(1)) * 4)?))
}

impl Parts {
    fn added_width(&self) -> Option<u32> {
        self.unet.config.text_time.map(|(_, input)| input)
    }

    /// Builds (or keeps) the plans for a `width`×`height` image.
    pub fn plans_for(
        &mut self,
        gpu: &Gpu,
        slot: &mut Option<SizedPlans>,
        width: u32,
        height: u32,
    ) -> Result<(), Error> {
        if slot
            .as_ref()
            .is_some_and(|p| p.width == width && p.height == height)
        {
            return Ok(());
        }
        *slot = None;
        let f = self.downscale();
        if width == 0
            || height == 0
            || !width.is_multiple_of(8 * f)
            || !height.is_multiple_of(8 * f)
        {
            return Err(Error::Invalid(format!(
                "{width}×{height}: width and height must be positive multiples of {}",
                8 * f
            )));
        }
        let (h, w) = (height / f, width / f);
        let lc = self.unet.config.in_channels;
        let n = h * w * lc;
        let ctx_floats = CONTEXT_TOKENS * self.unet.config.cross_attention_dim;
        let io = UnetIo {
            sample: zeros(gpu, "unet sample", n)?,
            time_proj: zeros(gpu, "time embedding", self.unet.config.levels[0].channels)?,
            context: zeros(gpu, "context", ctx_floats)?,
            context_tokens: CONTEXT_TOKENS,
            added: self
                .added_width()
                .map(|a| zeros(gpu, "added conditions", a))
                .transpose()?,
        };
        let dtype = self.dtype;
        let unet = {
            let (mut up, weights, config) = self.unet.loader(gpu, dtype);
            let b = Builder::new(gpu, &mut up, weights);
            build_unet(b, config, &io, (h, w))?
        };
        let latents = zeros(gpu, "latents", n)?;
        let decoder = {
            let (mut up, weights, config) = self.vae.loader(gpu, dtype);
            let b = Builder::new(gpu, &mut up, weights);
            build_decoder(b, config, &latents, (h, w))?
        };
        let uncond_out = zeros(gpu, "unconditional output", n)?;
        let denoised = zeros(gpu, "denoised", n)?;
        let prev_denoised = zeros(gpu, "previous denoised", n)?;
        let noise = zeros(gpu, "step noise", n)?;
        let denoise = Denoise::new(
            gpu,
            n,
            &DenoiseBuffers {
                latents: &latents,
                model_out: &unet.out,
                uncond: &uncond_out,
                model_in: &io.sample,
                denoised: &denoised,
                prev_denoised: &prev_denoised,
                noise: &noise,
            },
        )?;
        let activation_bytes = unet.activation_bytes + decoder.activation_bytes;
        *slot = Some(SizedPlans {
            width,
            height,
            unet,
            decoder,
            encoder: None,
            context_cond: zeros(gpu, "context", ctx_floats)?,
            context_uncond: zeros(gpu, "negative context", ctx_floats)?,
            added_cond: self
                .added_width()
                .map(|a| zeros(gpu, "added", a))
                .transpose()?,
            added_uncond: self
                .added_width()
                .map(|a| zeros(gpu, "added", a))
                .transpose()?,
            image_in: zeros(gpu, "init image", width * height * 3)?,
            io,
            latents,
            uncond_out,
            denoised,
            prev_denoised,
            noise,
            denoise,
            preview: None,
            activation_bytes,
        });
        Ok(())
    }

    /// The texture previews are drawn into for the current size (created on first use).
    pub fn preview_texture(
        &mut self,
        gpu: &Gpu,
        plans: &mut SizedPlans,
    ) -> Result<wgpu::Texture, Error> {
        if let Some((t, _, _)) = &plans.preview {
            return Ok(t.clone());
        }
        let f = self.downscale();
        let (lw, lh) = (plans.width / f, plans.height / f);
        let taesd = match self.taesd.as_mut() {
            Some(t) => Some(t.build(gpu, &plans.denoised, (lh, lw))?),
            None => None,
        };
        let (w, h) = if taesd.is_some() {
            (plans.width, plans.height)
        } else {
            (lw, lh)
        };
        let texture = preview_target(gpu, w, h);
        let view = texture.create_view(&wgpu::TextureViewDescriptor::default());
        let map = match self.family {
            Family::Sd => &super::preview_maps::SD,
            Family::Sdxl => &super::preview_maps::SDXL,
        };
        let (preview, decoder) = match taesd {
            Some((plan, pixels)) => (
                Preview::new(gpu, &PreviewSource::Pixels, &pixels, &view, w, h)?,
                Some(plan),
            ),
            None => (
                Preview::new(
                    gpu,
                    &PreviewSource::Latent {
                        rows: map.rows,
                        bias: map.bias,
                    },
                    &plans.denoised,
                    &view,
                    w,
                    h,
                )?,
                None,
            ),
        };
        plans.preview = Some((texture.clone(), preview, decoder));
        Ok(texture)
    }

    /// The VAE encoder's plan for the current size, built on first use.
    pub(super) fn encoder_plan<'p>(
        &mut self,
        gpu: &Gpu,
        plans: &'p mut SizedPlans,
    ) -> Result<&'p VaePlan, Error> {
        if plans.encoder.is_none() {
            let (mut up, weights, config) = self.vae.loader(gpu, self.dtype);
            let b = Builder::new(gpu, &mut up, weights);
            plans.encoder = Some(build_encoder(
                b,
                config,
                &plans.image_in,
                (plans.height, plans.width),
            )?);
        }
        plans
            .encoder
            .as_ref()
            .ok_or_else(|| Error::Invalid("no encoder".into()))
    }

    /// Generates one image. `on_step` hears after each step (with the preview drawn when
    /// asked) and returns false to stop.
    pub fn generate(
        &mut self,
        gpu: &Gpu,
        slot: &mut Option<SizedPlans>,
        params: &ImageParams,
        preview: bool,
        mut on_step: impl FnMut(StepInfo) -> bool,
    ) -> Result<Option<Generated>, Error> {
        let start = Instant::now();
        self.plans_for(gpu, slot, params.width, params.height)?;
        let plans = slot
            .as_mut()
            .ok_or_else(|| Error::Invalid("no plans".into()))?;
        let sched = schedule(
            &self.scheduler,
            params.scheduler,
            params.steps,
            params.init_image.as_ref().map(|(_, s)| *s),
        )?;
        let guided = params.guidance > 1.0;
        self.write_conditioning(gpu, plans, params, guided)?;
        let text_ms = start.elapsed().as_secs_f64() * 1e3;
        self.init_latents(gpu, plans, params, &sched)?;
        if preview {
            self.preview_texture(gpu, plans)?;
        }
        let steps_start = Instant::now();
        let total_steps = sched.steps.len() as u32;
        let n = plans.width / self.downscale()
            * (plans.height / self.downscale())
            * self.unet.config.in_channels;
        for (i, c) in sched.steps.iter().enumerate() {
            let emb = timestep_embedding(
                c.timestep,
                self.unet.config.levels[0].channels as usize,
                self.unet.config.flip_sin_to_cos,
                self.unet.config.freq_shift,
            );
            gpu.queue()
                .write_buffer(&plans.io.time_proj.buffer, 0, bytemuck::cast_slice(&emb));
            if c.d != 0.0 {
                let noise = nchw_to_nhwc(
                    &step_noise(params.seed, i as u32, n as usize),
                    self.unet.config.in_channels as usize,
                );
                gpu.queue()
                    .write_buffer(&plans.noise.buffer, 0, bytemuck::cast_slice(&noise));
            }
            plans.denoise.set(
                gpu,
                &DenoiseParams {
                    n,
                    c_in: c.c_in,
                    guidance: params.guidance,
                    p: c.p,
                    q: c.q,
                    a: c.a,
                    b: c.b,
                    c: c.c,
                    d: c.d,
                    ..Default::default()
                },
            );
            let mut rec = Recorder::in_parts(gpu);
            record_step(&mut rec, plans, guided);
            rec.submit();
            gpu.wait()?;
            let info = StepInfo {
                step: i as u32 + 1,
                steps: total_steps,
                elapsed_ms: start.elapsed().as_secs_f64() * 1e3,
            };
            if !on_step(info) {
                return Ok(None);
            }
        }
        let steps_ms = steps_start.elapsed().as_secs_f64() * 1e3;
        let vae_start = Instant::now();
        let mut rec = Recorder::in_parts(gpu);
        plans.decoder.plan.encode(&mut rec);
        rec.submit();
        let pixels = u64::from(plans.width * plans.height * 3);
        let image: Vec<f32> = gpu.read(&plans.decoder.out.buffer, 0, pixels)?;
        let vae_ms = vae_start.elapsed().as_secs_f64() * 1e3;
        let rgb = super::flow_loop::to_srgb(&image);
        Ok(Some(Generated {
            width: plans.width,
            height: plans.height,
            rgb,
            timings: Timings {
                text_ms,
                steps_ms,
                ms_per_step: steps_ms / f64::from(total_steps.max(1)),
                vae_ms,
                total_ms: start.elapsed().as_secs_f64() * 1e3,
            },
        }))
    }

    /// Writes the starting latent: given latents or seeded noise times the initial sigma, or
    /// for image-to-image the encoded image noised to the first kept step.
    fn init_latents(
        &mut self,
        gpu: &Gpu,
        plans: &mut SizedPlans,
        params: &ImageParams,
        sched: &Schedule,
    ) -> Result<(), Error> {
        let f = self.downscale();
        let lc = self.unet.config.in_channels as usize;
        let n = (plans.width / f * (plans.height / f)) as usize * lc;
        let noise = match &params.init_latents {
            Some(l) if l.len() == n => l.clone(),
            Some(l) => {
                return Err(Error::Invalid(format!(
                    "init latents hold {} values; a {}×{} image needs [1, {lc}, {}, {}] = {n}",
                    l.len(),
                    plans.width,
                    plans.height,
                    plans.height / f,
                    plans.width / f
                )));
            }
            None => gaussian_noise(params.seed, n),
        };
        let noise = nchw_to_nhwc(&noise, lc);
        let clear = |b: &StorageBuffer| {
            gpu.queue()
                .write_buffer(&b.buffer, 0, &vec![0u8; b.size as usize])
        };
        clear(&plans.prev_denoised);
        match (&params.init_image, sched.img2img) {
            (Some((pixels, _)), Some((img_a, img_b))) => {
                let expected = (plans.width * plans.height * 3) as usize;
                if pixels.len() != expected {
                    return Err(Error::Invalid(format!(
                        "the init image has {} values, {expected} expected",
                        pixels.len()
                    )));
                }
                let scaled: Vec<f32> = pixels.iter().map(|v| v * 2.0 - 1.0).collect();
                gpu.queue()
                    .write_buffer(&plans.image_in.buffer, 0, bytemuck::cast_slice(&scaled));
                let enc = self.encoder_plan(gpu, plans)?;
                let mut rec = Recorder::new(gpu);
                enc.plan.encode(&mut rec);
                rec.submit();
                let latent: Vec<f32> = gpu.read(&enc.out.buffer, 0, n as u64)?;
                let start: Vec<f32> = latent
                    .iter()
                    .zip(&noise)
                    .map(|(l, e)| img_a * l + img_b * e)
                    .collect();
                gpu.queue()
                    .write_buffer(&plans.latents.buffer, 0, bytemuck::cast_slice(&start));
            }
            (Some(_), None) => {
                return Err(Error::Invalid(
                    "this schedule has no image-to-image start".into(),
                ));
            }
            _ => {
                let start: Vec<f32> = noise.iter().map(|e| e * sched.init_noise_sigma).collect();
                gpu.queue()
                    .write_buffer(&plans.latents.buffer, 0, bytemuck::cast_slice(&start));
            }
        }
        Ok(())
    }
}

/// A texture a preview pass draws into and the Image panel shows.
pub(super) fn preview_target(gpu: &Gpu, width: u32, height: u32) -> wgpu::Texture {
    gpu.device().create_texture(&wgpu::TextureDescriptor {
        label: Some("image preview"),
        size: wgpu::Extent3d {
            width,
            height,
            depth_or_array_layers: 1,
        },
        mip_level_count: 1,
        sample_count: 1,
        dimension: wgpu::TextureDimension::D2,
        format: wgpu::TextureFormat::Rgba8Unorm,
        usage: wgpu::TextureUsages::STORAGE_BINDING
            | wgpu::TextureUsages::TEXTURE_BINDING
            | wgpu::TextureUsages::COPY_SRC,
        view_formats: &[],
    })
}

/// One denoising step: the UNet (twice under guidance, swapping the conditioning in), the
/// guidance mix, the scheduler's update, then the preview.
fn record_step(rec: &mut Recorder<'_>, plans: &SizedPlans, guided: bool) {
    plans.denoise.scale.encode(rec);
    if guided {
        copy_all(rec, &plans.context_uncond, &plans.io.context);
        if let (Some(src), Some(dst)) = (&plans.added_uncond, &plans.io.added) {
            copy_all(rec, src, dst);
        }
        plans.unet.plan.encode(rec);
        copy_all(rec, &plans.unet.out, &plans.uncond_out);
        copy_all(rec, &plans.context_cond, &plans.io.context);
        if let (Some(src), Some(dst)) = (&plans.added_cond, &plans.io.added) {
            copy_all(rec, src, dst);
        }
    }
    plans.unet.plan.encode(rec);
    if guided {
        plans.denoise.guide.encode(rec);
    }
    plans.denoise.step.encode(rec);
    if let Some((_, p, decoder)) = &plans.preview {
        if let Some(d) = decoder {
            d.encode(rec);
        }
        p.encode(rec);
    }
}

fn copy_all(rec: &mut Recorder<'_>, src: &StorageBuffer, dst: &StorageBuffer) {
    rec.copy(&src.buffer, 0, &dst.buffer, 0, src.size.min(dst.size));
}

/// diffusers' `[1][c][h][w]` → channel-last `[h·w][c]`.
pub fn nchw_to_nhwc(x: &[f32], c: usize) -> Vec<f32> {
    let hw = x.len() / c.max(1);
    let mut out = vec![0.0; x.len()];
    for ch in 0..c {
        for p in 0..hw {
            out[p * c + ch] = x[ch * hw + p];
        }
    }
    out
}

/// Channel-last `[h·w][c]` → `[1][c][h][w]`.
pub fn nhwc_to_nchw(x: &[f32], c: usize) -> Vec<f32> {
    let hw = x.len() / c.max(1);
    let mut out = vec![0.0; x.len()];
    for ch in 0..c {
        for p in 0..hw {
            out[ch * hw + p] = x[p * c + ch];
        }
    }
    out
}
