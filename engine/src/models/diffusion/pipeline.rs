//! Loading a Stable Diffusion pipeline — a diffusers folder or a single-file checkpoint — into
//! networks whose weights stay on the GPU between images.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::clip_tokenizer::ClipTokenizer;
use super::config::{ClipConfig, UnetConfig, VaeConfig};
use super::graph::WeightCache;
use super::scheduler::SchedulerConfig;
use super::single_file::{Family as FileFamily, open_single_file};
use crate::Error;
use crate::gpu::Gpu;
use crate::load::{LoadError, SafeTensors, read_json};
use crate::models::weights::{Uploader, WeightSource};
use crate::ops::WeightDType;

/// Which pipeline the weights belong to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// SD 1.x, SD 2.x, SD-Turbo: one text encoder.
    Sd,
    /// SDXL, SDXL-Turbo: two text encoders, pooled text and size conditioning.
    Sdxl,
}

/// One network: its config, where its weights come from, and those already on the GPU.
pub struct Network<C> {
    pub config: C,
    /// None: random weights (benchmarks at real shapes).
    pub files: Option<SafeTensors>,
    pub weights: WeightCache,
    pub seed: u32,
    /// Block-quantize the linear layers' matrices while loading (rows that are not whole
    /// blocks stay dense).
    pub quantize: Option<crate::load::GgmlType>,
}

impl<C> Network<C> {
    /// The weight loader, the cache it fills and the config, borrowed together.
    pub fn loader<'a>(
        &'a mut self,
        gpu: &'a Gpu,
        dtype: WeightDType,
    ) -> (Uploader<'a>, &'a mut WeightCache, &'a C) {
        let source = match &self.files {
            Some(st) => WeightSource::Files(st),
            None => WeightSource::Random { seed: self.seed },
        };
        let mut up = Uploader::new(gpu, source, dtype);
        up.quantize = self.quantize;
        (up, &mut self.weights, &self.config)
    }
}

pub struct TextEncoder {
    pub tokenizer: ClipTokenizer,
    pub net: Network<ClipConfig>,
    /// The encoder's plan, built on first use (prompts are always padded to one length).
    pub plan: Option<super::conditioning::TextPlan>,
}

/// A loaded pipeline's parts (its plans are built per image size, see `generate`).
pub struct Parts {
    pub family: Family,
    pub text: TextEncoder,
    pub text_2: Option<TextEncoder>,
    pub unet: Network<UnetConfig>,
    pub vae: Network<VaeConfig>,
    pub scheduler: SchedulerConfig,
    /// SDXL: an empty negative prompt conditions on zeros rather than on encoded "".
    pub force_zeros_for_empty_prompt: bool,
    pub dtype: WeightDType,
    pub name: String,
    /// Full-size live previews, when a TAESD decoder is installed.
    pub taesd: Option<super::taesd::Taesd>,
}

fn invalid(path: &Path, message: impl std::fmt::Display) -> Error {
    LoadError::Config {
        path: path.to_owned(),
        message: message.to_string(),
    }
    .into()
}

/// The weight files of one component folder: the `fp16` variant when present (half the
/// bytes to read), else the full-precision files; sharded through an index either way.
fn component_files(dir: &Path, stem: &str) -> Result<Vec<PathBuf>, Error> {
    for variant in [format!("{stem}.fp16"), stem.to_owned()] {
        let index = dir.join(format!("{variant}.safetensors.index.json"));
        if index.is_file() {
            let json = read_json(&index)?;
            let map = json
                .get("weight_map")
                .and_then(Value::as_object)
                .ok_or_else(|| invalid(&index, "no weight_map object"))?;
            let mut names: Vec<&str> = map.values().filter_map(Value::as_str).collect();
            names.sort_unstable();
            names.dedup();
            return Ok(names.into_iter().map(|n| dir.join(n)).collect());
        }
        let single = dir.join(format!("{variant}.safetensors"));
        if single.is_file() {
            return Ok(vec![single]);
        }
    }
    Err(LoadError::Missing {
        path: dir.join(format!("{stem}.safetensors")),
    }
    .into())
}

pub(super) fn open_component(dir: &Path, stem: &str) -> Result<SafeTensors, Error> {
    Ok(SafeTensors::open_files(&component_files(dir, stem)?)?)
}

fn text_encoder(
    root: &Path,
    which: &str,
    tokenizer: &str,
    random: bool,
) -> Result<TextEncoder, Error> {
    let dir = root.join(which);
    let config = ClipConfig::from_json(&read_json(&dir.join("config.json"))?)?;
    let files = if random {
        None
    } else {
        Some(open_component(&dir, "model")?)
    };
    Ok(TextEncoder {
        tokenizer: ClipTokenizer::from_dir(&root.join(tokenizer))?,
        net: network(config, files, 0),
        plan: None,
    })
}

/// Pipeline classes this engine runs.
const SD_CLASSES: &[&str] = &[
    "StableDiffusionPipeline",
    "StableDiffusionImg2ImgPipeline",
    "StableDiffusionXLPipeline",
    "StableDiffusionXLImg2ImgPipeline",
];

