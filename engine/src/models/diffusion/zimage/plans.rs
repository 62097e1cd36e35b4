//! The buffers and plans of one Z-Image image size: the transformer at each caption length in
//! use, the VAE decoder (and encoder, for image-to-image), the denoising update and the
//! preview; and single stages in diffusers' layouts for parity checks and tools.

use std::sync::Arc;

use super::ZImage;
use super::config::TIME_FREQUENCIES;
use super::transformer::{ZImageIo, ZImagePlan, build_transformer, padded};
use crate::Error;
use crate::gpu::{Gpu, Recorder, StorageBuffer};
use crate::models::diffusion::flow_loop::{FlowBuffers, zeros};
use crate::models::diffusion::generate::{nchw_to_nhwc, nhwc_to_nchw};
use crate::models::diffusion::graph::{Builder, Plan};
use crate::models::diffusion::preview_maps::{self, PreviewMap};
use crate::models::diffusion::scheduler::timestep_embedding;
use crate::models::diffusion::vae::{VaePlan, build_decoder, build_encoder};
use crate::ops::{Denoise, Preview, PreviewSource};

/// The transformer for captions that pad to one length, with its own caption input (and
/// count of rows in use) and output.
pub(super) struct CaptionPlan {
    /// The padded caption length the plan serves.
    pub(super) rows: u32,
    plan: ZImagePlan,
    caption: Arc<StorageBuffer>,
    used: Arc<StorageBuffer>,
    out: Arc<StorageBuffer>,
}

/// Plans and buffers for one image size, kept while the size stays.
pub struct ZImagePlans {
    pub width: u32,
    pub height: u32,
    pub(super) transformers: Vec<CaptionPlan>,
    /// The VAE decoder, reading `decode_in` (the final latent, or a step's estimate for a
    /// preview).
    pub(super) decoder: VaePlan,
    pub(super) decode_in: Arc<StorageBuffer>,
    /// The VAE encoder (image-to-image) and the start image it reads, made on first use.
    encoder: Option<(VaePlan, Arc<StorageBuffer>)>,
    pub(super) latents: Arc<StorageBuffer>,
    model_in: Arc<StorageBuffer>,
    time_proj: Arc<StorageBuffer>,
    pub(super) model_out: Arc<StorageBuffer>,
    pub(super) uncond_out: Arc<StorageBuffer>,
    denoised: Arc<StorageBuffer>,
    pub(super) denoise: Denoise,
    /// The preview texture, the pass drawing it, and what feeds that pass.
    pub(super) preview: Option<(wgpu::Texture, Preview, PreviewDecoder)>,
    /// Bytes of activations of the decoder and the transformer plans.
    pub activation_bytes: u64,
}

/// What turns a step's clean estimate into the preview's input.
pub(super) enum PreviewDecoder {
    /// A tiny autoencoder's decoder, to pixels.
    Tiny(Plan),
    /// None: the preview maps the latent itself.
    Linear(&'static PreviewMap),
    /// The pipeline's VAE decoder, to pixels.
    Vae,
}

/// A caption on the GPU: its features and (one u32) how many rows they fill.
pub(super) struct CaptionRows {
    pub(super) features: StorageBuffer,
    pub(super) used: StorageBuffer,
}

impl CaptionRows {
    pub(super) fn upload(
        gpu: &Gpu,
        label: &str,
        features: &[f32],
        rows: u32,
    ) -> Result<Self, Error> {
        let buffer = gpu.storage(label, (features.len() as u64).max(1) * 4)?;
        gpu.queue()
            .write_buffer(&buffer.buffer, 0, bytemuck::cast_slice(features));
        Ok(Self {
            features: buffer,
            used: gpu.storage_from("caption rows", &[rows])?,
        })
    }
}

/// One transformer call of a step: its plan, the caption it reads, where its output goes.
pub(super) struct Call<'a> {
    pub(super) plan: &'a CaptionPlan,
    pub(super) caption: &'a CaptionRows,
    pub(super) out: &'a StorageBuffer,
}

