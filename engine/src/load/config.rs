//! HF `config.json` → the decoder description the engine builds from. Accepts both the older
//! keys (`rope_theta`, `rope_scaling`, `torch_dtype`) and the newer (`rope_parameters`, `dtype`).

use std::path::Path;

use serde_json::Value;

pub use super::qwen35::LinearLayers;

use super::error::{LoadError, read_json};
use super::moe::MoeSpec;
use super::rope::{RopeSpec, rope_spec, rope_with};
use crate::ops::{Gelu, NormKind};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2/3.x, SmolLM2, TinyLlama, Mistral.
    Llama,
    /// Qwen2 / Qwen2.5: Llama with q/k/v biases.
    Qwen2,
    /// Qwen3 (dense): Llama with an RMSNorm over each query and key head before RoPE.
    Qwen3,
    /// Phi-3 / Phi-3.5-mini / Phi-4-mini: Llama with fused qkv and gate/up projections and
    /// partial rotary.
    Phi3,
    /// GPT-2: learned positions, LayerNorm, GELU, Conv1D weight layout.
    Gpt2,
    /// Gemma 3 (text): scaled embedding, (1 + w) RMSNorms before and after attention and MLP,
    /// q/k head norms, GeGLU, local sliding-window layers between global ones.
    Gemma3,
    /// Qwen3-MoE: Qwen3's attention, routed experts in the sparse layers.
    Qwen3Moe,
    /// GPT-OSS: biased attention with per-head sinks, sliding and full layers alternating,
    /// YaRN, biased router and experts with the clamped SwiGLU.
    GptOss,
    /// Qwen3.5: Gated DeltaNet layers, and on every fourth layer Qwen3's attention with a
    /// sigmoid output gate and partial rotary; (1 + w) RMSNorms.
    Qwen35,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MlpKind {
    /// down(silu(gate(x)) * up(x))
    SwiGlu,
    /// down(gelu(fc(x))), tanh or erf form.
    Gelu(Gelu),
    /// down(gelu_tanh(gate(x)) * up(x)) (Gemma).
    GeGlu,
}

impl MlpKind {
    /// Whether the MLP has a gate projection beside the up projection.
    pub fn gated(self) -> bool {
        matches!(self, Self::SwiGlu | Self::GeGlu)
    }
}

/// Attention limited to the last `size` positions (the query's own included) on some layers.
#[derive(Clone, Debug, PartialEq)]
pub struct SlidingWindow {
    pub size: u32,
    /// Per layer: whether it attends through the window (else to the whole context).
    pub local: Vec<bool>,
    /// The RoPE of windowed layers where it differs from the global one (Gemma 3).
    pub rope: Option<RopeSpec>,
}

/// Everything about a decoder-only transformer that its weights alone do not say.
#[derive(Clone, Debug)]
pub struct DecoderSpec {
    pub arch: Arch,
    pub vocab: u32,
    pub hidden: u32,
    pub layers: u32,
    pub heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    /// Leading dims of each head that RoPE rotates (head_dim unless the rotary is partial).
    pub rotary_dim: u32,
    pub intermediate: u32,
    pub norm: NormKind,
    pub norm_eps: f32,
    pub mlp: MlpKind,
    /// None: learned absolute positions.
    pub rope: Option<RopeSpec>,
    pub max_positions: u32,
    pub tied_embeddings: bool,
    /// Attention and MLP biases (GPT-2 has all; Qwen2 only on q/k/v).
    pub qkv_bias: bool,
    pub out_bias: bool,
    pub mlp_bias: bool,
    /// RMSNorm over each query and key head (head_dim wide, own weights) before RoPE.
    pub qk_norm: bool,
    /// Factor applied to gathered token embeddings (Gemma: √hidden).
    pub embed_scale: f32,
    /// Softmax scale of attention scores; None is 1/√head_dim.
    pub attn_scale: Option<f32>,
    /// Norms on the attention and MLP outputs before each residual add (Gemma).
    pub post_norms: bool,
    pub window: Option<SlidingWindow>,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// Routed experts in place of the dense MLP on the layers it marks sparse.
    pub moe: Option<MoeSpec>,
    /// A learned logit per query head that joins every softmax's denominator (GPT-OSS).
    pub sinks: bool,
    /// The attention output is gated by sigmoid(gate) per value, each query head's gate rows
    /// following its rows in the query product (Qwen3.5).
    pub output_gate: bool,
    /// Linear-attention (Gated DeltaNet) layers in place of attention on the layers it marks.
    pub linear: Option<LinearLayers>,
}

