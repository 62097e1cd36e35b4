//! GGUF mixture-of-experts models (`qwen3moe`, `gpt-oss`): the expert counts and widths from
//! metadata, GPT-OSS's sliding layers and YaRN, and the names of expert tensors.

use super::config::{Arch, DecoderSpec, SlidingWindow};
use super::error::LoadError;
use super::gguf::GgufFile;
use super::gguf_model::{invalid, opt_f32, req_u32};
use super::moe::{ExpertActivation, MoeSpec, RouterWeights};
use super::rope::RopeScaling;

/// The metadata prefix of a mixture-of-experts architecture.
pub(super) fn prefix(arch: Arch) -> Option<&'static str> {
    match arch {
        Arch::Qwen3Moe => Some("qwen3moe"),
        Arch::GptOss => Some("gpt-oss"),
        _ => None,
    }
}

/// `spec` (read as a Llama-like model under `p`) completed with its experts, and for GPT-OSS
/// its sinks, sliding layers and YaRN. llama.cpp always renormalizes Qwen3-MoE's chosen
/// weights and fixes GPT-OSS's activation constants; the files do not store them.
pub(super) fn moe_spec(file: &GgufFile, mut spec: DecoderSpec) -> Result<DecoderSpec, LoadError> {
    let Some(p) = prefix(spec.arch) else {
        return Ok(spec);
    };
    let key = |k: &str| format!("{p}.{k}");
    let gpt_oss = spec.arch == Arch::GptOss;
    let moe = MoeSpec {
        experts: req_u32(file, &key("expert_count"))?,
        top_k: req_u32(file, &key("expert_used_count"))?,
        intermediate: req_u32(file, &key("expert_feed_forward_length"))?,
        weights: RouterWeights::SoftmaxOfChosen,
        activation: if gpt_oss {
            ExpertActivation::ClampedSwiGlu {
                alpha: 1.702,
                limit: opt_f32(file, &key("swiglu_limit")).unwrap_or(7.0),
            }
        } else {
            ExpertActivation::SwiGlu
        },
        biases: gpt_oss,
        shared: false,
        // llama.cpp's files route every layer; a layer without a router keeps a dense MLP.
        sparse: (0..spec.layers)
            .map(|l| {
                file.tensor(&format!("blk.{l}.ffn_gate_inp.weight"))
                    .is_some()
            })
            .collect(),
    };
    moe.check().map_err(|e| invalid(file, e.to_string()))?;
    spec.moe = Some(moe);
    if !gpt_oss {
        spec.qk_norm = true;
        return Ok(spec);
    }
    spec.sinks = true;
    spec.norm_eps = opt_f32(file, &key("attention.layer_norm_rms_epsilon")).unwrap_or(1e-5);
    let window = req_u32(file, &key("attention.sliding_window"))?;
    // Sliding and full layers alternate, the first sliding (llama.cpp's pattern of 2).
    spec.window = Some(SlidingWindow {
        size: window,
        local: (0..spec.layers).map(|i| i % 2 == 0).collect(),
        rope: None,
    });
    let factor = opt_f32(file, &key("rope.scaling.factor")).unwrap_or(1.0);
    if factor > 1.0
        && let Some(rope) = spec.rope.as_mut()
    {
        let original = opt_f32(file, &key("rope.scaling.original_context_length"))
            .unwrap_or(spec.max_positions as f32 / factor);
        // GPT-OSS's published config: beta 32 / 1, no truncation of the correction range.
        rope.scaling = RopeScaling::Yarn {
            factor,
            beta_fast: opt_f32(file, &key("rope.scaling.yarn_beta_fast")).unwrap_or(32.0),
            beta_slow: opt_f32(file, &key("rope.scaling.yarn_beta_slow")).unwrap_or(1.0),
            original,
            truncate: false,
            attention_factor: 0.1 * factor.ln() + 1.0,
        };
    }
    Ok(spec)
}

/// The GGUF name of an expert-layer field (after `model.layers.N.`), where it has one.
pub(super) fn moe_tensor_name(field: &str, arch: Arch) -> Option<&'static str> {
    Some(match field {
        "mlp.gate.weight" | "mlp.router.weight" => "ffn_gate_inp.weight",
        "mlp.router.bias" => "ffn_gate_inp.bias",
        "mlp.experts.gate_proj" => "ffn_gate_exps.weight",
        "mlp.experts.up_proj" => "ffn_up_exps.weight",
        "mlp.experts.down_proj" => "ffn_down_exps.weight",
        "mlp.experts.gate_proj_bias" => "ffn_gate_exps.bias",
        "mlp.experts.up_proj_bias" => "ffn_up_exps.bias",
        "mlp.experts.down_proj_bias" => "ffn_down_exps.bias",
        "self_attn.sinks" => "attn_sinks.weight",
        // GPT-OSS's norm before the experts is llama.cpp's post-attention norm.
        "post_attention_layernorm.weight" if arch == Arch::GptOss => "post_attention_norm.weight",
        _ => return None,
    })
}
