//! Stable Diffusion single-file checkpoints: one `.safetensors` holding UNet, VAE and text
//! encoder(s) under the original LDM / SGM tensor names. They are opened as the diffusers /
//! transformers components with diffusers' names (the mapping of diffusers'
//! `loaders/single_file_utils.py`, generalised over levels, ResNets per level and transformer
//! depth) plus configs inferred from the tensor shapes, so the rest of the engine reads one
//! naming scheme. The tensors stay views into the mapped file; only SDXL's transposed text
//! projection is copied. Tokenizers are not part of these files: finding them is the caller's.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;
use std::path::Path;

use serde_json::Value;

use crate::Error;
use crate::load::{LoadError, SafeTensors};

mod configs;
#[cfg(test)]
mod tests;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// SD 1.x: CLIP ViT-L text encoder.
    Sd1,
    /// SD 2.x: OpenCLIP ViT-H text encoder, linear transformer projections.
    Sd2,
    /// SDXL: CLIP ViT-L plus OpenCLIP ViT-bigG, three levels, size conditioning.
    Sdxl,
}

pub struct SingleFile {
    pub family: Family,
    pub unet: SafeTensors,
    pub vae: SafeTensors,
    /// transformers `CLIPTextModel` names (`text_model.…`).
    pub text_encoder: SafeTensors,
    /// SDXL: `CLIPTextModelWithProjection` names, `text_projection.weight` included.
    pub text_encoder_2: Option<SafeTensors>,
    pub unet_config: Value,
    pub vae_config: Value,
    pub text_encoder_config: Value,
    pub text_encoder_2_config: Option<Value>,
}

const UNET: &str = "model.diffusion_model.";
const VAE: [&str; 2] = ["first_stage_model.", "vae."];
const SD1_TEXT: &str = "cond_stage_model.transformer.";
const SD2_TEXT: &str = "cond_stage_model.model.";
const XL_TEXT: &str = "conditioner.embedders.0.transformer.";
const XL_TEXT_2: &str = "conditioner.embedders.1.model.";

type Shapes = HashMap<String, Vec<usize>>;

/// How one diffusers tensor is made from the checkpoint's.
#[derive(Clone, Debug, PartialEq)]
enum Take {
    /// Rows `rows` of the source's first dimension (all when None), seen with `shape`.
    View {
        source: String,
        rows: Option<Range<usize>>,
        shape: Option<Vec<usize>>,
    },
    /// The 2-D source transposed (OpenCLIP stores its projection as `x @ P`).
    Transposed { source: String },
}

fn whole(source: &str) -> Take {
    Take::View {
        source: source.to_owned(),
        rows: None,
        shape: None,
    }
}

/// One component: diffusers name → how to make it.
type Part = BTreeMap<String, Take>;

struct Plan {
    family: Family,
    unet: Part,
    vae: Part,
    text: Part,
    text_2: Option<Part>,
}

/// `"12.rest"` → `(12, "rest")`.
fn index(s: &str) -> Option<(usize, &str)> {
    let (n, rest) = s.split_once('.')?;
    Some((n.parse().ok()?, rest))
}

fn resnet(rest: &str) -> String {
    const NAMES: [(&str, &str); 6] = [
        ("in_layers.0.", "norm1."),
        ("in_layers.2.", "conv1."),
        ("out_layers.0.", "norm2."),
        ("out_layers.3.", "conv2."),
        ("emb_layers.1.", "time_emb_proj."),
        ("skip_connection.", "conv_shortcut."),
    ];
    NAMES
        .iter()
        .find_map(|(old, new)| rest.strip_prefix(old).map(|r| format!("{new}{r}")))
        .unwrap_or_else(|| rest.to_owned())
}

