//! FLUX.2 transformer weights under the names the plan reads, as views (nothing copied):
//! diffusers' own names, or Black Forest Labs' original layout as ComfyUI's single files have
//! it (read as diffusers' `convert_flux2_transformer_checkpoint_to_diffusers` maps it: `img_in`,
//! `txt_in`, `time_in`, `*.lin`, fused `img_attn.qkv`/`txt_attn.qkv`, `img_mlp`/`txt_mlp`,
//! `single_blocks.*.linear1`/`linear2`, the final layer's shift before its scale, an optional
//! `model.diffusion_model.` prefix). Fused products are seen as their parts: a single-stream
//! block's `to_qkv_mlp_proj` is the query, key and value rows, then the feed-forward's gate and
//! up rows; a feed-forward's `linear_in` its gate rows, then its up rows (`Flux2SwiGLU`); the
//! output norm's product its scale rows and its shift rows.

use std::ops::Range;
use std::path::Path;

use super::config::Flux2Config;
use crate::Error;
use crate::load::{LoadError, SafeTensors};
use crate::models::diffusion::pipeline::transformer_files;

const PREFIX: &str = "model.diffusion_model.";

/// The transformer folder's weights: `diffusion_pytorch_model*` in either layout, or else the
/// folder's one `.safetensors` file (a single file put there).
pub fn transformer_weights(dir: &Path, cfg: &Flux2Config) -> Result<SafeTensors, Error> {
    let st = transformer_files(dir)?;
    Ok(views(&st, cfg)?)
}

/// A view: its name, and the rows of its source it takes (all when `None`).
type View = (String, Option<Range<usize>>);

/// Renames of the original layout that keep the tensor whole.
const RENAMES: [(&str, &str); 10] = [
    ("img_in.", "x_embedder."),
    ("txt_in.", "context_embedder."),
    (
        "time_in.in_layer.",
        "time_guidance_embed.timestep_embedder.linear_1.",
    ),
    (
        "time_in.out_layer.",
        "time_guidance_embed.timestep_embedder.linear_2.",
    ),
    (
        "guidance_in.in_layer.",
        "time_guidance_embed.guidance_embedder.linear_1.",
    ),
    (
        "guidance_in.out_layer.",
        "time_guidance_embed.guidance_embedder.linear_2.",
    ),
    (
        "double_stream_modulation_img.lin.",
        "double_stream_modulation_img.linear.",
    ),
    (
        "double_stream_modulation_txt.lin.",
        "double_stream_modulation_txt.linear.",
    ),
    (
        "single_stream_modulation.lin.",
        "single_stream_modulation.linear.",
    ),
    ("final_layer.linear.", "proj_out."),
];

/// Inside a double-stream block, original → diffusers.
const DOUBLE: [(&str, &str); 10] = [
    ("img_attn.norm.query_norm.scale", "attn.norm_q.weight"),
    ("img_attn.norm.key_norm.scale", "attn.norm_k.weight"),
    ("img_attn.proj.weight", "attn.to_out.0.weight"),
    ("img_mlp.0.weight", "ff.linear_in.weight"),
    ("img_mlp.2.weight", "ff.linear_out.weight"),
    ("txt_attn.norm.query_norm.scale", "attn.norm_added_q.weight"),
    ("txt_attn.norm.key_norm.scale", "attn.norm_added_k.weight"),
    ("txt_attn.proj.weight", "attn.to_add_out.weight"),
    ("txt_mlp.0.weight", "ff_context.linear_in.weight"),
    ("txt_mlp.2.weight", "ff_context.linear_out.weight"),
];

/// Inside a single-stream block, original → diffusers.
const SINGLE: [(&str, &str); 4] = [
    ("linear1.weight", "attn.to_qkv_mlp_proj.weight"),
    ("linear2.weight", "attn.to_out.weight"),
    ("norm.query_norm.scale", "attn.norm_q.weight"),
    ("norm.key_norm.scale", "attn.norm_k.weight"),
];

/// `rows` split at `sizes`, each part named `owner.suffix.weight`.
fn split(owner: &str, parts: &[(&str, usize)]) -> Vec<View> {
    let mut start = 0;
    parts
        .iter()
        .map(|(suffix, size)| {
            let range = start..start + size;
            start += size;
            (format!("{owner}.{suffix}.weight"), Some(range))
        })
        .collect()
}

/// A diffusers-named tensor as the views the plan reads, with the rows they need in all.
fn diffusers_views(name: &str, cfg: &Flux2Config) -> (Vec<View>, Option<usize>) {
    let (dim, mlp) = (cfg.dim() as usize, cfg.mlp_hidden() as usize);
    if let Some(block) = name.strip_suffix(".attn.to_qkv_mlp_proj.weight") {
        let parts = [
            ("attn.to_q", dim),
            ("attn.to_k", dim),
            ("attn.to_v", dim),
            ("attn.mlp_in.gate", mlp),
            ("attn.mlp_in.up", mlp),
        ];
        return (split(block, &parts), Some(3 * dim + 2 * mlp));
    }
    let ff = name
        .strip_suffix(".linear_in.weight")
        .filter(|n| n.ends_with(".ff") || n.ends_with(".ff_context"));
    if let Some(ff) = ff {
        let parts = [("linear_in.gate", mlp), ("linear_in.up", mlp)];
        return (split(ff, &parts), Some(2 * mlp));
    }
    if name == "norm_out.linear.weight" {
        let parts = [("scale", dim), ("shift", dim)];
        return (split("norm_out.linear", &parts), Some(2 * dim));
    }
    (vec![(name.to_owned(), None)], None)
}

