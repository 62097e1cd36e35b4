//! The `backpack` binary end to end: `generate --json` reproduces transformers' greedy tokens,
//! and bad input exits non-zero with a message that says what is wrong.

use std::path::PathBuf;
use std::process::{Command, Output};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

fn backpack(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_backpack"))
        .args(args)
        .output()
        .expect("the binary runs")
}

/// The JSON line a successful run prints last.
fn backpack_json(args: &[&str]) -> serde_json::Value {
    let out = backpack(args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.lines().last().expect("a line")).expect("JSON")
}

fn golden_case(model: &str, index: usize) -> serde_json::Value {
    let path = fixtures().join("goldens").join(format!("{model}.json"));
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("golden")).expect("json");
    golden["cases"][index].clone()
}

#[test]
fn generate_json_reproduces_greedy_tokens() {
    for (model, dtype) in [
        ("tiny-llama", "f32"),
        ("tiny-gpt2", "f16"),
        ("tiny-qwen2", "f32"),
        ("tiny-qwen3-moe", "f32"),
        ("tiny-gpt-oss-mxfp4", "f32"),
        ("tiny-qwen3-5", "f16"),
        ("tiny-qwen3-5-moe", "f32"),
    ] {
        let case = golden_case(model, 0);
        let (json, want, stdout) =
            generate_golden(model, dtype, &[]).unwrap_or_else(|e| panic!("{model}: {e}"));
        let got: Vec<u64> = json["tokens"]
            .as_array()
            .expect("tokens")
            .iter()
            .filter_map(|v| v.as_u64())
            .collect();
        assert_eq!(got, want, "{model} {dtype}");
        assert_eq!(json["prompt_tokens"], case["prompt_ids"], "{model}");
        assert!(json["dispatches_per_token"].as_u64().expect("dispatches") > 0);
        let ttft = json["ttft_ms"].as_f64().expect("ttft");
        let prompt = json["prompt_ms"].as_f64().expect("prompt_ms");
        assert!(
            prompt > 0.0 && prompt <= ttft,
            "prompt {prompt} ms, ttft {ttft} ms"
        );
        // The streamed text precedes the JSON line.
        let text = json["text"].as_str().expect("text");
        assert!(
            stdout.starts_with(text),
            "{model}: stdout {stdout:?} should start with {text:?}"
        );
    }
}

#[test]
fn chat_prompts_use_the_template() {
    let case = golden_case("tiny-qwen2", 2);
    assert_eq!(case["mode"], "chat");
    let messages = case["messages"].as_array().expect("messages");
    let system = messages[0]["content"].as_str().expect("system");
    let user = messages[1]["content"].as_str().expect("user");
    let dir = fixtures().join("models/tiny-qwen2");
    let json = backpack_json(&[
        "generate",
        "--model",
        dir.to_str().expect("path"),
        "--system",
        system,
        "--prompt",
        user,
        "--temperature",
        "0",
        "--max-tokens",
        "2",
        "--json",
    ]);
    assert_eq!(json["prompt_tokens"], case["prompt_ids"]);
}

/// `bench --json --profile`: speeds, dispatches, and per-kernel GPU time of the prompt and of
/// one decode step (what tests/reference/bench_llamacpp.sh's targets table reads). The decode
/// profile times every dispatch of the step, so its calls add up to the dispatches per token.
#[test]
fn bench_json_carries_the_profile() {
    let dir = fixtures().join("models/tiny-llama");
    let json = backpack_json(&[
        "bench",
        "--model",
        dir.to_str().expect("path"),
        "--prompt-len",
        "7",
        "--gen",
        "3",
        "--repeat",
        "1",
        "--json",
        "--profile",
    ]);
    for key in [
        "prefill_tok_s",
        "decode_tok_s",
        "ttft_ms",
        "decode_ms_per_token",
    ] {
        assert!(json[key].as_f64().expect(key) > 0.0, "{key}: {json}");
    }
    assert_eq!(json["prompt_len"], 7);
    // A dense model has no experts to spread a prompt over.
    assert!(json["profile"]["prompt_expert_counts"].is_null(), "{json}");
    // The whole prompt in one chunk, as the profile needs.
    assert_eq!(json["prompt_chunk"], 7);
    let dispatches = json["dispatches_per_token"].as_u64().expect("dispatches");
    let calls = |part: &str| -> u64 {
        let timings = json["profile"][part].as_array().expect(part);
        assert!(!timings.is_empty(), "{part}: {json}");
        for t in timings {
            let label = t["label"].as_str().expect("label");
            assert!(label.contains("::"), "{part}: label {label}");
            assert!(t["us"].as_f64().expect("us") >= 0.0, "{part}: {t}");
        }
        timings.iter().filter_map(|t| t["calls"].as_u64()).sum()
    };
    assert_eq!(calls("decode"), dispatches, "{json}");
    assert!(calls("prefill") > 0);
}

