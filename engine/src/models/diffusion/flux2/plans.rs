//! The buffers and plans of one FLUX.2 image size: the transformer (with or without a
//! reference image's tokens), the latents' way back through the batch-norm statistics to the
//! VAE decoder, the encoder for reference images, the Euler update and the preview; and
//! single stages in diffusers' layouts for parity checks.

use std::sync::Arc;

use super::Flux2;
use super::transformer::{Flux2Io, Flux2Plan, Grid, build_transformer};
use crate::Error;
use crate::gpu::{Gpu, Recorder, StorageBuffer};
use crate::models::diffusion::flow_loop::{FlowBuffers, zeros};
use crate::models::diffusion::generate::{nchw_to_nhwc, nhwc_to_nchw};
use crate::models::diffusion::graph::{Builder, Plan};
use crate::models::diffusion::preview_maps;
use crate::models::diffusion::qwen_text::MAX_PROMPT_TOKENS;
use crate::models::diffusion::scheduler::timestep_embedding;
use crate::models::diffusion::vae::{VaePlan, build_decoder, build_encoder};
use crate::ops::{Denoise, Pass, Preview, PreviewSource, bn_unpack};

/// The transformer for one token grid, reading `caption` and writing `out`.
pub(super) struct TransformerPlan {
    pub(super) grid: Grid,
    pub(super) plan: Flux2Plan,
}

/// Plans and buffers for one image size, kept while the size stays.
pub struct Flux2Plans {
    pub width: u32,
    pub height: u32,
    pub(super) transformer: Option<TransformerPlan>,
    /// The transformer's caption input, `[512][joint_attention_dim]`.
    pub(super) caption: Arc<StorageBuffer>,
    /// The transformer's output, `[h·w][in_channels]`.
    pub(super) transformer_out: Arc<StorageBuffer>,
    /// The VAE decoder, reading the latent (`[2h·2w][latent channels]`) that `unpack` (the
    /// final latents) and `unpack_estimate` (a step's clean estimate) write.
    pub(super) decoder: VaePlan,
    pub(super) unpack: Pass,
    pub(super) unpack_estimate: Pass,
    /// The VAE encoder (reference images) and the image it reads, made on first use.
    encoder: Option<(VaePlan, Arc<StorageBuffer>)>,
    pub(super) latents: Arc<StorageBuffer>,
    /// The transformer's input: the latents, then the reference tokens when there are some.
    pub(super) model_in: Arc<StorageBuffer>,
    time_proj: Arc<StorageBuffer>,
    pub(super) model_out: Arc<StorageBuffer>,
    pub(super) uncond_out: Arc<StorageBuffer>,
    /// Each step's clean estimate (packed, normalised), for previews.
    denoised: Arc<StorageBuffer>,
    pub(super) denoise: Denoise,
    /// The preview texture, the pass drawing it, and what feeds that pass.
    pub(super) preview: Option<Box<(wgpu::Texture, Preview, EstimatePreview)>>,
    /// Bytes of activations of the decoder and the transformer plan.
    pub activation_bytes: u64,
}

/// How a step's clean estimate reaches the preview.
pub(super) enum EstimatePreview {
    /// Unpacked (still normalised) for the linear map fitted for the 32-channel latents.
    Linear(Pass),
    /// Unpacked (still normalised, as TAEF2 reads them) through the tiny decoder.
    Tiny(Pass, Plan),
    /// Through the statistics and the VAE decoder.
    Vae,
}

impl Flux2 {
    /// The packed latent's token grid (rows, columns) for an image.
    pub(super) fn token_grid(&self, width: u32, height: u32) -> Result<(u32, u32), Error> {
        let step = self.size_step();
        if width == 0 || height == 0 || !width.is_multiple_of(step) || !height.is_multiple_of(step)
        {
            return Err(Error::Invalid(format!(
                "{width}×{height}: width and height must be positive multiples of {step}"
            )));
        }
        Ok((height / step, width / step))
    }

