//! diffusers' `AutoencoderKL`: the decoder (latent → image) and the encoder (image → latent,
//! for image-to-image), as plans over channel-last tensors.

use std::sync::Arc;

use super::blocks::{Norms, resnet, vae_attention};
use super::config::VaeConfig;
use super::graph::{Act, Builder, Plan};
use crate::Error;
use crate::gpu::StorageBuffer;
use crate::ops::NormActivation;

pub struct VaePlan {
    pub plan: Plan,
    pub out: Arc<StorageBuffer>,
    pub activation_bytes: u64,
}

impl VaePlan {
    /// Runs the decoder once on a `[1][c][h][w]` latent written into `input` (the buffer the
    /// plan reads): the image `[1][3][H][W]` of `pixels` pixels, in −1..1.
    pub fn decode_once(
        &self,
        gpu: &crate::gpu::Gpu,
        input: &StorageBuffer,
        latent: &[f32],
        channels: usize,
        pixels: u32,
    ) -> Result<Vec<f32>, Error> {
        let nhwc = super::generate::nchw_to_nhwc(latent, channels);
        gpu.queue()
            .write_buffer(&input.buffer, 0, bytemuck::cast_slice(&nhwc));
        let mut rec = crate::gpu::Recorder::new(gpu);
        self.plan.encode(&mut rec);
        rec.submit();
        let out: Vec<f32> = gpu.read(&self.out.buffer, 0, u64::from(pixels) * 3)?;
        Ok(super::generate::nhwc_to_nchw(&out, 3))
    }
}

const EPS: f32 = 1e-6;

fn norms(cfg: &VaeConfig) -> Norms {
    Norms {
        groups: cfg.norm_groups,
        eps: EPS,
    }
}

/// The mid block: ResNet, attention, ResNet.
fn mid_block(b: &mut Builder<'_, '_>, x: Act, prefix: &str, cfg: &VaeConfig) -> Result<Act, Error> {
    let c = x.channels;
    let r = resnet(
        b,
        &x,
        &format!("{prefix}.mid_block.resnets.0"),
        c,
        None,
        norms(cfg),
    )?;
    b.release(x);
    let r = if cfg.mid_attention {
        let a = vae_attention(
            b,
            &r,
            &format!("{prefix}.mid_block.attentions.0"),
            norms(cfg),
        )?;
        b.release(r);
        a
    } else {
        r
    };
    let y = resnet(
        b,
        &r,
        &format!("{prefix}.mid_block.resnets.1"),
        c,
        None,
        norms(cfg),
    )?;
    b.release(r);
    Ok(y)
}

/// Latent `[h·w][latent_channels]` as the UNet sees it → image `[8h·8w][3]` in −1..1.
pub fn build_decoder(
    mut b: Builder<'_, '_>,
    cfg: &VaeConfig,
    latent: &Arc<StorageBuffer>,
    (h, w): (u32, u32),
) -> Result<VaePlan, Error> {
    let z = Builder::external(latent, h, w, cfg.latent_channels);
    let z = b.affine(&z, 1.0 / cfg.scaling_factor, cfg.shift_factor)?;
    let z = if cfg.post_quant_conv {
        let y = b.conv(
            &z,
            "post_quant_conv",
            cfg.latent_channels,
            1,
            1,
            0,
            false,
            None,
        )?;
        b.release(z);
        y
    } else {
        z
    };
    let n = cfg.channels.len();
    let top = cfg.channels[n - 1];
    let x = b.conv(&z, "decoder.conv_in", top, 3, 1, 1, false, None)?;
    b.release(z);
    let mut x = mid_block(&mut b, x, "decoder", cfg)?;
    for ui in 0..n {
        let c = cfg.channels[n - 1 - ui];
        for j in 0..=cfg.layers_per_block {
            let name = format!("decoder.up_blocks.{ui}.resnets.{j}");
            let y = resnet(&mut b, &x, &name, c, None, norms(cfg))?;
            b.release(x);
            x = y;
        }
        if ui + 1 < n {
            let name = format!("decoder.up_blocks.{ui}.upsamplers.0.conv");
            let y = b.conv(&x, &name, c, 3, 1, 1, true, None)?;
            b.release(x);
            x = y;
        }
    }
    let g = b.group_norm(
        &x,
        "decoder.conv_norm_out",
        cfg.norm_groups,
        EPS,
        NormActivation::Silu,
    )?;
    b.release(x);
    let out = b.conv(
        &g,
        "decoder.conv_out",
        cfg.out_channels,
        3,
        1,
        1,
        false,
        None,
    )?;
    b.release(g);
    let out_buf = out.buf.clone();
    let (plan, activation_bytes) = b.finish();
    Ok(VaePlan {
        plan,
        out: out_buf,
        activation_bytes,
    })
}

/// Image `[H·W][3]` in −1..1 → the latent distribution's mean, scaled as the UNet sees it
/// (`[H/8·W/8][latent_channels]`).
pub fn build_encoder(
    mut b: Builder<'_, '_>,
    cfg: &VaeConfig,
    image: &Arc<StorageBuffer>,
    (h, w): (u32, u32),
) -> Result<VaePlan, Error> {
    let img = Builder::external(image, h, w, cfg.in_channels);
    let n = cfg.channels.len();
    let mut x = b.conv(
        &img,
        "encoder.conv_in",
        cfg.channels[0],
        3,
        1,
        1,
        false,
        None,
    )?;
    for (i, &c) in cfg.channels.iter().enumerate() {
        for j in 0..cfg.layers_per_block {
            let name = format!("encoder.down_blocks.{i}.resnets.{j}");
            let y = resnet(&mut b, &x, &name, c, None, norms(cfg))?;
            b.release(x);
            x = y;
        }
        if i + 1 < n {
            // diffusers pads right and bottom by one, then convolves with stride 2.
            let name = format!("encoder.down_blocks.{i}.downsamplers.0.conv");
            let y = b.conv_down_asymmetric(&x, &name, c)?;
            b.release(x);
            x = y;
        }
    }
    let x = mid_block(&mut b, x, "encoder", cfg)?;
    let g = b.group_norm(
        &x,
        "encoder.conv_norm_out",
        cfg.norm_groups,
        EPS,
        NormActivation::Silu,
    )?;
    b.release(x);
    let moments = b.conv(
        &g,
        "encoder.conv_out",
        2 * cfg.latent_channels,
        3,
        1,
        1,
        false,
        None,
    )?;
    b.release(g);
    let moments = if cfg.quant_conv {
        let y = b.conv(
            &moments,
            "quant_conv",
            2 * cfg.latent_channels,
            1,
            1,
            0,
            false,
            None,
        )?;
        b.release(moments);
        y
    } else {
        moments
    };
    let mean = b.slice_channels(&moments, 0, cfg.latent_channels)?;
    b.release(moments);
    let out = b.affine(
        &mean,
        cfg.scaling_factor,
        -cfg.shift_factor * cfg.scaling_factor,
    )?;
    b.release(mean);
    let out_buf = out.buf.clone();
    let (plan, activation_bytes) = b.finish();
    Ok(VaePlan {
        plan,
        out: out_buf,
        activation_bytes,
    })
}