impl DecoderSpec {
    pub fn from_file(path: &Path) -> Result<Self, LoadError> {
        let json = read_json(path)?;
        Self::from_json(&json).map_err(|message| match message {
            SpecError::Unsupported(name) => LoadError::UnsupportedArchitecture { name },
            SpecError::Invalid(message) => LoadError::Config {
                path: path.to_owned(),
                message,
            },
        })
    }

    pub fn from_json(c: &Value) -> Result<Self, SpecError> {
        let model_type = c
            .get("model_type")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .or_else(|| {
                c.get("architectures")
                    .and_then(|a| a.get(0))
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
            .ok_or_else(|| SpecError::Invalid("no model_type or architectures".into()))?;
        match model_type.as_str() {
            "llama" | "mistral" | "LlamaForCausalLM" | "MistralForCausalLM" => {
                llama_like(c, Arch::Llama)
            }
            "qwen2" | "Qwen2ForCausalLM" => llama_like(c, Arch::Qwen2),
            "qwen3" | "Qwen3ForCausalLM" => llama_like(c, Arch::Qwen3),
            "qwen3_moe" | "Qwen3MoeForCausalLM" => qwen3_moe(c),
            "gpt_oss" | "GptOssForCausalLM" => gpt_oss(c),
            "qwen3_5"
            | "qwen3_5_text"
            | "Qwen3_5ForConditionalGeneration"
            | "Qwen3_5ForCausalLM" => super::qwen35::qwen3_5(c),
            "qwen3_5_moe"
            | "qwen3_5_moe_text"
            | "Qwen3_5MoeForConditionalGeneration"
            | "Qwen3_5MoeForCausalLM" => super::qwen35::qwen3_5_moe(c),
            "phi3" | "Phi3ForCausalLM" => llama_like(c, Arch::Phi3),
            "gpt2" | "GPT2LMHeadModel" => gpt2(c),
            "gemma3_text" | "Gemma3ForCausalLM" => gemma3(c),
            // Multimodal checkpoints: the text model's config, the vision tower skipped.
            "gemma3" | "Gemma3ForConditionalGeneration" => gemma3(&text_config(c)),
            other => Err(SpecError::Unsupported(other.to_owned())),
        }
    }

    /// Parameter count (weights only).
    pub fn parameters(&self) -> u64 {
        let d = u64::from(self.hidden);
        let hd = u64::from(self.head_dim);
        let q = u64::from(self.heads) * hd;
        let kv = u64::from(self.kv_heads) * hd;
        let i = u64::from(self.intermediate);
        let dense_mlp = if self.mlp.gated() { 3 } else { 2 } * d * i;
        let gate = if self.output_gate { q } else { 0 };
        let attention = d * (q + gate + 2 * kv) + q * d + 4 * d;
        let embed = u64::from(self.vocab) * d;
        let head = if self.tied_embeddings { 0 } else { embed };
        let positions = if self.rope.is_none() {
            u64::from(self.max_positions) * d
        } else {
            0
        };
        let mlps: u64 = (0..self.layers)
            .map(|layer| match &self.moe {
                Some(moe) if moe.is_sparse(layer) => {
                    // A shared expert is a dense MLP with a one-row gate.
                    let shared = if moe.shared { dense_mlp + d } else { 0 };
                    moe.layer_parameters(self.hidden).0 + shared
                }
                _ => dense_mlp,
            })
            .sum();
        let mixers: u64 = (0..self.layers)
            .map(|layer| match &self.linear {
                Some(l) if l.is_linear(layer) => l.mixer_parameters(self.hidden) + 2 * d,
                _ => attention,
            })
            .sum();
        embed + head + positions + mixers + mlps
    }

    /// Parameters one token reads: all but the experts it is not routed to (the total for
    /// dense models).
    pub fn active_parameters(&self) -> u64 {
        let Some(moe) = &self.moe else {
            return self.parameters();
        };
        let (total, active) = moe.layer_parameters(self.hidden);
        let sparse = (0..self.layers).filter(|&l| moe.is_sparse(l)).count() as u64;
        self.parameters() - sparse * (total - active)
    }

    /// Softmax scale of attention scores.
    pub fn attention_scale(&self) -> f32 {
        self.attn_scale
            .unwrap_or(1.0 / (self.head_dim as f32).sqrt())
    }

    /// Whether layer `i` attends through the sliding window.
    pub fn is_local(&self, layer: u32) -> bool {
        self.window
            .as_ref()
            .is_some_and(|w| w.local.get(layer as usize).copied().unwrap_or(false))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("unsupported model architecture {0:?}")]
    Unsupported(String),
    #[error("{0}")]
    Invalid(String),
}

fn get_u32(c: &Value, key: &str) -> Result<u32, SpecError> {
    c.get(key)
        .and_then(Value::as_u64)
        .and_then(|v| u32::try_from(v).ok())
        .filter(|&v| v > 0)
        .ok_or_else(|| SpecError::Invalid(format!("missing or invalid {key:?}")))
}

pub(super) fn opt_u32(c: &Value, key: &str) -> Option<u32> {
    c.get(key)
        .and_then(Value::as_u64)
        .and_then(|v| u32::try_from(v).ok())
}

pub(super) fn opt_f32(c: &Value, key: &str) -> Option<f32> {
    c.get(key).and_then(Value::as_f64).map(|v| v as f32)
}

fn token_ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|n| vec![n as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|n| n.as_u64().map(|n| n as u32))
            .collect(),
        _ => Vec::new(),
    }
}

