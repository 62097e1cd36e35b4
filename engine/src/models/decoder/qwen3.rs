//! Qwen3 (dense): the Llama layout, plus an RMSNorm over each query and key head before RoPE
//! (`q_norm`, `k_norm`, head_dim wide), with head_dim set apart from hidden / heads.

use super::family::{Family, LayerNames};
use super::llama;

pub(super) const FAMILY: Family = Family {
    layer: LayerNames {
        q_norm: Some("{P}layers.{L}.self_attn.q_norm.weight"),
        k_norm: Some("{P}layers.{L}.self_attn.k_norm.weight"),
        ..llama::FAMILY.layer
    },
    ..llama::FAMILY
};
