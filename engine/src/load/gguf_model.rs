//! GGUF models: the decoder description from GGUF metadata (`llama.block_count`,
//! `llama.rope.freq_base`, …) and tensor names mapped to the engine's. The tokenizer and chat
//! template come from `gguf_tokenizer.rs`.

use super::config::{Arch, DecoderSpec, MlpKind, SlidingWindow};
use super::error::LoadError;
use super::gguf::{GgufFile, GgufValue};
use super::rope::{RopeScaling, RopeSpec};
use crate::ops::NormKind;

pub(super) fn invalid(file: &GgufFile, message: String) -> LoadError {
    LoadError::Config {
        path: file.path.clone(),
        message,
    }
}

pub(super) fn req_u32(file: &GgufFile, key: &str) -> Result<u32, LoadError> {
    file.metadata(key)
        .and_then(GgufValue::as_u64)
        .and_then(|v| u32::try_from(v).ok())
        .filter(|&v| v > 0)
        .ok_or_else(|| invalid(file, format!("metadata {key:?} is missing or invalid")))
}

pub(super) fn opt_f32(file: &GgufFile, key: &str) -> Option<f32> {
    file.metadata(key)
        .and_then(GgufValue::as_f64)
        .map(|v| v as f32)
}

/// The GGUF architecture name (`general.architecture`).
pub fn gguf_architecture(file: &GgufFile) -> Result<Arch, LoadError> {
    let name = file
        .metadata("general.architecture")
        .and_then(GgufValue::as_str)
        .ok_or_else(|| invalid(file, "no general.architecture".into()))?;
    match name {
        "llama" => Ok(Arch::Llama),
        "qwen2" => Ok(Arch::Qwen2),
        "qwen3" => Ok(Arch::Qwen3),
        "phi3" => Ok(Arch::Phi3),
        "gpt2" => Ok(Arch::Gpt2),
        "gemma3" => Ok(Arch::Gemma3),
        "qwen3moe" => Ok(Arch::Qwen3Moe),
        "gpt-oss" => Ok(Arch::GptOss),
        "qwen35" | "qwen35moe" => Ok(Arch::Qwen35),
        other => Err(LoadError::UnsupportedArchitecture {
            name: other.to_owned(),
        }),
    }
}

