//! Single stages of a pipeline in diffusers' layouts — one UNet call, the VAE either way, a
//! per-kernel profile — for parity checks and tools.

use super::generate::{MAX_PROFILED_DISPATCHES, SizedPlans, nchw_to_nhwc, nhwc_to_nchw};
use super::graph::Plan;
use super::pipeline::Parts;
use super::scheduler::timestep_embedding;
use crate::Error;
use crate::gpu::{Gpu, Recorder};

/// GPU time per kernel of one diffusion-transformer call (the plan last built, if any) and one
/// VAE decode.
pub(super) fn profile_transformer(
    gpu: &Gpu,
    transformer: Option<&Plan>,
    decoder: &Plan,
) -> Result<Vec<(&'static str, Vec<crate::gpu::KernelTiming>)>, Error> {
    let transformer = transformer
        .ok_or_else(|| Error::Invalid("no transformer plan: generate an image first".into()))?;
    profile_plans(
        gpu,
        &[("transformer", transformer), ("vae decode", decoder)],
    )
}

/// GPU time per kernel of one run of each plan (timestamp queries).
pub(super) fn profile_plans(
    gpu: &Gpu,
    plans: &[(&'static str, &Plan)],
) -> Result<Vec<(&'static str, Vec<crate::gpu::KernelTiming>)>, Error> {
    if !gpu.caps().timestamps {
        return Err(Error::Invalid("this GPU has no timestamp queries".into()));
    }
    let mut out = Vec::new();
    for &(what, plan) in plans {
        // Query sets hold at most 4096 timestamps: a larger network's later dispatches go
        // untimed.
        let dispatches = (plan.len() as u32 * 4 + 16).min(MAX_PROFILED_DISPATCHES);
        let mut profiler = crate::gpu::Profiler::new(gpu, dispatches);
        let mut rec = Recorder::with_profiler(gpu, Some(&mut profiler));
        plan.encode(&mut rec);
        rec.submit();
        gpu.wait()?;
        out.push((what, profiler.read(gpu)?));
    }
    Ok(out)
}

impl Parts {
    /// GPU time per kernel of one UNet call and one VAE decode at the plans' size.
    pub fn profile(
        &self,
        gpu: &Gpu,
        plans: &SizedPlans,
    ) -> Result<Vec<(&'static str, Vec<crate::gpu::KernelTiming>)>, Error> {
        profile_plans(
            gpu,
            &[
                ("unet", &plans.unet.plan),
                ("vae decode", &plans.decoder.plan),
            ],
        )
    }

    /// One UNet call on a `[1][c][h][w]` latent at timestep `t`.
    #[allow(clippy::too_many_arguments)]
    pub fn unet_once(
        &mut self,
        gpu: &Gpu,
        slot: &mut Option<SizedPlans>,
        latent: &[f32],
        (h, w): (u32, u32),
        t: f32,
        context: &[f32],
        added: Option<&[f32]>,
    ) -> Result<Vec<f32>, Error> {
        let f = self.downscale();
        self.plans_for(gpu, slot, w * f, h * f)?;
        let plans = slot
            .as_mut()
            .ok_or_else(|| Error::Invalid("no plans".into()))?;
        let lc = self.unet.config.in_channels as usize;
        let q = gpu.queue();
        q.write_buffer(
            &plans.io.sample.buffer,
            0,
            bytemuck::cast_slice(&nchw_to_nhwc(latent, lc)),
        );
        let cfg = &self.unet.config;
        let emb = timestep_embedding(
            t,
            cfg.levels[0].channels as usize,
            cfg.flip_sin_to_cos,
            cfg.freq_shift,
        );
        q.write_buffer(&plans.io.time_proj.buffer, 0, bytemuck::cast_slice(&emb));
        q.write_buffer(&plans.io.context.buffer, 0, bytemuck::cast_slice(context));
        if let (Some(a), Some(buf)) = (added, &plans.io.added) {
            q.write_buffer(&buf.buffer, 0, bytemuck::cast_slice(a));
        }
        let mut rec = Recorder::new(gpu);
        plans.unet.plan.encode(&mut rec);
        rec.submit();
        let n = u64::from(h * w * cfg.out_channels);
        let out: Vec<f32> = gpu.read(&plans.unet.out.buffer, 0, n)?;
        Ok(nhwc_to_nchw(&out, cfg.out_channels as usize))
    }

    /// The VAE decoder on a `[1][c][h][w]` latent (as the UNet sees it): `[1][3][8h][8w]`
    /// in −1..1.
    pub fn decode_latents(
        &mut self,
        gpu: &Gpu,
        slot: &mut Option<SizedPlans>,
        latent: &[f32],
        (h, w): (u32, u32),
    ) -> Result<Vec<f32>, Error> {
        let f = self.downscale();
        self.plans_for(gpu, slot, w * f, h * f)?;
        let plans = slot
            .as_mut()
            .ok_or_else(|| Error::Invalid("no plans".into()))?;
        let lc = self.unet.config.in_channels as usize;
        let decoder = &plans.decoder;
        decoder.decode_once(gpu, &plans.latents, latent, lc, h * w * f * f)
    }

    /// The VAE encoder's latent mean, scaled as the UNet sees it, for a `[1][3][H][W]` image
    /// in −1..1.
    pub fn encode_image(
        &mut self,
        gpu: &Gpu,
        slot: &mut Option<SizedPlans>,
        image: &[f32],
        (height, width): (u32, u32),
    ) -> Result<Vec<f32>, Error> {
        self.plans_for(gpu, slot, width, height)?;
        let plans = slot
            .as_mut()
            .ok_or_else(|| Error::Invalid("no plans".into()))?;
        gpu.queue().write_buffer(
            &plans.image_in.buffer,
            0,
            bytemuck::cast_slice(&nchw_to_nhwc(image, 3)),
        );
        let enc = self.encoder_plan(gpu, plans)?;
        let mut rec = Recorder::new(gpu);
        enc.plan.encode(&mut rec);
        rec.submit();
        let f = self.downscale();
        let lc = self.vae.config.latent_channels;
        let out: Vec<f32> =
            gpu.read(&enc.out.buffer, 0, u64::from(height / f * (width / f) * lc))?;
        Ok(nhwc_to_nchw(&out, lc as usize))
    }
}