impl Call<'_> {
    /// Copies the caption and its row count in (so that captions of one padded length share
    /// the plan, even within one submission), runs the plan, copies the output out.
    pub(super) fn record(&self, rec: &mut Recorder<'_>) {
        let features = &self.caption.features;
        let bytes = features.size.min(self.plan.caption.size);
        rec.copy(&features.buffer, 0, &self.plan.caption.buffer, 0, bytes);
        rec.copy(&self.caption.used.buffer, 0, &self.plan.used.buffer, 0, 4);
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
    pub(super) fn latent_shape(&self, width: u32, height: u32) -> Result<(u32, u32), Error> {
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
        let FlowBuffers {
            latents,
            model_in,
            model_out,
            uncond_out,
            denoised,
            denoise,
        } = FlowBuffers::new(gpu, n, n)?;
        *slot = Some(ZImagePlans {
            width,
            height,
            transformers: Vec::new(),
            activation_bytes: decoder.activation_bytes,
            decoder,
            decode_in,
            encoder: None,
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
    /// step's clean estimate through the tiny decoder when one is installed, else through the
    /// linear map fitted for the latent's channels (at the latent's size), else through the
    /// pipeline's VAE decoder (exact, at the cost of a decode a step).
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
        let map = preview_maps::for_channels(self.transformer.config.in_channels);
        let (decoder, source, (tw, th)) = match (self.taesd.as_mut(), map) {
            (Some(t), _) => {
                let (plan, pixels) = t.build(gpu, &plans.denoised, (h, w))?;
                (PreviewDecoder::Tiny(plan), pixels, (width, height))
            }
            (None, Some(map)) => (PreviewDecoder::Linear(map), plans.denoised.clone(), (w, h)),
            (None, None) => (
                PreviewDecoder::Vae,
                plans.decoder.out.clone(),
                (width, height),
            ),
        };
        let texture = crate::models::diffusion::generate::preview_target(gpu, tw, th);
        let view = texture.create_view(&wgpu::TextureViewDescriptor::default());
        let kind = match &decoder {
            PreviewDecoder::Linear(map) => PreviewSource::Latent {
                rows: map.rows,
                bias: map.bias,
            },
            _ => PreviewSource::Pixels,
        };
        let pass = Preview::new(gpu, &kind, &source, &view, tw, th)?;
        plans.preview = Some((texture.clone(), pass, decoder));
        Ok(texture)
    }

    /// Makes sure the size's plans hold a transformer for each caption length in `lengths`
    /// (one per padded length; those for other lengths are dropped).
    pub(super) fn transformers_for(
        &mut self,
        gpu: &Gpu,
        plans: &mut ZImagePlans,
        lengths: &[u32],
    ) -> Result<(), Error> {
        let wanted: Vec<u32> = lengths.iter().map(|&n| padded(n.max(1))).collect();
        let (kept, dropped): (Vec<_>, Vec<_>) = std::mem::take(&mut plans.transformers)
            .into_iter()
            .partition(|p| wanted.contains(&p.rows));
        plans.transformers = kept;
        for plan in dropped {
            plans.activation_bytes = plans
                .activation_bytes
                .saturating_sub(plan.plan.activation_bytes);
        }
        for rows in wanted {
            if plans.transformers.iter().any(|p| p.rows == rows) {
                continue;
            }
            let cfg = &self.transformer.config;
            let (h, w) = self.latent_shape(plans.width, plans.height)?;
            let io = ZImageIo {
                latent: plans.model_in.clone(),
                time_proj: plans.time_proj.clone(),
                caption: zeros(gpu, "caption", rows * cfg.cap_feat_dim)?,
                caption_rows: rows,
                caption_used: Arc::new(gpu.storage_from("caption rows in use", &[rows])?),
                out: zeros(gpu, "transformer output", h * w * cfg.in_channels)?,
            };
            let (mut up, weights, config) = self.transformer.loader(gpu, self.dtype);
            let plan = build_transformer(Builder::new(gpu, &mut up, weights), config, &io, (h, w))?;
            plans.activation_bytes += plan.activation_bytes;
            plans.transformers.push(CaptionPlan {
                rows,
                plan,
                caption: io.caption,
                used: io.caption_used,
                out: io.out,
            });
        }
        Ok(())
    }

    /// The VAE encoder's latent mean, scaled as the transformer sees it, `[h·w][c]`, for an
    /// image `[H·W][3]` in −1..1.
    pub(super) fn encode_image(
        &mut self,
        gpu: &Gpu,
        plans: &mut ZImagePlans,
        image: &[f32],
    ) -> Result<Vec<f32>, Error> {
        if plans.encoder.is_none() {
            let pixels = u64::from(plans.width) * u64::from(plans.height) * 3;
            let image_in = Arc::new(gpu.storage("start image", pixels * 4)?);
            let (mut up, weights, config) = self.vae.loader(gpu, self.dtype);
            let b = Builder::new(gpu, &mut up, weights);
            let hw = (plans.height, plans.width);
            let encoder = build_encoder(b, config, &image_in, hw)?;
            plans.activation_bytes += encoder.activation_bytes;
            plans.encoder = Some((encoder, image_in));
        }
        let (encoder, image_in) = plans
            .encoder
            .as_ref()
            .ok_or_else(|| Error::Invalid("no encoder".into()))?;
        gpu.queue()
            .write_buffer(&image_in.buffer, 0, bytemuck::cast_slice(image));
        let mut rec = Recorder::new(gpu);
        encoder.plan.encode(&mut rec);
        rec.submit();
        let (h, w) = self.latent_shape(plans.width, plans.height)?;
        let values = u64::from(h * w * self.transformer.config.in_channels);
        Ok(gpu.read(&encoder.out.buffer, 0, values)?)
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
            .find(|p| p.rows == padded(tokens))
            .ok_or_else(|| Error::Invalid("no transformer plan".into()))?;
        q.write_buffer(&plan.caption.buffer, 0, bytemuck::cast_slice(caption));
        q.write_buffer(&plan.used.buffer, 0, bytemuck::cast_slice(&[tokens]));
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
        let decoder = &plans.decoder;
        decoder.decode_once(gpu, &plans.decode_in, latent, c, h * w * f * f)
    }

    /// GPU time per kernel of one transformer call (at the last caption length used) and one
    /// VAE decode at the plans' size.
    pub fn profile(
        &self,
        gpu: &Gpu,
        plans: &ZImagePlans,
    ) -> Result<Vec<(&'static str, Vec<crate::gpu::KernelTiming>)>, Error> {
        let transformer = plans.transformers.last().map(|t| &t.plan.plan);
        crate::models::diffusion::stages::profile_transformer(gpu, transformer, &plans.decoder.plan)
    }

    /// The scaled timestep's sinusoidal embedding for model time `t`.
    pub(super) fn write_time(&self, gpu: &Gpu, plans: &ZImagePlans, t: f32) {
        let cfg = &self.transformer.config;
        let emb = timestep_embedding(t * cfg.t_scale, TIME_FREQUENCIES as usize, true, 0.0);
        gpu.queue()
            .write_buffer(&plans.time_proj.buffer, 0, bytemuck::cast_slice(&emb));
    }
}

pub(super) fn copy_all(rec: &mut Recorder<'_>, src: &StorageBuffer, dst: &StorageBuffer) {
    rec.copy(&src.buffer, 0, &dst.buffer, 0, src.size.min(dst.size));
}

/// Draws the step's clean estimate into the preview texture.
pub(super) fn record_preview(rec: &mut Recorder<'_>, plans: &ZImagePlans) {
    let Some((_, pass, tiny)) = &plans.preview else {
        return;
    };
    match tiny {
        PreviewDecoder::Tiny(plan) => plan.encode(rec),
        PreviewDecoder::Linear(_) => {}
        PreviewDecoder::Vae => {
            copy_all(rec, &plans.denoised, &plans.decode_in);
            plans.decoder.plan.encode(rec);
        }
    }
    pass.encode(rec);
}
