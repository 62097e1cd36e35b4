//! Qwen3.5's config (`qwen3_5_text`, or the `text_config` of a published
//! `Qwen3_5ForConditionalGeneration`): Qwen3's gated full attention on every
//! `full_attention_interval`-th layer, Gated DeltaNet layers between them. Defaults are
//! transformers' `Qwen3_5TextConfig`'s.

use serde_json::Value;

use super::config::{Arch, DecoderSpec, SpecError, opt_f32, opt_u32};
use super::moe::{ExpertActivation, MoeSpec, RouterWeights};
use crate::ops::DeltaNetShape;

/// The linear-attention layers of a hybrid model: their head layout, and which layers they
/// are (the others attend over the KV cache).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinearLayers {
    pub shape: DeltaNetShape,
    /// Per layer: whether it is a Gated DeltaNet layer.
    pub linear: Vec<bool>,
    /// Value head h reads key head h mod key_heads (GGUF's order, which llama.cpp's converter
    /// tiles) rather than h / (value_heads / key_heads) (the checkpoints' grouped order).
    pub tiled_heads: bool,
}

impl LinearLayers {
    pub fn is_linear(&self, layer: u32) -> bool {
        self.linear.get(layer as usize).copied().unwrap_or(false)
    }

    /// Parameters of one linear layer's mixer: the stacked input product, the output product,
    /// the convolution, A, dt_bias and the output norm.
    pub fn mixer_parameters(&self, hidden: u32) -> u64 {
        let s = &self.shape;
        let width = u64::from(s.projected_width());
        let values = u64::from(s.value_heads) * u64::from(s.value_dim);
        (width + values) * u64::from(hidden)
            + u64::from(s.channels()) * u64::from(s.conv_kernel)
            + 2 * u64::from(s.value_heads)
            + u64::from(s.value_dim)
    }
}

/// The text model of a published multimodal checkpoint, or the config itself; values only the
/// outer config holds are carried over.
fn text_of(c: &Value) -> Value {
    let Some(text) = c.get("text_config").filter(|t| t.is_object()) else {
        return c.clone();
    };
    let mut text = text.clone();
    if let (Some(t), Some(outer)) = (text.as_object_mut(), c.as_object()) {
        for key in ["eos_token_id", "bos_token_id", "tie_word_embeddings"] {
            if let (false, Some(v)) = (t.contains_key(key), outer.get(key)) {
                t.insert(key.to_owned(), v.clone());
            }
        }
    }
    text
}

/// Which layers are linear: `layer_types`, else every layer but each
/// `full_attention_interval`-th (4 by default).
fn linear_layers(c: &Value, layers: u32) -> Result<Vec<bool>, SpecError> {
    if let Some(types) = c.get("layer_types").and_then(Value::as_array) {
        if types.len() != layers as usize {
            return Err(SpecError::Invalid(format!(
                "layer_types lists {} layers, the model has {layers}",
                types.len()
            )));
        }
        return types
            .iter()
            .map(|t| match t.as_str() {
                Some("linear_attention") => Ok(true),
                Some("full_attention") => Ok(false),
                other => Err(SpecError::Invalid(format!(
                    "layer type {other:?} is neither linear_attention nor full_attention"
                ))),
            })
            .collect();
    }
    let interval = opt_u32(c, "full_attention_interval").unwrap_or(4).max(1);
    Ok((0..layers).map(|i| (i + 1) % interval != 0).collect())
}

/// Qwen3.5 (dense).
pub(super) fn qwen3_5(c: &Value) -> Result<DecoderSpec, SpecError> {
    let text = text_of(c);
    let c = &text;
    let mut with_defaults = c.clone();
    if let Some(obj) = with_defaults.as_object_mut() {
        for (key, value) in [
            ("head_dim", 256.into()),
            ("rms_norm_eps", 1e-6.into()),
            ("num_key_value_heads", 4.into()),
        ] {
            obj.entry(key).or_insert(value);
        }
        // Partial rotary (a quarter of each head by default), as rope_parameters or the top
        // level give it.
        let partial = c
            .get("rope_parameters")
            .and_then(|p| opt_f32(p, "partial_rotary_factor"))
            .or_else(|| opt_f32(c, "partial_rotary_factor"))
            .unwrap_or(0.25);
        obj.insert("partial_rotary_factor".into(), f64::from(partial).into());
        if let Some(params) = obj
            .get_mut("rope_parameters")
            .and_then(Value::as_object_mut)
        {
            params.insert("partial_rotary_factor".into(), f64::from(partial).into());
        }
    }
    let mut spec = super::config::llama_like(&with_defaults, Arch::Qwen35)?;
    spec.qk_norm = true;
    spec.output_gate = true;
    let shape = DeltaNetShape {
        key_heads: opt_u32(c, "linear_num_key_heads").unwrap_or(16),
        value_heads: opt_u32(c, "linear_num_value_heads").unwrap_or(32),
        key_dim: opt_u32(c, "linear_key_head_dim").unwrap_or(128),
        value_dim: opt_u32(c, "linear_value_head_dim").unwrap_or(128),
        conv_kernel: opt_u32(c, "linear_conv_kernel_dim").unwrap_or(4),
    };
    shape.check().map_err(SpecError::Invalid)?;
    spec.linear = Some(LinearLayers {
        shape,
        linear: linear_layers(c, spec.layers)?,
        tiled_heads: false,
    });
    Ok(spec)
}

