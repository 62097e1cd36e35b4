//! Text conditioning: the prompt through the text encoder(s) into what the UNet reads —
//! SD 1.x/2.x's last hidden states, or SDXL's two penultimate states side by side plus the
//! pooled text and the size conditions.

use std::sync::Arc;

use super::clip::{build_projection, build_text_encoder, pooled_position};
use super::generate::{CONTEXT_TOKENS, ImageParams, SizedPlans};
use super::graph::{Builder, Plan};
use super::pipeline::{Family, Parts, TextEncoder};
use super::scheduler::timestep_embedding;
use crate::Error;
use crate::gpu::{Gpu, Recorder, StorageBuffer};

/// A text encoder's plan over a fixed number of prompt tokens.
pub struct TextPlan {
    tokens: u32,
    ids: Arc<StorageBuffer>,
    clip: super::clip::ClipPlan,
    projection: Option<(Arc<StorageBuffer>, Plan, Arc<StorageBuffer>)>,
}

/// The conditioning one UNet pass reads.
pub(super) struct Conditioning {
    context: Vec<f32>,
    added: Option<Vec<f32>>,
}

impl Parts {
    /// Token ids → `[77][hidden]` states (last or penultimate) and the pooled state.
    fn run_text_encoder(
        gpu: &Gpu,
        dtype: crate::ops::WeightDType,
        enc: &mut TextEncoder,
        prompt: &str,
        penultimate: bool,
    ) -> Result<(Vec<f32>, Option<Vec<f32>>), Error> {
        let ids = enc.tokenizer.encode_padded(prompt)?;
        let tokens = ids.len() as u32;
        let cfg = enc.net.config.clone();
        if enc.plan.as_ref().is_none_or(|p| p.tokens != tokens) {
            let ids_buf = Arc::new(gpu.storage("prompt ids", u64::from(tokens) * 4)?);
            let (mut up, weights, _) = enc.net.loader(gpu, dtype);
            let b = Builder::new(gpu, &mut up, &mut *weights);
            let clip = build_text_encoder(b, &cfg, &ids_buf, tokens, penultimate)?;
            let projection = match cfg.projection {
                Some(_) => {
                    let pooled_in = Arc::new(gpu.storage("pooled", u64::from(cfg.hidden) * 4)?);
                    let b = Builder::new(gpu, &mut up, &mut *weights);
                    let (plan, out) = build_projection(b, &cfg, &pooled_in)?;
                    Some((pooled_in, plan, out))
                }
                None => None,
            };
            enc.plan = Some(TextPlan {
                tokens,
                ids: ids_buf,
                clip,
                projection,
            });
        }
        let plan = enc
            .plan
            .as_ref()
            .ok_or_else(|| Error::Invalid("no text plan".into()))?;
        gpu.queue()
            .write_buffer(&plan.ids.buffer, 0, bytemuck::cast_slice(&ids));
        let mut rec = Recorder::new(gpu);
        plan.clip.plan.encode(&mut rec);
        rec.submit();
        let floats = u64::from(tokens * cfg.hidden);
        let last: Vec<f32> = gpu.read(&plan.clip.last.buffer, 0, floats)?;
        let states = match &plan.clip.penultimate {
            Some(p) => gpu.read(&p.buffer, 0, floats)?,
            None => last.clone(),
        };
        let pooled = match (&plan.projection, cfg.projection) {
            (Some((pooled_in, proj, out)), Some(dim)) => {
                let pos = pooled_position(&ids, cfg.eos_token_id);
                let row = &last[pos * cfg.hidden as usize..(pos + 1) * cfg.hidden as usize];
                gpu.queue()
                    .write_buffer(&pooled_in.buffer, 0, bytemuck::cast_slice(row));
                let mut rec = Recorder::new(gpu);
                proj.encode(&mut rec);
                rec.submit();
                Some(gpu.read(&out.buffer, 0, u64::from(dim))?)
            }
            _ => None,
        };
        Ok((states, pooled))
    }

