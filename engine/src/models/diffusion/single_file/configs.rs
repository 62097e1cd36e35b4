//! The diffusers / transformers `config.json` values of a checkpoint's components, inferred
//! from their tensor shapes (diffusers names); what shapes cannot tell (head counts, GroupNorm
//! groups, training resolution) comes from the family's released configs.

use serde_json::{Value, json};

use super::{Family, Shapes};

pub(super) struct Configs {
    pub unet: Value,
    pub vae: Value,
    pub text: Value,
    pub text_2: Option<Value>,
}

fn shape<'a>(shapes: &'a Shapes, name: &str) -> Result<&'a [usize], String> {
    shapes
        .get(name)
        .map(Vec::as_slice)
        .ok_or_else(|| format!("tensor {name} is missing"))
}

fn dim(shapes: &Shapes, name: &str, axis: usize) -> Result<usize, String> {
    let shape = shape(shapes, name)?;
    shape
        .get(axis)
        .copied()
        .ok_or_else(|| format!("tensor {name} has shape {shape:?}, no dimension {axis}"))
}

/// How many of `name(0)`, `name(1)`, … exist.
fn count(shapes: &Shapes, name: impl Fn(usize) -> String) -> usize {
    (0..).take_while(|&i| shapes.contains_key(&name(i))).count()
}

/// GroupNorm's group count is not in its weights: 32 in every released model, else (tiny test
/// models) 8, or the largest power of two dividing every channel count.
fn norm_groups(channels: &[usize]) -> usize {
    [32, 8, 4, 2]
        .into_iter()
        .find(|g| channels.iter().all(|c| c % g == 0))
        .unwrap_or(1)
}

/// The side in pixels diffusers assumes for the family (SD 2.x: the 768 px v-model).
fn image_size(family: Family) -> usize {
    match family {
        Family::Sd1 => 512,
        Family::Sd2 => 768,
        Family::Sdxl => 1024,
    }
}

pub(super) fn configs(
    family: Family,
    unet: &Shapes,
    vae: &Shapes,
    text: &Shapes,
    text_2: Option<&Shapes>,
) -> Result<Configs, String> {
    // OpenAI's CLIP uses quick GELU; the OpenCLIP towers (SD 2.x, SDXL's second) plain GELU.
    let act = if family == Family::Sd2 {
        "gelu"
    } else {
        "quick_gelu"
    };
    let text = clip(text, act, false)?;
    let text_2 = text_2.map(|t| clip(t, "gelu", true)).transpose()?;
    let pooled = text_2
        .as_ref()
        .and_then(|c| c["projection_dim"].as_u64())
        .map(|p| p as usize);
    let vae = vae_config(family, vae)?;
    let vae_levels = vae["block_out_channels"].as_array().map_or(1, Vec::len);
    let unet = unet_config(family, unet, 1 << vae_levels.saturating_sub(1), pooled)?;
    Ok(Configs {
        unet,
        vae,
        text,
        text_2,
    })
}

/// Transformer blocks of the attention `prefix` (0 when it does not exist).
fn depth(s: &Shapes, prefix: &str) -> usize {
    count(s, |t| {
        format!("{prefix}.transformer_blocks.{t}.attn1.to_q.weight")
    })
}

/// Transformer depth of each level, checked to be the same in every attention of the level
/// and mirrored by the up path (what diffusers' `transformer_layers_per_block` can express).
fn level_depths(s: &Shapes, levels: usize, layers: usize) -> Result<Vec<usize>, String> {
    let mut depths = Vec::with_capacity(levels);
    for b in 0..levels {
        let d = depth(s, &format!("down_blocks.{b}.attentions.0"));
        let u = levels - 1 - b;
        let down = (0..layers).map(|j| depth(s, &format!("down_blocks.{b}.attentions.{j}")));
        let up = (0..=layers).map(|j| depth(s, &format!("up_blocks.{u}.attentions.{j}")));
        if down.chain(up).any(|x| x != d) {
            return Err(format!(
                "UNet level {b} has transformer depths that differ between its blocks; only uniform depths per level are supported"
            ));
        }
        depths.push(d);
    }
    Ok(depths)
}