impl Parts {
    /// Opens a diffusers folder (with `model_index.json`) or a single-file checkpoint.
    /// `random` keeps the configs but gives random weights (benchmarks).
    pub fn open(path: &Path, dtype: WeightDType, random: bool) -> Result<Self, Error> {
        if path.is_file() {
            return Self::open_single_file(path, dtype);
        }
        let index_path = path.join("model_index.json");
        if !index_path.is_file() {
            return Err(LoadError::Missing { path: index_path }.into());
        }
        let index = read_json(&index_path)?;
        let class = index
            .get("_class_name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if !SD_CLASSES.contains(&class) {
            return Err(invalid(
                &index_path,
                format!(
                    "unsupported pipeline {class:?} (supported: Stable Diffusion 1.x/2.x, SD-Turbo, SDXL, SDXL-Turbo, Z-Image)"
                ),
            ));
        }
        let family = if path.join("text_encoder_2").is_dir() {
            Family::Sdxl
        } else {
            Family::Sd
        };
        let text = text_encoder(path, "text_encoder", "tokenizer", random)?;
        let text_2 = match family {
            Family::Sdxl => Some(text_encoder(path, "text_encoder_2", "tokenizer_2", random)?),
            Family::Sd => None,
        };
        let unet_config = UnetConfig::from_json(&read_json(&path.join("unet/config.json"))?)?;
        let vae_config = VaeConfig::from_json(&read_json(&path.join("vae/config.json"))?)?;
        let scheduler = SchedulerConfig::from_file(&path.join("scheduler/scheduler_config.json"))?;
        let (unet_files, vae_files) = if random {
            (None, None)
        } else {
            (
                Some(open_component(
                    &path.join("unet"),
                    "diffusion_pytorch_model",
                )?),
                Some(open_component(
                    &path.join("vae"),
                    "diffusion_pytorch_model",
                )?),
            )
        };
        Ok(Self {
            family,
            text,
            text_2,
            unet: network(unet_config, unet_files, 3),
            vae: network(vae_config, vae_files, 4),
            scheduler,
            force_zeros_for_empty_prompt: index
                .get("force_zeros_for_empty_prompt")
                .and_then(Value::as_bool)
                .unwrap_or(family == Family::Sdxl),
            dtype,
            name: display_name(path),
            taesd: None,
        })
    }

    fn open_single_file(path: &Path, dtype: WeightDType) -> Result<Self, Error> {
        let file = open_single_file(path)?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let tokenizer = |name: &str| {
            ClipTokenizer::from_dir(&dir.join(name)).map_err(|e| {
                invalid(
                    path,
                    format!(
                        "a single-file checkpoint carries no tokenizer: put the CLIP tokenizer folder {name}/ (vocab.json and merges.txt, or tokenizer.json) next to it ({e})"
                    ),
                )
            })
        };
        let family = match file.family {
            FileFamily::Sdxl => Family::Sdxl,
            FileFamily::Sd1 | FileFamily::Sd2 => Family::Sd,
        };
        let text = TextEncoder {
            tokenizer: tokenizer("tokenizer")?,
            net: network(
                ClipConfig::from_json(&file.text_encoder_config)?,
                Some(file.text_encoder),
                1,
            ),
            plan: None,
        };
        let text_2 = match (file.text_encoder_2, file.text_encoder_2_config) {
            (Some(st), Some(config)) => Some(TextEncoder {
                tokenizer: tokenizer("tokenizer_2")?,
                net: network(ClipConfig::from_json(&config)?, Some(st), 2),
                plan: None,
            }),
            _ => None,
        };
        let scheduler_path = dir.join("scheduler/scheduler_config.json");
        let scheduler = if scheduler_path.is_file() {
            SchedulerConfig::from_file(&scheduler_path)?
        } else {
            SchedulerConfig::from_json(&default_scheduler())?
        };
        Ok(Self {
            family,
            text,
            text_2,
            unet: network(
                UnetConfig::from_json(&file.unet_config)?,
                Some(file.unet),
                3,
            ),
            vae: network(VaeConfig::from_json(&file.vae_config)?, Some(file.vae), 4),
            scheduler,
            force_zeros_for_empty_prompt: family == Family::Sdxl,
            dtype,
            name: display_name(path),
            taesd: None,
        })
    }

    /// Bytes the weights take on the GPU, and the largest tensor's, from the files' tensor
    /// sizes.
    pub fn weight_bytes(&self) -> (u64, u64) {
        let per = self.dtype.bytes();
        let files = [
            &self.unet.files,
            &self.vae.files,
            &self.text.net.files,
            self.text_2.as_ref().map_or(&None, |t| &t.net.files),
        ];
        let sizes = files.into_iter().flatten().flat_map(|st| {
            st.names()
                .filter_map(|n| st.get(n).ok())
                .map(|v| v.len() as u64 * per)
                .collect::<Vec<_>>()
        });
        sizes.fold((0, 0), |(total, largest), b| (total + b, largest.max(b)))
    }

    /// The VAE's image-to-latent factor (8 for every Stable Diffusion).
    pub fn downscale(&self) -> u32 {
        self.vae.config.downscale()
    }
}