/// An original-layout tensor as the plan's views (through diffusers' names).
fn original_views(key: &str, cfg: &Flux2Config) -> (Vec<View>, Option<usize>) {
    let dim = cfg.dim() as usize;
    if key == "final_layer.adaLN_modulation.1.weight" {
        // The original keeps (shift, scale); diffusers and the plan read (scale, shift).
        let parts = [("shift", dim), ("scale", dim)];
        return (split("norm_out.linear", &parts), Some(2 * dim));
    }
    let block = |prefix: &str| -> Option<(String, String)> {
        let rest = key.strip_prefix(prefix)?;
        let (index, inner) = rest.split_once('.')?;
        Some((index.to_owned(), inner.to_owned()))
    };
    if let Some((i, inner)) = block("double_blocks.") {
        let owner = format!("transformer_blocks.{i}");
        let qkv = match inner.as_str() {
            "img_attn.qkv.weight" => Some(["attn.to_q", "attn.to_k", "attn.to_v"]),
            "txt_attn.qkv.weight" => {
                Some(["attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"])
            }
            _ => None,
        };
        if let Some(names) = qkv {
            let parts: Vec<(&str, usize)> = names.iter().map(|n| (*n, dim)).collect();
            return (split(&owner, &parts), Some(3 * dim));
        }
        let mapped = DOUBLE.iter().find(|(from, _)| *from == inner);
        let name = mapped.map_or(inner, |(_, to)| (*to).to_owned());
        return diffusers_views(&format!("{owner}.{name}"), cfg);
    }
    if let Some((i, inner)) = block("single_blocks.") {
        let mapped = SINGLE.iter().find(|(from, _)| *from == inner);
        let name = mapped.map_or(inner, |(_, to)| (*to).to_owned());
        return diffusers_views(&format!("single_transformer_blocks.{i}.{name}"), cfg);
    }
    let renamed = RENAMES
        .iter()
        .fold(key.to_owned(), |k, (from, to)| k.replace(from, to));
    diffusers_views(&renamed, cfg)
}

fn is_original(st: &SafeTensors) -> bool {
    st.names().any(|n| {
        n.starts_with(PREFIX) || n.starts_with("double_blocks.") || n.starts_with("single_blocks.")
    })
}

fn views(st: &SafeTensors, cfg: &Flux2Config) -> Result<SafeTensors, LoadError> {
    let original = is_original(st);
    let mut views = Vec::new();
    for name in st.names() {
        let (parts, rows_needed) = if original {
            original_views(name.strip_prefix(PREFIX).unwrap_or(name), cfg)
        } else {
            diffusers_views(name, cfg)
        };
        if let Some(needed) = rows_needed {
            let shape = st.get(name)?.shape.to_vec();
            if shape.first() != Some(&needed) {
                let mut expected = shape.clone();
                if let Some(first) = expected.first_mut() {
                    *first = needed;
                }
                return Err(LoadError::ShapeMismatch {
                    name: name.to_owned(),
                    actual: shape,
                    expected,
                });
            }
        }
        for (view, rows) in parts {
            views.push((view, name, rows, None));
        }
    }
    st.remap(views)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cfg() -> Flux2Config {
        Flux2Config::from_json(&json!({
            "num_attention_heads": 2, "attention_head_dim": 8, "axes_dims_rope": [2, 2, 2, 2],
            "mlp_ratio": 2.0
        }))
        .expect("config")
    }

    #[test]
    fn original_names_map_as_diffusers_converts_them() {
        let c = cfg();
        let names = |key: &str| -> Vec<String> {
            original_views(key, &c)
                .0
                .into_iter()
                .map(|(n, _)| n)
                .collect()
        };
        assert_eq!(
            names("double_blocks.3.txt_attn.qkv.weight"),
            [
                "transformer_blocks.3.attn.add_q_proj.weight",
                "transformer_blocks.3.attn.add_k_proj.weight",
                "transformer_blocks.3.attn.add_v_proj.weight"
            ]
        );
        assert_eq!(
            names("double_blocks.0.img_mlp.0.weight"),
            [
                "transformer_blocks.0.ff.linear_in.gate.weight",
                "transformer_blocks.0.ff.linear_in.up.weight"
            ]
        );
        assert_eq!(
            names("single_blocks.1.norm.key_norm.scale"),
            ["single_transformer_blocks.1.attn.norm_k.weight"]
        );
        assert_eq!(
            names("time_in.out_layer.weight"),
            ["time_guidance_embed.timestep_embedder.linear_2.weight"]
        );
        // (shift, scale) in the original: the scale is the second half.
        let (views, _) = original_views("final_layer.adaLN_modulation.1.weight", &c);
        assert_eq!(
            views[1],
            ("norm_out.linear.scale.weight".to_owned(), Some(16..32))
        );
        let (views, _) = diffusers_views("norm_out.linear.weight", &c);
        assert_eq!(
            views[0],
            ("norm_out.linear.scale.weight".to_owned(), Some(0..16))
        );
    }
}
