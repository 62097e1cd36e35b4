//! Golden tests: the tiny fixtures of every supported family (dense, and the mixture-of-experts
//! Qwen3-MoE and GPT-OSS, whose MXFP4 folder is written as the published checkpoints are)
//! against what transformers computed for them (tests/reference/make_tiny_models.py):
//! tokenization, chat-template prompts, prompt logits at every position, per-step logits and
//! greedy continuations, in f32 and f16.

mod common;

use backpack_engine::models::{ModelOptions, Prompt, TextModel};
use backpack_engine::ops::{SamplerParams, WeightDType};
use common::goldens::{fixtures, golden, load, load_path, max_diff, model_tolerance, tolerance};
use common::gpu;

const MODELS: [&str; 11] = [
    "tiny-llama",
    "tiny-qwen2",
    "tiny-gpt2",
    "tiny-qwen3",
    "tiny-phi3",
    "tiny-gemma3",
    "tiny-qwen3-moe",
    "tiny-gpt-oss",
    "tiny-gpt-oss-mxfp4",
    "tiny-qwen3-5",
    "tiny-qwen3-5-moe",
];

#[test]
fn tokenizers_and_chat_templates_match_transformers() {
    for name in MODELS {
        let g = golden(name);
        let m = load(name, WeightDType::F32);
        for t in &g.tokenization {
            let ids = m.tokenizer.encode(&t.text, true).expect("encode");
            assert_eq!(ids, t.ids, "{name}: tokenizing {:?}", t.text);
            let text = m.tokenizer.decode(&t.ids, true).expect("decode");
            assert_eq!(text, t.decoded, "{name}: decoding {:?}", t.ids);
        }
        for c in &g.cases {
            let prompt = match c.mode.as_str() {
                "raw" => Prompt::Raw(c.prompt.clone().expect("raw case has a prompt")),
                "chat" => Prompt::Chat(c.messages.clone().expect("chat case has messages")),
                other => panic!("unknown mode {other}"),
            };
            assert_eq!(
                m.tokenize(&prompt).expect("tokenize"),
                c.prompt_ids,
                "{name}/{}",
                c.name
            );
        }
    }
}

#[test]
fn prompt_logits_match_transformers() {
    for dtype in [WeightDType::F32, WeightDType::F16] {
        for name in MODELS {
            let g = golden(name);
            let mut m = load(name, dtype);
            let vocab = m.model.spec().vocab as usize;
            let mut worst = 0.0f32;
            for c in &g.cases {
                let got = m.model.prompt_logits(&c.prompt_ids).expect("prompt logits");
                for (pos, want) in c.prompt_logits.iter().enumerate() {
                    if !c.routed_clearly(pos, 2.0 * tolerance(dtype)) {
                        break;
                    }
                    let row = &got[pos * vocab..(pos + 1) * vocab];
                    let diff = max_diff(row, want);
                    worst = worst.max(diff);
                    assert!(
                        diff <= model_tolerance(name, dtype),
                        "{name}/{} {dtype:?}: position {pos} differs by {diff}",
                        c.name
                    );
                }
            }
            eprintln!("{name} {dtype:?}: largest prompt-logit difference {worst}");
        }
    }
}

#[test]
fn greedy_decoding_matches_transformers() {
    for dtype in [WeightDType::F32, WeightDType::F16] {
        for name in models_under_test() {
            let g = golden(name);
            let mut m = load(name, dtype);
            // Loading warms a hardware GPU's kernels up with a throwaway prompt: whatever it
            // leaves behind must not reach the next sequence.
            if dtype == WeightDType::F16 {
                m.model.warm_up().expect("warm-up");
            }
            m.model.set_sampler(&SamplerParams::default());
            for c in &g.cases {
                let mut token = m.model.prefill(&c.prompt_ids).expect("prefill");
                for (step, (&want, want_logits)) in
                    c.greedy_tokens.iter().zip(&c.step_logits).enumerate()
                {
                    if !c.routed_clearly(c.prompt_ids.len() - 1 + step, 2.0 * tolerance(dtype)) {
                        break;
                    }
                    let logits = m.model.last_logits().expect("logits");
                    let diff = max_diff(&logits, want_logits);
                    assert!(
                        diff <= model_tolerance(name, dtype),
                        "{name}/{} {dtype:?}: step {step} logits differ by {diff}",
                        c.name
                    );
                    // A golden step whose top two logits are closer than twice our error
                    // bound could legitimately flip; every later step would then differ.
                    if c.top2_margins[step] < 2.0 * tolerance(dtype) {
                        break;
                    }
                    assert_eq!(
                        token, want,
                        "{name}/{} {dtype:?}: greedy token {step}",
                        c.name
                    );
                    if step + 1 < c.greedy_tokens.len() {
                        token = m.model.decode().expect("decode");
                    }
                }
            }
        }
    }
}