/// Qwen3.5-MoE: Qwen3.5's layers with routed experts (a softmax over all experts, top-k,
/// renormalized: the softmax of the chosen logits) and a gated shared expert on every layer.
/// The shared expert's width stands as the dense MLP's.
pub(super) fn qwen3_5_moe(c: &Value) -> Result<DecoderSpec, SpecError> {
    let mut text = text_of(c);
    let shared = opt_u32(&text, "shared_expert_intermediate_size").unwrap_or(512);
    if let Some(obj) = text.as_object_mut() {
        obj.insert("intermediate_size".into(), shared.into());
    }
    let mut spec = qwen3_5(&text)?;
    let moe = MoeSpec {
        experts: opt_u32(&text, "num_experts").unwrap_or(256),
        top_k: opt_u32(&text, "num_experts_per_tok").unwrap_or(8),
        intermediate: opt_u32(&text, "moe_intermediate_size").unwrap_or(512),
        weights: RouterWeights::SoftmaxOfChosen,
        activation: ExpertActivation::SwiGlu,
        biases: false,
        sparse: vec![true; spec.layers as usize],
        shared: true,
    };
    moe.check()?;
    spec.moe = Some(moe);
    Ok(spec)
}

/// Completes a GGUF `qwen35` spec (read as a Llama-like model) with its linear layers, as
/// llama.cpp's converter writes them: `ssm.*` shapes, `full_attention_interval`, and value
/// heads tiled over the key heads.
pub(super) fn gguf_spec(
    file: &super::GgufFile,
    prefix: &str,
    mut spec: DecoderSpec,
) -> Result<DecoderSpec, String> {
    let key = |k: &str| {
        file.metadata(&format!("{prefix}.{k}"))
            .and_then(super::GgufValue::as_u64)
            .and_then(|v| u32::try_from(v).ok())
    };
    let need = |k: &str| key(k).ok_or_else(|| format!("no {prefix}.{k}"));
    let value_heads = need("ssm.time_step_rank")?;
    let inner = need("ssm.inner_size")?;
    if value_heads == 0 || !inner.is_multiple_of(value_heads) {
        return Err(format!(
            "ssm.inner_size {inner} is not a whole number of {value_heads} heads"
        ));
    }
    let shape = DeltaNetShape {
        key_heads: need("ssm.group_count")?,
        value_heads,
        key_dim: need("ssm.state_size")?,
        value_dim: inner / value_heads,
        conv_kernel: need("ssm.conv_kernel")?,
    };
    shape.check()?;
    // Multi-token-prediction layers follow the model's own and are not run.
    spec.layers = spec
        .layers
        .saturating_sub(key("nextn_predict_layers").unwrap_or(0));
    let interval = key("full_attention_interval").unwrap_or(4).max(1);
    spec.qk_norm = true;
    spec.output_gate = true;
    spec.linear = Some(LinearLayers {
        shape,
        linear: (0..spec.layers).map(|i| (i + 1) % interval != 0).collect(),
        tiled_heads: true,
    });
    // `qwen35moe`: routed experts and the shared expert on every layer.
    if let Some(experts) = key("expert_count") {
        let moe = MoeSpec {
            experts,
            top_k: need("expert_used_count")?,
            intermediate: need("expert_feed_forward_length")?,
            weights: RouterWeights::SoftmaxOfChosen,
            activation: ExpertActivation::SwiGlu,
            biases: false,
            sparse: vec![true; spec.layers as usize],
            shared: true,
        };
        moe.check().map_err(|e| e.to_string())?;
        spec.intermediate = need("expert_shared_feed_forward_length")?;
        spec.moe = Some(moe);
    }
    Ok(spec)
}