/// A UNet tensor's diffusers name from its LDM one (without `model.diffusion_model.`); every
/// level holds `layers + 1` input (down) slots and as many output (up) slots.
fn unet_name(key: &str, layers: usize) -> Option<String> {
    const FIXED: [(&str, &str); 7] = [
        ("time_embed.0.", "time_embedding.linear_1."),
        ("time_embed.2.", "time_embedding.linear_2."),
        ("label_emb.0.0.", "add_embedding.linear_1."),
        ("label_emb.0.2.", "add_embedding.linear_2."),
        ("input_blocks.0.0.", "conv_in."),
        ("out.0.", "conv_norm_out."),
        ("out.2.", "conv_out."),
    ];
    if let Some(name) = FIXED
        .iter()
        .find_map(|(old, new)| key.strip_prefix(old).map(|r| format!("{new}{r}")))
    {
        return Some(name);
    }
    let per = layers + 1;
    if let Some((i, rest)) = key.strip_prefix("input_blocks.").and_then(index) {
        let (b, j) = ((i.checked_sub(1)?) / per, (i - 1) % per);
        let (slot, rest) = index(rest)?;
        return match (slot, rest.strip_prefix("op.")) {
            (0, Some(op)) => Some(format!("down_blocks.{b}.downsamplers.0.conv.{op}")),
            (0, None) => Some(format!("down_blocks.{b}.resnets.{j}.{}", resnet(rest))),
            (1, None) => Some(format!("down_blocks.{b}.attentions.{j}.{rest}")),
            _ => None,
        };
    }
    if let Some((slot, rest)) = key.strip_prefix("middle_block.").and_then(index) {
        return Some(if slot % 2 == 0 {
            format!("mid_block.resnets.{}.{}", slot / 2, resnet(rest))
        } else {
            format!("mid_block.attentions.{}.{rest}", slot / 2)
        });
    }
    let (i, rest) = key.strip_prefix("output_blocks.").and_then(index)?;
    let (b, j) = (i / per, i % per);
    let (slot, rest) = index(rest)?;
    match (slot, rest.strip_prefix("conv.")) {
        (0, _) => Some(format!("up_blocks.{b}.resnets.{j}.{}", resnet(rest))),
        (1 | 2, Some(conv)) => Some(format!("up_blocks.{b}.upsamplers.0.conv.{conv}")),
        (1, None) => Some(format!("up_blocks.{b}.attentions.{j}.{rest}")),
        _ => None,
    }
}

/// ResNets per level: the first downsampler sits right after level 0's ResNets.
fn unet_layers(keys: &[&str]) -> Result<usize, String> {
    let inputs: BTreeSet<usize> = keys
        .iter()
        .filter_map(|k| k.strip_prefix("input_blocks.").and_then(index))
        .map(|(i, _)| i)
        .collect();
    let count = inputs.last().map_or(0, |&i| i + 1);
    let per = inputs
        .iter()
        .copied()
        .find(|i| keys.contains(&format!("input_blocks.{i}.0.op.weight").as_str()))
        .unwrap_or(count);
    if per < 2 || !count.is_multiple_of(per) {
        return Err(format!(
            "UNet input blocks do not form levels ({count} blocks, first downsampler at {per})"
        ));
    }
    Ok(per - 1)
}