pub fn gguf_spec(file: &GgufFile) -> Result<DecoderSpec, LoadError> {
    let arch = gguf_architecture(file)?;
    if arch == Arch::Gpt2 {
        return gpt2_spec(file);
    }
    // Metadata keys are prefixed with the architecture's name.
    let p = match arch {
        Arch::Qwen2 => "qwen2",
        Arch::Qwen3 => "qwen3",
        Arch::Phi3 => "phi3",
        Arch::Gemma3 => "gemma3",
        // Qwen3.5's dense and MoE files share the architecture; each keeps its own prefix.
        Arch::Qwen35 => match file
            .metadata("general.architecture")
            .and_then(GgufValue::as_str)
        {
            Some("qwen35moe") => "qwen35moe",
            _ => "qwen35",
        },
        other => super::gguf_moe::prefix(other).unwrap_or("llama"),
    };
    let key = |k: &str| format!("{p}.{k}");
    let hidden = req_u32(file, &key("embedding_length"))?;
    let heads = req_u32(file, &key("attention.head_count"))?;
    let kv_heads = file
        .metadata(&key("attention.head_count_kv"))
        .and_then(GgufValue::as_u64)
        .map_or(heads, |v| v as u32);
    let head_dim = file
        .metadata(&key("attention.key_length"))
        .and_then(GgufValue::as_u64)
        .map_or(hidden / heads, |v| v as u32);
    let vocab = file
        .metadata("tokenizer.ggml.tokens")
        .and_then(GgufValue::as_array)
        .map(|t| t.len() as u32)
        .or_else(|| {
            file.metadata(&key("vocab_size"))
                .and_then(GgufValue::as_u64)
                .map(|v| v as u32)
        })
        .ok_or_else(|| invalid(file, "no vocabulary size".into()))?;
    let scaling = match file
        .metadata(&key("rope.scaling.type"))
        .and_then(GgufValue::as_str)
    {
        // Longrope's factors are tensors and YaRN's are completed with the experts (gguf_moe).
        None | Some("none" | "longrope" | "su" | "yarn") => RopeScaling::None,
        Some("linear") => RopeScaling::Linear {
            factor: opt_f32(file, &key("rope.scaling.factor")).unwrap_or(1.0),
        },
        Some(other) => {
            return Err(invalid(
                file,
                format!("rope scaling {other:?} is not supported (linear is)"),
            ));
        }
    };
    let scaling = match longrope(file, &key)? {
        Some(longrope) => longrope,
        None => scaling,
    };
    // Llama 3.x scaling arrives as one divisor per frequency.
    let scaling = match file.tensor("rope_freqs.weight") {
        Some(t) if t.ggml_type == super::gguf::GgmlType::F32 => {
            let mut factors = vec![0.0f32; t.elements() as usize];
            super::quant::dequantize(t.ggml_type, file.data(t), &mut factors);
            if factors.iter().any(|f| !f.is_finite() || *f <= 0.0) {
                return Err(invalid(
                    file,
                    "rope_freqs.weight holds a non-positive factor".into(),
                ));
            }
            RopeScaling::Factors(factors)
        }
        Some(t) => {
            return Err(invalid(
                file,
                format!("rope_freqs.weight is {}, expected F32", t.ggml_type.name()),
            ));
        }
        None => scaling,
    };
    let tied = file.tensor("output.weight").is_none();
    let bos = file
        .metadata("tokenizer.ggml.bos_token_id")
        .and_then(GgufValue::as_u64)
        .map(|v| v as u32);
    // End-of-turn and end-of-message tokens (Llama 3 chats) stop generation like EOS does.
    let mut eos: Vec<u32> = Vec::new();
    for key in ["eos_token_id", "eot_token_id", "eom_token_id"] {
        let id = file
            .metadata(&format!("tokenizer.ggml.{key}"))
            .and_then(GgufValue::as_u64);
        if let Some(id) = id.map(|v| v as u32).filter(|id| !eos.contains(id)) {
            eos.push(id);
        }
    }
    let spec = DecoderSpec {
        arch,
        vocab,
        hidden,
        layers: req_u32(file, &key("block_count"))?,
        heads,
        kv_heads,
        head_dim,
        // Partial rotary (phi3 with Phi-4-mini's factor) is stored as the rotating dims.
        rotary_dim: file
            .metadata(&key("rope.dimension_count"))
            .and_then(GgufValue::as_u64)
            .map_or(head_dim, |v| v as u32),
        // Models whose every layer is sparse may give only the experts' width.
        intermediate: req_u32(file, &key("feed_forward_length"))
            .or_else(|_| req_u32(file, &key("expert_feed_forward_length")))?,
        norm: NormKind::Rms,
        norm_eps: opt_f32(file, &key("attention.layer_norm_rms_epsilon")).unwrap_or(1e-6),
        mlp: MlpKind::SwiGlu,
        rope: Some(RopeSpec {
            theta: opt_f32(file, &key("rope.freq_base")).unwrap_or(10_000.0),
            scaling,
        }),
        max_positions: file
            .metadata(&key("context_length"))
            .and_then(GgufValue::as_u64)
            .map_or(4096, |v| v as u32),
        tied_embeddings: tied,
        qkv_bias: file.tensor("blk.0.attn_q.bias").is_some(),
        out_bias: file.tensor("blk.0.attn_output.bias").is_some(),
        mlp_bias: false,
        qk_norm: file.tensor("blk.0.attn_q_norm.weight").is_some(),
        embed_scale: 1.0,
        attn_scale: None,
        post_norms: false,
        window: None,
        bos_token_id: bos,
        eos_token_ids: eos,
        moe: None,
        sinks: false,
        output_gate: false,
        linear: None,
    };
    if arch == Arch::Gemma3 {
        return gemma3_spec(file, spec);
    }
    if arch == Arch::Qwen35 {
        return super::qwen35::gguf_spec(file, p, spec).map_err(|m| invalid(file, m));
    }
    super::gguf_moe::moe_spec(file, spec)
}

/// An F32 vector tensor (RoPE factors), checked to be finite and positive.
fn factor_tensor(file: &GgufFile, name: &str) -> Result<Option<Vec<f32>>, LoadError> {
    let Some(t) = file.tensor(name) else {
        return Ok(None);
    };
    if t.ggml_type != super::gguf::GgmlType::F32 {
        return Err(invalid(
            file,
            format!("{name} is {}, expected F32", t.ggml_type.name()),
        ));
    }
    let mut factors = vec![0.0f32; t.elements() as usize];
    super::quant::dequantize(t.ggml_type, file.data(t), &mut factors);
    if factors.iter().any(|f| !f.is_finite() || *f <= 0.0) {
        return Err(invalid(file, format!("{name} holds a non-positive factor")));
    }
    Ok(Some(factors))
}