pub(super) fn llama_like(c: &Value, arch: Arch) -> Result<DecoderSpec, SpecError> {
    let hidden = get_u32(c, "hidden_size")?;
    let heads = get_u32(c, "num_attention_heads")?;
    let kv_heads = opt_u32(c, "num_key_value_heads").unwrap_or(heads);
    let head_dim = opt_u32(c, "head_dim")
        .filter(|&d| d > 0)
        .unwrap_or(hidden / heads);
    let attention_bias = c
        .get("attention_bias")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    // Phi-3.5 / Phi-4-mini rotate only part of each head; transformers 5 keeps the factor
    // under rope_parameters, older configs at the top level.
    let partial = c
        .get("rope_parameters")
        .and_then(|p| opt_f32(p, "partial_rotary_factor"))
        .or_else(|| opt_f32(c, "partial_rotary_factor"))
        .unwrap_or(1.0);
    if !(partial > 0.0 && partial <= 1.0) {
        return Err(SpecError::Invalid(format!(
            "partial_rotary_factor {partial} is not in (0, 1]"
        )));
    }
    let rotary_dim = ((head_dim as f32 * partial) as u32) & !1;
    let max_positions = opt_u32(c, "max_position_embeddings").unwrap_or(4096);
    let layers = get_u32(c, "num_hidden_layers")?;
    Ok(DecoderSpec {
        arch,
        vocab: get_u32(c, "vocab_size")?,
        hidden,
        layers,
        heads,
        kv_heads,
        head_dim,
        rotary_dim,
        intermediate: get_u32(c, "intermediate_size")?,
        norm: NormKind::Rms,
        norm_eps: opt_f32(c, "rms_norm_eps").unwrap_or(1e-6),
        mlp: MlpKind::SwiGlu,
        rope: Some(rope_spec(c)?),
        max_positions,
        tied_embeddings: c
            .get("tie_word_embeddings")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        qkv_bias: arch == Arch::Qwen2 || attention_bias,
        out_bias: attention_bias,
        mlp_bias: c.get("mlp_bias").and_then(Value::as_bool).unwrap_or(false),
        qk_norm: arch == Arch::Qwen3,
        embed_scale: 1.0,
        attn_scale: None,
        post_norms: false,
        window: sliding_window(c, layers, None)?,
        bos_token_id: opt_u32(c, "bos_token_id"),
        eos_token_ids: token_ids(c.get("eos_token_id")),
        moe: None,
        sinks: false,
        output_gate: false,
        linear: None,
    })
}

/// Qwen3-MoE: Qwen3's layers, sparse MLPs as `moe::qwen3_moe` reads them.
fn qwen3_moe(c: &Value) -> Result<DecoderSpec, SpecError> {
    let mut spec = llama_like(c, Arch::Qwen3Moe)?;
    spec.qk_norm = true;
    spec.moe = Some(super::moe::qwen3_moe(c, spec.layers)?);
    Ok(spec)
}