fn unet_config(
    family: Family,
    s: &Shapes,
    vae_scale: usize,
    pooled: Option<usize>,
) -> Result<Value, String> {
    let resnet = |b: usize, j: usize| format!("down_blocks.{b}.resnets.{j}.conv1.weight");
    let levels = count(s, |b| resnet(b, 0));
    let layers = count(s, |j| resnet(0, j));
    if levels == 0 || layers == 0 {
        return Err("the UNet has no down blocks".into());
    }
    let channels = (0..levels)
        .map(|b| dim(s, &resnet(b, 0), 0))
        .collect::<Result<Vec<_>, _>>()?;
    let depths = level_depths(s, levels, layers)?;
    let mid = depth(s, "mid_block.attentions.0");
    if mid == 0 || (depths[levels - 1] != 0 && depths[levels - 1] != mid) {
        return Err(format!(
            "the UNet's mid block has {mid} transformer blocks, its last level {}",
            depths[levels - 1]
        ));
    }
    // diffusers' mid block takes the last level's entry; entries of levels without attention
    // are otherwise unused (its configs write 1).
    let mut per_level: Vec<usize> = depths.iter().map(|&d| d.max(1)).collect();
    per_level[levels - 1] = mid;
    let attention = if let Some(b) = depths.iter().position(|&d| d > 0) {
        format!("down_blocks.{b}.attentions.0")
    } else {
        "mid_block.attentions.0".to_owned()
    };
    let cross = dim(
        s,
        &format!("{attention}.transformer_blocks.0.attn2.to_k.weight"),
        1,
    )?;
    // SD 2.x and SDXL project in and out of the transformers with linear layers, SD 1.x with
    // 1×1 convolutions.
    let linear = shape(s, &format!("{attention}.proj_in.weight"))?.len() == 2;
    // SD 1.x has 8 heads everywhere; SD 2.x and SDXL heads of 64 channels. diffusers writes
    // both as `attention_head_dim` (a head count, its naming quirk).
    let heads: Vec<usize> = channels
        .iter()
        .map(|&c| match family {
            Family::Sd1 => 8,
            Family::Sd2 | Family::Sdxl => (c / 64).max(1),
        })
        .collect();
    let kind = |attn: bool, down: bool| match (attn, down) {
        (true, true) => "CrossAttnDownBlock2D",
        (false, true) => "DownBlock2D",
        (true, false) => "CrossAttnUpBlock2D",
        (false, false) => "UpBlock2D",
    };
    let down: Vec<&str> = depths.iter().map(|&d| kind(d > 0, true)).collect();
    let up: Vec<&str> = depths.iter().rev().map(|&d| kind(d > 0, false)).collect();
    let (inputs, outputs) = (dim(s, "conv_in.weight", 1)?, dim(s, "conv_out.weight", 0)?);
    if inputs != outputs {
        return Err(format!(
            "the UNet takes {inputs} channels and gives {outputs}: an inpainting or instruct-pix2pix model; only text-to-image checkpoints are supported"
        ));
    }
    let mut config = json!({
        "_class_name": "UNet2DConditionModel",
        "act_fn": "silu",
        "attention_head_dim": heads,
        "block_out_channels": channels,
        "center_input_sample": false,
        "cross_attention_dim": cross,
        "down_block_types": down,
        "downsample_padding": 1,
        "flip_sin_to_cos": true,
        "freq_shift": 0,
        "in_channels": inputs,
        "layers_per_block": layers,
        "mid_block_scale_factor": 1,
        "mid_block_type": "UNetMidBlock2DCrossAttn",
        "norm_eps": 1e-5,
        "norm_num_groups": norm_groups(&channels),
        "out_channels": outputs,
        "sample_size": image_size(family) / vae_scale,
        "transformer_layers_per_block": per_level,
        "up_block_types": up,
        "upcast_attention": family == Family::Sd2,
        "use_linear_projection": linear,
    });
    if s.contains_key("add_embedding.linear_1.weight") {
        if family != Family::Sdxl {
            return Err("class-conditioned UNets (label_emb) are not supported".into());
        }
        add_text_time(&mut config, s, pooled)?;
    }
    Ok(config)
}

