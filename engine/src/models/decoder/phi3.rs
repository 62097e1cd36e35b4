//! Phi-3 / Phi-3.5-mini / Phi-4-mini: the Llama layout with q/k/v in one `qkv_proj` and gate/up
//! in one `gate_up_proj`; partial rotary comes from the config.

use super::family::{Family, LayerNames, Projection};
use super::llama;

pub(super) const FAMILY: Family = Family {
    layer: LayerNames {
        qkv: Projection::Fused("{P}layers.{L}.self_attn.qkv_proj.weight"),
        qkv_bias: Projection::Fused("{P}layers.{L}.self_attn.qkv_proj.bias"),
        up: Projection::Fused("{P}layers.{L}.mlp.gate_up_proj.weight"),
        up_bias: Projection::Fused("{P}layers.{L}.mlp.gate_up_proj.bias"),
        ..llama::FAMILY.layer
    },
    ..llama::FAMILY
};
