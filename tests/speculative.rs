//! Speculative decoding: at temperature 0 the answer is the plain greedy one token for token,
//! whether the drafts always hit (the model drafting for itself), mostly miss (another model
//! with the same tokenizer) or come from the context (prompt lookup); on plain, sliding-window
//! and sparse models, with a repetition penalty, and up to a full context.

mod common;
#[path = "support/temp_dir.rs"]
mod temp_dir;

use std::path::PathBuf;

use backpack_engine::models::speculate::{DraftStats, Speculation};
use backpack_engine::models::{GenerateParams, ModelOptions, Prompt, StopReason, TextModel};
use backpack_engine::ops::{SamplerParams, WeightDType};
use common::goldens::fixtures;
use common::gpu;

fn path(name: &str) -> PathBuf {
    fixtures().join("models").join(name)
}

fn load(name: &str, speculate: Option<Speculation>, context: Option<u32>) -> TextModel {
    let opts = ModelOptions {
        dtype: WeightDType::F32,
        prefill_chunk: Some(16),
        context,
        speculate,
        ..Default::default()
    };
    TextModel::load(&gpu(), &path(name), &opts).unwrap_or_else(|e| panic!("loading {name}: {e}"))
}

fn run(
    m: &mut TextModel,
    prompt: &[u32],
    n: u32,
    sampler: SamplerParams,
) -> (Vec<u32>, StopReason, DraftStats) {
    let params = GenerateParams {
        max_tokens: n,
        sampler,
        ..Default::default()
    };
    let stats = m
        .generate(
            &Prompt::Tokens(prompt.to_vec()),
            &params,
            &|| false,
            |_, _| {},
        )
        .expect("generate");
    (stats.tokens, stats.stop, stats.drafts)
}

/// A prompt that repeats itself, so that prompt lookup finds runs to copy.
fn repetitive(vocab: u32) -> Vec<u32> {
    let phrase: Vec<u32> = (0..11).map(|i| (i * 37 + 5) % vocab).collect();
    phrase.iter().cycle().take(40).copied().collect()
}

/// Every round takes the most drafts (the counts below depend on it).
fn lookup(tokens: u32) -> Option<Speculation> {
    Some(Speculation {
        draft: None,
        tokens,
        paced: false,
    })
}

fn drafted_by(name: &str, tokens: u32) -> Option<Speculation> {
    Some(Speculation {
        draft: Some(path(name)),
        tokens,
        paced: false,
    })
}

#[test]
fn greedy_answers_match_plain_decoding_token_for_token() {
    let penalized = SamplerParams {
        repeat_penalty: 1.3,
        ..Default::default()
    };
    for name in ["tiny-qwen2", "tiny-gemma3", "tiny-gpt-oss"] {
        let mut plain = load(name, None, None);
        let vocab = plain.model.spec().vocab.min(400);
        let prompt = repetitive(vocab);
        for sampler in [SamplerParams::default(), penalized] {
            let (want, _, none) = run(&mut plain, &prompt, 48, sampler);
            assert_eq!(none, DraftStats::default());
            for tokens in [1, 4, 7] {
                let mut spec = load(name, lookup(tokens), None);
                let (got, _, drafts) = run(&mut spec, &prompt, 48, sampler);
                assert_eq!(got, want, "{name} lookup {tokens} {sampler:?}");
                // (A penalty keeps the answer off the prompt's tokens: nothing to copy.)
                if sampler.repeat_penalty == 1.0 {
                    assert!(
                        drafts.drafted > 0,
                        "{name}: the repetitive prompt gave no drafts"
                    );
                }
                // A second answer starts from the prompt cache the first one left.
                let (again, _, _) = run(&mut spec, &prompt, 48, sampler);
                assert_eq!(again, want, "{name} lookup {tokens}: a repeated prompt");
            }
            // The model drafting for itself: every draft is what it would have said.
            let mut itself = load(name, drafted_by(name, 5), None);
            let (got, _, drafts) = run(&mut itself, &prompt, 48, sampler);
            assert_eq!(got, want, "{name} drafting for itself {sampler:?}");
            assert!(drafts.drafted >= 35, "{name}: {drafts:?}");
            assert_eq!(
                drafts.accepted, drafts.drafted,
                "{name}: a draft of itself missed"
            );
        }
    }
}