/// GPT-OSS: biased attention with sinks over sliding and full layers (`layer_types`), YaRN,
/// experts on every layer.
fn gpt_oss(c: &Value) -> Result<DecoderSpec, SpecError> {
    let mut spec = llama_like(c, Arch::GptOss)?;
    spec.qkv_bias = c
        .get("attention_bias")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    spec.out_bias = spec.qkv_bias;
    spec.norm_eps = opt_f32(c, "rms_norm_eps").unwrap_or(1e-5);
    spec.sinks = true;
    spec.moe = Some(super::moe::gpt_oss(c, spec.layers)?);
    Ok(spec)
}

/// The sliding window a config declares, if it is in use: on the layers `layer_types` calls
/// `sliding_attention`, else on every `pattern`-th layer's neighbours (Gemma), else on every
/// layer (Mistral; Qwen2/3 from `max_window_layers` on, and only with `use_sliding_window`).
fn sliding_window(
    c: &Value,
    layers: u32,
    pattern: Option<u32>,
) -> Result<Option<SlidingWindow>, SpecError> {
    let Some(size) = opt_u32(c, "sliding_window").filter(|w| *w > 0) else {
        return Ok(None);
    };
    if c.get("use_sliding_window").and_then(Value::as_bool) == Some(false) {
        return Ok(None);
    }
    let local: Vec<bool> = match c.get("layer_types").and_then(Value::as_array) {
        Some(types) => {
            if types.len() != layers as usize {
                return Err(SpecError::Invalid(format!(
                    "layer_types lists {} layers, the model has {layers}",
                    types.len()
                )));
            }
            types
                .iter()
                .map(|t| t.as_str() == Some("sliding_attention"))
                .collect()
        }
        None => {
            let from = opt_u32(c, "max_window_layers").unwrap_or(0);
            (0..layers)
                .map(|i| match pattern {
                    Some(p) => (i + 1) % p != 0,
                    None => i >= from,
                })
                .collect()
        }
    };
    if !local.contains(&true) {
        return Ok(None);
    }
    Ok(Some(SlidingWindow {
        size,
        local,
        rope: None,
    }))
}

/// The text model's config of a multimodal Gemma 3 checkpoint; ids the outer config holds
/// (EOS, BOS) are carried over.
fn text_config(c: &Value) -> Value {
    let mut text = c.get("text_config").cloned().unwrap_or(Value::Null);
    if let (Some(t), Some(outer)) = (text.as_object_mut(), c.as_object()) {
        for key in ["eos_token_id", "bos_token_id", "tie_word_embeddings"] {
            if let (false, Some(v)) = (t.contains_key(key), outer.get(key)) {
                t.insert(key.to_owned(), v.clone());
            }
        }
        t.insert("model_type".into(), "gemma3_text".into());
    }
    text
}

