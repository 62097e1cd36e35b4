//! One FLUX.2 image: the captions, the start latent (seeded noise or the given latents, and a
//! reference image's tokens when one is given), the flow-matching loop (transformer, guidance
//! and the Euler update on the GPU, one submission per step), then the latents through the
//! batch-norm statistics and the VAE decoder.

use std::time::Instant;

use super::Flux2;
use super::plans::{EstimatePreview, Flux2Plans};
use crate::Error;
use crate::gpu::{Gpu, Recorder, StorageBuffer};
use crate::models::diffusion::generate::{Generated, ImageParams, StepInfo, Timings, nchw_to_nhwc};
use crate::models::diffusion::scheduler::{flow_step, gaussian_noise, linear_sigmas};
use crate::ops::DenoiseParams;

/// The most steps an image takes.
const MAX_STEPS: u32 = 1000;

/// The pipeline's `compute_empirical_mu`: the shift fitted to the image's token count and the
/// number of steps (above 4300 tokens, the token count alone).
pub fn empirical_mu(image_tokens: u32, steps: u32) -> f64 {
    let (a1, b1) = (8.738_095_24e-05, 1.898_333_33);
    let (a2, b2) = (0.000_169_27, 0.456_666_66);
    let tokens = f64::from(image_tokens);
    if image_tokens > 4300 {
        return a2 * tokens + b2;
    }
    let m_200 = a2 * tokens + b2;
    let m_10 = a1 * tokens + b1;
    let a = (m_200 - m_10) / 190.0;
    let b = m_200 - 200.0 * a;
    a * f64::from(steps) + b
}

/// The captions of one image on the GPU.
struct Captions {
    cond: StorageBuffer,
    uncond: Option<StorageBuffer>,
}

impl Flux2 {
    /// Whether the pipeline guides at `guidance`: above 1, and never the distilled weights.
    pub fn guides(&self, guidance: f32) -> bool {
        guidance > 1.0 && !self.distilled
    }

    fn captions(&mut self, gpu: &Gpu, params: &ImageParams) -> Result<Captions, Error> {
        let upload = |label: &str, features: &[f32]| -> Result<StorageBuffer, Error> {
            Ok(gpu.storage_from(label, features)?)
        };
        let (cond, _) = self.caption(&params.prompt)?;
        let uncond = if self.guides(params.guidance) {
            let (features, _) = self.caption(&params.negative)?;
            Some(upload("negative caption", &features)?)
        } else {
            None
        };
        Ok(Captions {
            cond: upload("caption", &cond)?,
            uncond,
        })
    }

    /// Writes the starting latent (the given latents, else seeded noise) and, for a start
    /// image, its reference tokens after it.
    fn start_latents(
        &mut self,
        gpu: &Gpu,
        plans: &mut Flux2Plans,
        params: &ImageParams,
    ) -> Result<(), Error> {
        let (h, w) = self.token_grid(params.width, params.height)?;
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
        let start = nchw_to_nhwc(&noise, c as usize);
        gpu.queue()
            .write_buffer(&plans.latents.buffer, 0, bytemuck::cast_slice(&start));
        if let Some((pixels, _)) = &params.init_image {
            let expected = (params.width * params.height * 3) as usize;
            if pixels.len() != expected {
                return Err(Error::Invalid(format!(
                    "the start image has {} values, {expected} expected",
                    pixels.len()
                )));
            }
            let scaled: Vec<f32> = pixels.iter().map(|v| v * 2.0 - 1.0).collect();
            let tokens = self.reference_tokens(gpu, plans, &scaled)?;
            gpu.queue().write_buffer(
                &plans.model_in.buffer,
                u64::from(n) * 4,
                bytemuck::cast_slice(&tokens),
            );
        }
        Ok(())
    }

