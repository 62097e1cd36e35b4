//! GPT-2: LayerNorm with biases, learned absolute positions, fused q/k/v (`c_attn`), GELU MLP,
//! biases everywhere, and Conv1D weights stored `[in][out]`. Checkpoints name their tensors
//! with or without the `transformer.` prefix.

use super::family::{Family, LayerNames, Projection};

pub(super) const FAMILY: Family = Family {
    prefixes: &["transformer.", ""],
    embedding: "{P}wte.weight",
    positions: Some("{P}wpe.weight"),
    final_norm: "{P}ln_f.weight",
    final_norm_bias: Some("{P}ln_f.bias"),
    lm_head: "lm_head.weight",
    layer: LayerNames {
        attn_norm: "{P}h.{L}.ln_1.weight",
        attn_norm_bias: Some("{P}h.{L}.ln_1.bias"),
        qkv: Projection::Fused("{P}h.{L}.attn.c_attn.weight"),
        qkv_bias: Projection::Fused("{P}h.{L}.attn.c_attn.bias"),
        q_norm: None,
        k_norm: None,
        o: "{P}h.{L}.attn.c_proj.weight",
        o_bias: "{P}h.{L}.attn.c_proj.bias",
        mlp_norm: "{P}h.{L}.ln_2.weight",
        mlp_norm_bias: Some("{P}h.{L}.ln_2.bias"),
        post_attn_norm: None,
        post_mlp_norm: None,
        up: Projection::Separate(&["{P}h.{L}.mlp.c_fc.weight"]),
        up_bias: Projection::Separate(&["{P}h.{L}.mlp.c_fc.bias"]),
        down: "{P}h.{L}.mlp.c_proj.weight",
        down_bias: "{P}h.{L}.mlp.c_proj.bias",
        sinks: None,
        linear: None,
        shared_expert: None,
    },
    norm_plus_one: false,
    transposed: true,
};
