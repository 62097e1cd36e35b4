//! Qwen3.5: Qwen3's attention layout (q/k head norms; the query product carrying a gate head
//! after each query head) on the full-attention layers, Gated DeltaNet layers between them,
//! (1 + w) RMSNorms. Published checkpoints keep the text model under
//! `model.language_model.`; the vision tower and the multi-token-prediction head are never read.

use super::family::{Family, LayerNames, LinearNames, Projection, SharedExpertNames};
use super::qwen3;

pub(super) const FAMILY: Family = Family {
    prefixes: &["model.language_model.", "model."],
    layer: LayerNames {
        linear: Some(LinearNames {
            in_proj: Projection::Separate(&[
                "{P}layers.{L}.linear_attn.in_proj_qkv.weight",
                "{P}layers.{L}.linear_attn.in_proj_z.weight",
                "{P}layers.{L}.linear_attn.in_proj_b.weight",
                "{P}layers.{L}.linear_attn.in_proj_a.weight",
            ]),
            conv: "{P}layers.{L}.linear_attn.conv1d.weight",
            a_log: "{P}layers.{L}.linear_attn.A_log",
            dt_bias: "{P}layers.{L}.linear_attn.dt_bias",
            norm: "{P}layers.{L}.linear_attn.norm.weight",
            out: "{P}layers.{L}.linear_attn.out_proj.weight",
        }),
        shared_expert: Some(SharedExpertNames {
            up: Projection::Separate(&[
                "{P}layers.{L}.mlp.shared_expert.gate_proj.weight",
                "{P}layers.{L}.mlp.shared_expert.up_proj.weight",
            ]),
            down: "{P}layers.{L}.mlp.shared_expert.down_proj.weight",
            gate: "{P}layers.{L}.mlp.shared_expert_gate.weight",
        }),
        ..qwen3::FAMILY.layer
    },
    norm_plus_one: true,
    ..qwen3::FAMILY
};
