//! Llama 2/3.x, SmolLM2, TinyLlama, Mistral, and Qwen2/Qwen2.5 (the same layout with q/k/v
//! biases, which its config announces): RMSNorm before attention and MLP, separate q/k/v and
//! gate/up projections, RoPE.

use super::family::{Family, LayerNames, Projection};

pub(super) const FAMILY: Family = Family {
    prefixes: &["model.", ""],
    embedding: "{P}embed_tokens.weight",
    positions: None,
    final_norm: "{P}norm.weight",
    final_norm_bias: None,
    lm_head: "lm_head.weight",
    layer: LayerNames {
        attn_norm: "{P}layers.{L}.input_layernorm.weight",
        attn_norm_bias: None,
        qkv: Projection::Separate(&[
            "{P}layers.{L}.self_attn.q_proj.weight",
            "{P}layers.{L}.self_attn.k_proj.weight",
            "{P}layers.{L}.self_attn.v_proj.weight",
        ]),
        qkv_bias: Projection::Separate(&[
            "{P}layers.{L}.self_attn.q_proj.bias",
            "{P}layers.{L}.self_attn.k_proj.bias",
            "{P}layers.{L}.self_attn.v_proj.bias",
        ]),
        q_norm: None,
        k_norm: None,
        o: "{P}layers.{L}.self_attn.o_proj.weight",
        o_bias: "{P}layers.{L}.self_attn.o_proj.bias",
        mlp_norm: "{P}layers.{L}.post_attention_layernorm.weight",
        mlp_norm_bias: None,
        post_attn_norm: None,
        post_mlp_norm: None,
        up: Projection::Separate(&[
            "{P}layers.{L}.mlp.gate_proj.weight",
            "{P}layers.{L}.mlp.up_proj.weight",
        ]),
        up_bias: Projection::Separate(&[
            "{P}layers.{L}.mlp.gate_proj.bias",
            "{P}layers.{L}.mlp.up_proj.bias",
        ]),
        down: "{P}layers.{L}.mlp.down_proj.weight",
        down_bias: "{P}layers.{L}.mlp.down_proj.bias",
        sinks: None,
        linear: None,
        shared_expert: None,
    },
    norm_plus_one: false,
    transposed: false,
};