    /// Builds (or keeps) the size's buffers and VAE decoder.
    pub fn plans_for(
        &mut self,
        gpu: &Gpu,
        slot: &mut Option<Flux2Plans>,
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
        let (h, w) = self.token_grid(width, height)?;
        let features = self.transformer.config.in_channels;
        let n = h * w * features;
        let decode_in = zeros(gpu, "decoder input", n)?;
        let decoder = {
            let (mut up, weights, config) = self.vae.loader(gpu, self.dtype);
            build_decoder(
                Builder::new(gpu, &mut up, weights),
                config,
                &decode_in,
                (2 * h, 2 * w),
            )?
        };
        let stats = gpu.storage_from("latent statistics", &self.latent_stats)?;
        let FlowBuffers {
            latents,
            model_in,
            model_out,
            uncond_out,
            denoised,
            denoise,
        } = FlowBuffers::new(gpu, n, 2 * n)?;
        let unpack = bn_unpack(gpu, (h * w, features, w), &stats, &latents, &decode_in)?;
        let unpack_estimate = bn_unpack(gpu, (h * w, features, w), &stats, &denoised, &decode_in)?;
        let joint = self.transformer.config.joint_attention_dim;
        *slot = Some(Flux2Plans {
            width,
            height,
            transformer: None,
            caption: zeros(gpu, "caption", MAX_PROMPT_TOKENS * joint)?,
            transformer_out: zeros(gpu, "transformer output", n)?,
            activation_bytes: decoder.activation_bytes,
            decoder,
            unpack,
            unpack_estimate,
            encoder: None,
            latents,
            model_in,
            time_proj: zeros(gpu, "time embedding", self.transformer.config.time_channels)?,
            model_out,
            uncond_out,
            denoised,
            denoise,
            preview: None,
        });
        Ok(())
    }

    /// Makes sure the size's transformer plan takes a reference image's tokens or not.
    pub(super) fn transformer_for(
        &mut self,
        gpu: &Gpu,
        plans: &mut Flux2Plans,
        reference: bool,
    ) -> Result<(), Error> {
        let (h, w) = self.token_grid(plans.width, plans.height)?;
        let grid = Grid { h, w, reference };
        if plans.transformer.as_ref().is_some_and(|t| t.grid == grid) {
            return Ok(());
        }
        if let Some(old) = plans.transformer.take() {
            plans.activation_bytes = plans
                .activation_bytes
                .saturating_sub(old.plan.activation_bytes);
        }
        let io = Flux2Io {
            latent: plans.model_in.clone(),
            time_proj: plans.time_proj.clone(),
            caption: plans.caption.clone(),
            caption_rows: MAX_PROMPT_TOKENS,
            out: plans.transformer_out.clone(),
        };
        let (mut up, weights, config) = self.transformer.loader(gpu, self.dtype);
        let plan = build_transformer(Builder::new(gpu, &mut up, weights), config, &io, grid)?;
        plans.activation_bytes += plan.activation_bytes;
        plans.transformer = Some(TransformerPlan { grid, plan });
        Ok(())
    }