/// The GGUF name of a Qwen3.5 layer tensor (HF `field` under `model.layers.N.`).
pub(super) fn gguf_tensor_name(field: &str) -> Option<&'static str> {
    Some(match field {
        "post_attention_layernorm.weight" => "post_attention_norm.weight",
        "linear_attn.in_proj_qkv.weight" => "attn_qkv.weight",
        "linear_attn.in_proj_z.weight" => "attn_gate.weight",
        "linear_attn.in_proj_b.weight" => "ssm_beta.weight",
        "linear_attn.in_proj_a.weight" => "ssm_alpha.weight",
        "linear_attn.conv1d.weight" => "ssm_conv1d.weight",
        "linear_attn.A_log" => "ssm_a",
        "linear_attn.dt_bias" => "ssm_dt.bias",
        "linear_attn.norm.weight" => "ssm_norm.weight",
        "linear_attn.out_proj.weight" => "ssm_out.weight",
        "mlp.shared_expert.gate_proj.weight" => "ffn_gate_shexp.weight",
        "mlp.shared_expert.up_proj.weight" => "ffn_up_shexp.weight",
        "mlp.shared_expert.down_proj.weight" => "ffn_down_shexp.weight",
        "mlp.shared_expert_gate.weight" => "ffn_gate_inp_shexp.weight",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The published form: the text settings under `text_config`, rope settings under
    /// rope_parameters with the multimodal sections, tying at the top level.
    #[test]
    fn nested_text_configs_read_with_their_defaults() {
        let c = serde_json::json!({
            "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
            "tie_word_embeddings": true,
            "text_config": {
                "model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 1024,
                "intermediate_size": 3584, "num_hidden_layers": 8, "num_attention_heads": 8,
                "num_key_value_heads": 2, "linear_num_key_heads": 16,
                "linear_num_value_heads": 16, "eos_token_id": 248044,
                "rope_parameters": {"mrope_interleaved": true, "mrope_section": [11, 11, 10],
                    "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                    "rope_type": "default"}
            }
        });
        let spec = DecoderSpec::from_json(&c).expect("spec");
        assert_eq!(spec.arch, Arch::Qwen35);
        assert_eq!((spec.head_dim, spec.rotary_dim), (256, 64));
        assert!(spec.tied_embeddings && spec.qk_norm && spec.output_gate);
        assert_eq!(spec.eos_token_ids, [248_044]);
        assert_eq!(spec.rope.as_ref().expect("rope").theta, 1e7);
        let linear = spec.linear.as_ref().expect("linear layers");
        assert_eq!(
            linear.linear,
            [true, true, true, false, true, true, true, false]
        );
        assert_eq!(
            (
                linear.shape.key_dim,
                linear.shape.value_dim,
                linear.shape.conv_kernel
            ),
            (128, 128, 4)
        );
        let bad = serde_json::json!({
            "model_type": "qwen3_5_text", "vocab_size": 10, "hidden_size": 64,
            "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
            "layer_types": ["linear_attention", "sliding_attention"]
        });
        assert!(DecoderSpec::from_json(&bad).is_err());
    }

    /// The MoE form: routed experts on every layer, the shared expert's width as the dense
    /// MLP's (the config has no intermediate_size).
    #[test]
    fn moe_configs_read_their_experts_and_shared_expert() {
        let c = serde_json::json!({
            "model_type": "qwen3_5_moe",
            "text_config": {
                "model_type": "qwen3_5_moe_text", "vocab_size": 248320, "hidden_size": 2048,
                "num_hidden_layers": 40, "num_attention_heads": 16, "num_key_value_heads": 2,
                "num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
                "shared_expert_intermediate_size": 512, "linear_num_value_heads": 32
            }
        });
        let spec = DecoderSpec::from_json(&c).expect("spec");
        let moe = spec.moe.as_ref().expect("experts");
        assert_eq!((moe.experts, moe.top_k, moe.intermediate), (256, 8, 512));
        assert!(moe.shared && moe.sparse.iter().all(|&s| s) && moe.sparse.len() == 40);
        assert_eq!(spec.intermediate, 512);
        assert_eq!(moe.weights, RouterWeights::SoftmaxOfChosen);
        // Published as 35B total, 3B active.
        let billions = |n: u64| n as f64 / 1e9;
        assert!(
            (33.0..37.0).contains(&billions(spec.parameters())),
            "{}",
            spec.parameters()
        );
        assert!((2.5..3.8).contains(&billions(spec.active_parameters())));
    }
}