    /// The UNet's conditioning for one prompt (diffusers' `encode_prompt`).
    fn condition(
        &mut self,
        gpu: &Gpu,
        prompt: &str,
        size: (u32, u32),
    ) -> Result<Conditioning, Error> {
        let dtype = self.dtype;
        match self.family {
            Family::Sd => {
                let (context, _) =
                    Self::run_text_encoder(gpu, dtype, &mut self.text, prompt, false)?;
                Ok(Conditioning {
                    context,
                    added: None,
                })
            }
            Family::Sdxl => {
                let (a, _) = Self::run_text_encoder(gpu, dtype, &mut self.text, prompt, true)?;
                let enc2 = self
                    .text_2
                    .as_mut()
                    .ok_or_else(|| Error::Invalid("SDXL needs text_encoder_2".into()))?;
                let (b, pooled) = Self::run_text_encoder(gpu, dtype, enc2, prompt, true)?;
                let (da, db) = (
                    a.len() / CONTEXT_TOKENS as usize,
                    b.len() / CONTEXT_TOKENS as usize,
                );
                let mut context = Vec::with_capacity(a.len() + b.len());
                for t in 0..CONTEXT_TOKENS as usize {
                    context.extend_from_slice(&a[t * da..(t + 1) * da]);
                    context.extend_from_slice(&b[t * db..(t + 1) * db]);
                }
                let pooled = pooled.unwrap_or_default();
                Ok(Conditioning {
                    context,
                    added: Some(self.added_conditions(&pooled, size)),
                })
            }
        }
    }

    /// SDXL's added conditions: the pooled text, then the embedded size ids
    /// (original size, crop origin, target size).
    fn added_conditions(&self, pooled: &[f32], (width, height): (u32, u32)) -> Vec<f32> {
        let dim = self.unet.config.text_time.map_or(0, |(d, _)| d) as usize;
        let cfg = &self.unet.config;
        let mut out = pooled.to_vec();
        for id in [height, width, 0, 0, height, width] {
            out.extend(timestep_embedding(
                id as f32,
                dim,
                cfg.flip_sin_to_cos,
                cfg.freq_shift,
            ));
        }
        out
    }

    fn zero_conditioning(&self) -> Conditioning {
        let ctx = (CONTEXT_TOKENS * self.unet.config.cross_attention_dim) as usize;
        Conditioning {
            context: vec![0.0; ctx],
            added: None,
        }
    }

    /// The UNet's conditioning for `prompt` at an image size: `[77][cross_attention_dim]`
    /// and, for SDXL, the added conditions (pooled text, then the embedded size ids).
    pub fn text_conditioning(
        &mut self,
        gpu: &Gpu,
        prompt: &str,
        size: (u32, u32),
    ) -> Result<(Vec<f32>, Option<Vec<f32>>), Error> {
        let c = self.condition(gpu, prompt, size)?;
        Ok((c.context, c.added))
    }

    /// Writes the prompt's (and under guidance the negative prompt's) conditioning where the
    /// step recordings copy it from.
    pub(super) fn write_conditioning(
        &mut self,
        gpu: &Gpu,
        plans: &SizedPlans,
        params: &ImageParams,
        guided: bool,
    ) -> Result<(), Error> {
        let size = (params.width, params.height);
        let cond = self.condition(gpu, &params.prompt, size)?;
        let uncond = if !guided {
            None
        } else if params.negative.is_empty() && self.force_zeros_for_empty_prompt {
            let mut z = self.zero_conditioning();
            if let Some((time_dim, input)) = self.unet.config.text_time {
                let pooled = vec![0.0; (input - 6 * time_dim) as usize];
                z.added = Some(self.added_conditions(&pooled, size));
            }
            Some(z)
        } else {
            Some(self.condition(gpu, &params.negative, size)?)
        };
        let write = |buf: &StorageBuffer, data: &[f32]| {
            gpu.queue()
                .write_buffer(&buf.buffer, 0, bytemuck::cast_slice(data));
        };
        write(&plans.context_cond, &cond.context);
        write(&plans.io.context, &cond.context);
        if let (Some(a), Some(buf), Some(io)) = (&cond.added, &plans.added_cond, &plans.io.added) {
            write(buf, a);
            write(io, a);
        }
        if let Some(u) = &uncond {
            write(&plans.context_uncond, &u.context);
            if let (Some(a), Some(buf)) = (&u.added, &plans.added_uncond) {
                write(buf, a);
            }
        }
        Ok(())
    }
}