    /// How previews are drawn without a tiny decoder: "linear" where a map is fitted for the
    /// VAE's channels (the published 32), else "vae".
    pub fn preview_kind(&self) -> &'static str {
        match preview_maps::for_channels(self.transformer.config.latent_channels()) {
            Some(_) => "linear",
            None => "vae",
        }
    }

    /// The texture previews of the current size are drawn into (made on first use): each
    /// step's clean estimate unpacked through the tiny decoder when one is installed, else
    /// through the linear map fitted for its channels (at the latent's size), else through
    /// the statistics and the VAE decoder (exact, a decode a step).
    pub fn preview_texture(
        &mut self,
        gpu: &Gpu,
        slot: &mut Option<Flux2Plans>,
        width: u32,
        height: u32,
    ) -> Result<wgpu::Texture, Error> {
        self.plans_for(gpu, slot, width, height)?;
        let plans = slot
            .as_mut()
            .ok_or_else(|| Error::Invalid("no plans".into()))?;
        if let Some((texture, _, _)) = plans.preview.as_deref() {
            return Ok(texture.clone());
        }
        let (h, w) = self.token_grid(width, height)?;
        let channels = self.transformer.config.latent_channels();
        let features = self.transformer.config.in_channels;
        let target = |tw, th| {
            let texture = crate::models::diffusion::generate::preview_target(gpu, tw, th);
            let view = texture.create_view(&wgpu::TextureViewDescriptor::default());
            (texture, view)
        };
        let (texture, pass, feed) =
            match (self.taesd.as_mut(), preview_maps::for_channels(channels)) {
                (Some(taesd), _) => {
                    let (unpack, unpacked) =
                        unpack_estimate(gpu, &plans.denoised, features, (h, w))?;
                    let (plan, pixels) = taesd.build(gpu, &unpacked, (2 * h, 2 * w))?;
                    let (texture, view) = target(width, height);
                    let pass =
                        Preview::new(gpu, &PreviewSource::Pixels, &pixels, &view, width, height)?;
                    (texture, pass, EstimatePreview::Tiny(unpack, plan))
                }
                (None, Some(map)) => {
                    let (unpack, unpacked) =
                        unpack_estimate(gpu, &plans.denoised, features, (h, w))?;
                    let (texture, view) = target(2 * w, 2 * h);
                    let source = PreviewSource::Latent {
                        rows: map.rows,
                        bias: map.bias,
                    };
                    let pass = Preview::new(gpu, &source, &unpacked, &view, 2 * w, 2 * h)?;
                    (texture, pass, EstimatePreview::Linear(unpack))
                }
                (None, None) => {
                    let (texture, view) = target(width, height);
                    let pixels = plans.decoder.out.clone();
                    let pass =
                        Preview::new(gpu, &PreviewSource::Pixels, &pixels, &view, width, height)?;
                    (texture, pass, EstimatePreview::Vae)
                }
            };
        plans.preview = Some(Box::new((texture.clone(), pass, feed)));
        Ok(texture)
    }

    /// The reference image's packed, normalised tokens `[h·w][in_channels]` for an image
    /// `[H·W][3]` in −1..1: the VAE encoder's mean (`sample_mode="argmax"`), 2×2-packed,
    /// minus the batch-norm means over their σ.
    pub(super) fn reference_tokens(
        &mut self,
        gpu: &Gpu,
        plans: &mut Flux2Plans,
        image: &[f32],
    ) -> Result<Vec<f32>, Error> {
        if plans.encoder.is_none() {
            let pixels = u64::from(plans.width) * u64::from(plans.height) * 3;
            let image_in = Arc::new(gpu.storage("reference image", pixels * 4)?);
            let (mut up, weights, config) = self.vae.loader(gpu, self.dtype);
            let b = Builder::new(gpu, &mut up, weights);
            let encoder = build_encoder(b, config, &image_in, (plans.height, plans.width))?;
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
        let (h, w) = self.token_grid(plans.width, plans.height)?;
        let channels = self.transformer.config.latent_channels();
        let values = u64::from(4 * h * w * channels);
        let latent: Vec<f32> = gpu.read(&encoder.out.buffer, 0, values)?;
        Ok(pack_normalised(
            &latent,
            (h, w),
            channels,
            &self.latent_stats,
        ))
    }

    /// Builds the transformer's plan at the current size, which loads (and checks) every one
    /// of its weights.
    pub fn warm_transformer(
        &mut self,
        gpu: &Gpu,
        slot: &mut Option<Flux2Plans>,
    ) -> Result<(), Error> {
        let plans = slot
            .as_mut()
            .ok_or_else(|| Error::Invalid("no plans".into()))?;
        self.transformer_for(gpu, plans, false)
    }

    /// The transformer on a packed latent `[1][in_channels][h][w]` at sigma `t` with caption
    /// features `[512][joint_attention_dim]`: its velocity, `[1][in_channels][h][w]`.
    pub fn transformer_once(
        &mut self,
        gpu: &Gpu,
        slot: &mut Option<Flux2Plans>,
        latent: &[f32],
        (h, w): (u32, u32),
        t: f32,
        caption: &[f32],
    ) -> Result<Vec<f32>, Error> {
        let step = self.size_step();
        self.plans_for(gpu, slot, w * step, h * step)?;
        let plans = slot
            .as_mut()
            .ok_or_else(|| Error::Invalid("no plans".into()))?;
        let joint = self.transformer.config.joint_attention_dim as usize;
        if caption.len() != MAX_PROMPT_TOKENS as usize * joint {
            return Err(Error::Invalid(format!(
                "caption features hold {} values; [{MAX_PROMPT_TOKENS}][{joint}] are needed",
                caption.len()
            )));
        }
        self.transformer_for(gpu, plans, false)?;
        let c = self.transformer.config.in_channels as usize;
        let q = gpu.queue();
        q.write_buffer(
            &plans.model_in.buffer,
            0,
            bytemuck::cast_slice(&nchw_to_nhwc(latent, c)),
        );
        q.write_buffer(&plans.caption.buffer, 0, bytemuck::cast_slice(caption));
        self.write_time(gpu, plans, t);
        let plan = plans
            .transformer
            .as_ref()
            .ok_or_else(|| Error::Invalid("no transformer plan".into()))?;
        let mut rec = Recorder::new(gpu);
        plan.plan.plan.encode(&mut rec);
        rec.submit();
        let out: Vec<f32> = gpu.read(
            &plans.transformer_out.buffer,
            0,
            u64::from(h * w) * c as u64,
        )?;
        Ok(nhwc_to_nchw(&out, c))
    }

    /// The VAE decoder on a packed latent `[1][in_channels][h][w]` as the transformer sees
    /// it (before the batch-norm statistics): `[1][3][16h][16w]` in −1..1.
    pub fn decode_latents(
        &mut self,
        gpu: &Gpu,
        slot: &mut Option<Flux2Plans>,
        latent: &[f32],
        (h, w): (u32, u32),
    ) -> Result<Vec<f32>, Error> {
        let step = self.size_step();
        self.plans_for(gpu, slot, w * step, h * step)?;
        let plans = slot
            .as_mut()
            .ok_or_else(|| Error::Invalid("no plans".into()))?;
        let c = self.transformer.config.in_channels as usize;
        gpu.queue().write_buffer(
            &plans.latents.buffer,
            0,
            bytemuck::cast_slice(&nchw_to_nhwc(latent, c)),
        );
        let mut rec = Recorder::new(gpu);
        plans.unpack.encode(&mut rec);
        plans.decoder.plan.encode(&mut rec);
        rec.submit();
        let out: Vec<f32> = gpu.read(
            &plans.decoder.out.buffer,
            0,
            u64::from(h * w * step * step) * 3,
        )?;
        Ok(nhwc_to_nchw(&out, 3))
    }

    /// GPU time per kernel of one transformer call and one VAE decode at the plans' size.
    pub fn profile(
        &self,
        gpu: &Gpu,
        plans: &Flux2Plans,
    ) -> Result<Vec<(&'static str, Vec<crate::gpu::KernelTiming>)>, Error> {
        let transformer = plans.transformer.as_ref().map(|t| &t.plan.plan);
        crate::models::diffusion::stages::profile_transformer(gpu, transformer, &plans.decoder.plan)
    }

    /// The sinusoidal embedding of sigma `t` as the transformer takes it: the scheduler's
    /// timestep `t·1000`, divided by 1000 by the pipeline and multiplied back by the model,
    /// in f32.
    pub(super) fn write_time(&self, gpu: &Gpu, plans: &Flux2Plans, sigma: f32) {
        let timestep = (sigma * 1000.0) / 1000.0 * 1000.0;
        let channels = self.transformer.config.time_channels as usize;
        let emb = timestep_embedding(timestep, channels, true, 0.0);
        gpu.queue()
            .write_buffer(&plans.time_proj.buffer, 0, bytemuck::cast_slice(&emb));
    }
}