/// Phi-3.5 / Phi-4-mini longrope as llama.cpp's converter stores it: the two factor tensors,
/// the original context and the attention factor. Tables switch by sequence length as in
/// transformers (llama.cpp itself picks one set by the context size it runs with).
fn longrope(
    file: &GgufFile,
    key: &dyn Fn(&str) -> String,
) -> Result<Option<RopeScaling>, LoadError> {
    let short = factor_tensor(file, "rope_factors_short.weight")?;
    let long = factor_tensor(file, "rope_factors_long.weight")?;
    let (short, long) = match (short, long) {
        (Some(s), Some(l)) => (s, l),
        (None, None) => return Ok(None),
        _ => {
            return Err(invalid(
                file,
                "longrope needs both rope_factors_short and rope_factors_long".into(),
            ));
        }
    };
    let context = file
        .metadata(&key("context_length"))
        .and_then(GgufValue::as_u64)
        .unwrap_or(4096) as f32;
    let original = file
        .metadata(&key("rope.scaling.original_context_length"))
        .and_then(GgufValue::as_u64)
        .map_or(context, |v| v as f32)
        .max(1.0);
    let scale = context / original;
    let attention_factor =
        opt_f32(file, &key("rope.scaling.attn_factor")).unwrap_or(if scale > 1.0 {
            (1.0 + scale.ln() / original.ln()).sqrt()
        } else {
            1.0
        });
    Ok(Some(RopeScaling::LongRope {
        short,
        long,
        original: original as u32,
        attention_factor,
    }))
}

/// Gemma 3 (`gemma3`): what llama.cpp's graph builder adds to the common keys. Its converter
/// stores the norms' (1 + w) already added up, so they load as plain RMSNorm weights. The
/// local layers' pattern and RoPE base are fixed by llama.cpp (every 6th layer global, base
/// 10k) unless the file says otherwise.
fn gemma3_spec(file: &GgufFile, spec: DecoderSpec) -> Result<DecoderSpec, LoadError> {
    let key = |k: &str| format!("gemma3.{k}");
    let window = req_u32(file, &key("attention.sliding_window"))?;
    let local: Vec<bool> = match file.metadata(&key("attention.sliding_window_pattern")) {
        Some(GgufValue::Array(flags)) => flags
            .iter()
            .map(|f| matches!(f, GgufValue::Bool(true)) || f.as_u64() == Some(1))
            .collect(),
        Some(v) => {
            let every = v
                .as_u64()
                .filter(|&p| p > 0)
                .ok_or_else(|| invalid(file, "invalid attention.sliding_window_pattern".into()))?;
            (0..u64::from(spec.layers))
                .map(|i| (i + 1) % every != 0)
                .collect()
        }
        None => (0..spec.layers).map(|i| (i + 1) % 6 != 0).collect(),
    };
    if local.len() != spec.layers as usize {
        return Err(invalid(
            file,
            "attention.sliding_window_pattern does not cover every layer".into(),
        ));
    }
    let local_rope = RopeSpec {
        theta: opt_f32(file, &key("rope.freq_base_swa")).unwrap_or(10_000.0),
        scaling: RopeScaling::None,
    };
    // llama.cpp scales Gemma 3 27B's queries by hidden / heads (its query_pre_attn_scalar);
    // the other sizes use the head size. A file may state the scale (`attention.scale`).
    let scalar = if spec.layers == 62 {
        spec.hidden / spec.heads
    } else {
        spec.head_dim
    };
    let attn_scale = opt_f32(file, &key("attention.scale")).unwrap_or(1.0 / (scalar as f32).sqrt());
    Ok(DecoderSpec {
        mlp: MlpKind::GeGlu,
        embed_scale: (spec.hidden as f32).sqrt(),
        attn_scale: Some(attn_scale),
        post_norms: true,
        window: Some(SlidingWindow {
            size: window,
            local,
            rope: Some(local_rope),
        }),
        ..spec
    })
}

