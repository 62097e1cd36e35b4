//! The prompt cache: a prompt that starts with the tokens the last one (and its answer) left in
//! the KV cache runs only the rest, and answers token for token as a model that runs it whole.
//! Checked on a plain model, on sliding-window ones (Gemma 3, GPT-OSS, whose rolling caches
//! limit how far back a prompt may rejoin), with the decode pipeline on and off.

mod common;

use backpack_engine::models::{GenerateParams, ModelOptions, Prompt, TextModel};
use backpack_engine::ops::{SamplerParams, WeightDType};
use common::goldens::fixtures;
use common::gpu;

fn model(name: &str, prefix_cache: bool, lookahead: bool) -> TextModel {
    let opts = ModelOptions {
        dtype: WeightDType::F32,
        prefix_cache,
        lookahead,
        prefill_chunk: Some(7),
        ..Default::default()
    };
    TextModel::load(&gpu(), &fixtures().join("models").join(name), &opts)
        .unwrap_or_else(|e| panic!("loading {name}: {e}"))
}

/// Greedy ids after `prompt`, and how many prompt tokens came from the cache.
fn greedy(m: &mut TextModel, prompt: &[u32], n: u32) -> (Vec<u32>, usize) {
    let params = GenerateParams {
        max_tokens: n,
        sampler: SamplerParams::default(),
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
    (stats.tokens, stats.cached_tokens)
}

#[test]
fn cached_prefixes_answer_as_whole_prompts_do() {
    for name in ["tiny-qwen2", "tiny-gemma3", "tiny-gpt-oss"] {
        for lookahead in [true, false] {
            let mut cached = model(name, true, lookahead);
            let mut whole = model(name, false, lookahead);
            let vocab = cached.model.spec().vocab.min(200);
            let first: Vec<u32> = (0..23).map(|i| (i * 7 + 3) % vocab).collect();
            let (answer, reused) = greedy(&mut cached, &first, 6);
            assert_eq!(reused, 0, "{name}: a first prompt has nothing to reuse");
            // The next turn: the conversation so far, then new text.
            let mut next = first.clone();
            next.extend(&answer[..answer.len() - 1]);
            next.extend((0..9).map(|i| (i * 11 + 5) % vocab));
            let (got, reused) = greedy(&mut cached, &next, 8);
            let (want, none) = greedy(&mut whole, &next, 8);
            assert_eq!(none, 0);
            assert_eq!(
                got, want,
                "{name} lookahead {lookahead}: a continued conversation"
            );
            // Windowed models too: their rolling caches still hold what the rest needs.
            assert!(reused >= first.len(), "{name}: {reused} tokens reused");
            // A prompt that leaves the cached one partway.
            let mut branch = first[..15].to_vec();
            branch.extend([1, 2, 3]);
            let (got, reused) = greedy(&mut cached, &branch, 8);
            let (want, _) = greedy(&mut whole, &branch, 8);
            assert_eq!(got, want, "{name} lookahead {lookahead}: a branch");
            assert!(reused <= 15, "{name}: {reused}");
            if name != "tiny-qwen2" {
                // Rejoining 15 tokens in, after the cache was written to position 30 and
                // more: a rolling window no longer holds what those queries need.
                assert_eq!(reused, 0, "{name}");
            }
            // The same prompt again runs its last token only.
            let (again, reused) = greedy(&mut cached, &branch, 8);
            assert_eq!(again, want, "{name}: a repeated prompt");
            if name == "tiny-qwen2" {
                assert_eq!(reused, branch.len() - 1);
            }
        }
    }
}

/// A prompt through another path (here the logits of every position) leaves nothing the next
/// prompt may trust.
#[test]
fn other_uses_of_the_cache_forget_the_prefix() {
    let mut m = model("tiny-qwen2", true, true);
    let prompt: Vec<u32> = (0..20).map(|i| (i * 5 + 1) % 100).collect();
    let _ = greedy(&mut m, &prompt, 4);
    let other: Vec<u32> = (0..20).map(|i| (i * 3 + 2) % 100).collect();
    m.model.prompt_logits(&other).expect("logits");
    let (_, reused) = greedy(&mut m, &prompt, 4);
    assert_eq!(reused, 0);
}

/// Gated DeltaNet's recurrent state cannot rewind: Qwen3.5 runs every prompt whole.
#[test]
fn recurrent_models_run_every_prompt_whole() {
    let mut m = model("tiny-qwen3-5", true, true);
    let prompt: Vec<u32> = (0..20).map(|i| (i * 5 + 1) % 100).collect();
    let (first, _) = greedy(&mut m, &prompt, 4);
    let (again, reused) = greedy(&mut m, &prompt, 4);
    assert_eq!((again, reused), (first, 0));
}
