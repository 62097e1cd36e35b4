//! TAESD (diffusers' `AutoencoderTiny` decoder): a small convolutional decoder that turns the
//! denoising estimate into a full-size preview in a few milliseconds, close to what the real
//! VAE will draw. Used for live previews when installed: `madebyollin/taesd` and `taesdxl`
//! (diffusers folders), `taef1` (FLUX.1's latents, which Z-Image shares) and `taef2` (FLUX.2's,
//! published as one `taef2.safetensors` without a `config.json`, whose first-level blocks add
//! a pooled GroupNorm branch).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use super::graph::{Act, Activation, Builder, Plan, WeightCache};
use crate::Error;
use crate::gpu::{Gpu, StorageBuffer};
use crate::load::{LoadError, SafeTensors, read_json};
use crate::models::weights::{Uploader, WeightSource};
use crate::ops::{NormActivation, WeightDType};

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

    /// The shape read from the decoder's tensors, for files published without a
    /// `config.json`: the first convolution gives the latent channels, then each level is a
    /// run of blocks (`.conv.0.weight`) ended by an upsampler and a convolution, the last by
    /// the convolution to pixels.
    pub fn from_tensors(files: &SafeTensors, file: &Path) -> Result<Self, Error> {
        let shape = |i: usize, suffix: &str| -> Option<Vec<usize>> {
            let name = format!("decoder.layers.{i}.{suffix}");
            files.get(&name).ok().map(|t| t.shape.to_vec())
        };
        let bad = |why: String| {
            Error::Invalid(format!(
                "{}: not a tiny autoencoder's decoder ({why})",
                file.display()
            ))
        };
        let first = shape(0, "weight").ok_or_else(|| bad("no decoder.layers.0.weight".into()))?;
        let [_, latent, 3, 3] = first[..] else {
            return Err(bad(format!("decoder.layers.0.weight is {first:?}")));
        };
        let (mut channels, mut blocks) = (Vec::new(), Vec::new());
        // Layer 1 is the activation after the first convolution.
        let mut i = 2;
        loop {
            let mut n = 0;
            let mut width = None;
            while let Some(conv) = shape(i, "conv.4.weight") {
                width = conv.first().copied();
                n += 1;
                i += 1;
            }
            let width = width.ok_or_else(|| bad(format!("no blocks at decoder.layers.{i}")))?;
            channels.push(width as u32);
            blocks.push(n);
            if let Some(out) = shape(i, "weight") {
                return Ok(Self {
                    latent_channels: latent as u32,
                    out_channels: out[0] as u32,
                    channels,
                    blocks,
                });
            }
            // The upsampler has no weights; its convolution follows.
            if shape(i + 1, "weight").is_none() || channels.len() > 8 {
                return Err(bad(format!("no convolution at decoder.layers.{}", i + 1)));
            }
            i += 2;
        }
    }

    /// How many times the latent side is doubled.
    pub fn upscale(&self) -> u32 {
        1 << (self.channels.len() - 1)
    }
}

/// The decoder's weights in `dir`: diffusers' `diffusion_pytorch_model.safetensors`, else the
/// folder's one `.safetensors` file (`taef2.safetensors`); `dir` may also be that file.
fn weights_file(dir: &Path) -> Result<PathBuf, Error> {
    if dir.is_file() {
        return Ok(dir.to_owned());
    }
    let diffusers = dir.join("diffusion_pytorch_model.safetensors");
    if diffusers.is_file() {
        return Ok(diffusers);
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::Invalid(format!("{}: {e}", dir.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    found.sort();
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(LoadError::Missing { path: diffusers }.into()),
        _ => Err(Error::Invalid(format!(
            "{}: several .safetensors files and no diffusion_pytorch_model.safetensors",
            dir.display()
        ))),
    }
}

/// A loaded TAESD decoder.
pub struct Taesd {
    pub config: TaesdConfig,
    files: SafeTensors,
    weights: WeightCache,
}

impl Taesd {
    /// The decoder in `dir` (a diffusers folder, or a folder or file of published weights
    /// whose shape is read from the tensors).
    pub fn open(dir: &Path) -> Result<Self, Error> {
        let file = weights_file(dir)?;
        let files = SafeTensors::open_files(std::slice::from_ref(&file))?;
        let config_path = if dir.is_dir() {
            Some(dir.join("config.json"))
        } else {
            None
        };
        let config = match config_path.filter(|p| p.is_file()) {
            Some(path) => TaesdConfig::from_json(&read_json(&path)?)?,
            None => TaesdConfig::from_tensors(&files, &file)?,
        };
        Ok(Self {
            config,
            files,
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

/// TAEF2's pooled branch: a GroupNorm of four groups (torch's default eps) over a 1×1
/// widening to four times the channels.
const POOL_GROUPS: u32 = 4;
const POOL_EPS: f32 = 1e-5;

/// `AutoencoderTinyBlock`: relu(conv(relu(conv(relu(conv(x))))) + x), where a block with a
/// pooled branch (`.pool`) first adds conv(relu(GroupNorm(conv(x)))) to x.
fn tiny_block(b: &mut Builder<'_, '_>, x: &Act, name: &str, c: u32) -> Result<Act, Error> {
    let pooled = pool_branch(b, x, name, c)?;
    let x = pooled.as_ref().unwrap_or(x);
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
    if let Some(p) = pooled {
        b.release(p);
    }
    Ok(y)
}

/// x + conv(relu(GroupNorm(conv(x)))) for a block with a pooled branch, else None.
fn pool_branch(b: &mut Builder<'_, '_>, x: &Act, name: &str, c: u32) -> Result<Option<Act>, Error> {
    let widen = format!("{name}.pool.0");
    if !b.has(&format!("{widen}.weight")) {
        return Ok(None);
    }
    let one = (1, 1, 0);
    let wide = b.conv_with_bias(x, &widen, 4 * c, one, false, None, None, Activation::None)?;
    let norm = format!("{name}.pool.1");
    let n = b.group_norm(&wide, &norm, POOL_GROUPS, POOL_EPS, NormActivation::Relu)?;
    b.release(wide);
    let skip = b.copy(x)?;
    let narrow = format!("{name}.pool.3");
    let y = b.conv_with_bias(
        &n,
        &narrow,
        c,
        one,
        false,
        None,
        Some(skip),
        Activation::None,
    )?;
    b.release(n);
    Ok(Some(y))
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
