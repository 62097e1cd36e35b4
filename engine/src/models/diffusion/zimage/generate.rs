//! One Z-Image image: captions, the start latent (noise, or for image-to-image the encoded
//! start image noised to the first kept sigma), the flow-matching loop (transformer, guidance
//! and the Euler update on the GPU, one submission per step), then the VAE decoder.

use std::time::Instant;

use super::ZImage;
use super::plans::{Call, CaptionRows, ZImagePlans, copy_all, record_preview};
use super::transformer::padded;
use crate::Error;
use crate::gpu::{Gpu, Recorder};
use crate::models::diffusion::flow_loop::{
    FlowSteps, check_steps, decode_to_srgb, finished, run_steps, start_noise, start_pixels,
};
use crate::models::diffusion::generate::{Generated, ImageParams, StepInfo};
use crate::models::diffusion::scheduler::linear_sigmas;

/// The captions of one image on the GPU, and the order of a step's transformer calls.
struct Captions {
    cond: CaptionRows,
    uncond: Option<CaptionRows>,
    /// (plan index, conditional): under guidance the negative caption's call comes first,
    /// its output set aside.
    calls: Vec<(usize, bool)>,
}

/// The first step image-to-image runs, as diffusers' `get_timesteps` takes it:
/// `t_start = int(max(steps − min(steps·strength, steps), 0))`.
pub fn img2img_first_step(steps: u32, strength: f32) -> Result<usize, Error> {
    if !(strength > 0.0 && strength <= 1.0) {
        return Err(Error::Invalid(format!(
            "strength {strength}: it must be in (0, 1]"
        )));
    }
    let n = f64::from(steps);
    // The strength as typed (0.6, not the f32 nearest it, 0.6000000238): diffusers multiplies
    // Python floats, and a product that is a whole number must stay one.
    let strength: f64 = strength.to_string().parse().unwrap_or(f64::from(strength));
    let first = (n - (n * strength).min(n)).max(0.0) as usize;
    if first >= steps as usize {
        return Err(Error::Invalid(format!(
            "{steps} steps at strength {strength} leave none to run"
        )));
    }
    Ok(first)
}

impl ZImage {
    /// Encodes the prompt (and under guidance the negative prompt), makes sure a transformer
    /// plan exists for each caption length, and uploads the captions.
    fn captions(
        &mut self,
        gpu: &Gpu,
        plans: &mut ZImagePlans,
        params: &ImageParams,
        guided: bool,
    ) -> Result<Captions, Error> {
        let (cond, cond_tokens) = self.caption(&params.prompt)?;
        let uncond = if guided {
            Some(self.caption(&params.negative)?)
        } else {
            None
        };
        let mut lengths = vec![cond_tokens];
        lengths.extend(uncond.as_ref().map(|u| u.1));
        self.transformers_for(gpu, plans, &lengths)?;
        let find = |tokens: u32| {
            plans
                .transformers
                .iter()
                .position(|p| p.rows == padded(tokens))
                .ok_or_else(|| Error::Invalid("no transformer plan".into()))
        };
        let mut calls = Vec::new();
        if let Some((_, tokens)) = &uncond {
            calls.push((find(*tokens)?, false));
        }
        calls.push((find(cond_tokens)?, true));
        Ok(Captions {
            cond: CaptionRows::upload(gpu, "caption", &cond, cond_tokens)?,
            uncond: uncond
                .as_ref()
                .map(|(u, n)| CaptionRows::upload(gpu, "negative caption", u, *n))
                .transpose()?,
            calls,
        })
    }