/// GPT-2 (`gpt2` architecture): LayerNorm with biases, learned positions, tanh GELU, biases on
/// every projection; llama.cpp's converter stores its Conv1D weights transposed to `[out][in]`.
fn gpt2_spec(file: &GgufFile) -> Result<DecoderSpec, LoadError> {
    let key = |k: &str| format!("gpt2.{k}");
    let hidden = req_u32(file, &key("embedding_length"))?;
    let heads = req_u32(file, &key("attention.head_count"))?;
    if heads == 0 || !hidden.is_multiple_of(heads) {
        return Err(invalid(
            file,
            format!("{heads} heads do not divide a width of {hidden}"),
        ));
    }
    let vocab = file
        .metadata("tokenizer.ggml.tokens")
        .and_then(GgufValue::as_array)
        .map(|t| t.len() as u32)
        .ok_or_else(|| invalid(file, "no tokenizer.ggml.tokens".into()))?;
    let token = |k: &str| {
        file.metadata(&format!("tokenizer.ggml.{k}"))
            .and_then(GgufValue::as_u64)
            .map(|v| v as u32)
    };
    Ok(DecoderSpec {
        arch: Arch::Gpt2,
        vocab,
        hidden,
        layers: req_u32(file, &key("block_count"))?,
        heads,
        kv_heads: heads,
        head_dim: hidden / heads,
        rotary_dim: hidden / heads,
        intermediate: req_u32(file, &key("feed_forward_length"))?,
        norm: NormKind::Layer,
        norm_eps: opt_f32(file, &key("attention.layer_norm_epsilon")).unwrap_or(1e-5),
        mlp: MlpKind::Gelu(crate::ops::Gelu::Tanh),
        rope: None,
        max_positions: req_u32(file, &key("context_length"))?,
        tied_embeddings: file.tensor("output.weight").is_none(),
        qkv_bias: true,
        out_bias: true,
        mlp_bias: true,
        qk_norm: false,
        embed_scale: 1.0,
        attn_scale: None,
        post_norms: false,
        window: None,
        bos_token_id: token("bos_token_id"),
        eos_token_ids: token("eos_token_id").into_iter().collect(),
        moe: None,
        sinks: false,
        output_gate: false,
        linear: None,
    })
}