#[test]
fn text_generation_reproduces_the_greedy_continuation() {
    for name in MODELS {
        let g = golden(name);
        let mut m = load(name, WeightDType::F32);
        let c = &g.cases[0];
        let params = backpack_engine::models::GenerateParams {
            max_tokens: c.greedy_tokens.len() as u32,
            sampler: SamplerParams::default(),
            ..Default::default()
        };
        let mut streamed = String::new();
        let stats = m
            .generate(
                &Prompt::Tokens(c.prompt_ids.clone()),
                &params,
                &|| false,
                |_, d| streamed.push_str(d),
            )
            .expect("generate");
        assert_eq!(stats.tokens, c.greedy_tokens, "{name}");
        assert_eq!(
            streamed, stats.text,
            "{name}: streamed deltas add up to the text"
        );
        let decoded = m.tokenizer.decode(&stats.tokens, true).expect("decode");
        assert_eq!(stats.text, decoded, "{name}");
    }
}

#[test]
fn a_model_too_big_for_the_gpu_is_refused_with_numbers() {
    // A 10 GB embedding table exceeds any GPU's largest buffer binding.
    let config = serde_json::json!({
        "model_type": "llama", "hidden_size": 128, "intermediate_size": 256,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1,
        "vocab_size": 20_000_000, "max_position_embeddings": 64
    });
    let spec = backpack_engine::load::DecoderSpec::from_json(&config).expect("valid config");
    let err = backpack_engine::models::DecoderModel::build(
        &gpu(),
        &spec,
        backpack_engine::models::WeightSource::Random { seed: 1 },
        &ModelOptions {
            dtype: WeightDType::F32,
            ..Default::default()
        },
    )
    .err()
    .expect("too big");
    let message = err.to_string();
    assert!(
        message.contains("token embedding") && message.contains("10240000000 byte"),
        "{message}"
    );
}

#[test]
fn quantizing_while_loading_shrinks_weights_and_keeps_logits_close() {
    let g = golden("tiny-llama");
    let path = fixtures().join("models/tiny-llama");
    let load = |quantize| {
        let opts = ModelOptions {
            dtype: WeightDType::F16,
            quantize,
            lookahead: false,
            ..Default::default()
        };
        TextModel::load(&gpu(), &path, &opts).expect("loads")
    };
    let f16 = load(None).model.weight_bytes();
    // Bounds from the rounding itself: transformers run with these weights rounded through
    // gguf-py's Q8_0 moves the logits by 0.56 at worst (this model's weights are large:
    // std 0.25); Q4_0 has 16× coarser steps.
    for (ty, allowed) in [
        (backpack_engine::load::GgmlType::Q8_0, 0.7f32),
        (backpack_engine::load::GgmlType::Q4_0, 8.0),
    ] {
        let mut m = load(Some(ty));
        assert!(
            m.model.weight_bytes() < f16,
            "{ty:?} {} vs f16 {f16}",
            m.model.weight_bytes()
        );
        let vocab = m.model.spec().vocab as usize;
        let mut worst = 0.0f32;
        for c in &g.cases {
            let got = m.model.prompt_logits(&c.prompt_ids).expect("logits");
            for (pos, want) in c.prompt_logits.iter().enumerate() {
                worst = worst.max(max_diff(&got[pos * vocab..(pos + 1) * vocab], want));
            }
        }
        eprintln!("{ty:?}: largest prompt-logit difference {worst}");
        assert!(worst <= allowed, "{ty:?}: logits differ by {worst}");
        // Decode steps (int8 inputs to the products, which hand their outputs on as int8
        // blocks) give the logits of the prompt path over the same tokens, within the same bound.
        m.model.set_sampler(&SamplerParams::default());
        let mut worst = 0.0f32;
        for c in &g.cases {
            let mut tokens = c.prompt_ids.clone();
            let mut steps = vec![];
            tokens.push(m.model.prefill(&c.prompt_ids).expect("prefill"));
            for _ in 0..3 {
                tokens.push(m.model.decode().expect("decode"));
                steps.push(m.model.last_logits().expect("logits"));
            }
            let all = m.model.prompt_logits(&tokens).expect("logits");
            for (i, got) in steps.iter().enumerate() {
                let at = c.prompt_ids.len() + i;
                worst = worst.max(max_diff(got, &all[at * vocab..(at + 1) * vocab]));
            }
        }
        eprintln!("{ty:?}: decode against prompt logits {worst}");
        assert!(worst <= allowed, "{ty:?}: decode logits differ by {worst}");
    }
}