/// A VAE tensor's diffusers name from its LDM one (without `first_stage_model.`).
fn vae_name(key: &str, levels: usize) -> Option<String> {
    let (half, rest) = key.split_once('.')?;
    if !matches!(half, "encoder" | "decoder") {
        return matches!(half, "quant_conv" | "post_quant_conv").then(|| key.to_owned());
    }
    let rest = rest.replace("nin_shortcut", "conv_shortcut");
    let name = if let Some(r) = rest.strip_prefix("norm_out.") {
        format!("conv_norm_out.{r}")
    } else if rest.starts_with("conv_in.") || rest.starts_with("conv_out.") {
        rest
    } else if let Some((i, r)) = rest.strip_prefix("down.").and_then(index) {
        match r.strip_prefix("block.") {
            Some(block) => format!("down_blocks.{i}.resnets.{block}"),
            None => format!(
                "down_blocks.{i}.downsamplers.0.{}",
                r.strip_prefix("downsample.")?
            ),
        }
    } else if let Some((i, r)) = rest.strip_prefix("up.").and_then(index) {
        let u = levels.checked_sub(i + 1)?;
        match r.strip_prefix("block.") {
            Some(block) => format!("up_blocks.{u}.resnets.{block}"),
            None => format!(
                "up_blocks.{u}.upsamplers.0.{}",
                r.strip_prefix("upsample.")?
            ),
        }
    } else if let Some(r) = rest.strip_prefix("mid.block_") {
        let (k, r) = index(r)?;
        format!("mid_block.resnets.{}.{r}", k.checked_sub(1)?)
    } else {
        let (layer, tail) = rest.strip_prefix("mid.attn_1.")?.split_once('.')?;
        let layer = match layer {
            "norm" => "group_norm",
            "q" => "to_q",
            "k" => "to_k",
            "v" => "to_v",
            "proj_out" => "to_out.0",
            _ => return None,
        };
        format!("mid_block.attentions.0.{layer}.{tail}")
    };
    Some(format!("{half}.{name}"))
}

fn vae_part(shapes: &Shapes, prefix: &str) -> Part {
    let keys: Vec<&str> = shapes
        .keys()
        .filter_map(|k| k.strip_prefix(prefix))
        .collect();
    let levels = keys
        .iter()
        .filter_map(|k| k.strip_prefix("encoder.down.").and_then(index))
        .map(|(i, _)| i + 1)
        .max()
        .unwrap_or(0);
    let mut vae = Part::new();
    for k in keys {
        let Some(name) = vae_name(k, levels) else {
            continue;
        };
        let source = format!("{prefix}{k}");
        let conv = &shapes[&source];
        // The mid-block attention's 1×1 convolutions are diffusers' linear layers.
        let shape = (name.contains(".attentions.") && conv.len() > 2).then(|| conv[..2].to_vec());
        let take = Take::View {
            source,
            rows: None,
            shape,
        };
        vae.insert(name, take);
    }
    vae
}

/// transformers names of an OpenCLIP text tower under `prefix`: q/k/v split out of the fused
/// `in_proj`, blocks from `layers` on dropped, the projection kept when `projection`.
fn open_clip(shapes: &Shapes, prefix: &str, layers: usize, projection: bool) -> Part {
    let mut part = Part::new();
    for (key, shape) in shapes {
        let Some(k) = key.strip_prefix(prefix) else {
            continue;
        };
        let fixed = match k {
            "positional_embedding" => Some("text_model.embeddings.position_embedding.weight"),
            "token_embedding.weight" => Some("text_model.embeddings.token_embedding.weight"),
            "ln_final.weight" => Some("text_model.final_layer_norm.weight"),
            "ln_final.bias" => Some("text_model.final_layer_norm.bias"),
            _ => None,
        };
        if let Some(name) = fixed {
            part.insert(name.to_owned(), whole(key));
            continue;
        }
        if k == "text_projection" && projection {
            let take = Take::Transposed {
                source: key.clone(),
            };
            part.insert("text_projection.weight".to_owned(), take);
            continue;
        }
        let Some((layer, rest)) = k.strip_prefix("transformer.resblocks.").and_then(index) else {
            continue;
        };
        if layer >= layers {
            continue;
        }
        let p = format!("text_model.encoder.layers.{layer}");
        if let Some(kind) = rest.strip_prefix("attn.in_proj_") {
            let h = shape.first().copied().unwrap_or(0) / 3;
            for (i, q) in ["q_proj", "k_proj", "v_proj"].into_iter().enumerate() {
                let take = Take::View {
                    source: key.clone(),
                    rows: Some(i * h..(i + 1) * h),
                    shape: None,
                };
                part.insert(format!("{p}.self_attn.{q}.{kind}"), take);
            }
            continue;
        }
        const NAMES: [(&str, &str); 5] = [
            ("ln_1.", "layer_norm1."),
            ("ln_2.", "layer_norm2."),
            ("mlp.c_fc.", "mlp.fc1."),
            ("mlp.c_proj.", "mlp.fc2."),
            ("attn.out_proj.", "self_attn.out_proj."),
        ];
        if let Some(name) = NAMES
            .iter()
            .find_map(|(old, new)| rest.strip_prefix(old).map(|r| format!("{p}.{new}{r}")))
        {
            part.insert(name, whole(key));
        }
    }
    part
}