/// The VAE's channel-last latent `[2h·2w][c]` as packed tokens `[h·w][4c]` (feature
/// `channel·4 + dy·2 + dx`, `_patchify_latents` then `_pack_latents`), each feature less its
/// batch-norm mean over its σ (`stats`: σ then means).
pub(super) fn pack_normalised(
    latent: &[f32],
    (h, w): (u32, u32),
    c: u32,
    stats: &[f32],
) -> Vec<f32> {
    let (h, w, c) = (h as usize, w as usize, c as usize);
    let features = 4 * c;
    let mut out = vec![0.0; h * w * features];
    for ty in 0..h {
        for tx in 0..w {
            for ch in 0..c {
                for (dy, dx) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                    let j = ch * 4 + dy * 2 + dx;
                    let value = latent[((2 * ty + dy) * 2 * w + 2 * tx + dx) * c + ch];
                    out[(ty * w + tx) * features + j] = (value - stats[features + j]) / stats[j];
                }
            }
        }
    }
    out
}

/// A pass unpacking the clean estimate (`[h·w][in_channels]`, normalised) into the
/// latent `[2h·2w][latent channels]` it returns, the normalisation kept.
fn unpack_estimate(
    gpu: &Gpu,
    denoised: &StorageBuffer,
    features: u32,
    (h, w): (u32, u32),
) -> Result<(Pass, Arc<StorageBuffer>), Error> {
    let unpacked = zeros(gpu, "preview latent", h * w * features)?;
    let mut identity = vec![1.0; features as usize];
    identity.resize(2 * features as usize, 0.0);
    let stats = gpu.storage_from("identity statistics", &identity)?;
    let unpack = bn_unpack(gpu, (h * w, features, w), &stats, denoised, &unpacked)?;
    Ok((unpack, unpacked))
}

#[cfg(test)]
mod tests {
    use super::pack_normalised;

    #[test]
    fn packing_is_channel_major_within_a_patch() {
        // A 2×4 latent of 1 channel (values = pixel index) packs into 1×2 tokens of 4.
        let latent: Vec<f32> = (0..8).map(|v| v as f32).collect();
        let mut stats = vec![1.0; 4];
        stats.extend([0.0; 4]);
        let packed = pack_normalised(&latent, (1, 2), 1, &stats);
        assert_eq!(packed, [0.0, 1.0, 4.0, 5.0, 2.0, 3.0, 6.0, 7.0]);
        // Normalised: (x − mean) / σ.
        let stats = [2.0, 2.0, 2.0, 2.0, 1.0, 1.0, 1.0, 1.0];
        let packed = pack_normalised(&latent, (1, 2), 1, &stats);
        assert_eq!(packed[..2], [-0.5, 0.0]);
    }
}
