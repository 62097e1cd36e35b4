//! One Z-Image image: captions, the flow-matching loop (transformer, guidance and the Euler
//! update on the GPU, one submission per step), then the VAE decoder.

use std::sync::Arc;
use std::time::Instant;

use super::ZImage;
use super::config::TIME_FREQUENCIES;
use super::transformer::{ZImageIo, ZImagePlan, build_transformer, padded};
use crate::Error;
use crate::gpu::{Gpu, Recorder, StorageBuffer};
use crate::models::diffusion::generate::{
    Generated, ImageParams, StepInfo, Timings, nchw_to_nhwc, nhwc_to_nchw,
};
use crate::models::diffusion::graph::{Builder, Plan};
use crate::models::diffusion::scheduler::{
    flow_step, gaussian_noise, linear_sigmas, timestep_embedding,
};
use crate::models::diffusion::vae::{VaePlan, build_decoder};
use crate::ops::{Denoise, DenoiseBuffers, DenoiseParams, Preview, PreviewSource};

/// The transformer at one caption length, with its own caption input and output.
struct CaptionPlan {
    tokens: u32,
    plan: ZImagePlan,
    caption: Arc<StorageBuffer>,
    out: Arc<StorageBuffer>,
}

/// Plans and buffers for one image size, kept while the size stays.
pub struct ZImagePlans {
    pub width: u32,
    pub height: u32,
    transformers: Vec<CaptionPlan>,
    /// The VAE decoder, reading `decode_in` (the final latent, or a step's estimate for a
    /// preview).
    decoder: VaePlan,
    decode_in: Arc<StorageBuffer>,
    latents: Arc<StorageBuffer>,
    model_in: Arc<StorageBuffer>,
    time_proj: Arc<StorageBuffer>,
    model_out: Arc<StorageBuffer>,
    uncond_out: Arc<StorageBuffer>,
    denoised: Arc<StorageBuffer>,
    denoise: Denoise,
    /// The preview texture and the pass drawing it, with the tiny decoder feeding it (else
    /// the VAE decoder on the step's estimate does).
    preview: Option<(wgpu::Texture, Preview, Option<Plan>)>,
    /// Bytes of activations of the decoder and the transformer plans.
    pub activation_bytes: u64,
}

fn zeros(gpu: &Gpu, label: &str, floats: u32) -> Result<Arc<StorageBuffer>, Error> {
    Ok(Arc::new(gpu.storage(label, u64::from(floats.max(1)) * 4)?))
}

/// One transformer call of a step: its plan, the caption it reads, where its output goes.
struct Call<'a> {
    plan: &'a CaptionPlan,
    caption: &'a StorageBuffer,
    out: &'a StorageBuffer,
}

impl Call<'_> {
    fn record(&self, rec: &mut Recorder<'_>) {
        let bytes = self.caption.size.min(self.plan.caption.size);
        rec.copy(&self.caption.buffer, 0, &self.plan.caption.buffer, 0, bytes);
        self.plan.plan.plan.encode(rec);
        rec.copy(
            &self.plan.out.buffer,
            0,
            &self.out.buffer,
            0,
            self.plan.out.size.min(self.out.size),
        );
    }
}

impl ZImage {
    fn latent_shape(&self, width: u32, height: u32) -> Result<(u32, u32), Error> {
        let step = self.size_step();
        if width == 0 || height == 0 || !width.is_multiple_of(step) || !height.is_multiple_of(step)
        {
            return Err(Error::Invalid(format!(
                "{width}×{height}: width and height must be positive multiples of {step}"
            )));
        }
        let f = self.downscale();
        Ok((height / f, width / f))
    }