/// GGUF names of GPT-2's HF tensors (with or without the `transformer.` prefix).
fn gpt2_tensor_name(hf: &str) -> Option<String> {
    let name = hf.strip_prefix("transformer.").unwrap_or(hf);
    let simple = match name {
        "wte.weight" => Some("token_embd.weight"),
        "wpe.weight" => Some("position_embd.weight"),
        "ln_f.weight" => Some("output_norm.weight"),
        "ln_f.bias" => Some("output_norm.bias"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(s) = simple {
        return Some(s.to_owned());
    }
    let (layer, field) = name.strip_prefix("h.")?.split_once('.')?;
    let (module, kind) = field.rsplit_once('.')?;
    let module = match module {
        "ln_1" => "attn_norm",
        "attn.c_attn" => "attn_qkv",
        "attn.c_proj" => "attn_output",
        "ln_2" => "ffn_norm",
        "mlp.c_fc" => "ffn_up",
        "mlp.c_proj" => "ffn_down",
        _ => return None,
    };
    Some(format!("blk.{layer}.{module}.{kind}"))
}

/// The GGUF name of an engine (HF) tensor name, and for Q/K of the llama architecture the
/// number of heads whose rows llama.cpp's converter interleaved for its rotary layout.
pub fn gguf_tensor_name(hf: &str, spec: &DecoderSpec) -> Option<(String, Option<u32>)> {
    if spec.arch == Arch::Gpt2 {
        return gpt2_tensor_name(hf).map(|n| (n, None));
    }
    let simple = match hf {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(s) = simple {
        return Some((s.to_owned(), None));
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, field) = rest.split_once('.')?;
    if let Some(name) = super::gguf_moe::moe_tensor_name(field, spec.arch) {
        return Some((format!("blk.{layer}.{name}"), None));
    }
    if spec.arch == Arch::Qwen35
        && let Some(name) = super::qwen35::gguf_tensor_name(field)
    {
        return Some((format!("blk.{layer}.{name}"), None));
    }
    let permuted = spec.arch == Arch::Llama;
    let gemma = spec.arch == Arch::Gemma3;
    let (name, heads) = match field {
        "input_layernorm.weight" => ("attn_norm.weight", None),
        "self_attn.q_proj.weight" => ("attn_q.weight", permuted.then_some(spec.heads)),
        "self_attn.k_proj.weight" => ("attn_k.weight", permuted.then_some(spec.kv_heads)),
        "self_attn.v_proj.weight" => ("attn_v.weight", None),
        "self_attn.q_proj.bias" => ("attn_q.bias", permuted.then_some(spec.heads)),
        "self_attn.k_proj.bias" => ("attn_k.bias", permuted.then_some(spec.kv_heads)),
        "self_attn.v_proj.bias" => ("attn_v.bias", None),
        "self_attn.o_proj.weight" => ("attn_output.weight", None),
        "self_attn.o_proj.bias" => ("attn_output.bias", None),
        "self_attn.q_norm.weight" => ("attn_q_norm.weight", None),
        "self_attn.qkv_proj.weight" => ("attn_qkv.weight", None),
        "mlp.gate_up_proj.weight" => ("ffn_up.weight", None),
        "self_attn.k_norm.weight" => ("attn_k_norm.weight", None),
        // Gemma's post-attention norm is on the attention output; its pre-MLP norm is
        // llama.cpp's ffn_norm.
        "post_attention_layernorm.weight" if gemma => ("post_attention_norm.weight", None),
        "post_attention_layernorm.weight" => ("ffn_norm.weight", None),
        "pre_feedforward_layernorm.weight" => ("ffn_norm.weight", None),
        "post_feedforward_layernorm.weight" => ("post_ffw_norm.weight", None),
        "mlp.gate_proj.weight" => ("ffn_gate.weight", None),
        "mlp.up_proj.weight" => ("ffn_up.weight", None),
        "mlp.down_proj.weight" => ("ffn_down.weight", None),
        _ => return None,
    };
    Some((format!("blk.{layer}.{name}"), heads))
}

/// Source row of HF row `row` in a Q/K matrix whose rows llama.cpp's converter permuted
/// (within each head, rows (j·hd/2 + i) were moved to (2i + j)).
pub fn unpermuted_row(row: usize, rows: usize, heads: u32) -> usize {
    let head_dim = rows / heads as usize;
    let half = head_dim / 2;
    let (h, r) = (row / head_dim, row % head_dim);
    let (j, i) = (r / half, r % half);
    h * head_dim + 2 * i + j
}

#[cfg(test)]
mod tests {
    use super::super::gguf::{GgmlType, GgufFile, GgufValue, write_gguf};
    use super::{gguf_spec, unpermuted_row};
    use crate::load::RopeScaling;

    #[test]
    fn llama_metadata_and_rope_factors_become_a_spec() {
        let factors: Vec<u8> = [1.0f32, 1.0, 2.0, 8.0]
            .iter()
            .flat_map(|f| f.to_le_bytes())
            .collect();
        let bytes = write_gguf(
            &[
                ("general.architecture", GgufValue::String("llama".into())),
                ("llama.embedding_length", GgufValue::U32(32)),
                ("llama.attention.head_count", GgufValue::U32(4)),
                ("llama.attention.head_count_kv", GgufValue::U32(2)),
                ("llama.block_count", GgufValue::U32(1)),
                ("llama.feed_forward_length", GgufValue::U32(64)),
                ("llama.rope.freq_base", GgufValue::F32(500000.0)),
                ("llama.vocab_size", GgufValue::U32(10)),
            ],
            &[("rope_freqs.weight", &[4], GgmlType::F32, &factors)],
        );
        let path = std::env::temp_dir().join(format!("backpack-spec-{}.gguf", std::process::id()));
        std::fs::write(&path, bytes).expect("write");
        let file = GgufFile::open(&path).expect("opens");
        let spec = gguf_spec(&file).expect("spec");
        let _ = std::fs::remove_file(&path);
        assert_eq!(
            (spec.hidden, spec.heads, spec.kv_heads, spec.head_dim),
            (32, 4, 2, 8)
        );
        assert!(spec.tied_embeddings);
        let rope = spec.rope.expect("rope");
        assert_eq!(rope.theta, 500000.0);
        assert_eq!(rope.scaling, RopeScaling::Factors(vec![1.0, 1.0, 2.0, 8.0]));
        let plain = crate::load::RopeSpec {
            theta: 500000.0,
            scaling: RopeScaling::None,
        }
        .inv_freq(8);
        let scaled = rope.inv_freq(8);
        assert_eq!(scaled[0], plain[0]);
        assert_eq!(scaled[3], plain[3] / 8.0);
    }

    #[test]
    fn unpermuting_inverts_the_converter() {
        // The converter: rows (h, j, i) -> (h, i, j) with j in 0..2 and i in 0..hd/2.
        let (heads, hd) = (3usize, 8usize);
        let rows = heads * hd;
        let mut permuted = vec![0usize; rows];
        for h in 0..heads {
            for j in 0..2 {
                for i in 0..hd / 2 {
                    permuted[h * hd + 2 * i + j] = h * hd + j * hd / 2 + i;
                }
            }
        }
        for row in 0..rows {
            assert_eq!(permuted[unpermuted_row(row, rows, heads as u32)], row);
        }
    }
}