/// Gemma 3 text models. Keys the published configs leave out take transformers'
/// `Gemma3TextConfig` defaults (the 4B+ `text_config` lists only what differs).
fn gemma3(c: &Value) -> Result<DecoderSpec, SpecError> {
    if !c.is_object() {
        return Err(SpecError::Invalid(
            "no text_config for the Gemma 3 text model".into(),
        ));
    }
    let num = |key: &str, default: u32| opt_u32(c, key).filter(|v| *v > 0).unwrap_or(default);
    let hidden = num("hidden_size", 2304);
    let heads = num("num_attention_heads", 8);
    let head_dim = num("head_dim", 256);
    let layers = num("num_hidden_layers", 26);
    let act = c
        .get("hidden_activation")
        .or_else(|| c.get("hidden_act"))
        .and_then(Value::as_str)
        .unwrap_or("gelu_pytorch_tanh");
    if !matches!(act, "gelu_pytorch_tanh" | "gelu_new" | "gelu_fast") {
        return Err(SpecError::Invalid(format!(
            "Gemma activation {act:?} is not supported (gelu_pytorch_tanh is)"
        )));
    }
    for key in ["final_logit_softcapping", "attn_logit_softcapping"] {
        if c.get(key).is_some_and(|v| !v.is_null()) {
            return Err(SpecError::Invalid(format!("{key} is not supported")));
        }
    }
    // transformers 5: rope_parameters per layer type; older: rope_theta and rope_scaling for
    // global layers, rope_local_base_freq for local ones.
    let per_type = c
        .get("rope_parameters")
        .filter(|p| p.get("full_attention").is_some());
    let (global, local) = match per_type {
        Some(p) => (
            rope_with(p.get("full_attention"), 1_000_000.0, c)?,
            rope_with(p.get("sliding_attention"), 10_000.0, c)?,
        ),
        None => (
            rope_with(
                c.get("rope_scaling").filter(|v| v.is_object()),
                opt_f32(c, "rope_theta").unwrap_or(1_000_000.0),
                c,
            )?,
            rope_with(
                None,
                opt_f32(c, "rope_local_base_freq").unwrap_or(10_000.0),
                c,
            )?,
        ),
    };
    let pattern = opt_u32(c, "sliding_window_pattern")
        .or_else(|| opt_u32(c, "_sliding_window_pattern"))
        .unwrap_or(6);
    let window = match c.get("sliding_window") {
        Some(Value::Null) => None,
        Some(_) => sliding_window(c, layers, Some(pattern))?,
        None => sliding_window(
            &serde_json::json!({"sliding_window": 4096}),
            layers,
            Some(pattern),
        )?,
    }
    .map(|w| SlidingWindow {
        rope: Some(local),
        ..w
    });
    Ok(DecoderSpec {
        arch: Arch::Gemma3,
        vocab: num("vocab_size", 262_208),
        hidden,
        layers,
        heads,
        kv_heads: num("num_key_value_heads", 4),
        head_dim,
        rotary_dim: head_dim,
        intermediate: num("intermediate_size", 9216),
        norm: NormKind::Rms,
        norm_eps: opt_f32(c, "rms_norm_eps").unwrap_or(1e-6),
        mlp: MlpKind::GeGlu,
        rope: Some(global),
        max_positions: num("max_position_embeddings", 131_072),
        tied_embeddings: c
            .get("tie_word_embeddings")
            .and_then(Value::as_bool)
            .unwrap_or(true),
        qkv_bias: c
            .get("attention_bias")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        out_bias: c
            .get("attention_bias")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        mlp_bias: false,
        qk_norm: true,
        embed_scale: (hidden as f32).sqrt(),
        attn_scale: Some(1.0 / (num("query_pre_attn_scalar", 256) as f32).sqrt()),
        post_norms: true,
        window,
        bos_token_id: opt_u32(c, "bos_token_id").or(Some(2)),
        eos_token_ids: match token_ids(c.get("eos_token_id")) {
            ids if ids.is_empty() => vec![1],
            ids => ids,
        },
        moe: None,
        sinks: false,
        output_gate: false,
        linear: None,
    })
}

