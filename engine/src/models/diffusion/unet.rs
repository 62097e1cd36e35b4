//! diffusers' `UNet2DConditionModel` (SD 1.x/2.x, SDXL) as a plan over channel-last latents.

use std::sync::Arc;

use super::blocks::{Norms, TransformerShape, embedding_mlp, resnet, spatial_transformer};
use super::config::UnetConfig;
use super::graph::{Act, Builder, Plan};
use crate::Error;
use crate::gpu::StorageBuffer;
use crate::ops::NormActivation;

/// The inputs a UNet plan reads each call (written by the denoising loop) and where its
/// output lands.
pub struct UnetIo {
    /// `[h·w][in_channels]`: the scaled latent.
    pub sample: Arc<StorageBuffer>,
    /// `[block_out_channels[0]]`: the sinusoidal embedding of the timestep.
    pub time_proj: Arc<StorageBuffer>,
    /// `[tokens][cross_attention_dim]`: the text conditioning.
    pub context: Arc<StorageBuffer>,
    pub context_tokens: u32,
    /// SDXL: `[6·time_embed + pooled]`, the embedded time ids after the pooled text.
    pub added: Option<Arc<StorageBuffer>>,
}

pub struct UnetPlan {
    pub plan: Plan,
    /// `[h·w][out_channels]`.
    pub out: Arc<StorageBuffer>,
    pub activation_bytes: u64,
}

/// Records the UNet for an `h`×`w` latent.
pub fn build_unet(
    mut b: Builder<'_, '_>,
    cfg: &UnetConfig,
    io: &UnetIo,
    (h, w): (u32, u32),
) -> Result<UnetPlan, Error> {
    let n = cfg.levels.len();
    if !h.is_multiple_of(1 << (n - 1)) || !w.is_multiple_of(1 << (n - 1)) {
        return Err(Error::Invalid(format!(
            "a {w}×{h} latent does not halve {} times",
            n - 1
        )));
    }
    let norms = Norms {
        groups: cfg.norm_groups,
        eps: cfg.norm_eps,
    };
    let ted = cfg.time_embed_dim();
    let c0 = cfg.levels[0].channels;
    let time_proj = Builder::external(&io.time_proj, 1, 1, c0);
    let mut temb = embedding_mlp(&mut b, &time_proj, "time_embedding", ted, None)?;
    if let (Some((_, input)), Some(added)) = (cfg.text_time, &io.added) {
        let added = Builder::external(added, 1, 1, input);
        temb = embedding_mlp(&mut b, &added, "add_embedding", ted, Some(temb))?;
    }
    let temb_act = b.silu(&temb)?;
    b.release(temb);
    let temb = Some(&temb_act);
    let context = Builder::external(&io.context, 1, io.context_tokens, cfg.cross_attention_dim);
    let sample = Builder::external(&io.sample, h, w, cfg.in_channels);

    let mut skips = vec![b.conv(&sample, "conv_in", c0, 3, 1, 1, false, None)?];
    for (i, level) in cfg.levels.iter().enumerate() {
        for j in 0..cfg.layers_per_block {
            let x = skips
                .last()
                .ok_or_else(|| Error::Invalid("empty UNet".into()))?;
            let name = format!("down_blocks.{i}.resnets.{j}");
            let mut y = resnet(&mut b, x, &name, level.channels, temb, norms)?;
            if level.depth > 0 {
                let name = format!("down_blocks.{i}.attentions.{j}");
                y = transformer(&mut b, y, &name, level.heads, level.depth, &context, cfg)?;
            }
            skips.push(y);
        }
        if i + 1 < n {
            let x = skips
                .last()
                .ok_or_else(|| Error::Invalid("empty UNet".into()))?;
            let name = format!("down_blocks.{i}.downsamplers.0.conv");
            let y = b.conv(x, &name, level.channels, 3, 2, 1, false, None)?;
            skips.push(y);
        }
    }

    let last = &cfg.levels[n - 1];
    let x = skips
        .last()
        .ok_or_else(|| Error::Invalid("empty UNet".into()))?;
    let m = resnet(&mut b, x, "mid_block.resnets.0", last.channels, temb, norms)?;
    let mid_depth = cfg.mid_depth;
    let m = transformer(
        &mut b,
        m,
        "mid_block.attentions.0",
        last.heads,
        mid_depth,
        &context,
        cfg,
    )?;
    let mut cur = resnet(
        &mut b,
        &m,
        "mid_block.resnets.1",
        last.channels,
        temb,
        norms,
    )?;
    b.release(m);

    for (ui, depth) in cfg.up_depths.iter().enumerate() {
        let level = &cfg.levels[n - 1 - ui];
        for j in 0..=cfg.layers_per_block {
            let skip = skips
                .pop()
                .ok_or_else(|| Error::Invalid("UNet skip connections ran out".into()))?;
            let cat = b.concat(&cur, &skip)?;
            b.release(cur);
            b.release(skip);
            let name = format!("up_blocks.{ui}.resnets.{j}");
            let mut y = resnet(&mut b, &cat, &name, level.channels, temb, norms)?;
            b.release(cat);
            if *depth > 0 {
                let name = format!("up_blocks.{ui}.attentions.{j}");
                y = transformer(&mut b, y, &name, level.heads, *depth, &context, cfg)?;
            }
            cur = y;
        }
        if ui + 1 < n {
            let name = format!("up_blocks.{ui}.upsamplers.0.conv");
            let y = b.conv(&cur, &name, level.channels, 3, 1, 1, true, None)?;
            b.release(cur);
            cur = y;
        }
    }
    b.release(temb_act);
    let g = b.group_norm(
        &cur,
        "conv_norm_out",
        cfg.norm_groups,
        cfg.norm_eps,
        NormActivation::Silu,
    )?;
    b.release(cur);
    let out = b.conv(&g, "conv_out", cfg.out_channels, 3, 1, 1, false, None)?;
    b.release(g);
    let out_buf = out.buf.clone();
    let (plan, activation_bytes) = b.finish();
    Ok(UnetPlan {
        plan,
        out: out_buf,
        activation_bytes,
    })
}

fn transformer(
    b: &mut Builder<'_, '_>,
    x: Act,
    name: &str,
    heads: u32,
    depth: u32,
    context: &Act,
    cfg: &UnetConfig,
) -> Result<Act, Error> {
    let shape = TransformerShape {
        heads,
        depth,
        linear_projection: cfg.linear_projection,
        groups: cfg.norm_groups,
    };
    spatial_transformer(b, x, name, context, shape)
}
