//! Gemma 3 (text): the Llama projections with four (1 + w) RMSNorms per layer — before and
//! after attention, before and after the MLP — and q/k head norms. The √hidden embedding
//! scale, GeGLU, the attention scale and the local/global layers come from the config.
//! Multimodal checkpoints keep the text model under `language_model.`; the vision tower is
//! never read.

use super::family::{Family, LayerNames};
use super::llama;

pub(super) const FAMILY: Family = Family {
    prefixes: &["model.", "language_model.model.", "model.language_model."],
    layer: LayerNames {
        q_norm: Some("{P}layers.{L}.self_attn.q_norm.weight"),
        k_norm: Some("{P}layers.{L}.self_attn.k_norm.weight"),
        post_attn_norm: Some("{P}layers.{L}.post_attention_layernorm.weight"),
        mlp_norm: "{P}layers.{L}.pre_feedforward_layernorm.weight",
        post_mlp_norm: Some("{P}layers.{L}.post_feedforward_layernorm.weight"),
        ..llama::FAMILY.layer
    },
    norm_plus_one: true,
    ..llama::FAMILY
};