fn gpt2(c: &Value) -> Result<DecoderSpec, SpecError> {
    let hidden = get_u32(c, "n_embd")?;
    let heads = get_u32(c, "n_head")?;
    let act = c
        .get("activation_function")
        .and_then(Value::as_str)
        .unwrap_or("gelu_new");
    let gelu = match act {
        "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Gelu::Tanh,
        "gelu" => Gelu::Erf,
        other => {
            return Err(SpecError::Invalid(format!(
                "GPT-2 activation {other:?} is not supported (supported: gelu_new, gelu)"
            )));
        }
    };
    Ok(DecoderSpec {
        arch: Arch::Gpt2,
        vocab: get_u32(c, "vocab_size")?,
        hidden,
        layers: get_u32(c, "n_layer")?,
        heads,
        kv_heads: heads,
        head_dim: hidden / heads,
        rotary_dim: hidden / heads,
        intermediate: opt_u32(c, "n_inner").unwrap_or(4 * hidden),
        norm: NormKind::Layer,
        norm_eps: opt_f32(c, "layer_norm_epsilon").unwrap_or(1e-5),
        mlp: MlpKind::Gelu(gelu),
        rope: None,
        max_positions: opt_u32(c, "n_positions")
            .or_else(|| opt_u32(c, "n_ctx"))
            .unwrap_or(1024),
        tied_embeddings: c
            .get("tie_word_embeddings")
            .and_then(Value::as_bool)
            .unwrap_or(true),
        qkv_bias: true,
        out_bias: true,
        mlp_bias: true,
        qk_norm: false,
        embed_scale: 1.0,
        attn_scale: None,
        post_norms: false,
        window: None,
        bos_token_id: opt_u32(c, "bos_token_id"),
        eos_token_ids: token_ids(c.get("eos_token_id")),
        moe: None,
        sinks: false,
        output_gate: false,
        linear: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::RopeScaling;

    fn llama_config(extra: serde_json::Value) -> Value {
        let mut c = serde_json::json!({
            "model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
            "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 100,
            "vocab_size": 300, "rms_norm_eps": 1e-5, "max_position_embeddings": 128
        });
        if let (Some(a), Some(b)) = (c.as_object_mut(), extra.as_object()) {
            a.extend(b.clone());
        }
        c
    }

    #[test]
    fn partial_rotary_and_sliding_windows_are_read() {
        let phi = llama_config(serde_json::json!({
            "model_type": "phi3", "head_dim": 32,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                "partial_rotary_factor": 0.75}
        }));
        let spec = DecoderSpec::from_json(&phi).expect("phi3 parses");
        assert_eq!(
            (spec.arch, spec.head_dim, spec.rotary_dim),
            (Arch::Phi3, 32, 24)
        );
        let old_key = llama_config(serde_json::json!({"partial_rotary_factor": 0.5}));
        assert_eq!(
            DecoderSpec::from_json(&old_key).expect("parses").rotary_dim,
            8
        );
        let bad = llama_config(serde_json::json!({"partial_rotary_factor": 1.5}));
        assert!(DecoderSpec::from_json(&bad).is_err());
        // Mistral's window covers every layer; a declared but unused one is no window.
        let mistral =
            llama_config(serde_json::json!({"model_type": "mistral", "sliding_window": 100}));
        let spec = DecoderSpec::from_json(&mistral).expect("parses");
        assert_eq!(spec.max_positions, 128);
        let window = spec.window.expect("a window");
        assert_eq!((window.size, window.local), (100, vec![true, true]));
        let qwen = llama_config(serde_json::json!({
            "model_type": "qwen2", "sliding_window": 100, "use_sliding_window": false
        }));
        assert!(
            DecoderSpec::from_json(&qwen)
                .expect("parses")
                .window
                .is_none()
        );
        let qwen3 = llama_config(serde_json::json!({"model_type": "qwen3", "head_dim": 24}));
        let spec = DecoderSpec::from_json(&qwen3).expect("qwen3 parses");
        assert!(spec.qk_norm && !spec.qkv_bias && spec.head_dim == 24);
    }

    #[test]
    fn old_and_new_rope_keys_agree() {
        let old = llama_config(serde_json::json!({
            "rope_theta": 500000.0,
            "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
        }));
        let new = llama_config(serde_json::json!({
            "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 8192}
        }));
        let a = DecoderSpec::from_json(&old).expect("old keys parse");
        let b = DecoderSpec::from_json(&new).expect("new keys parse");
        assert_eq!(a.rope, b.rope);
        assert_eq!(a.rope.as_ref().map(|r| r.theta), Some(500000.0));
        assert_eq!(a.head_dim, 16);
    }

    #[test]
    fn gemma3_configs_old_and_new_read_alike() {
        // google/gemma-3-1b-it's config (transformers 4.50 keys).
        let one_b = serde_json::json!({
            "architectures": ["Gemma3ForCausalLM"], "attention_bias": false,
            "attn_logit_softcapping": null, "bos_token_id": 2, "eos_token_id": [1, 106],
            "final_logit_softcapping": null, "head_dim": 256,
            "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152,
            "intermediate_size": 6912, "max_position_embeddings": 32768,
            "model_type": "gemma3_text", "num_attention_heads": 4, "num_hidden_layers": 26,
            "num_key_value_heads": 1, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
            "rope_local_base_freq": 10000, "rope_scaling": null, "rope_theta": 1000000,
            "sliding_window": 512, "sliding_window_pattern": 6, "vocab_size": 262144
        });
        let spec = DecoderSpec::from_json(&one_b).expect("gemma 3 1b parses");
        assert_eq!(spec.arch, Arch::Gemma3);
        assert_eq!((spec.heads, spec.kv_heads, spec.head_dim), (4, 1, 256));
        assert_eq!(spec.eos_token_ids, vec![1, 106]);
        assert!(spec.tied_embeddings && spec.qk_norm && spec.post_norms);
        assert_eq!(spec.mlp, MlpKind::GeGlu);
        assert!((spec.embed_scale - 1152f32.sqrt()).abs() < 1e-4);
        assert_eq!(spec.attention_scale(), 1.0 / 16.0);
        let window = spec.window.as_ref().expect("sliding window");
        assert_eq!(window.size, 512);
        // Every sixth layer is global.
        let globals: Vec<u32> = (0..26).filter(|&i| !spec.is_local(i)).collect();
        assert_eq!(globals, vec![5, 11, 17, 23]);
        let local = window.rope.as_ref().expect("local rope");
        assert_eq!(
            (local.theta, spec.rope.as_ref().map(|r| r.theta)),
            (10_000.0, Some(1_000_000.0))
        );
        // gemma-3-4b-it: a multimodal config whose text_config lists only what differs.
        let four_b = serde_json::json!({
            "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
            "eos_token_id": [1, 106],
            "text_config": {"hidden_size": 2560, "intermediate_size": 10240,
                            "model_type": "gemma3_text", "num_hidden_layers": 34,
                            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                            "sliding_window": 1024},
            "vision_config": {"model_type": "siglip_vision_model"}
        });
        let spec = DecoderSpec::from_json(&four_b).expect("gemma 3 4b parses");
        assert_eq!(
            (spec.hidden, spec.layers, spec.heads, spec.kv_heads),
            (2560, 34, 8, 4)
        );
        assert_eq!(spec.vocab, 262_208);
        assert_eq!(spec.eos_token_ids, vec![1, 106]);
        assert_eq!(
            spec.rope.as_ref().map(|r| r.scaling.clone()),
            Some(RopeScaling::Linear { factor: 8.0 })
        );
        // transformers 5 keys: layer_types and per-type rope_parameters.
        let new = serde_json::json!({
            "model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 3,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            "sliding_window": 4,
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}
            }
        });
        let spec = DecoderSpec::from_json(&new).expect("new keys parse");
        assert_eq!(
            (0..3).map(|i| spec.is_local(i)).collect::<Vec<_>>(),
            vec![true, false, true]
        );
        assert_eq!(
            spec.rope.as_ref().map(|r| (r.theta, r.scaling.clone())),
            Some((1_000_000.0, RopeScaling::Linear { factor: 8.0 }))
        );
        let soft =
            serde_json::json!({"model_type": "gemma3_text", "final_logit_softcapping": 30.0});
        assert!(DecoderSpec::from_json(&soft).is_err());
    }

    #[test]
    fn longrope_reads_both_factor_sets_and_the_attention_factor() {
        let short: Vec<f32> = (0..8).map(|i| 1.0 + i as f32 / 16.0).collect();
        let long: Vec<f32> = (0..8).map(|i| 1.0 + i as f32).collect();
        let phi = llama_config(serde_json::json!({
            "model_type": "phi3", "max_position_embeddings": 131072,
            "original_max_position_embeddings": 4096,
            "rope_scaling": {"type": "longrope", "short_factor": short, "long_factor": long}
        }));
        let spec = DecoderSpec::from_json(&phi).expect("longrope parses");
        let rope = spec.rope.expect("rope");
        let (long_inv, original, attention_factor) = rope.longrope(16).expect("longrope");
        assert_eq!(original, 4096);
        let want = (1.0 + 32f32.ln() / 4096f32.ln()).sqrt();
        assert!((attention_factor - want).abs() < 1e-6);
        let plain = RopeSpec {
            theta: rope.theta,
            scaling: RopeScaling::None,
        }
        .inv_freq(16);
        let short_inv = rope.inv_freq(16);
        for i in 0..8 {
            assert!((short_inv[i] - plain[i] / short[i]).abs() <= 1e-7 * plain[i]);
            assert!((long_inv[i] - plain[i] / long[i]).abs() <= 1e-7 * plain[i]);
        }
        let missing = llama_config(serde_json::json!({
            "model_type": "phi3", "rope_scaling": {"type": "longrope", "short_factor": [1.0]}
        }));
        assert!(DecoderSpec::from_json(&missing).is_err());
    }

    #[test]
    fn unknown_architectures_are_named() {
        let c = serde_json::json!({"model_type": "mamba"});
        match DecoderSpec::from_json(&c) {
            Err(SpecError::Unsupported(name)) => assert_eq!(name, "mamba"),
            other => panic!("expected an unsupported-architecture error, got {other:?}"),
        }
    }
}
