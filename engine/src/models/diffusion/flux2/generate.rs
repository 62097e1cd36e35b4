//! One FLUX.2 image: the captions, the start latent (seeded noise or the given latents, and a
//! reference image's tokens when one is given), the flow-matching loop (transformer, guidance
//! and the Euler update on the GPU, one submission per step), then the latents through the
//! batch-norm statistics and the VAE decoder.

use std::time::Instant;

use super::Flux2;
use super::plans::{EstimatePreview, Flux2Plans};
use crate::Error;
use crate::gpu::{Gpu, Recorder, StorageBuffer};
use crate::models::diffusion::flow_loop::{
    FlowSteps, check_steps, decode_to_srgb, finished, run_steps, start_noise, start_pixels,
};
use crate::models::diffusion::generate::{Generated, ImageParams, StepInfo};
use crate::models::diffusion::scheduler::linear_sigmas;

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
        let start = start_noise(params, (c, h, w))?;
        gpu.queue()
            .write_buffer(&plans.latents.buffer, 0, bytemuck::cast_slice(&start));
        if let Some(scaled) = start_pixels(params)? {
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
        check_steps(params.steps)?;
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
        let flow = FlowSteps {
            sigmas: &sigmas,
            values: h * w * self.transformer.config.in_channels,
            guidance: if captions.uncond.is_some() {
                params.guidance
            } else {
                1.0
            },
            negated_velocity: false,
        };
        let plans = &*plans;
        let this = &*self;
        let Some(steps_ms) = run_steps(
            gpu,
            &plans.denoise,
            &flow,
            start,
            |sigma| this.write_time(gpu, plans, sigma),
            |rec| record_step(rec, plans, &captions, preview),
            &mut on_step,
        )?
        else {
            return Ok(None);
        };
        let decode_start = Instant::now();
        let pixels = params.width * params.height;
        let rgb = decode_to_srgb(gpu, &plans.decoder, pixels, |rec| plans.unpack.encode(rec))?;
        let steps = params.steps;
        Ok(Some(finished(
            params,
            rgb,
            (text_ms, steps_ms, steps),
            decode_start,
            start,
        )))
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
    if preview && let Some((_, pass, feed)) = plans.preview.as_deref() {
        match feed {
            EstimatePreview::Linear(unpack) => unpack.encode(rec),
            EstimatePreview::Tiny(unpack, decoder) => {
                unpack.encode(rec);
                decoder.encode(rec);
            }
            EstimatePreview::Vae => {
                plans.unpack_estimate.encode(rec);
                plans.decoder.plan.encode(rec);
            }
        }
        pass.encode(rec);
    }
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