    /// Writes the starting latent: the given latents or seeded noise, or for image-to-image
    /// the start image's latent noised to `sigma` (`σ·noise + (1 − σ)·x₀`, the scheduler's
    /// `scale_noise`).
    fn start_latents(
        &mut self,
        gpu: &Gpu,
        plans: &mut ZImagePlans,
        params: &ImageParams,
        sigma: f32,
    ) -> Result<(), Error> {
        let (h, w) = self.latent_shape(params.width, params.height)?;
        let c = self.transformer.config.in_channels;
        let noise = start_noise(params, (c, h, w))?;
        let start = match start_pixels(params)? {
            Some(scaled) => {
                let x0 = self.encode_image(gpu, plans, &scaled)?;
                x0.iter()
                    .zip(&noise)
                    .map(|(x, e)| sigma * e + (1.0 - sigma) * x)
                    .collect()
            }
            None => noise,
        };
        gpu.queue()
            .write_buffer(&plans.latents.buffer, 0, bytemuck::cast_slice(&start));
        Ok(())
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
        check_steps(params.steps)?;
        let first = match &params.init_image {
            Some((_, strength)) => img2img_first_step(params.steps, *strength)?,
            None => 0,
        };
        if preview {
            self.preview_texture(gpu, slot, params.width, params.height)?;
        }
        self.plans_for(gpu, slot, params.width, params.height)?;
        let plans = slot
            .as_mut()
            .ok_or_else(|| Error::Invalid("no plans".into()))?;
        // The pipeline guides whenever the scale is above zero: pos + g·(pos − neg).
        let guided = params.guidance > 0.0;
        let captions = self.captions(gpu, plans, params, guided)?;
        let text_ms = start.elapsed().as_secs_f64() * 1e3;
        let (h, w) = self.latent_shape(params.width, params.height)?;
        let patch = self.transformer.config.patch;
        let sigmas = self
            .scheduler
            .sigmas(&linear_sigmas(params.steps), (h / patch) * (w / patch))?;
        self.start_latents(gpu, plans, params, sigmas[first])?;
        let walked = &sigmas[first..];
        let flow = FlowSteps {
            sigmas: walked,
            values: h * w * self.transformer.config.in_channels,
            // The pipeline's pos + g·(pos − neg) is neg + (g + 1)·(pos − neg).
            guidance: params.guidance + 1.0,
            negated_velocity: true,
        };
        let plans = &*plans;
        let this = &*self;
        let Some(steps_ms) = run_steps(
            gpu,
            &plans.denoise,
            &flow,
            start,
            |sigma| this.write_time(gpu, plans, this.scheduler.model_time(sigma)),
            |rec| record_step(rec, plans, &captions, preview),
            &mut on_step,
        )?
        else {
            return Ok(None);
        };
        let decode_start = Instant::now();
        let pixels = params.width * params.height;
        let rgb = decode_to_srgb(gpu, &plans.decoder, pixels, |rec| {
            copy_all(rec, &plans.latents, &plans.decode_in);
        })?;
        let steps = (walked.len() - 1) as u32;
        Ok(Some(finished(
            params,
            rgb,
            (text_ms, steps_ms, steps),
            decode_start,
            start,
        )))
    }
}

/// One step: the model input, the transformer once per caption, guidance, the Euler update,
/// then the preview.
fn record_step(rec: &mut Recorder<'_>, plans: &ZImagePlans, captions: &Captions, preview: bool) {
    plans.denoise.scale.encode(rec);
    for &(index, is_cond) in &captions.calls {
        let (caption, out) = match (&captions.uncond, is_cond) {
            (Some(negative), false) => (negative, &plans.uncond_out),
            _ => (&captions.cond, &plans.model_out),
        };
        let call = Call {
            plan: &plans.transformers[index],
            caption,
            out,
        };
        call.record(rec);
    }
    if captions.uncond.is_some() {
        plans.denoise.guide.encode(rec);
    }
    plans.denoise.step.encode(rec);
    if preview {
        record_preview(rec, plans);
    }
}

#[cfg(test)]
mod tests {
    use super::img2img_first_step;

    #[test]
    fn image_to_image_starts_where_diffusers_does() {
        // diffusers: 4 steps at 0.6 run the last 3 (int(4 − 2.4) = 1); at 1.0 all of them.
        assert_eq!(img2img_first_step(4, 0.6).ok(), Some(1));
        assert_eq!(img2img_first_step(4, 1.0).ok(), Some(0));
        assert_eq!(img2img_first_step(9, 0.5).ok(), Some(4));
        // Whole products of steps and strength, as Python's floats give them.
        assert_eq!(img2img_first_step(5, 0.6).ok(), Some(2));
        assert_eq!(img2img_first_step(10, 0.8).ok(), Some(2));
        assert_eq!(img2img_first_step(50, 0.6).ok(), Some(20));
        // Any strength above zero keeps at least the last step.
        assert_eq!(img2img_first_step(4, 0.1).ok(), Some(3));
        assert!(img2img_first_step(0, 0.5).is_err(), "no step to run");
        assert!(img2img_first_step(4, 0.0).is_err());
        assert!(img2img_first_step(4, f32::NAN).is_err());
    }
}
