//! The golden fixtures of tests/reference/make_tiny_models.py: what transformers computed for
//! each tiny model (tokenization, chat prompts, prompt logits at every position, per-step
//! logits and greedy continuations), and loading the models they were computed for.

use std::path::{Path, PathBuf};

use backpack_engine::load::ChatMessage;
use backpack_engine::models::{ModelOptions, TextModel};
use backpack_engine::ops::WeightDType;
use serde::Deserialize;

use super::gpu;

#[derive(Deserialize)]
pub struct Golden {
    pub cases: Vec<Case>,
    pub tokenization: Vec<TokenCase>,
}

#[derive(Deserialize)]
pub struct Case {
    pub name: String,
    pub mode: String,
    pub prompt: Option<String>,
    pub messages: Option<Vec<ChatMessage>>,
    pub prompt_ids: Vec<u32>,
    pub prompt_logits: Vec<Vec<f32>>,
    pub greedy_tokens: Vec<u32>,
    pub step_logits: Vec<Vec<f32>>,
    pub top2_margins: Vec<f32>,
    /// Mixture-of-experts models: per position (prompt, then each step's input), the smallest
    /// gap over the sparse layers between the last router logit a token was routed by and the
    /// next one.
    #[serde(default)]
    pub routing_margins: Option<Vec<f32>>,
}

impl Case {
    /// Whether every token up to position `pos` was routed by a margin of at least `slack`.
    /// Where one was not, rounding may legitimately send it to another expert, which changes
    /// that position's output and, through attention, every later one.
    pub fn routed_clearly(&self, pos: usize, slack: f32) -> bool {
        self.routing_margins
            .as_ref()
            .is_none_or(|margins| margins.iter().take(pos + 1).all(|&m| m >= slack))
    }
}

#[derive(Deserialize)]
pub struct TokenCase {
    pub text: String,
    pub ids: Vec<u32>,
    pub decoded: String,
}

pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

pub fn golden(name: &str) -> Golden {
    let path = fixtures().join("goldens").join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn load(name: &str, dtype: WeightDType) -> TextModel {
    load_path(&fixtures().join("models").join(name), dtype)
}

pub fn load_path(path: &Path, dtype: WeightDType) -> TextModel {
    let name = path.display();
    let opts = ModelOptions {
        dtype,
        // Every step completes before decode returns, so its logits can be read.
        lookahead: false,
        // Small chunks so prompts cross chunk boundaries.
        prefill_chunk: Some(5),
        ..Default::default()
    };
    TextModel::load(&gpu(), path, &opts).unwrap_or_else(|e| panic!("loading {name}: {e}"))
}

/// Logit tolerance per storage type. f32: the fixtures' weights are exact in f32 and only
/// summation order differs; measured worst 2.3·10⁻⁵, allowed 2·10⁻⁴. f16: weights and cached
/// K/V are rounded to 11 significant bits (relative 2⁻¹¹ ≈ 4.9·10⁻⁴) in every layer; measured
/// worst 1.15·10⁻² on logits of standard deviation ~2, allowed 3·10⁻².
pub fn tolerance(dtype: WeightDType) -> f32 {
    match dtype {
        WeightDType::F32 => 2e-4,
        WeightDType::F16 => 3e-2,
    }
}

/// The logit tolerance for model `name`. Qwen3.5's prompts run through transformers' chunked
/// form of the delta rule and Backpack's recurrent form: the same sums in another order, whose
/// f32 rounding the gated norm of a small head output magnifies. Most positions of the tiny
/// model agree to 2e-5 (as the other families do); its worst reached 3.7e-4 (logits of ±7).
pub fn model_tolerance(name: &str, dtype: WeightDType) -> f32 {
    match (name, dtype) {
        ("tiny-qwen3-5" | "tiny-qwen3-5-moe", WeightDType::F32) => 6e-4,
        _ => tolerance(dtype),
    }
}

pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}