    /// Builds (or keeps) the size's buffers and VAE decoder.
    pub fn plans_for(
        &mut self,
        gpu: &Gpu,
        slot: &mut Option<ZImagePlans>,
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
        let (h, w) = self.latent_shape(width, height)?;
        let n = h * w * self.transformer.config.in_channels;
        let latents = zeros(gpu, "latents", n)?;
        let decode_in = zeros(gpu, "decoder input", n)?;
        let decoder = {
            let (mut up, weights, config) = self.vae.loader(gpu, self.dtype);
            build_decoder(
                Builder::new(gpu, &mut up, weights),
                config,
                &decode_in,
                (h, w),
            )?
        };
        let model_in = zeros(gpu, "transformer input", n)?;
        let model_out = zeros(gpu, "transformer output", n)?;
        let uncond_out = zeros(gpu, "unconditional output", n)?;
        let denoised = zeros(gpu, "denoised", n)?;
        let prev = zeros(gpu, "previous denoised", n)?;
        let noise = zeros(gpu, "step noise", n)?;
        let denoise = Denoise::new(
            gpu,
            n,
            &DenoiseBuffers {
                latents: &latents,
                model_out: &model_out,
                uncond: &uncond_out,
                model_in: &model_in,
                denoised: &denoised,
                prev_denoised: &prev,
                noise: &noise,
            },
        )?;
        *slot = Some(ZImagePlans {
            width,
            height,
            transformers: Vec::new(),
            activation_bytes: decoder.activation_bytes,
            decoder,
            decode_in,
            latents,
            model_in,
            time_proj: zeros(gpu, "time embedding", TIME_FREQUENCIES)?,
            model_out,
            uncond_out,
            denoised,
            denoise,
            preview: None,
        });
        Ok(())
    }

    /// The texture previews of the current size are drawn into (made on first use): the
    /// step's clean estimate through the tiny decoder when one is installed, else through
    /// the pipeline's VAE decoder (exact, at the cost of a decode a step).
    pub fn preview_texture(
        &mut self,
        gpu: &Gpu,
        slot: &mut Option<ZImagePlans>,
        width: u32,
        height: u32,
    ) -> Result<wgpu::Texture, Error> {
        self.plans_for(gpu, slot, width, height)?;
        let plans = slot
            .as_mut()
            .ok_or_else(|| Error::Invalid("no plans".into()))?;
        if let Some((texture, _, _)) = &plans.preview {
            return Ok(texture.clone());
        }
        let (h, w) = self.latent_shape(width, height)?;
        let (decoder, pixels) = match self.taesd.as_mut() {
            Some(t) => {
                let (plan, pixels) = t.build(gpu, &plans.denoised, (h, w))?;
                (Some(plan), pixels)
            }
            None => (None, plans.decoder.out.clone()),
        };
        let texture = crate::models::diffusion::generate::preview_target(gpu, width, height);
        let view = texture.create_view(&wgpu::TextureViewDescriptor::default());
        let pass = Preview::new(gpu, &PreviewSource::Pixels, &pixels, &view, width, height)?;
        plans.preview = Some((texture.clone(), pass, decoder));
        Ok(texture)
    }

    /// Makes sure the size's plans hold a transformer for each caption length in `lengths`
    /// (dropping those for other lengths).
    fn transformers_for(
        &mut self,
        gpu: &Gpu,
        plans: &mut ZImagePlans,
        lengths: &[u32],
    ) -> Result<(), Error> {
        plans.transformers.retain(|p| lengths.contains(&p.tokens));
        for &tokens in lengths {
            if plans.transformers.iter().any(|p| p.tokens == tokens) {
                continue;
            }
            let cfg = &self.transformer.config;
            let (h, w) = self.latent_shape(plans.width, plans.height)?;
            let io = ZImageIo {
                latent: plans.model_in.clone(),
                time_proj: plans.time_proj.clone(),
                caption: zeros(gpu, "caption", padded(tokens) * cfg.cap_feat_dim)?,
                caption_tokens: tokens,
                out: zeros(gpu, "transformer output", h * w * cfg.in_channels)?,
            };
            let (mut up, weights, config) = self.transformer.loader(gpu, self.dtype);
            let plan = build_transformer(Builder::new(gpu, &mut up, weights), config, &io, (h, w))?;
            plans.activation_bytes += plan.activation_bytes;
            plans.transformers.push(CaptionPlan {
                tokens,
                plan,
                caption: io.caption,
                out: io.out,
            });
        }
        Ok(())
    }