#[test]
fn bad_input_exits_nonzero_with_a_reason() {
    let out = backpack(&["generate", "--model", "/no/such/model", "--prompt", "hi"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("/no/such/model") && err.contains("does not exist"),
        "{err}"
    );

    let dir = std::env::temp_dir().join(format!("backpack-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    for entry in std::fs::read_dir(fixtures().join("models/tiny-gpt2")).expect("fixture") {
        let path = entry.expect("entry").path();
        std::fs::copy(&path, dir.join(path.file_name().expect("name"))).expect("copy");
    }
    let weights = dir.join("model.safetensors");
    let len = std::fs::metadata(&weights).expect("meta").len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&weights)
        .expect("open")
        .set_len(len - 100)
        .expect("truncate");
    let out = backpack(&[
        "generate",
        "--model",
        dir.to_str().expect("path"),
        "--raw",
        "--prompt",
        "hi",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("model.safetensors") && err.contains("truncated"),
        "{err}"
    );

    let long = "the fox ".repeat(40);
    let good = fixtures().join("models/tiny-gpt2");
    let out = backpack(&[
        "generate",
        "--model",
        good.to_str().expect("path"),
        "--raw",
        "--prompt",
        &long,
        "--context",
        "8",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("context holds 8"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn self_test_reports_the_gpu_and_checks_kernels() {
    let out = backpack(&["--self-test"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("GPU "), "{text}");
    assert_eq!(text.matches("kernel       ok").count(), 3, "{text}");
    assert!(text.contains("audio input"), "{text}");
    assert!(text.trim_end().ends_with("all good"), "{text}");
}

/// `generate --json` (greedy, weights stored as `dtype`) with the given extra flags on a
/// fixture's first golden case: the JSON line, the tokens transformers chose greedily, and
/// stdout.
fn generate_golden(
    model: &str,
    dtype: &str,
    extra: &[&str],
) -> Result<(serde_json::Value, Vec<u64>, String), String> {
    let case = golden_case(model, 0);
    let want: Vec<u64> = case["greedy_tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .filter_map(|v| v.as_u64())
        .collect();
    let dir = fixtures().join("models").join(model);
    let max = want.len().to_string();
    let mut args = vec![
        "generate",
        "--model",
        dir.to_str().expect("utf-8 path"),
        "--raw",
        "--prompt",
        case["prompt"].as_str().expect("raw prompt"),
        "--max-tokens",
        &max,
        "--temperature",
        "0",
        "--dtype",
        dtype,
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = backpack(&args);
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json = serde_json::from_str(stdout.lines().last().expect("a JSON line")).expect("json");
    Ok((json, want, stdout.into_owned()))
}

/// Speculative decoding keeps transformers' greedy answer, with drafts from the context and
/// from a draft model (here the model itself, so every draft is kept), and says what it kept.
#[test]
fn speculative_generation_keeps_the_greedy_tokens() {
    for model in ["tiny-llama", "tiny-qwen3-moe"] {
        let dir = fixtures().join("models").join(model);
        let draft = dir.to_str().expect("path");
        for extra in [
            vec!["--speculate", "4"],
            vec!["--draft-model", draft, "--speculate", "3"],
        ] {
            let (json, want, _) = generate_golden(model, "f32", &extra).expect("generate");
            let got: Vec<u64> = json["tokens"]
                .as_array()
                .expect("tokens")
                .iter()
                .filter_map(|v| v.as_u64())
                .collect();
            assert_eq!(got, want, "{model} {extra:?}");
            let drafted = json["drafted_tokens"].as_u64().expect("drafted_tokens");
            let accepted = json["accepted_tokens"].as_u64().expect("accepted_tokens");
            assert!(accepted <= drafted, "{model} {extra:?}");
            if extra.len() == 4 && want.len() > 1 {
                assert!(drafted > 0 && accepted == drafted, "{model}: {json}");
            }
        }
    }
    let err =
        generate_golden("tiny-qwen3-5", "f32", &["--speculate", "4"]).expect_err("cannot rewind");
    assert!(err.contains("cannot speculate"), "{err}");
    let err = generate_golden("tiny-llama", "f32", &["--speculate", "9"]).expect_err("too many");
    assert!(err.contains("1 to 7"), "{err}");
}

/// `bench --config` of a mixture-of-experts shape with random weights: the prompt's tokens
/// spread over the experts as a trained router spreads them, so that the prompts' expert
/// tiles are timed as full as they are then (random layers left as they are send the whole
/// prompt to a few experts), and `--profile` reports the spread.
#[test]
fn bench_of_a_random_moe_shape_spreads_the_prompt_over_the_experts() {
    let config = serde_json::json!({
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 256,
        "num_hidden_layers": 16, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 64, "num_experts": 16, "num_experts_per_tok": 4, "norm_topk_prob": true,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 512,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "tie_word_embeddings": false
    });
    let path =
        std::env::temp_dir().join(format!("backpack-moe-spread-{}.json", std::process::id()));
    std::fs::write(&path, config.to_string()).expect("config written");
    for quant in [None, Some("q4_k")] {
        let mut args = vec![
            "bench",
            "--config",
            path.to_str().expect("path"),
            "--prompt-len",
            "64",
            "--gen",
            "1",
            "--repeat",
            "1",
            "--json",
            "--profile",
        ];
        args.extend(quant.iter().flat_map(|q| ["--quant", q]));
        let json = backpack_json(&args);
        let counts: Vec<u64> = json["profile"]["prompt_expert_counts"]
            .as_array()
            .expect("counts")
            .iter()
            .map(|c| c.as_u64().expect("count"))
            .collect();
        assert_eq!(counts.len(), 16);
        assert_eq!(counts.iter().sum::<u64>(), 64 * 4, "{quant:?}: {counts:?}");
        // 16 each on average; uniformly random choices stay within about twice that.
        let most = counts.iter().max().copied().unwrap_or(0);
        assert!(
            counts.iter().all(|&c| c > 0) && most <= 40,
            "{quant:?}: the prompt collapsed onto few experts: {counts:?}"
        );
    }
    std::fs::remove_file(&path).ok();
}

/// `bench --speculate K --acceptance A,...`: one speculative row per pair, on the greedy answer
/// plain decoding gave (f32: the two forms agree token for token).
#[test]
fn bench_json_carries_the_speculative_rows() {
    let dir = fixtures().join("models/tiny-llama");
    let json = backpack_json(&[
        "bench",
        "--model",
        dir.to_str().expect("path"),
        "--dtype",
        "f32",
        "--prompt-len",
        "9",
        "--gen",
        "20",
        "--repeat",
        "1",
        "--speculate",
        "2,5",
        "--acceptance",
        "1,0.5",
        "--json",
    ]);
    let rows = json["speculative"].as_array().expect("speculative rows");
    let shapes: Vec<(u64, f64)> = rows
        .iter()
        .map(|r| {
            let k = r["drafts_per_round"].as_u64().expect("k");
            (k, r["acceptance"].as_f64().expect("acceptance"))
        })
        .collect();
    assert_eq!(shapes, [(2, 1.0), (2, 0.5), (5, 1.0), (5, 0.5)]);
    for r in rows {
        assert_eq!(r["differing_tokens"], 0, "{r}");
        assert!(r["speculative_tok_s"].as_f64().expect("tok/s") > 0.0);
        let per_round = r["tokens_per_round"].as_f64().expect("tokens a round");
        let k = r["drafts_per_round"].as_f64().expect("k");
        assert!(per_round >= 1.0 && per_round <= k + 1.0, "{r}");
        if r["acceptance"] == 1.0 {
            // Every draft kept: all but the last round give k + 1 tokens.
            assert!(per_round > k * 0.75, "{r}");
        }
    }
}