/// Block-quantized weights kept as f16 copies for prompts (`f16_prompt_weights`) give the
/// prompt logits of expanding (or multiplying) them before each product, and the copies count
/// as weights.
#[test]
fn f16_prompt_weight_copies_match_the_default_prompt_path() {
    let g = golden("tiny-llama");
    let path = fixtures().join("models/tiny-llama");
    for ty in [
        backpack_engine::load::GgmlType::Q8_0,
        backpack_engine::load::GgmlType::Q4_0,
    ] {
        let load = |f16_prompt_weights| {
            let opts = ModelOptions {
                dtype: WeightDType::F16,
                quantize: Some(ty),
                lookahead: false,
                f16_prompt_weights,
                ..Default::default()
            };
            TextModel::load(&gpu(), &path, &opts).expect("loads")
        };
        let (mut plain, mut copies) = (load(false), load(true));
        assert!(
            copies.model.weight_bytes() > plain.model.weight_bytes(),
            "{ty:?}: {} with copies, {} without",
            copies.model.weight_bytes(),
            plain.model.weight_bytes()
        );
        for c in &g.cases {
            let want = plain.model.prompt_logits(&c.prompt_ids).expect("logits");
            let got = copies.model.prompt_logits(&c.prompt_ids).expect("logits");
            let diff = max_diff(&got, &want);
            assert!(
                diff <= tolerance(WeightDType::F16),
                "{ty:?}/{}: prompt logits differ by {diff}",
                c.name
            );
        }
    }
}

/// GGUF files written from the fixture folders (tests/reference/folder_to_gguf.py: F16
/// matrices, F32 norms, 3-D expert tensors, GPT-OSS's experts in MXFP4 blocks, the tokenizer
/// and chat template as GGUF metadata) against the folders' goldens: tokenization, chat
/// prompts, prompt logits at every position, greedy tokens.
const GGUF_MODELS: [(&str, &str); 8] = [
    ("tiny-qwen3.gguf", "tiny-qwen3"),
    ("tiny-gpt2.gguf", "tiny-gpt2"),
    ("tiny-phi3.gguf", "tiny-phi3"),
    ("tiny-gemma3.gguf", "tiny-gemma3"),
    ("tiny-qwen3-moe.gguf", "tiny-qwen3-moe"),
    ("tiny-gpt-oss-mxfp4.gguf", "tiny-gpt-oss-mxfp4"),
    ("tiny-qwen3-5.gguf", "tiny-qwen3-5"),
    ("tiny-qwen3-5-moe.gguf", "tiny-qwen3-5-moe"),
];

/// MODELS, or those whose names contain one of `BACKPACK_TEST_MODELS`' comma-separated parts
/// (for the runs of this binary that `decoded_tokens_route_alike_in_every_form` starts).
fn models_under_test() -> Vec<&'static str> {
    let only = std::env::var("BACKPACK_TEST_MODELS").unwrap_or_default();
    MODELS
        .into_iter()
        .filter(|name| only.is_empty() || only.split(',').any(|part| name.contains(part)))
        .collect()
}