    /// Builds the transformer's plan for a one-token caption at the current size, which
    /// loads (and checks) every one of its weights.
    pub fn warm_transformer(
        &mut self,
        gpu: &Gpu,
        slot: &mut Option<ZImagePlans>,
    ) -> Result<(), Error> {
        let plans = slot
            .as_mut()
            .ok_or_else(|| Error::Invalid("no plans".into()))?;
        self.transformers_for(gpu, plans, &[1])
    }

    /// The transformer on a `[1][c][h][w]` latent at model time `t` (0 = noise, 1 = clean)
    /// with caption features `[tokens][cap_feat_dim]`: its raw output, `[1][c][h][w]`.
    pub fn transformer_once(
        &mut self,
        gpu: &Gpu,
        slot: &mut Option<ZImagePlans>,
        latent: &[f32],
        (h, w): (u32, u32),
        t: f32,
        caption: &[f32],
    ) -> Result<Vec<f32>, Error> {
        let f = self.downscale();
        self.plans_for(gpu, slot, w * f, h * f)?;
        let plans = slot
            .as_mut()
            .ok_or_else(|| Error::Invalid("no plans".into()))?;
        let cfg = self.transformer.config.clone();
        let tokens = (caption.len() / cfg.cap_feat_dim as usize) as u32;
        self.transformers_for(gpu, plans, &[tokens])?;
        let c = cfg.in_channels as usize;
        let q = gpu.queue();
        q.write_buffer(
            &plans.model_in.buffer,
            0,
            bytemuck::cast_slice(&nchw_to_nhwc(latent, c)),
        );
        self.write_time(gpu, plans, t);
        let plan = plans
            .transformers
            .iter()
            .find(|p| p.tokens == tokens)
            .ok_or_else(|| Error::Invalid("no transformer plan".into()))?;
        q.write_buffer(&plan.caption.buffer, 0, bytemuck::cast_slice(caption));
        let mut rec = Recorder::new(gpu);
        plan.plan.plan.encode(&mut rec);
        rec.submit();
        let out: Vec<f32> = gpu.read(&plan.out.buffer, 0, u64::from(h * w) * c as u64)?;
        Ok(nhwc_to_nchw(&out, c))
    }

    /// The VAE decoder on a `[1][c][h][w]` latent as the transformer sees it: `[1][3][H][W]`
    /// in −1..1.
    pub fn decode_latents(
        &mut self,
        gpu: &Gpu,
        slot: &mut Option<ZImagePlans>,
        latent: &[f32],
        (h, w): (u32, u32),
    ) -> Result<Vec<f32>, Error> {
        let f = self.downscale();
        self.plans_for(gpu, slot, w * f, h * f)?;
        let plans = slot
            .as_mut()
            .ok_or_else(|| Error::Invalid("no plans".into()))?;
        let c = self.transformer.config.in_channels as usize;
        gpu.queue().write_buffer(
            &plans.decode_in.buffer,
            0,
            bytemuck::cast_slice(&nchw_to_nhwc(latent, c)),
        );
        let mut rec = Recorder::new(gpu);
        plans.decoder.plan.encode(&mut rec);
        rec.submit();
        let pixels = u64::from(h * w * f * f * 3);
        let out: Vec<f32> = gpu.read(&plans.decoder.out.buffer, 0, pixels)?;
        Ok(nhwc_to_nchw(&out, 3))
    }