/// Verifications after a long prompt take each row's keys in runs across workgroups (at 256
/// keys and more, past the fixtures' 256 positions: these copies allow 512); their answers
/// still equal plain decoding's, through GPT-OSS's sliding window and sinks too.
#[test]
fn verifications_after_a_long_prompt_match_plain_decoding() {
    for name in ["tiny-llama", "tiny-gpt-oss"] {
        let longer = temp_dir::TempDir::new("longer-context");
        temp_dir::copy_dir(&path(name), &longer);
        let config_path = longer.join("config.json");
        let mut config: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&config_path).expect("config")).expect("json");
        config["max_position_embeddings"] = 512.into();
        std::fs::write(&config_path, config.to_string()).expect("write config");
        let load_longer = |speculate| {
            let opts = ModelOptions {
                dtype: WeightDType::F32,
                prefill_chunk: Some(16),
                speculate,
                ..Default::default()
            };
            TextModel::load(&gpu(), &longer, &opts).unwrap_or_else(|e| panic!("{name}: {e}"))
        };
        let mut plain = load_longer(None);
        let vocab = plain.model.spec().vocab.min(400);
        // The first of a few prompts whose answer runs to 24 tokens (random weights may stop
        // at once).
        let (prompt, want) = (0..8u32)
            .map(|seed| {
                let phrase: Vec<u32> = (0..29).map(|i| (i * 53 + 11 + seed) % vocab).collect();
                let prompt: Vec<u32> = phrase.iter().cycle().take(300).copied().collect();
                let (want, _, _) = run(&mut plain, &prompt, 24, SamplerParams::default());
                (prompt, want)
            })
            .find(|(_, want)| want.len() == 24)
            .unwrap_or_else(|| panic!("{name}: every prompt's answer stopped early"));
        // The model drafting for itself: every round verifies seven drafts.
        let mut spec = load_longer(Some(Speculation {
            draft: Some(longer.to_path_buf()),
            tokens: 7,
            paced: false,
        }));
        let (got, _, drafts) = run(&mut spec, &prompt, 24, SamplerParams::default());
        assert_eq!(got, want, "{name}");
        assert!(drafts.drafted >= 14, "{name}: {drafts:?}");
    }
}

#[test]
fn drafts_that_miss_cost_speed_not_tokens() {
    // Another model with the same tokenizer: its drafts are mostly refused.
    let mut plain = load("tiny-qwen2", None, None);
    let mut spec = load("tiny-qwen2", drafted_by("tiny-qwen3", 6), None);
    for prompt in [vec![1, 2, 3], repetitive(300)] {
        let (want, _, _) = run(&mut plain, &prompt, 40, SamplerParams::default());
        let (got, _, drafts) = run(&mut spec, &prompt, 40, SamplerParams::default());
        assert_eq!(got, want);
        assert!(drafts.accepted < drafts.drafted, "{drafts:?}");
    }
}

#[test]
fn a_full_context_ends_the_answer_where_plain_decoding_does() {
    let context = Some(64);
    let mut plain = load("tiny-llama", None, context);
    let mut spec = load("tiny-llama", lookup(7), context);
    let prompt = repetitive(300);
    let (want, stop, _) = run(&mut plain, &prompt, 100, SamplerParams::default());
    assert_eq!(stop, StopReason::ContextFull);
    let (got, stop, _) = run(&mut spec, &prompt, 100, SamplerParams::default());
    assert_eq!(stop, StopReason::ContextFull);
    assert_eq!(got, want);
}

#[test]
fn sampled_answers_keep_their_seed_and_stay_in_the_vocabulary() {
    let sampler = SamplerParams {
        temperature: 0.9,
        top_k: 20,
        top_p: 0.95,
        seed: 11,
        ..Default::default()
    };
    let mut spec = load("tiny-qwen2", drafted_by("tiny-qwen2", 4), None);
    let vocab = spec.model.spec().vocab;
    let prompt = repetitive(300);
    let (first, _, drafts) = run(&mut spec, &prompt, 40, sampler);
    let (second, _, _) = run(&mut spec, &prompt, 40, sampler);
    assert_eq!(first, second, "the same seed gives the same answer");
    assert!(first.iter().all(|&t| t < vocab));
    // The draft is the model's greedy pick: at this temperature most are kept.
    assert!(drafts.accepted > 0, "{drafts:?}");
}

#[test]
fn models_and_drafts_that_cannot_speculate_are_refused_by_name() {
    let opts = |speculate| ModelOptions {
        dtype: WeightDType::F32,
        speculate,
        ..Default::default()
    };
    let err = TextModel::load(&gpu(), &path("tiny-qwen3-5"), &opts(lookup(4)))
        .err()
        .expect("a Gated DeltaNet model cannot rewind")
        .to_string();
    assert!(
        err.contains("tiny-qwen3-5") && err.contains("cannot speculate"),
        "{err}"
    );
    // The same model with two tokens' ids swapped: drafts would mean other text.
    let other = temp_dir::TempDir::new("other-tokenizer");
    temp_dir::copy_dir(&path("tiny-qwen3"), &other);
    let file = other.join("tokenizer.json");
    let mut tokenizer: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&file).expect("read")).expect("json");
    let vocab = &mut tokenizer["model"]["vocab"];
    let (a, b) = (vocab["a"].clone(), vocab["b"].clone());
    vocab["a"] = b;
    vocab["b"] = a;
    std::fs::write(&file, tokenizer.to_string()).expect("write");
    let swapped = Speculation {
        draft: Some(other.to_path_buf()),
        tokens: 4,
        paced: true,
    };
    let err = TextModel::load(&gpu(), &path("tiny-qwen2"), &opts(Some(swapped)))
        .err()
        .expect("a draft with another tokenizer")
        .to_string();
    assert!(
        err.contains(&other.display().to_string()) && err.contains("tokenizer"),
        "{err}"
    );
    let err = TextModel::load(&gpu(), &path("tiny-qwen2"), &opts(lookup(40)))
        .err()
        .expect("too many drafts a round")
        .to_string();
    assert!(err.contains("1 to 7"), "{err}");
}