/// The mixture-of-experts goldens again with a decoded token routed by each form the tiny
/// fixtures do not take by themselves (their few expert workgroups route the token inside the
/// gate/up product): the router's product in one workgroup (`BACKPACK_MOE_DECODE=router`, as
/// GPT-OSS-20B) and a routing dispatch (`=route`). This binary runs again for each, as the
/// form is chosen when a model loads from the environment.
#[test]
fn decoded_tokens_route_alike_in_every_form() {
    let exe = std::env::current_exe().expect("test binary");
    for form in ["router", "route"] {
        let out = std::process::Command::new(&exe)
            .args([
                "--exact",
                "greedy_decoding_matches_transformers",
                "gguf_files_match_their_folders_goldens",
                "--test-threads",
                "1",
            ])
            .env("BACKPACK_MOE_DECODE", form)
            .env("BACKPACK_TEST_MODELS", "gpt-oss-mxfp4,moe")
            .output()
            .expect("run the goldens");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("2 passed"),
            "routing form {form}:\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn gguf_files_match_their_folders_goldens() {
    for (file, name) in GGUF_MODELS
        .into_iter()
        .filter(|(_, name)| models_under_test().contains(name))
    {
        let g = golden(name);
        let mut m = load_path(&fixtures().join("models").join(file), WeightDType::F32);
        for t in &g.tokenization {
            let ids = m.tokenizer.encode(&t.text, true).expect("encode");
            assert_eq!(ids, t.ids, "{file}: tokenizing {:?}", t.text);
        }
        let vocab = m.model.spec().vocab as usize;
        m.model.set_sampler(&SamplerParams::default());
        for c in &g.cases {
            let prompt = match c.mode.as_str() {
                "raw" => Prompt::Raw(c.prompt.clone().expect("raw case has a prompt")),
                _ => Prompt::Chat(c.messages.clone().expect("chat case has messages")),
            };
            assert_eq!(
                m.tokenize(&prompt).expect("tokenize"),
                c.prompt_ids,
                "{file}/{}",
                c.name
            );
            // bf16 and f32 fixture weights are exact in the file's f16 where they matter; the
            // f16 tolerance covers those that are not.
            let got = m.model.prompt_logits(&c.prompt_ids).expect("prompt logits");
            for (pos, want) in c.prompt_logits.iter().enumerate() {
                if !c.routed_clearly(pos, 2.0 * tolerance(WeightDType::F16)) {
                    break;
                }
                let diff = max_diff(&got[pos * vocab..(pos + 1) * vocab], want);
                assert!(
                    diff <= tolerance(WeightDType::F16),
                    "{file}/{}: position {pos} differs by {diff}",
                    c.name
                );
            }
            let mut token = m.model.prefill(&c.prompt_ids).expect("prefill");
            for (step, &want) in c.greedy_tokens.iter().enumerate() {
                let pos = c.prompt_ids.len() - 1 + step;
                if c.top2_margins[step] < 2.0 * tolerance(WeightDType::F16)
                    || !c.routed_clearly(pos, 2.0 * tolerance(WeightDType::F16))
                {
                    break;
                }
                assert_eq!(token, want, "{file}/{}: greedy token {step}", c.name);
                if step + 1 < c.greedy_tokens.len() {
                    token = m.model.decode().expect("decode");
                }
            }
        }
    }
}

/// A q8_0 KV cache on a Gemma-3-shaped random model (heads of 32, sliding-window layers with
/// rolling caches that wrap across prompt chunks) gives the prompt logits of an f32 cache up to
/// int8 rounding, and the same greedy continuation where the f32 cache's choices are clear.
#[test]
fn q8_kv_cache_and_rolling_windows_track_the_f32_cache() {
    use backpack_engine::load::DecoderSpec;
    use backpack_engine::models::{DecoderModel, WeightSource};
    use backpack_engine::ops::KvDType;
    let gpu = gpu();
    let spec = DecoderSpec::from_json(&serde_json::json!({
        "model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 3, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": 32, "vocab_size": 300, "sliding_window": 6, "query_pre_attn_scalar": 32,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        "max_position_embeddings": 128
    }))
    .expect("spec");
    let ids: Vec<u32> = (0..41).map(|i| (i * 37 + 11) % 300).collect();
    let logits = |kv: KvDType| {
        let options = ModelOptions {
            dtype: WeightDType::F32,
            kv_cache: Some(kv),
            context: Some(96),
            // Seven-token chunks: the windowed layers' caches (6 + 7 − 1 rows) wrap.
            prefill_chunk: Some(7),
            lookahead: false,
            ..Default::default()
        };
        let mut model =
            DecoderModel::build(&gpu, &spec, WeightSource::Random { seed: 5 }, &options)
                .expect("model");
        let all = model.prompt_logits(&ids).expect("prompt logits");
        let mut tokens = vec![model.prefill(&ids).expect("prefill")];
        for _ in 0..6 {
            tokens.push(model.decode().expect("decode"));
        }
        (all, tokens, model.cache_bytes())
    };
    let (exact, exact_tokens, exact_bytes) = logits(KvDType::F32);
    let (q8, q8_tokens, q8_bytes) = logits(KvDType::Q8_0);
    assert!(exact.iter().all(|v| v.is_finite()));
    let top = exact.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let worst = exact
        .iter()
        .zip(&q8)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    eprintln!("q8_0 against f32 cache: logits differ by {worst} of {top}");
    assert!(
        worst <= 0.02 * top,
        "q8_0 cache differs by {worst} (logits up to {top})"
    );
    assert_eq!(q8_tokens, exact_tokens);
    // 8.5 bits a value against 32 (rolling caches in both).
    assert_eq!(q8_bytes * 32, exact_bytes * 9);
}

/// A multimodal Gemma 3 checkpoint (`Gemma3ForConditionalGeneration`: the text model's config
/// under `text_config`, its weights under `model.language_model.`, a vision tower beside them)
/// loads as its text model: the tiny Gemma 3 rewritten in that layout gives the folder's prompt
/// logits.
#[test]
fn multimodal_gemma3_checkpoints_load_their_text_model() {
    let src = fixtures().join("models").join("tiny-gemma3");
    let dir = std::env::temp_dir().join(format!("backpack-gemma3-mm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        std::fs::copy(src.join(f), dir.join(f)).expect("copy tokenizer");
    }
    let text: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.join("config.json")).expect("config"))
            .expect("config json");
    let config = serde_json::json!({
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "eos_token_id": text["eos_token_id"].clone(),
        "text_config": text,
        "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 4}
    });
    std::fs::write(dir.join("config.json"), config.to_string()).expect("write config");
    // safetensors: 8-byte header length, JSON header, data. Rename the text model's tensors and
    // append a vision tensor (offsets are relative to the data).
    let bytes = std::fs::read(src.join("model.safetensors")).expect("weights");
    let header_len = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + header_len]).expect("header");
    let mut data = bytes[8 + header_len..].to_vec();
    let mut renamed = serde_json::Map::new();
    for (name, info) in header {
        let name = match name.strip_prefix("model.") {
            Some(rest) => format!("model.language_model.{rest}"),
            None => name,
        };
        renamed.insert(name, info);
    }
    renamed.insert(
        "model.vision_tower.vision_model.embeddings.patch_embedding.weight".into(),
        serde_json::json!({"dtype": "F32", "shape": [1], "data_offsets": [data.len(), data.len() + 4]}),
    );
    data.extend(1.5f32.to_le_bytes());
    let header = serde_json::Value::Object(renamed).to_string();
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend(header.as_bytes());
    out.extend(data);
    std::fs::write(dir.join("model.safetensors"), out).expect("write weights");

    let g = golden("tiny-gemma3");
    let mut m = load_path(&dir, WeightDType::F32);
    let vocab = m.model.spec().vocab as usize;
    for c in &g.cases {
        let got = m.model.prompt_logits(&c.prompt_ids).expect("prompt logits");
        for (pos, want) in c.prompt_logits.iter().enumerate() {
            let diff = max_diff(&got[pos * vocab..(pos + 1) * vocab], want);
            assert!(
                diff <= tolerance(WeightDType::F32),
                "multimodal layout/{}: position {pos} differs by {diff}",
                c.name
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// GPT-OSS's harmony answers, tokenized by the tiny GPT-OSS fixture's tokenizer (which has the
/// harmony control tokens): the analysis channel becomes the reasoning, the final channel the
/// reply, headers never reach the text, and a call to `functions.NAME` (its body ending at
/// `<|call|>`) is written as a `<tool_call>` that reads back as the call.
#[test]
fn harmony_channels_split_into_reasoning_and_reply() {
    use backpack_engine::load::TextTokenizer;
    use backpack_engine::models::harmony::{HarmonyStream, HarmonyTokens};
    use backpack_engine::models::reasoning::split_reasoning;

    let tokenizer =
        TextTokenizer::from_dir(&fixtures().join("models/tiny-gpt-oss")).expect("tokenizer");
    let tokens = HarmonyTokens::of(&tokenizer).expect("the harmony control tokens");
    let run = |answer: &str| {
        let ids = tokenizer.encode(answer, false).expect("encode");
        let mut stream = HarmonyStream::new(tokens);
        let mut text = String::new();
        for id in ids {
            text.push_str(&stream.push(&tokenizer, id).expect("push"));
        }
        text.push_str(&stream.finish(&tokenizer).expect("finish"));
        text
    };
    let text = run(concat!(
        "<|channel|>analysis<|message|>The user greets München; answer politely.<|end|>",
        "<|start|>assistant<|channel|>final<|message|>Hallo, München! 🎉<|return|>"
    ));
    assert_eq!(
        text,
        "<think>\nThe user greets München; answer politely.\n</think>\n\nHallo, München! 🎉"
    );
    assert_eq!(
        split_reasoning(&text),
        (
            Some("The user greets München; answer politely.".into()),
            "Hallo, München! 🎉".into()
        )
    );
    let call = run(concat!(
        "<|channel|>analysis<|message|>Need the weather.<|end|>",
        "<|start|>assistant<|channel|>commentary to=functions.weather <|constrain|>json",
        "<|message|>{\"city\":\"Paris\"}<|call|>"
    ));
    let (reasoning, reply) = split_reasoning(&call);
    assert_eq!(reasoning.as_deref(), Some("Need the weather."));
    assert_eq!(
        reply,
        "<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\":\"Paris\"}}\n</tool_call>"
    );
    let (content, calls) =
        backpack_engine::models::tool_calls::ToolFormat::Hermes.parse(&reply, &[]);
    assert!(content.is_empty());
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].name, "weather");
    assert_eq!(calls[0].arguments, serde_json::json!({"city": "Paris"}));
    // Cut off while reasoning: the reasoning is closed, the reply empty.
    let cut = run("<|channel|>analysis<|message|>Still thinking about");
    assert_eq!(
        split_reasoning(&cut),
        (Some("Still thinking about".into()), String::new())
    );
}

/// The reasoning effort reaches a harmony template (the fixture's states it as GPT-OSS's does),
/// and a system message becomes the developer's instructions.
#[test]
fn reasoning_effort_reaches_the_chat_template() {
    use backpack_engine::load::{ChatMessage, ChatSwitches, ReasoningEffort, TextTokenizer};

    let tokenizer =
        TextTokenizer::from_dir(&fixtures().join("models/tiny-gpt-oss")).expect("tokenizer");
    let messages = [
        ChatMessage::new("system", "Answer in one word."),
        ChatMessage::new("user", "Colour of the sky?"),
    ];
    let render = |effort| {
        tokenizer
            .render_chat(
                &messages,
                true,
                &ChatSwitches {
                    reasoning_effort: effort,
                    ..Default::default()
                },
            )
            .expect("renders")
    };
    assert!(render(None).contains("Reasoning: medium"));
    let high = render(Some(ReasoningEffort::High));
    assert!(high.contains("Reasoning: high"), "{high}");
    assert!(
        high.contains("<|start|>developer<|message|># Instructions\n\nAnswer in one word.<|end|>")
    );
    assert!(high.ends_with("<|start|>user<|message|>Colour of the sky?<|end|><|start|>assistant"));
}

/// A GGUF file names one end-of-text token; a harmony model's answer still ends at
/// `<|return|>` and at `<|call|>`, as GPT-OSS's generation config says.
#[test]
fn harmony_models_stop_at_return_and_call_from_gguf_too() {
    for file in ["tiny-gpt-oss-mxfp4", "tiny-gpt-oss-mxfp4.gguf"] {
        let m = load(file, WeightDType::F32);
        for token in ["<|return|>", "<|call|>"] {
            let id = m.tokenizer.token_to_id(token).expect("a harmony token");
            assert!(m.eos_ids().contains(&id), "{file}: {token} does not stop");
        }
    }
}