/// transformers-named CLIP under `prefix`, as it is (its integer `position_ids` left out).
fn clip(shapes: &Shapes, prefix: &str) -> Part {
    shapes
        .keys()
        .filter_map(|key| Some((key.strip_prefix(prefix)?, key)))
        .filter(|(k, _)| !k.ends_with("position_ids"))
        .map(|(k, key)| (k.to_owned(), whole(key)))
        .collect()
}

/// What a file that is not an SD 1.x/2.x/XL checkpoint seems to be, for the error.
fn foreign(keys: &[&str]) -> String {
    let looks = |what: &str| format!("it looks like {what}");
    let any = |f: &dyn Fn(&str) -> bool| keys.iter().any(|k| f(k));
    let what = if any(&|k| k.contains("joint_blocks.")) {
        "an SD3 / SD3.5 (MMDiT) checkpoint"
    } else if any(&|k| k.contains("double_blocks.") || k.contains("single_blocks.")) {
        "a Flux checkpoint"
    } else if any(&|k| k.contains("lora_")) {
        "a LoRA adapter"
    } else if any(&|k| k.starts_with("conditioner.embedders.0.model.")) {
        "an SDXL refiner (image-to-image only)"
    } else if any(&|k| k.starts_with("down_blocks.") || k.starts_with("encoder.down_blocks.")) {
        "one component in diffusers' naming; open the diffusers folder instead"
    } else if any(&|k| k.starts_with("encoder.down.") || k.starts_with("decoder.up.")) {
        "a standalone VAE"
    } else if any(&|k| k.starts_with(UNET)) {
        "a UNet without a CLIP text encoder this engine knows"
    } else {
        let mut first: Vec<&str> = keys.to_vec();
        first.sort_unstable();
        first.truncate(3);
        return format!(
            "it has none of their tensor names (first: {})",
            first.join(", ")
        );
    };
    looks(what)
}

fn plan(shapes: &Shapes) -> Result<Plan, String> {
    let keys: Vec<&str> = shapes.keys().map(String::as_str).collect();
    let has = |prefix: &str| keys.iter().any(|k| k.starts_with(prefix));
    let sd = "not a Stable Diffusion 1.x/2.x/XL checkpoint";
    let family = if has(&format!("{XL_TEXT_2}transformer.resblocks.")) && has(XL_TEXT) {
        Family::Sdxl
    } else if has(SD2_TEXT) {
        Family::Sd2
    } else if has(SD1_TEXT) {
        Family::Sd1
    } else {
        return Err(format!("{sd}: {}", foreign(&keys)));
    };
    let unet_keys: Vec<&str> = keys.iter().filter_map(|k| k.strip_prefix(UNET)).collect();
    let vae_prefix = VAE.into_iter().find(|p| has(p));
    let (false, Some(vae_prefix)) = (unet_keys.is_empty(), vae_prefix) else {
        return Err(format!(
            "{sd}: it has text encoder tensors but no {}",
            if unet_keys.is_empty() {
                "UNet (model.diffusion_model.*)"
            } else {
                "VAE (first_stage_model.*)"
            }
        ));
    };
    let layers = unet_layers(&unet_keys)?;
    let unet = unet_keys
        .iter()
        .filter_map(|k| Some((unet_name(k, layers)?, whole(&format!("{UNET}{k}")))))
        .collect();
    let vae = vae_part(shapes, vae_prefix);
    let (text, text_2) = match family {
        Family::Sd1 => (clip(shapes, SD1_TEXT), None),
        // SD 2.x conditions on OpenCLIP's penultimate layer: diffusers' text encoder has 23
        // layers and drops the 24th block of the file by name (`resblocks.23`).
        Family::Sd2 => (open_clip(shapes, SD2_TEXT, 23, false), None),
        Family::Sdxl => (
            clip(shapes, XL_TEXT),
            Some(open_clip(shapes, XL_TEXT_2, usize::MAX, true)),
        ),
    };
    Ok(Plan {
        family,
        unet,
        vae,
        text,
        text_2,
    })
}