    /// GPU time per kernel of one transformer call (at the last caption length used) and one
    /// VAE decode at the plans' size.
    pub fn profile(
        &self,
        gpu: &Gpu,
        plans: &ZImagePlans,
    ) -> Result<Vec<(&'static str, Vec<crate::gpu::KernelTiming>)>, Error> {
        let transformer = plans
            .transformers
            .last()
            .ok_or_else(|| Error::Invalid("no transformer plan: generate an image first".into()))?;
        crate::models::diffusion::stages::profile_plans(
            gpu,
            &[
                ("transformer", &transformer.plan.plan),
                ("vae decode", &plans.decoder.plan),
            ],
        )
    }

    /// The scaled timestep's sinusoidal embedding for model time `t`.
    fn write_time(&self, gpu: &Gpu, plans: &ZImagePlans, t: f32) {
        let cfg = &self.transformer.config;
        let emb = timestep_embedding(t * cfg.t_scale, TIME_FREQUENCIES as usize, true, 0.0);
        gpu.queue()
            .write_buffer(&plans.time_proj.buffer, 0, bytemuck::cast_slice(&emb));
    }

    /// Generates one image. `on_step` hears after each step and returns false to stop.
    pub fn generate(
        &mut self,
        gpu: &Gpu,
        slot: &mut Option<ZImagePlans>,
        params: &ImageParams,
        preview: bool,
        mut on_step: impl FnMut(StepInfo) -> bool,
    ) -> Result<Option<Generated>, Error> {
        let start = Instant::now();
        if params.init_image.is_some() {
            return Err(Error::Invalid(
                "image-to-image is not available for Z-Image pipelines".into(),
            ));
        }
        if preview {
            self.preview_texture(gpu, slot, params.width, params.height)?;
        }
        self.plans_for(gpu, slot, params.width, params.height)?;
        let plans = slot
            .as_mut()
            .ok_or_else(|| Error::Invalid("no plans".into()))?;
        // The pipeline guides whenever the scale is above zero: pos + g·(pos − neg).
        let guided = params.guidance > 0.0;
        let (cond, cond_tokens) = self.caption(&params.prompt)?;
        let uncond = if guided {
            Some(self.caption(&params.negative)?)
        } else {
            None
        };
        let mut lengths = vec![cond_tokens];
        lengths.extend(uncond.as_ref().map(|u| u.1));
        self.transformers_for(gpu, plans, &lengths)?;
        let q = gpu.queue();
        let cap_dim = u64::from(self.transformer.config.cap_feat_dim);
        let caption_buffer = |label: &str, values: &[f32]| -> Result<StorageBuffer, Error> {
            let buf = gpu.storage(label, (values.len() as u64).max(cap_dim) * 4)?;
            q.write_buffer(&buf.buffer, 0, bytemuck::cast_slice(values));
            Ok(buf)
        };
        let cond_caption = caption_buffer("caption", &cond)?;
        let uncond_caption = uncond
            .as_ref()
            .map(|(u, _)| caption_buffer("negative caption", u))
            .transpose()?;
        let text_ms = start.elapsed().as_secs_f64() * 1e3;

        let (h, w) = self.latent_shape(params.width, params.height)?;
        let c = self.transformer.config.in_channels;
        let n = h * w * c;
        let noise = match &params.init_latents {
            Some(l) if l.len() == n as usize => l.clone(),
            Some(l) => {
                return Err(Error::Invalid(format!(
                    "init latents hold {} values; a {}×{} image needs [1, {c}, {h}, {w}] = {n}",
                    l.len(),
                    params.width,
                    params.height
                )));
            }
            None => gaussian_noise(params.seed, n as usize),
        };
        q.write_buffer(
            &plans.latents.buffer,
            0,
            bytemuck::cast_slice(&nchw_to_nhwc(&noise, c as usize)),
        );
        let patch = self.transformer.config.patch;
        let sigmas = self
            .scheduler
            .sigmas(&linear_sigmas(params.steps), (h / patch) * (w / patch));
        let steps = sigmas.len() as u32 - 1;
        // Under guidance the negative caption's call comes first, its output set aside.
        let find = |tokens: u32| {
            plans
                .transformers
                .iter()
                .position(|p| p.tokens == tokens)
                .ok_or_else(|| Error::Invalid("no transformer plan".into()))
        };
        let mut order = Vec::new();
        if let Some((_, tokens)) = &uncond {
            order.push((find(*tokens)?, false));
        }
        order.push((find(cond_tokens)?, true));
        let steps_start = Instant::now();
        for i in 0..steps as usize {
            let (sigma, next) = (sigmas[i], sigmas[i + 1]);
            // The pipeline's model time: (1000 − 1000σ) / 1000, in f32 as torch takes it.
            let t = (1000.0 - sigma * 1000.0) / 1000.0;
            self.write_time(gpu, plans, t);
            let s = flow_step(sigma, next, true);
            plans.denoise.set(
                gpu,
                &DenoiseParams {
                    n,
                    c_in: 1.0,
                    guidance: params.guidance + 1.0,
                    p: s.p,
                    q: s.q,
                    a: s.a,
                    b: s.b,
                    ..Default::default()
                },
            );
            let mut rec = Recorder::in_parts(gpu);
            plans.denoise.scale.encode(&mut rec);
            for &(index, is_cond) in &order {
                let (caption, out) = match (&uncond_caption, is_cond) {
                    (Some(negative), false) => (negative, &plans.uncond_out),
                    _ => (&cond_caption, &plans.model_out),
                };
                let call = Call {
                    plan: &plans.transformers[index],
                    caption,
                    out,
                };
                call.record(&mut rec);
            }
            if guided {
                plans.denoise.guide.encode(&mut rec);
            }
            plans.denoise.step.encode(&mut rec);
            if preview {
                record_preview(&mut rec, plans);
            }
            rec.submit();
            gpu.wait()?;
            let info = StepInfo {
                step: i as u32 + 1,
                steps,
                elapsed_ms: start.elapsed().as_secs_f64() * 1e3,
            };
            if !on_step(info) {
                return Ok(None);
            }
        }
        let steps_ms = steps_start.elapsed().as_secs_f64() * 1e3;
        let vae_start = Instant::now();
        let mut rec = Recorder::in_parts(gpu);
        copy_all(&mut rec, &plans.latents, &plans.decode_in);
        plans.decoder.plan.encode(&mut rec);
        rec.submit();
        let pixels = u64::from(params.width * params.height * 3);
        let image: Vec<f32> = gpu.read(&plans.decoder.out.buffer, 0, pixels)?;
        let vae_ms = vae_start.elapsed().as_secs_f64() * 1e3;
        let rgb = image
            .iter()
            .map(|v| ((v / 2.0 + 0.5).clamp(0.0, 1.0) * 255.0).round() as u8)
            .collect();
        Ok(Some(Generated {
            width: params.width,
            height: params.height,
            rgb,
            timings: Timings {
                text_ms,
                steps_ms,
                ms_per_step: steps_ms / f64::from(steps.max(1)),
                vae_ms,
                total_ms: start.elapsed().as_secs_f64() * 1e3,
            },
        }))
    }
}

fn copy_all(rec: &mut Recorder<'_>, src: &StorageBuffer, dst: &StorageBuffer) {
    rec.copy(&src.buffer, 0, &dst.buffer, 0, src.size.min(dst.size));
}

/// Draws the step's clean estimate into the preview texture.
fn record_preview(rec: &mut Recorder<'_>, plans: &ZImagePlans) {
    let Some((_, pass, tiny)) = &plans.preview else {
        return;
    };
    match tiny {
        Some(plan) => plan.encode(rec),
        None => {
            copy_all(rec, &plans.denoised, &plans.decode_in);
            plans.decoder.plan.encode(rec);
        }
    }
    pass.encode(rec);
}