    /// Generates one image. `on_step` hears after each step and returns false to stop.
    pub fn generate(
        &mut self,
        gpu: &Gpu,
        slot: &mut Option<Flux2Plans>,
        params: &ImageParams,
        preview: bool,
        mut on_step: impl FnMut(StepInfo) -> bool,
    ) -> Result<Option<Generated>, Error> {
        let start = Instant::now();
        if !(1..=MAX_STEPS).contains(&params.steps) {
            return Err(Error::Invalid(format!(
                "{} steps: 1 to {MAX_STEPS} are possible",
                params.steps
            )));
        }
        if preview {
            self.preview_texture(gpu, slot, params.width, params.height)?;
        }
        self.plans_for(gpu, slot, params.width, params.height)?;
        let plans = slot
            .as_mut()
            .ok_or_else(|| Error::Invalid("no plans".into()))?;
        let captions = self.captions(gpu, params)?;
        let text_ms = start.elapsed().as_secs_f64() * 1e3;
        self.transformer_for(gpu, plans, params.init_image.is_some())?;
        let (h, w) = self.token_grid(params.width, params.height)?;
        let mu = empirical_mu(h * w, params.steps);
        let sigmas = self
            .scheduler
            .sigmas_at_mu(&linear_sigmas(params.steps), mu)?;
        self.start_latents(gpu, plans, params)?;
        let n = h * w * self.transformer.config.in_channels;
        let guidance = if captions.uncond.is_some() {
            params.guidance
        } else {
            1.0
        };
        let steps_start = Instant::now();
        for (i, pair) in sigmas.windows(2).enumerate() {
            let (sigma, next) = (pair[0], pair[1]);
            self.write_time(gpu, plans, sigma);
            let s = flow_step(sigma, next, false);
            let update = DenoiseParams {
                n,
                c_in: 1.0,
                guidance,
                p: s.p,
                q: s.q,
                a: s.a,
                b: s.b,
                ..Default::default()
            };
            plans.denoise.set(gpu, &update);
            let mut rec = Recorder::in_parts(gpu);
            record_step(&mut rec, plans, &captions, preview);
            rec.submit();
            gpu.wait()?;
            let info = StepInfo {
                step: i as u32 + 1,
                steps: params.steps,
                elapsed_ms: start.elapsed().as_secs_f64() * 1e3,
            };
            if !on_step(info) {
                return Ok(None);
            }
        }
        let steps_ms = steps_start.elapsed().as_secs_f64() * 1e3;
        let vae_start = Instant::now();
        let rgb = decode(gpu, plans)?;
        Ok(Some(Generated {
            width: params.width,
            height: params.height,
            rgb,
            timings: Timings {
                text_ms,
                steps_ms,
                ms_per_step: steps_ms / f64::from(params.steps),
                vae_ms: vae_start.elapsed().as_secs_f64() * 1e3,
                total_ms: start.elapsed().as_secs_f64() * 1e3,
            },
        }))
    }
}

/// Runs the transformer on `caption` and copies its velocity into `out`.
fn record_call(
    rec: &mut Recorder<'_>,
    plans: &Flux2Plans,
    caption: &StorageBuffer,
    out: &StorageBuffer,
) {
    let Some(transformer) = &plans.transformer else {
        return;
    };
    let bytes = caption.size.min(plans.caption.size);
    rec.copy(&caption.buffer, 0, &plans.caption.buffer, 0, bytes);
    transformer.plan.plan.encode(rec);
    let bytes = plans.transformer_out.size.min(out.size);
    rec.copy(&plans.transformer_out.buffer, 0, &out.buffer, 0, bytes);
}

/// One step: the model input, the transformer per caption, guidance, the Euler update, then
/// the preview.
fn record_step(rec: &mut Recorder<'_>, plans: &Flux2Plans, captions: &Captions, preview: bool) {
    plans.denoise.scale.encode(rec);
    if let Some(negative) = &captions.uncond {
        record_call(rec, plans, negative, &plans.uncond_out);
    }
    record_call(rec, plans, &captions.cond, &plans.model_out);
    if captions.uncond.is_some() {
        plans.denoise.guide.encode(rec);
    }
    plans.denoise.step.encode(rec);
    if preview && let Some((_, pass, feed)) = &plans.preview {
        match feed {
            EstimatePreview::Linear(unpack) => unpack.encode(rec),
            EstimatePreview::Vae => {
                plans.unpack_estimate.encode(rec);
                plans.decoder.plan.encode(rec);
            }
        }
        pass.encode(rec);
    }
}

/// The final latents through the batch-norm statistics and the VAE decoder:
/// `[height][width][3]` sRGB bytes.
fn decode(gpu: &Gpu, plans: &Flux2Plans) -> Result<Vec<u8>, Error> {
    let mut rec = Recorder::in_parts(gpu);
    plans.unpack.encode(&mut rec);
    plans.decoder.plan.encode(&mut rec);
    rec.submit();
    let pixels = u64::from(plans.width * plans.height * 3);
    let image: Vec<f32> = gpu.read(&plans.decoder.out.buffer, 0, pixels)?;
    Ok(image
        .iter()
        .map(|v| ((v / 2.0 + 0.5).clamp(0.0, 1.0) * 255.0).round() as u8)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::empirical_mu;

    #[test]
    fn mu_as_the_pipeline_fits_it() {
        // diffusers 0.42 `compute_empirical_mu(4096, 4)` and `(1024, 50)`, and past 4300
        // tokens the token count alone.
        assert!((empirical_mu(4096, 4) - 2.291_179_894_115_571).abs() < 1e-12);
        assert!((empirical_mu(1024, 50) - 1.701_956_207_308_631_6).abs() < 1e-12);
        assert!((empirical_mu(8192, 4) - (0.000_169_27 * 8192.0 + 0.456_666_66)).abs() < 1e-12);
    }
}