/// Shapes of a component's tensors as the plan makes them.
fn part_shapes(part: &Part, shapes: &Shapes) -> Shapes {
    part.iter()
        .filter_map(|(name, take)| {
            let shape = match take {
                Take::View {
                    source,
                    rows,
                    shape,
                } => match (shape, rows) {
                    (Some(s), _) => s.clone(),
                    (None, Some(r)) => {
                        let mut s = shapes.get(source)?.clone();
                        *s.first_mut()? = r.len();
                        s
                    }
                    (None, None) => shapes.get(source)?.clone(),
                },
                Take::Transposed { source } => shapes.get(source)?.iter().rev().copied().collect(),
            };
            Some((name.clone(), shape))
        })
        .collect()
}

fn derive(file: &SafeTensors, part: &Part) -> Result<SafeTensors, LoadError> {
    let views = part.iter().filter_map(|(name, take)| match take {
        Take::View {
            source,
            rows,
            shape,
        } => Some((name.clone(), source.as_str(), rows.clone(), shape.clone())),
        Take::Transposed { .. } => None,
    });
    let mut table = file.remap(views)?;
    for (name, take) in part {
        let Take::Transposed { source } = take else {
            continue;
        };
        let view = file.get(source)?;
        let &[rows, cols] = view.shape else {
            return Err(LoadError::ShapeMismatch {
                name: source.clone(),
                actual: view.shape.to_vec(),
                expected: vec![0, 0],
            });
        };
        let size = view.dtype.size();
        let mut bytes = vec![0u8; view.bytes.len()];
        for r in 0..rows {
            for c in 0..cols {
                let (from, to) = ((r * cols + c) * size, (c * rows + r) * size);
                bytes[to..to + size].copy_from_slice(&view.bytes[from..from + size]);
            }
        }
        table.insert_owned(name.clone(), view.dtype, vec![cols, rows], bytes)?;
    }
    Ok(table)
}

/// Opens a single-file SD 1.x / 2.x / XL checkpoint as its diffusers components.
pub fn open_single_file(path: &Path) -> Result<SingleFile, Error> {
    let file = SafeTensors::open_files(&[path.to_owned()])?;
    let shapes: Shapes = file
        .names()
        .filter_map(|n| Some((n.to_owned(), file.get(n).ok()?.shape.to_vec())))
        .collect();
    let invalid = |message: String| -> Error {
        LoadError::Config {
            path: path.to_owned(),
            message,
        }
        .into()
    };
    let plan = plan(&shapes).map_err(invalid)?;
    let configs = configs::configs(
        plan.family,
        &part_shapes(&plan.unet, &shapes),
        &part_shapes(&plan.vae, &shapes),
        &part_shapes(&plan.text, &shapes),
        plan.text_2
            .as_ref()
            .map(|p| part_shapes(p, &shapes))
            .as_ref(),
    )
    .map_err(invalid)?;
    Ok(SingleFile {
        family: plan.family,
        unet: derive(&file, &plan.unet)?,
        vae: derive(&file, &plan.vae)?,
        text_encoder: derive(&file, &plan.text)?,
        text_encoder_2: plan.text_2.map(|p| derive(&file, &p)).transpose()?,
        unet_config: configs.unet,
        vae_config: configs.vae,
        text_encoder_config: configs.text,
        text_encoder_2_config: configs.text_2,
    })
}
