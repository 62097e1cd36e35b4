//! FLUX.2 transformer weights under the names the plan reads: diffusers' own, with its fused
//! products seen as their parts (views, nothing copied). A single-stream block's
//! `to_qkv_mlp_proj` is the query, key and value rows, then the feed-forward's gate and up
//! rows; a feed-forward's `linear_in` is its gate rows, then its up rows (`Flux2SwiGLU`).

use std::path::Path;

use super::config::Flux2Config;
use crate::Error;
use crate::load::{LoadError, SafeTensors};
use crate::models::diffusion::pipeline::open_component;

pub fn transformer_weights(dir: &Path, cfg: &Flux2Config) -> Result<SafeTensors, Error> {
    if !dir.is_dir() {
        return Err(LoadError::Missing {
            path: dir.to_owned(),
        }
        .into());
    }
    let st = open_component(dir, "diffusion_pytorch_model")?;
    Ok(split_fused(&st, cfg)?)
}

/// A fused weight's owner (the name before its suffix) and its parts: `(suffix, rows)`.
type Parts = (String, Vec<(&'static str, std::ops::Range<usize>)>);

/// Each fused weight's parts.
fn parts(name: &str, cfg: &Flux2Config) -> Option<Parts> {
    let (dim, mlp) = (cfg.dim() as usize, cfg.mlp_hidden() as usize);
    if let Some(block) = name.strip_suffix(".attn.to_qkv_mlp_proj.weight") {
        let qkv_mlp = vec![
            ("attn.to_q", 0..dim),
            ("attn.to_k", dim..2 * dim),
            ("attn.to_v", 2 * dim..3 * dim),
            ("attn.mlp_in.gate", 3 * dim..3 * dim + mlp),
            ("attn.mlp_in.up", 3 * dim + mlp..3 * dim + 2 * mlp),
        ];
        return Some((block.to_owned(), qkv_mlp));
    }
    let ff = name
        .strip_suffix(".linear_in.weight")
        .filter(|n| n.ends_with(".ff") || n.ends_with(".ff_context"))?;
    Some((
        ff.to_owned(),
        vec![("linear_in.gate", 0..mlp), ("linear_in.up", mlp..2 * mlp)],
    ))
}

fn split_fused(st: &SafeTensors, cfg: &Flux2Config) -> Result<SafeTensors, LoadError> {
    let mut views = Vec::new();
    for name in st.names() {
        match parts(name, cfg) {
            Some((owner, pieces)) => {
                let rows = st.get(name)?.shape.first().copied().unwrap_or(0);
                let needed = pieces.last().map_or(0, |(_, r)| r.end);
                if rows != needed {
                    return Err(LoadError::ShapeMismatch {
                        name: name.to_owned(),
                        actual: st.get(name)?.shape.to_vec(),
                        expected: vec![needed],
                    });
                }
                for (suffix, range) in pieces {
                    views.push((format!("{owner}.{suffix}.weight"), name, Some(range), None));
                }
            }
            None => views.push((name.to_owned(), name, None, None)),
        }
    }
    st.remap(views)
}
