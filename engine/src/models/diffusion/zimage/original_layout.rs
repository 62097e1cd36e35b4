//! Z-Image transformer weights in the model's original key layout, as the Z-Image repository
//! and ComfyUI's single files have them, read under diffusers' names without copying. The
//! mapping is the one diffusers' `convert_z_image_transformer_checkpoint_to_diffusers`
//! applies: an optional `model.diffusion_model.` prefix, `x_embedder.` and `final_layer.` for
//! the patch-size modules, `attention.out`, `attention.q_norm`/`k_norm`, and the fused
//! `attention.qkv` split into its query, key and value rows.

use std::path::Path;

use crate::Error;
use crate::load::{LoadError, SafeTensors};
use crate::models::diffusion::pipeline::transformer_files;

const PREFIX: &str = "model.diffusion_model.";

/// The transformer folder's weights under diffusers' names: `diffusion_pytorch_model*` in
/// either layout, or else the folder's one `.safetensors` file (a single file put there).
pub fn transformer_weights(dir: &Path, patch: u32) -> Result<SafeTensors, Error> {
    let st = transformer_files(dir)?;
    if is_original(&st) {
        return Ok(to_diffusers(&st, patch)?);
    }
    Ok(st)
}

fn is_original(st: &SafeTensors) -> bool {
    st.names().any(|n| {
        n.starts_with(PREFIX)
            || n.ends_with(".attention.qkv.weight")
            || n.starts_with("x_embedder.")
    })
}

/// Views of `st`'s tensors under diffusers' names.
fn to_diffusers(st: &SafeTensors, patch: u32) -> Result<SafeTensors, LoadError> {
    let mut views = Vec::new();
    for name in st.names() {
        let key = name.strip_prefix(PREFIX).unwrap_or(name);
        if key == "norm_final.weight" {
            continue;
        }
        let key = key
            .replace("final_layer.", &format!("all_final_layer.{patch}-1."))
            .replace("x_embedder.", &format!("all_x_embedder.{patch}-1."))
            .replace(".attention.out.", ".attention.to_out.0.")
            .replace(".attention.k_norm.", ".attention.norm_k.")
            .replace(".attention.q_norm.", ".attention.norm_q.");
        match key.strip_suffix(".attention.qkv.weight") {
            Some(block) => {
                let rows = st.get(name)?.shape.first().copied().unwrap_or(0);
                let third = rows / 3;
                for (i, which) in ["to_q", "to_k", "to_v"].into_iter().enumerate() {
                    let range = i * third..(i + 1) * third;
                    views.push((
                        format!("{block}.attention.{which}.weight"),
                        name,
                        Some(range),
                        None,
                    ));
                }
            }
            None => views.push((key, name, None, None)),
        }
    }
    st.remap(views)
}