pub(super) fn network<C>(config: C, files: Option<SafeTensors>, seed: u32) -> Network<C> {
    Network {
        config,
        files,
        weights: WeightCache::default(),
        seed,
        quantize: None,
    }
}

/// The model's name for the UI and the PNG's parameters: the file's or folder's name, or for a
/// Hugging Face cache snapshot (`models--ORG--NAME/snapshots/<revision>`) the repository's.
pub(super) fn display_name(path: &Path) -> String {
    let cached = path
        .parent()
        .filter(|p| p.file_name().is_some_and(|n| n == "snapshots"))
        .and_then(Path::parent)
        .and_then(Path::file_name)
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("models--"))
        .and_then(|n| n.rsplit("--").next());
    if let Some(name) = cached {
        return name.to_owned();
    }
    path.file_stem()
        .or_else(|| path.file_name())
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// Stable Diffusion's training schedule, for checkpoints that come without a scheduler.
fn default_scheduler() -> Value {
    serde_json::json!({
        "_class_name": "EulerDiscreteScheduler",
        "num_train_timesteps": 1000,
        "beta_start": 0.00085,
        "beta_end": 0.012,
        "beta_schedule": "scaled_linear",
        "prediction_type": "epsilon",
        "timestep_spacing": "leading",
        "steps_offset": 1
    })
}

/// Bytes `st`'s tensors take as `dtype` (matrices in `quantize`'s block format where given),
/// and the largest tensor's.
pub(super) fn tensors_bytes(
    st: &SafeTensors,
    dtype: WeightDType,
    quantize: Option<crate::load::GgmlType>,
) -> (u64, u64) {
    let dense = dtype.bytes() as f64;
    let matrix = quantize.map_or(dense, |ty| {
        ty.block_bytes() as f64 / ty.block_elems() as f64
    });
    st.names()
        .filter_map(|n| st.get(n).ok())
        .map(|v| (v.len() as f64 * if v.shape.len() == 2 { matrix } else { dense }) as u64)
        .fold((0, 0), |(total, largest), b| (total + b, largest.max(b)))
}

/// The transformer's and the VAE's bytes from their files (none for random weights).
pub(super) fn networks_bytes<C>(
    transformer: &Network<C>,
    vae: &Network<VaeConfig>,
    dtype: WeightDType,
) -> (u64, u64) {
    let parts = [
        (&transformer.files, transformer.quantize),
        (&vae.files, None),
    ];
    parts
        .into_iter()
        .filter_map(|(files, quantize)| files.as_ref().map(|st| tensors_bytes(st, dtype, quantize)))
        .fold((0, 0), |(total, largest), (b, l)| {
            (total + b, largest.max(l))
        })
}

/// The VAE config's `sample_size` (a side, or `[height, width]`), rounded down to `step`.
pub(super) fn native_side(vae: &Value, step: u32) -> u32 {
    let side = match vae.get("sample_size") {
        Some(Value::Number(n)) => n.as_u64(),
        Some(Value::Array(sides)) => sides.iter().filter_map(Value::as_u64).min(),
        _ => None,
    }
    .unwrap_or(1024)
    .min(4096)
    .max(u64::from(step)) as u32;
    side / step * step
}

pub(super) fn component_config(root: &Path, which: &str, file: &str) -> Result<Value, Error> {
    Ok(read_json(&root.join(which).join(file))?)
}

/// The folder's only `.safetensors` file, if it has exactly one (a single-file checkpoint put
/// in a component's folder).
fn lone_safetensors(dir: &Path) -> Result<Option<PathBuf>, Error> {
    let entries = std::fs::read_dir(dir).map_err(|e| LoadError::Io {
        path: dir.to_owned(),
        source: e,
    })?;
    let files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("safetensors"))
        })
        .collect();
    Ok(match files.as_slice() {
        [one] => Some(one.clone()),
        _ => None,
    })
}

/// A diffusion transformer folder's weights: `diffusion_pytorch_model*`, or else the folder's
/// one `.safetensors` file (a single-file checkpoint put there).
pub(super) fn transformer_files(dir: &Path) -> Result<SafeTensors, Error> {
    if !dir.is_dir() {
        return Err(LoadError::Missing {
            path: dir.to_owned(),
        }
        .into());
    }
    match open_component(dir, "diffusion_pytorch_model") {
        Ok(st) => Ok(st),
        Err(missing) => match lone_safetensors(dir)? {
            Some(file) => Ok(SafeTensors::open_files(&[file])?),
            None => Err(missing),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::display_name;
    use std::path::Path;

    #[test]
    fn cache_snapshots_are_named_by_their_repository() {
        let snapshot = Path::new("/hub/models--Tongyi-MAI--Z-Image-Turbo/snapshots/5f1c2a");
        assert_eq!(display_name(snapshot), "Z-Image-Turbo");
        assert_eq!(display_name(Path::new("/m/sd-turbo")), "sd-turbo");
        assert_eq!(display_name(Path::new("/m/v1-5.safetensors")), "v1-5");
    }
}
