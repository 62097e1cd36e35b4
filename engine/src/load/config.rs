//! HF `config.json` → the decoder description the engine builds from. Accepts both the older
//! keys (`rope_theta`, `rope_scaling`, `torch_dtype`) and the newer (`rope_parameters`, `dtype`).

use std::path::Path;

use serde_json::Value;

use super::error::{LoadError, read_json};
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
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MlpKind {
    /// down(silu(gate(x)) * up(x))
    SwiGlu,
    /// down(gelu(fc(x))), tanh or erf form.
    Gelu(Gelu),
}

#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    Linear {
        factor: f32,
    },
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position_embeddings: f32,
    },
    /// One divisor per frequency (GGUF's `rope_freqs.weight`, how llama.cpp stores Llama 3.x
    /// scaling).
    Factors(Vec<f32>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct RopeSpec {
    pub theta: f32,
    pub scaling: RopeScaling,
}

impl RopeSpec {
    /// Inverse frequencies for a head of `head_dim`, as transformers computes them (f32).
    pub fn inv_freq(&self, head_dim: u32) -> Vec<f32> {
        let base: Vec<f32> = (0..head_dim / 2)
            .map(|i| 1.0 / self.theta.powf((2 * i) as f32 / head_dim as f32))
            .collect();
        match self.scaling {
            RopeScaling::None => base,
            RopeScaling::Linear { factor } => base.iter().map(|f| f / factor).collect(),
            RopeScaling::Factors(ref factors) => base
                .iter()
                .zip(factors.iter().chain(std::iter::repeat(&1.0)))
                .map(|(f, d)| f / d)
                .collect(),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: old,
            } => {
                let low_freq_wavelen = old / low_freq_factor;
                let high_freq_wavelen = old / high_freq_factor;
                base.iter()
                    .map(|&f| {
                        let wavelen = 2.0 * std::f32::consts::PI / f;
                        if wavelen < high_freq_wavelen {
                            f
                        } else if wavelen > low_freq_wavelen {
                            f / factor
                        } else {
                            let smooth = (old / wavelen - low_freq_factor)
                                / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect()
            }
        }
    }
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
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
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
            "phi3" | "Phi3ForCausalLM" => llama_like(c, Arch::Phi3),
            "gpt2" | "GPT2LMHeadModel" => gpt2(c),
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
        let mlp = match self.mlp {
            MlpKind::SwiGlu => 3 * d * i,
            MlpKind::Gelu(_) => 2 * d * i,
        };
        let per_layer = d * (q + 2 * kv) + q * d + mlp + 4 * d;
        let embed = u64::from(self.vocab) * d;
        let head = if self.tied_embeddings { 0 } else { embed };
        let positions = if self.rope.is_none() {
            u64::from(self.max_positions) * d
        } else {
            0
        };
        embed + head + positions + u64::from(self.layers) * per_layer
    }
}

#[derive(Debug)]
pub enum SpecError {
    Unsupported(String),
    Invalid(String),
}

fn get_u32(c: &Value, key: &str) -> Result<u32, SpecError> {
    c.get(key)
        .and_then(Value::as_u64)
        .and_then(|v| u32::try_from(v).ok())
        .filter(|&v| v > 0)
        .ok_or_else(|| SpecError::Invalid(format!("missing or invalid {key:?}")))
}

fn opt_u32(c: &Value, key: &str) -> Option<u32> {
    c.get(key)
        .and_then(Value::as_u64)
        .and_then(|v| u32::try_from(v).ok())
}

fn opt_f32(c: &Value, key: &str) -> Option<f32> {
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

fn rope_spec(c: &Value) -> Result<RopeSpec, SpecError> {
    // Newer configs put everything under rope_parameters; older ones use rope_theta plus an
    // optional rope_scaling object.
    let params = c.get("rope_parameters").filter(|v| v.is_object());
    let scaling = params
        .or_else(|| c.get("rope_scaling").filter(|v| v.is_object()))
        .cloned()
        .unwrap_or(Value::Null);
    let theta = params
        .and_then(|p| opt_f32(p, "rope_theta"))
        .or_else(|| opt_f32(c, "rope_theta"))
        .unwrap_or(10_000.0);
    let kind = scaling
        .get("rope_type")
        .or_else(|| scaling.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let factor = || {
        opt_f32(&scaling, "factor")
            .filter(|f| *f > 0.0)
            .ok_or_else(|| SpecError::Invalid(format!("rope scaling {kind:?} needs a factor")))
    };
    let scaling = match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: factor()? },
        "llama3" => RopeScaling::Llama3 {
            factor: factor()?,
            low_freq_factor: opt_f32(&scaling, "low_freq_factor").unwrap_or(1.0),
            high_freq_factor: opt_f32(&scaling, "high_freq_factor").unwrap_or(4.0),
            original_max_position_embeddings: opt_f32(&scaling, "original_max_position_embeddings")
                .unwrap_or(8192.0),
        },
        other => {
            return Err(SpecError::Invalid(format!(
                "rope scaling type {other:?} is not supported (supported: default, linear, llama3)"
            )));
        }
    };
    Ok(RopeSpec { theta, scaling })
}

fn llama_like(c: &Value, arch: Arch) -> Result<DecoderSpec, SpecError> {
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
    // Attention limited to a sliding window is exact only while every key fits in it, so the
    // context stops there (rolling caches for windowed layers are not built yet).
    let max_positions = opt_u32(c, "max_position_embeddings").unwrap_or(4096);
    let max_positions = match opt_u32(c, "sliding_window").filter(|w| *w > 0) {
        Some(window) if c.get("use_sliding_window").and_then(Value::as_bool) != Some(false) => {
            max_positions.min(window)
        }
        _ => max_positions,
    };
    Ok(DecoderSpec {
        arch,
        vocab: get_u32(c, "vocab_size")?,
        hidden,
        layers: get_u32(c, "num_hidden_layers")?,
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
        bos_token_id: opt_u32(c, "bos_token_id"),
        eos_token_ids: token_ids(c.get("eos_token_id")),
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
        bos_token_id: opt_u32(c, "bos_token_id"),
        eos_token_ids: token_ids(c.get("eos_token_id")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
        // A window shorter than the context caps it; a declared but unused one does not.
        let mistral =
            llama_config(serde_json::json!({"model_type": "mistral", "sliding_window": 100}));
        assert_eq!(
            DecoderSpec::from_json(&mistral)
                .expect("parses")
                .max_positions,
            100
        );
        let qwen = llama_config(serde_json::json!({
            "model_type": "qwen2", "sliding_window": 100, "use_sliding_window": false
        }));
        assert_eq!(
            DecoderSpec::from_json(&qwen).expect("parses").max_positions,
            128
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
    fn llama3_frequencies_follow_the_three_bands() {
        let spec = RopeSpec {
            theta: 10000.0,
            scaling: RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 32.0,
            },
        };
        let plain = RopeSpec {
            theta: 10000.0,
            scaling: RopeScaling::None,
        };
        let scaled = spec.inv_freq(16);
        let base = plain.inv_freq(16);
        // Highest frequency (wavelength 2π < 8) untouched; lowest divided by the factor.
        assert_eq!(scaled[0], base[0]);
        assert!((scaled[7] - base[7] / 8.0).abs() < 1e-12);
        // Something in between is smoothed strictly between the two.
        assert!(
            scaled
                .iter()
                .zip(&base)
                .any(|(s, b)| *s < *b && *s > *b / 8.0)
        );
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
