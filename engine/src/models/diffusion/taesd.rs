//! TAESD (diffusers' `AutoencoderTiny` decoder): a small convolutional decoder that turns the
//! denoising estimate into a full-size preview in a few milliseconds, close to what the real
//! VAE will draw. Used for live previews when installed (`madebyollin/taesd`, `taesdxl`).

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

use super::graph::{Activation, Builder, Plan, WeightCache};
use crate::Error;
use crate::gpu::{Gpu, StorageBuffer};
use crate::load::{LoadError, SafeTensors, read_json};
use crate::models::weights::{Uploader, WeightSource};
use crate::ops::WeightDType;

/// The decoder's shape from its `config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct TaesdConfig {
    pub latent_channels: u32,
    pub out_channels: u32,
    pub channels: Vec<u32>,
    pub blocks: Vec<u32>,
}

impl TaesdConfig {
    pub fn from_json(v: &Value) -> Result<Self, Error> {
        let list = |key: &str, default: &[u32]| -> Vec<u32> {
            v.get(key)
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_u64().map(|n| n as u32))
                        .collect()
                })
                .unwrap_or_else(|| default.to_vec())
        };
        let channels = list("decoder_block_out_channels", &[64, 64, 64, 64]);
        let blocks = list("num_decoder_blocks", &[3, 3, 3, 1]);
        let act = v.get("act_fn").and_then(Value::as_str).unwrap_or("relu");
        if channels.is_empty() || channels.len() != blocks.len() || act != "relu" {
            return Err(Error::Invalid(format!(
                "TAESD config: {} channel levels, {} block counts, activation {act} (relu expected)",
                channels.len(),
                blocks.len()
            )));
        }
        let count =
            |key: &str, default: u64| v.get(key).and_then(Value::as_u64).unwrap_or(default) as u32;
        Ok(Self {
            latent_channels: count("latent_channels", 4),
            out_channels: count("out_channels", 3),
            channels,
            blocks,
        })
    }

    /// How many times the latent side is doubled.
    pub fn upscale(&self) -> u32 {
        1 << (self.channels.len() - 1)
    }
}

/// A loaded TAESD decoder.
pub struct Taesd {
    pub config: TaesdConfig,
    files: SafeTensors,
    weights: WeightCache,
}

impl Taesd {
    pub fn open(dir: &Path) -> Result<Self, Error> {
        let config = TaesdConfig::from_json(&read_json(&dir.join("config.json"))?)?;
        let file = dir.join("diffusion_pytorch_model.safetensors");
        if !file.is_file() {
            return Err(LoadError::Missing { path: file }.into());
        }
        Ok(Self {
            config,
            files: SafeTensors::open_files(&[file])?,
            weights: WeightCache::default(),
        })
    }

    /// Records the decoder from `latent` (`[h·w][latent_channels]`, as the UNet sees it) to
    /// pixels `[h·f·w·f][3]` in −1..1.
    pub fn build(
        &mut self,
        gpu: &Gpu,
        latent: &Arc<StorageBuffer>,
        (h, w): (u32, u32),
    ) -> Result<(Plan, Arc<StorageBuffer>), Error> {
        let mut up = Uploader::new(gpu, WeightSource::Files(&self.files), WeightDType::F16);
        let mut b = Builder::new(gpu, &mut up, &mut self.weights);
        let cfg = &self.config;
        let z = Builder::external(latent, h, w, cfg.latent_channels);
        // tanh(z/3)·3 keeps outliers of a noisy estimate in the decoder's range.
        let z = b.tanh_clamp(&z, 3.0)?;
        // diffusers numbers the decoder's layers in one sequence, activations and upsamplers
        // included.
        let mut index = 0usize;
        let mut layer = || {
            index += 1;
            format!("decoder.layers.{}", index - 1)
        };
        let first = layer();
        let bias = b_bias(&mut b, &first, cfg.channels[0])?;
        let mut x = b.conv_with_bias(
            &z,
            &first,
            cfg.channels[0],
            (3, 1, 1),
            false,
            bias,
            None,
            Activation::Relu,
        )?;
        b.release(z);
        let _activation = layer();
        let levels = cfg.channels.len();
        for (i, (&c, &n)) in cfg.channels.iter().zip(&cfg.blocks).enumerate() {
            for _ in 0..n {
                let name = layer();
                let y = tiny_block(&mut b, &x, &name, c)?;
                b.release(x);
                x = y;
            }
            let last = i + 1 == levels;
            if !last {
                let _upsample = layer();
            }
            let name = layer();
            let out = if last { cfg.out_channels } else { c };
            let y = b.conv(&x, &name, out, 3, 1, 1, !last, None)?;
            b.release(x);
            x = y;
        }
        // The decoder's output is 0..1; previews take −1..1.
        let y = b.affine(&x, 2.0, -1.0)?;
        b.release(x);
        let out = y.buf.clone();
        let (plan, _) = b.finish();
        Ok((plan, out))
    }
}

fn b_bias(
    b: &mut Builder<'_, '_>,
    layer: &str,
    len: u32,
) -> Result<Option<Arc<StorageBuffer>>, Error> {
    Ok(Some(b.vector(&format!("{layer}.bias"), len, None)?))
}

/// `AutoencoderTinyBlock`: relu(conv(relu(conv(relu(conv(x))))) + x).
fn tiny_block(
    b: &mut Builder<'_, '_>,
    x: &super::graph::Act,
    name: &str,
    c: u32,
) -> Result<super::graph::Act, Error> {
    let mut h = None;
    for k in [0, 2] {
        let conv = format!("{name}.conv.{k}");
        let bias = b_bias(b, &conv, c)?;
        let input = h.as_ref().unwrap_or(x);
        let y = b.conv_with_bias(
            input,
            &conv,
            c,
            (3, 1, 1),
            false,
            bias,
            None,
            Activation::Relu,
        )?;
        if let Some(old) = h.replace(y) {
            b.release(old);
        }
    }
    let h = h.ok_or_else(|| Error::Invalid("empty TAESD block".into()))?;
    let skip = b.copy(x)?;
    let conv = format!("{name}.conv.4");
    let bias = b_bias(b, &conv, c)?;
    let y = b.conv_with_bias(
        &h,
        &conv,
        c,
        (3, 1, 1),
        false,
        bias,
        Some(skip),
        Activation::Relu,
    )?;
    b.release(h);
    Ok(y)
}

impl Taesd {
    /// Decodes a `[1][c][h][w]` latent into `[1][3][h·f][w·f]` in −1..1 (parity checks and
    /// tools; previews run the plan on the GPU buffers directly).
    pub fn decode(
        &mut self,
        gpu: &Gpu,
        latent: &[f32],
        (h, w): (u32, u32),
    ) -> Result<Vec<f32>, Error> {
        let c = self.config.latent_channels as usize;
        let input = Arc::new(gpu.storage_from("taesd latent", &super::nchw_to_nhwc(latent, c))?);
        let (plan, out) = self.build(gpu, &input, (h, w))?;
        let mut rec = crate::gpu::Recorder::new(gpu);
        plan.encode(&mut rec);
        rec.submit();
        let f = self.config.upscale();
        let pixels: Vec<f32> = gpu.read(&out.buffer, 0, u64::from(h * f * w * f * 3))?;
        Ok(super::nhwc_to_nchw(&pixels, 3))
    }
}
