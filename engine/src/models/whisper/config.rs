//! Whisper's `config.json` (shapes) and `generation_config.json` (decoding defaults), read
//! the way transformers reads them.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use crate::load::{LoadError, read_json};

/// The shapes of a Whisper checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct WhisperConfig {
    pub d_model: u32,
    pub encoder_layers: u32,
    pub encoder_heads: u32,
    pub encoder_ffn: u32,
    pub decoder_layers: u32,
    pub decoder_heads: u32,
    pub decoder_ffn: u32,
    pub n_mels: u32,
    /// Encoder positions: 1500 for 30 s windows (3000 mel frames, halved by the stride).
    pub max_source_positions: u32,
    pub max_target_positions: u32,
    pub vocab: u32,
    pub scale_embedding: bool,
    pub decoder_start_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
}

fn field(c: &Value, key: &str, path: &Path) -> Result<u32, LoadError> {
    c.get(key)
        .and_then(Value::as_u64)
        .and_then(|v| u32::try_from(v).ok())
        .filter(|&v| v > 0)
        .ok_or_else(|| LoadError::Config {
            path: path.to_owned(),
            message: format!("{key} is missing or not a positive integer"),
        })
}

fn id(c: &Value, key: &str) -> Option<u32> {
    match c.get(key)? {
        Value::Number(n) => n.as_u64().and_then(|v| u32::try_from(v).ok()),
        // Some configs list several end tokens: the first is the one that ends a transcript.
        Value::Array(list) => list
            .first()
            .and_then(Value::as_u64)
            .and_then(|v| u32::try_from(v).ok()),
        _ => None,
    }
}

impl WhisperConfig {
    pub fn from_file(path: &Path) -> Result<Self, LoadError> {
        let c = read_json(path)?;
        let model_type = c.get("model_type").and_then(Value::as_str).unwrap_or("");
        if model_type != "whisper" {
            return Err(LoadError::Config {
                path: path.to_owned(),
                message: format!(
                    "model_type {model_type:?} is not a Whisper speech model (model_type \"whisper\")"
                ),
            });
        }
        let activation = c
            .get("activation_function")
            .and_then(Value::as_str)
            .unwrap_or("gelu");
        if activation != "gelu" {
            return Err(LoadError::Config {
                path: path.to_owned(),
                message: format!("activation_function {activation:?} is not supported (gelu is)"),
            });
        }
        let cfg = Self {
            d_model: field(&c, "d_model", path)?,
            encoder_layers: field(&c, "encoder_layers", path)?,
            encoder_heads: field(&c, "encoder_attention_heads", path)?,
            encoder_ffn: field(&c, "encoder_ffn_dim", path)?,
            decoder_layers: field(&c, "decoder_layers", path)?,
            decoder_heads: field(&c, "decoder_attention_heads", path)?,
            decoder_ffn: field(&c, "decoder_ffn_dim", path)?,
            n_mels: field(&c, "num_mel_bins", path)?,
            max_source_positions: field(&c, "max_source_positions", path)?,
            max_target_positions: field(&c, "max_target_positions", path)?,
            vocab: field(&c, "vocab_size", path)?,
            scale_embedding: c
                .get("scale_embedding")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            decoder_start_token_id: id(&c, "decoder_start_token_id"),
            eos_token_id: id(&c, "eos_token_id"),
        };
        for (heads, what) in [
            (cfg.encoder_heads, "encoder_attention_heads"),
            (cfg.decoder_heads, "decoder_attention_heads"),
        ] {
            if !cfg.d_model.is_multiple_of(heads) || !(cfg.d_model / heads).is_multiple_of(4) {
                return Err(LoadError::Config {
                    path: path.to_owned(),
                    message: format!(
                        "d_model {} over {what} {heads} is not a head size the kernels support (a multiple of 4)",
                        cfg.d_model
                    ),
                });
            }
        }
        Ok(cfg)
    }

    /// Mel frames one window holds (two per encoder position).
    pub fn window_frames(&self) -> u32 {
        self.max_source_positions * 2
    }

    pub fn parameters(&self) -> u64 {
        let d = u64::from(self.d_model);
        let enc =
            u64::from(self.encoder_layers) * (4 * d * d + 2 * d * u64::from(self.encoder_ffn));
        let dec =
            u64::from(self.decoder_layers) * (8 * d * d + 2 * d * u64::from(self.decoder_ffn));
        let stem = 3 * d * (u64::from(self.n_mels) + d);
        let tables = d
            * (u64::from(self.vocab)
                + u64::from(self.max_source_positions)
                + u64::from(self.max_target_positions));
        enc + dec + stem + tables
    }
}

/// Decoding defaults from `generation_config.json`; every field may be missing.
#[derive(Clone, Debug, Default)]
pub struct WhisperGeneration {
    pub is_multilingual: Option<bool>,
    pub lang_to_id: BTreeMap<String, u32>,
    pub task_to_id: BTreeMap<String, u32>,
    pub no_timestamps_token_id: Option<u32>,
    pub decoder_start_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
    pub suppress_tokens: Vec<u32>,
    pub begin_suppress_tokens: Vec<u32>,
    pub max_initial_timestamp_index: Option<u32>,
    pub prev_sot_token_id: Option<u32>,
}

fn id_map(v: Option<&Value>) -> BTreeMap<String, u32> {
    v.and_then(Value::as_object)
        .map(|o| {
            o.iter()
                .filter_map(|(k, v)| Some((k.clone(), u32::try_from(v.as_u64()?).ok()?)))
                .collect()
        })
        .unwrap_or_default()
}

fn id_list(v: Option<&Value>) -> Vec<u32> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| u32::try_from(v.as_u64()?).ok())
                .collect()
        })
        .unwrap_or_default()
}

impl WhisperGeneration {
    /// Reads `generation_config.json` in `dir`; a missing file gives the empty defaults.
    pub fn from_dir(dir: &Path) -> Result<Self, LoadError> {
        let path = dir.join("generation_config.json");
        if !path.is_file() {
            return Ok(Self::default());
        }
        let c = read_json(&path)?;
        Ok(Self {
            is_multilingual: c.get("is_multilingual").and_then(Value::as_bool),
            lang_to_id: id_map(c.get("lang_to_id")),
            task_to_id: id_map(c.get("task_to_id")),
            no_timestamps_token_id: id(&c, "no_timestamps_token_id"),
            decoder_start_token_id: id(&c, "decoder_start_token_id"),
            eos_token_id: id(&c, "eos_token_id"),
            suppress_tokens: id_list(c.get("suppress_tokens")),
            begin_suppress_tokens: id_list(c.get("begin_suppress_tokens")),
            max_initial_timestamp_index: id(&c, "max_initial_timestamp_index"),
            prev_sot_token_id: id(&c, "prev_sot_token_id"),
        })
    }
}