/// SDXL's added conditioning: the pooled text embedding plus six sinusoidal embeddings of the
/// original size, crop and target size.
fn add_text_time(config: &mut Value, s: &Shapes, pooled: Option<usize>) -> Result<(), String> {
    let input = dim(s, "add_embedding.linear_1.weight", 1)?;
    let time = pooled
        .and_then(|p| input.checked_sub(p))
        .filter(|d| *d > 0 && d % 6 == 0)
        .map_or(256, |d| d / 6);
    config["addition_embed_type"] = json!("text_time");
    config["addition_time_embed_dim"] = json!(time);
    config["projection_class_embeddings_input_dim"] = json!(input);
    Ok(())
}

fn vae_config(family: Family, s: &Shapes) -> Result<Value, String> {
    let resnet = |i: usize, j: usize| format!("encoder.down_blocks.{i}.resnets.{j}.conv1.weight");
    let levels = count(s, |i| resnet(i, 0));
    if levels == 0 {
        return Err("the VAE has no encoder blocks".into());
    }
    let channels = (0..levels)
        .map(|i| dim(s, &resnet(i, 0), 0))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(json!({
        "_class_name": "AutoencoderKL",
        "act_fn": "silu",
        "block_out_channels": channels,
        "down_block_types": vec!["DownEncoderBlock2D"; levels],
        "force_upcast": true,
        "in_channels": dim(s, "encoder.conv_in.weight", 1)?,
        "latent_channels": dim(s, "decoder.conv_in.weight", 1)?,
        "layers_per_block": count(s, |j| resnet(0, j)),
        "mid_block_add_attention": s.contains_key("decoder.mid_block.attentions.0.to_q.weight"),
        "norm_num_groups": norm_groups(&channels),
        "out_channels": dim(s, "decoder.conv_out.weight", 0)?,
        "sample_size": image_size(family),
        "scaling_factor": if family == Family::Sdxl { 0.13025 } else { 0.18215 },
        "up_block_types": vec!["UpDecoderBlock2D"; levels],
        "use_post_quant_conv": s.contains_key("post_quant_conv.weight"),
        "use_quant_conv": s.contains_key("quant_conv.weight"),
    }))
}

fn clip(s: &Shapes, act: &str, projection: bool) -> Result<Value, String> {
    let tokens = "text_model.embeddings.token_embedding.weight";
    let hidden = dim(s, tokens, 1)?;
    let layer = |l: usize| format!("text_model.encoder.layers.{l}.self_attn.q_proj.weight");
    let mut config = json!({
        "architectures": [if projection { "CLIPTextModelWithProjection" } else { "CLIPTextModel" }],
        "model_type": "clip_text_model",
        "vocab_size": dim(s, tokens, 0)?,
        "hidden_size": hidden,
        "intermediate_size": dim(s, "text_model.encoder.layers.0.mlp.fc1.weight", 0)?,
        "num_hidden_layers": count(s, layer),
        // Every released CLIP text tower has 64-channel heads.
        "num_attention_heads": (hidden / 64).max(1),
        "max_position_embeddings": dim(s, "text_model.embeddings.position_embedding.weight", 0)?,
        "hidden_act": act,
        "layer_norm_eps": 1e-5,
        // As the released configs say: with eos_token_id 2, transformers pools at the highest
        // id of the row, which is CLIP's EOS.
        "bos_token_id": 0,
        "eos_token_id": 2,
        "pad_token_id": 1,
    });
    if projection {
        config["projection_dim"] = json!(dim(s, "text_projection.weight", 0)?);
    }
    Ok(config)
}
