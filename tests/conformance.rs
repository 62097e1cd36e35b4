//! The formats as published, through the engine's own readers: the hub's recorded answers
//! (model info with `_id`, `id` and `modelId` together, gated as bool or string, tree pages,
//! Link headers), configs saved by transformers 4 and 5 (`torch_dtype`/`dtype`,
//! `rope_theta`/`rope_parameters`, no `model_type`), tokenizer configs of both eras with the
//! chat template inline or in `chat_template.jinja`, diffusers configs, a CTranslate2 Whisper
//! tokenizer, and OpenAI's recorded event streams. Every sample and its source is listed in
//! tests/conformance/SOURCES.md.

use std::path::{Path, PathBuf};

use backpack_engine::hub::{next_link, parse_revision, parse_search, parse_tree_page};
use backpack_engine::load::{
    ChatMessage, ChatSwitches, DecoderSpec, GenerationConfig, TextTokenizer,
};
use backpack_engine::models::diffusion::config::{ClipConfig, VaeConfig};
use backpack_engine::models::diffusion::scheduler::SchedulerConfig;
use backpack_engine::models::whisper::{language_code, multilingual_by_vocab};
use serde_json::Value;

fn corpus(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/conformance")
        .join(path)
}

fn bytes(path: &str) -> Vec<u8> {
    std::fs::read(corpus(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn json(path: &str) -> Value {
    serde_json::from_slice(&bytes(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn model_info_answers_as_the_hub_sends_them() {
    for (file, gated) in [
        ("hub/model_info.json", false),
        ("hub/model_info_bert.json", false),
        ("hub/model_info_diffusers.json", false),
        ("hub/model_info_gated.json", true),
    ] {
        let raw = json(file);
        assert!(
            raw.get("id").is_some() && raw.get("modelId").is_some() && raw.get("_id").is_some(),
            "{file} is a real answer: id, modelId and _id together"
        );
        let info = parse_revision(&bytes(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(info.commit.as_deref(), raw["sha"].as_str(), "{file}");
        assert_eq!(info.gated, gated, "{file}: gated {}", raw["gated"]);
    }
}

#[test]
fn search_answers_keep_every_model() {
    let raw = json("hub/search.json");
    let found = parse_search(&bytes("hub/search.json")).expect("search answer");
    let ids: Vec<&str> = raw
        .as_array()
        .expect("array")
        .iter()
        .map(|m| m["id"].as_str().expect("id"))
        .collect();
    assert_eq!(found.iter().map(|m| m.id.as_str()).collect::<Vec<_>>(), ids);
    assert!(found[0].gated, "the gated Llama");
    assert!(found.iter().skip(1).all(|m| !m.gated));
    assert!(
        found
            .iter()
            .all(|m| m.downloads.is_some() && m.likes.is_some())
    );
    // Only one of the two id fields, as older answers and mirrors send them.
    let single = br#"[{"modelId": "a/b", "downloads": 3.0}, {"id": "c/d", "gated": "auto"}, {"private": true}]"#;
    let found = parse_search(single).expect("single id field");
    assert_eq!(found.len(), 2);
    assert_eq!((found[0].id.as_str(), found[0].downloads), ("a/b", Some(3)));
    assert!(found[1].gated);
}

#[test]
fn tree_pages_give_files_with_their_hashes() {
    let raw = json("hub/tree.json");
    let files = parse_tree_page(&bytes("hub/tree.json")).expect("tree page");
    let entries: Vec<&Value> = raw
        .as_array()
        .expect("array")
        .iter()
        .filter(|e| e["type"] == "file")
        .collect();
    assert_eq!(files.len(), entries.len());
    for (file, entry) in files.iter().zip(entries) {
        assert_eq!(file.path, entry["path"].as_str().expect("path"));
        assert_eq!(Some(file.size), entry["size"].as_u64());
        assert_eq!(file.git_oid.as_deref(), entry["oid"].as_str());
        assert_eq!(file.sha256.as_deref(), entry["lfs"]["oid"].as_str());
    }
    assert!(files.iter().any(|f| f.sha256.is_some()), "an LFS file");
    let hostile = br#"[{"type": "file", "path": "../../etc/passwd", "size": 1, "oid": "a"}]"#;
    let message = parse_tree_page(hostile).expect_err("unsafe path");
    assert!(message.contains("unsafe path"), "{message}");
}

#[test]
fn link_headers_name_the_next_page() {
    let text = String::from_utf8(bytes("hub/tree_link_header.txt")).expect("utf-8");
    let headers: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("Link: "))
        .collect();
    assert!(headers.len() >= 2, "{text}");
    for header in headers {
        let next = next_link(header).unwrap_or_else(|| panic!("no next in {header}"));
        assert!(next.starts_with("https://huggingface.co/api/"), "{next}");
    }
    assert_eq!(
        next_link(
            r#"<https://h/api/models?p=0>; rel="prev", <https://h/api/models?p=2>; rel="next""#
        )
        .as_deref(),
        Some("https://h/api/models?p=2")
    );
    assert_eq!(next_link(r#"<https://h/x>; rel="last""#), None);
}

#[test]
fn decoder_configs_of_both_transformers_eras() {
    // The same model as transformers 4 and 5 write it: torch_dtype and rope_theta, or dtype,
    // rope_parameters and layer_types.
    let old = DecoderSpec::from_file(&corpus("models/Qwen--Qwen3-0.6B/config.json")).expect("4.x");
    let new = DecoderSpec::from_file(&corpus(
        "models/transformers5-roundtrip--Qwen3-0.6B/config.json",
    ))
    .expect("5.x");
    assert_eq!(format!("{old:?}"), format!("{new:?}"));
    assert_eq!(
        (old.layers, old.hidden, old.kv_heads, old.head_dim),
        (28, 1024, 8, 128)
    );
    // gpt2 as first published: no model_type, the architecture names the family.
    let first = DecoderSpec::from_file(&corpus(
        "models/openai-community--gpt2/history/8bfcadd/config.json",
    ))
    .expect("architectures only");
    assert_eq!((first.layers, first.hidden, first.vocab), (12, 768, 50257));
    let bare = corpus("models/openai-community--gpt2/history/b57efa2/config.json");
    let message = DecoderSpec::from_file(&bare)
        .expect_err("neither")
        .to_string();
    assert!(
        message.contains("config.json") && message.contains("model_type"),
        "{message}"
    );
}

#[test]
fn generation_configs_as_published() {
    let dir = corpus("models/HuggingFaceTB--SmolLM2-135M-Instruct");
    let raw = json("models/HuggingFaceTB--SmolLM2-135M-Instruct/generation_config.json");
    let config = GenerationConfig::from_dir(&dir).expect("generation config");
    let eos: Vec<u32> = match &raw["eos_token_id"] {
        Value::Array(list) => list
            .iter()
            .filter_map(|v| v.as_u64())
            .map(|v| v as u32)
            .collect(),
        v => v.as_u64().map(|v| vec![v as u32]).unwrap_or_default(),
    };
    assert_eq!(config.eos_token_ids, eos);
    assert_eq!(
        config.bos_token_id,
        raw["bos_token_id"].as_u64().map(|v| v as u32)
    );
}

#[path = "support/temp_dir.rs"]
mod temp_dir;

/// A folder of a tiny tokenizer.json beside a published tokenizer_config.json (and template).
fn with_tokenizer(config_dir: &str, name: &str) -> temp_dir::TempDir {
    let dir = temp_dir::TempDir::new(&format!("conformance-{name}"));
    let tiny = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/models/tiny-qwen3");
    std::fs::copy(tiny.join("tokenizer.json"), dir.join("tokenizer.json")).expect("tokenizer");
    for entry in std::fs::read_dir(corpus(config_dir)).expect("corpus dir") {
        let path = entry.expect("entry").path();
        let file = path.file_name().expect("name").to_owned();
        if file == "tokenizer_config.json" || file == "chat_template.jinja" {
            std::fs::copy(&path, dir.join(file)).expect("copy");
        }
    }
    dir
}

#[test]
fn chat_templates_inline_or_in_their_own_file_render_alike() {
    // transformers 4 keeps the template in tokenizer_config.json; 5 writes chat_template.jinja.
    let inline = with_tokenizer("models/Qwen3-family--tokenizer_config-from-npm", "inline");
    let separate = with_tokenizer("models/transformers5-roundtrip--Qwen3-0.6B", "separate");
    assert!(
        !separate.join("tokenizer_config.json").exists() || {
            let c: Value = serde_json::from_slice(
                &std::fs::read(separate.join("tokenizer_config.json")).expect("read"),
            )
            .expect("json");
            c.get("chat_template").is_none()
        }
    );
    let messages = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Hi"),
    ];
    let mut rendered = Vec::new();
    for dir in [&inline, &separate] {
        let tokenizer = TextTokenizer::from_dir(dir).expect("tokenizer");
        assert!(tokenizer.has_chat_template() && tokenizer.has_thinking_switch());
        let text = tokenizer
            .render_chat(
                &messages,
                true,
                &ChatSwitches {
                    thinking: Some(false),
                    ..Default::default()
                },
            )
            .expect("render");
        assert!(
            text.contains("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"),
            "{text}"
        );
        rendered.push(text);
    }
    assert_eq!(rendered[0], rendered[1]);
}

#[test]
fn diffusers_configs_as_published() {
    let clip = json("models/stabilityai--sd-turbo/text_encoder/config.json");
    ClipConfig::from_json(&clip).expect("CLIP text encoder");
    let vae = json("models/stabilityai--sdxl-turbo/vae_decoder/config.json");
    VaeConfig::from_json(&vae).expect("SDXL VAE");
    for file in [
        "models/stabilityai--sd-turbo/scheduler/scheduler_config.json",
        "models/stabilityai--sdxl-turbo/scheduler/scheduler_config.json",
    ] {
        let config =
            SchedulerConfig::from_json(&json(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        let _ = config.default_kind();
    }
    let index = json("models/stabilityai--sd-turbo/model_index.json");
    assert_eq!(index["_class_name"], "StableDiffusionPipeline");
}

/// CTranslate2's tiny.en ships no is_multilingual and a tokenizer that lists every language:
/// the vocabulary size decides (51,864 is English-only).
#[test]
fn english_only_whisper_tokenizers_list_languages_yet_are_english_only() {
    let tokenizer = TextTokenizer::from_dir(&corpus("whisper-tiny.en-ct2")).expect("tokenizer");
    let config = json("whisper-tiny.en-ct2/config.json");
    assert!(config.get("is_multilingual").is_none());
    assert_eq!(tokenizer.token_to_id("<|en|>"), Some(50258));
    let languages: Vec<(&str, u32)> = ["en", "de", "fr"]
        .iter()
        .filter_map(|code| {
            let id = tokenizer.token_to_id(&format!("<|{code}|>"))?;
            Some((language_code(&format!("<|{code}|>"))?, id))
        })
        .collect();
    assert_eq!(languages.len(), 3, "the .en tokenizer lists languages");
    assert!(!multilingual_by_vocab(51_864, &languages));
}

#[test]
fn openai_event_streams_decode_whole() {
    use backpack_engine::remote::sse::SseDecoder;
    for file in [
        "openai/chat_completions_stream.openai-live.sse",
        "openai/chat_completions_stream_tool_calls.openai-live.sse",
        "openai/chat_completions_stream.hf-router-tgi.sse",
    ] {
        let stream = bytes(file);
        // Every chunking: one byte at a time, and whole.
        for step in [1, 7, stream.len()] {
            let mut decoder = SseDecoder::default();
            let mut events = Vec::new();
            for chunk in stream.chunks(step) {
                decoder.push(chunk, &mut events).expect("push");
            }
            decoder.finish(&mut events).expect("finish");
            assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{file}");
            for data in &events[..events.len() - 1] {
                let chunk: Value =
                    serde_json::from_str(data).unwrap_or_else(|e| panic!("{file}: {e}: {data}"));
                assert_eq!(chunk["object"], "chat.completion.chunk", "{file}");
            }
        }
    }
}

/// Every published file in the corpus, read by the reader its kind calls for: a new sample
/// dropped into tests/conformance/models/ is tested without a test of its own.
#[test]
fn every_recorded_model_file_is_read() {
    use backpack_engine::load::ChatTemplate;
    use backpack_engine::models::diffusion::config::UnetConfig;
    use backpack_engine::models::diffusion::flux2::Flux2Config;
    use backpack_engine::models::diffusion::scheduler::FlowMatchConfig;
    use backpack_engine::models::diffusion::taesd::TaesdConfig;
    use backpack_engine::models::diffusion::zimage::ZImageConfig;
    use backpack_engine::models::whisper::{WhisperConfig, WhisperGeneration};

    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("corpus dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(&corpus("models"), &mut files);
    files.sort();
    // gpt2's first config names neither model_type nor architectures: refused by name.
    let refused = ["openai-community--gpt2/history/b57efa2/config.json"];
    let mut read = 0;
    for path in &files {
        let shown = path.display().to_string();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let value = || -> Value {
            serde_json::from_slice(&std::fs::read(path).expect("read"))
                .unwrap_or_else(|e| panic!("{shown}: {e}"))
        };
        let result: Result<(), String> = match name {
            "config.json" => {
                let v = value();
                let class = v["_class_name"].as_str().unwrap_or_default();
                let model_type = v["model_type"].as_str().unwrap_or_default();
                let e = |e: &dyn std::fmt::Display| e.to_string();
                match (class, model_type) {
                    ("UNet2DConditionModel", _) => {
                        UnetConfig::from_json(&v).map(drop).map_err(|x| e(&x))
                    }
                    ("AutoencoderKL", _) => VaeConfig::from_json(&v).map(drop).map_err(|x| e(&x)),
                    ("AutoencoderTiny", _) => {
                        TaesdConfig::from_json(&v).map(drop).map_err(|x| e(&x))
                    }
                    ("ZImageTransformer2DModel", _) => {
                        ZImageConfig::from_json(&v).map(drop).map_err(|x| e(&x))
                    }
                    ("Flux2Transformer2DModel", _) => {
                        Flux2Config::from_json(&v).map(drop).map_err(|x| e(&x))
                    }
                    ("AutoencoderKLFlux2", _) => {
                        VaeConfig::from_json(&v).map(drop).map_err(|x| e(&x))
                    }
                    (_, "whisper") => WhisperConfig::from_file(path).map(drop).map_err(|x| e(&x)),
                    (_, "clip_text_model") => {
                        ClipConfig::from_json(&v).map(drop).map_err(|x| e(&x))
                    }
                    _ => DecoderSpec::from_file(path).map(drop).map_err(|x| e(&x)),
                }
            }
            "generation_config.json" => {
                let dir = path.parent().expect("dir");
                GenerationConfig::from_dir(dir)
                    .map(drop)
                    .and_then(|()| WhisperGeneration::from_dir(dir).map(drop))
                    .map_err(|e| e.to_string())
            }
            "scheduler_config.json" => {
                let v = value();
                if v["_class_name"] == "FlowMatchEulerDiscreteScheduler" {
                    FlowMatchConfig::from_json(&v)
                        .map(drop)
                        .map_err(|e| e.to_string())
                } else {
                    SchedulerConfig::from_json(&v)
                        .map(|c| {
                            c.default_kind();
                        })
                        .map_err(|e| e.to_string())
                }
            }
            "tokenizer_config.json" => match value().get("chat_template").and_then(Value::as_str) {
                Some(source) => ChatTemplate::new(source, "<s>", "</s>")
                    .and_then(|t| {
                        t.render(
                            &[ChatMessage::new("user", "Hi")],
                            true,
                            &ChatSwitches::default(),
                        )
                    })
                    .map(drop)
                    .map_err(|e| e.to_string()),
                None => Ok(()),
            },
            _ if name.ends_with(".json") => {
                value();
                Ok(())
            }
            _ => continue,
        };
        let expected_refusal = refused.iter().any(|r| shown.ends_with(r));
        match (result, expected_refusal) {
            (Ok(()), false) | (Err(_), true) => read += 1,
            (Ok(()), true) => panic!("{shown} was expected to be refused"),
            (Err(e), false) => panic!("{shown}: {e}"),
        }
    }
    assert!(read >= 15, "{read} files read");
}

/// Where a published Whisper folder states `is_multilingual`, the vocabulary rule used without
/// it gives the same answer.
#[test]
fn the_vocabulary_rule_agrees_with_published_flags() {
    let mut checked = 0;
    for entry in std::fs::read_dir(corpus("models")).expect("models") {
        let dir = entry.expect("entry").path();
        let (config, generation) = (dir.join("config.json"), dir.join("generation_config.json"));
        if !config.is_file() || !generation.is_file() {
            continue;
        }
        let config: Value =
            serde_json::from_slice(&std::fs::read(&config).expect("read")).expect("json");
        let generation: Value =
            serde_json::from_slice(&std::fs::read(&generation).expect("read")).expect("json");
        let (Some(vocab), Some(flag)) = (
            config["vocab_size"].as_u64(),
            generation["is_multilingual"].as_bool(),
        ) else {
            continue;
        };
        let languages = [("en", 50_259)];
        assert_eq!(
            multilingual_by_vocab(vocab as u32, &languages),
            flag,
            "{}",
            dir.display()
        );
        checked += 1;
    }
    assert!(checked >= 1, "a published Whisper folder with the flag");
}

/// The published GPT-OSS harmony template renders as transformers renders it, for every
/// recorded case the chat path produces (plain role/content messages, the generation prompt
/// and the reasoning effort); the date line is today's in both.
#[test]
fn gpt_oss_harmony_template_renders_as_transformers_does() {
    use backpack_engine::load::{ChatTemplate, ReasoningEffort};
    let source =
        String::from_utf8(bytes("models/openai--gpt-oss-20b/chat_template.jinja")).expect("utf-8");
    let template = ChatTemplate::new(&source, "<|startoftext|>", "<|return|>").expect("template");
    let renders = json("models/transformers5-render--gpt-oss-20b/chat_template_renders.json");
    let dated = |text: &str| -> String {
        text.lines()
            .map(|line| match line.strip_prefix("Current date: ") {
                Some(date) => {
                    let digits = date.replace('-', "");
                    assert!(date.len() == 10 && digits.len() == 8, "{line}");
                    assert!(digits.chars().all(|c| c.is_ascii_digit()), "{line}");
                    "Current date: (today)".to_owned()
                }
                None => line.to_owned(),
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let mut checked = 0;
    for case in renders["cases"].as_array().expect("cases") {
        let kwargs = case["kwargs"].as_object().expect("kwargs");
        let known = kwargs
            .keys()
            .all(|k| k == "add_generation_prompt" || k == "reasoning_effort");
        if !known {
            continue;
        }
        let messages: Vec<ChatMessage> =
            serde_json::from_value(case["messages"].clone()).expect("messages");
        let switches = ChatSwitches {
            reasoning_effort: kwargs
                .get("reasoning_effort")
                .and_then(Value::as_str)
                .map(|e| ReasoningEffort::parse(e).expect("effort")),
            tools: case["tools"].as_array().cloned().unwrap_or_default(),
            ..Default::default()
        };
        let generation = kwargs["add_generation_prompt"].as_bool().expect("bool");
        let got = template
            .render(&messages, generation, &switches)
            .unwrap_or_else(|e| panic!("{}: {e}", case["name"]));
        let want = case["rendered"].as_str().expect("rendered");
        assert_eq!(dated(&got), dated(want), "{}", case["name"]);
        checked += 1;
    }
    assert_eq!(checked, 8);
}

/// The published mixture-of-experts configs read as their model cards describe them: GPT-OSS's
/// 32 experts top-4 with sinks, alternating 128-token windows and YaRN ×32; Qwen3-30B-A3B's
/// 128 experts top-8 on every layer; 21B / 3.6B and 30.5B / 3.3B parameters, total / active,
/// as the model cards count them.
#[test]
fn moe_configs_as_published() {
    use backpack_engine::load::{Arch, ExpertActivation, RopeScaling, RouterWeights};
    let spec = |path: &str| DecoderSpec::from_file(&corpus(path)).expect(path);
    let billions = |n: u64| n as f64 / 1e9;

    let oss = spec("models/openai--gpt-oss-20b/config.json");
    assert_eq!(oss.arch, Arch::GptOss);
    assert_eq!(
        (
            oss.layers,
            oss.hidden,
            oss.heads,
            oss.kv_heads,
            oss.head_dim
        ),
        (24, 2880, 64, 8, 64)
    );
    assert!(oss.sinks && oss.qkv_bias && oss.out_bias);
    let moe = oss.moe.as_ref().expect("experts");
    assert_eq!((moe.experts, moe.top_k, moe.intermediate), (32, 4, 2880));
    assert_eq!(moe.weights, RouterWeights::SoftmaxOfChosen);
    assert_eq!(
        moe.activation,
        ExpertActivation::ClampedSwiGlu {
            alpha: 1.702,
            limit: 7.0
        }
    );
    assert!(moe.biases && moe.sparse.iter().all(|&s| s) && moe.sparse.len() == 24);
    let window = oss.window.as_ref().expect("window");
    assert_eq!(window.size, 128);
    assert!((0..24).all(|l| window.local[l] == (l % 2 == 0)));
    let rope = oss.rope.as_ref().expect("rope");
    assert_eq!(rope.theta, 150_000.0);
    let RopeScaling::Yarn {
        factor,
        beta_fast,
        beta_slow,
        original,
        truncate,
        ..
    } = rope.scaling
    else {
        panic!("YaRN expected: {:?}", rope.scaling)
    };
    assert_eq!(
        (factor, beta_fast, beta_slow, original),
        (32.0, 32.0, 1.0, 4096.0)
    );
    assert!(!truncate);
    assert!((rope.attention_factor() - (0.1 * 32f32.ln() + 1.0)).abs() < 1e-6);
    assert!((20.5..21.5).contains(&billions(oss.parameters())));
    // OpenAI's 3.6B active leaves the embedding table out (Qwen's 3.3B counts it).
    let table = u64::from(oss.vocab) * u64::from(oss.hidden);
    assert!((3.5..3.7).contains(&billions(oss.active_parameters() - table)));
    let generation =
        GenerationConfig::from_dir(&corpus("models/openai--gpt-oss-20b")).expect("generation");
    assert_eq!(generation.eos_token_ids, [200_002, 199_999]);

    for (path, theta, positions) in [
        ("models/Qwen--Qwen3-30B-A3B/config.json", 1e6, 40_960),
        (
            "models/Qwen--Qwen3-30B-A3B-Instruct-2507/config.json",
            1e7,
            262_144,
        ),
        (
            "models/Qwen--Qwen3-Coder-30B-A3B-Instruct/config.json",
            1e7,
            262_144,
        ),
    ] {
        let qwen = spec(path);
        assert_eq!(qwen.arch, Arch::Qwen3Moe, "{path}");
        assert_eq!((qwen.layers, qwen.hidden, qwen.kv_heads), (48, 2048, 4));
        assert!(qwen.qk_norm && !qwen.sinks && qwen.window.is_none());
        let moe = qwen.moe.as_ref().expect("experts");
        assert_eq!((moe.experts, moe.top_k, moe.intermediate), (128, 8, 768));
        assert_eq!(moe.weights, RouterWeights::SoftmaxOfChosen);
        assert_eq!(moe.activation, ExpertActivation::SwiGlu);
        assert!(!moe.biases && moe.sparse.iter().all(|&s| s) && moe.sparse.len() == 48);
        assert_eq!(qwen.rope.as_ref().expect("rope").theta, theta, "{path}");
        assert_eq!(qwen.max_positions, positions, "{path}");
        assert!(
            (30.0..31.0).contains(&billions(qwen.parameters())),
            "{path}"
        );
        assert!(
            (3.2..3.4).contains(&billions(qwen.active_parameters())),
            "{path}"
        );
    }
    let coder = GenerationConfig::from_dir(&corpus("models/Qwen--Qwen3-Coder-30B-A3B-Instruct"))
        .expect("generation");
    assert_eq!(coder.eos_token_ids, [151_645, 151_643]);
}

/// Qwen3.5's published chat template renders through Backpack's renderer to transformers' exact
/// strings (thinking on by default, off, on; earlier turns' reasoning dropped; no generation
/// prompt), has a thinking switch, and with thinking on leaves the answer inside `<think>`.
#[test]
fn qwen3_5_template_renders_as_transformers_does() {
    let dir = with_tokenizer("models/Qwen--Qwen3.5-35B-A3B", "qwen35");
    let tokenizer = TextTokenizer::from_dir(&dir).expect("tokenizer");
    assert!(tokenizer.has_thinking_switch());
    let renders = json("models/transformers5-render--Qwen3.5-35B-A3B/chat_template_renders.json");
    let cases = renders["cases"].as_array().expect("cases");
    for case in cases {
        let messages: Vec<ChatMessage> =
            serde_json::from_value(case["messages"].clone()).expect("messages");
        let kwargs = &case["kwargs"];
        let switches = ChatSwitches {
            thinking: kwargs["enable_thinking"].as_bool(),
            ..Default::default()
        };
        let generation = kwargs["add_generation_prompt"].as_bool().expect("bool");
        let got = tokenizer
            .render_chat(&messages, generation, &switches)
            .unwrap_or_else(|e| panic!("{}: {e}", case["name"]));
        assert_eq!(
            got,
            case["rendered"].as_str().expect("rendered"),
            "{}",
            case["name"]
        );
        let ids = tokenizer.encode(&got, false).expect("encode");
        let thinking_on = generation && switches.thinking != Some(false);
        assert_eq!(
            tokenizer.opens_reasoning(&ids),
            thinking_on,
            "{}: answer starts inside the reasoning",
            case["name"]
        );
    }
    assert_eq!(cases.len(), 7);
}

/// Qwen3.5 configs as Qwen publishes them (the text settings nested in `text_config`, three
/// linear-attention layers to one full one) and as exporters rewrite them (`type` for
/// `rope_type`) describe the models their cards state.
#[test]
fn qwen3_5_configs_as_published() {
    use backpack_engine::load::Arch;
    let spec = |path: &str| DecoderSpec::from_file(&corpus(path)).expect(path);
    for (path, layers, hidden, heads, value_heads, tied) in [
        (
            "models/Qwen--Qwen3.5-27B/config.json",
            64,
            5120,
            24,
            48,
            false,
        ),
        (
            "models/third-party-mlx--Qwen3.5-2B/config.json",
            24,
            2048,
            8,
            16,
            true,
        ),
    ] {
        let s = spec(path);
        assert_eq!(s.arch, Arch::Qwen35, "{path}");
        assert_eq!(
            (s.layers, s.hidden, s.heads, s.head_dim),
            (layers, hidden, heads, 256)
        );
        assert_eq!((s.vocab, s.tied_embeddings), (248_320, tied), "{path}");
        assert!(s.output_gate && s.qk_norm, "{path}");
        // A quarter of each 256-wide head rotates.
        assert_eq!(s.rotary_dim, 64, "{path}");
        let linear = s.linear.as_ref().expect("linear-attention layers");
        assert_eq!(
            (
                linear.shape.key_heads,
                linear.shape.value_heads,
                linear.shape.key_dim,
                linear.shape.value_dim,
                linear.shape.conv_kernel
            ),
            (16, value_heads, 128, 128, 4),
            "{path}"
        );
        let full: Vec<u32> = (0..layers).filter(|&l| !linear.is_linear(l)).collect();
        assert_eq!(full, (0..layers / 4).map(|i| 4 * i + 3).collect::<Vec<_>>());
        assert_eq!(s.eos_token_ids, [248_044], "{path}");
        assert!(s.moe.is_none());
    }
}

/// Z-Image and Z-Image-Turbo as Tongyi-MAI publishes them: the transformer, VAE, scheduler and
/// text-encoder configs describe the 6B single-stream model with Qwen3-4B's hidden states as
/// captions, and the tokenizer's chat template renders the prompt as the pipeline does
/// (thinking on: no empty reasoning block).
#[test]
fn z_image_configs_as_published() {
    use backpack_engine::load::ChatTemplate;
    use backpack_engine::models::diffusion::scheduler::{FlowMatchConfig, linear_sigmas};
    use backpack_engine::models::diffusion::zimage::ZImageConfig;
    let json = |path: &str| -> Value {
        serde_json::from_slice(&std::fs::read(corpus(path)).expect(path)).expect(path)
    };
    for (repo, shift) in [("Z-Image-Turbo", 3.0), ("Z-Image", 6.0)] {
        let dir = format!("models/Tongyi-MAI--{repo}");
        let t = ZImageConfig::from_json(&json(&format!("{dir}/transformer/config.json")))
            .expect("transformer");
        assert_eq!(
            (t.dim, t.heads, t.layers, t.refiner_layers),
            (3840, 30, 30, 2)
        );
        assert_eq!(
            (t.head_dim(), t.ffn_hidden(), t.patch_features()),
            (128, 10240, 64)
        );
        assert_eq!(
            (t.cap_feat_dim, t.axes_dims.clone()),
            (2560, vec![32, 48, 48])
        );
        let vae = VaeConfig::from_json(&json(&format!("{dir}/vae/config.json"))).expect("vae");
        assert_eq!((vae.latent_channels, vae.downscale()), (16, 8));
        assert_eq!((vae.scaling_factor, vae.shift_factor), (0.3611, 0.1159));
        assert!(!vae.quant_conv && !vae.post_quant_conv);
        let sched =
            FlowMatchConfig::from_json(&json(&format!("{dir}/scheduler/scheduler_config.json")))
                .expect("scheduler");
        assert_eq!((sched.shift, sched.dynamic.is_none()), (shift, true));
        // Shifted, the schedule still starts at pure noise and ends at the clean image.
        let sigmas = sched.sigmas(&linear_sigmas(8), 4096).expect("sigmas");
        assert_eq!((sigmas[0], sigmas[8], sigmas.len()), (1.0, 0.0, 9));
    }
    let encoder = DecoderSpec::from_file(&corpus(
        "models/Tongyi-MAI--Z-Image-Turbo/text_encoder/config.json",
    ))
    .expect("text encoder");
    assert_eq!((encoder.hidden, encoder.layers), (2560, 36));
    let tokenizer = json("models/Tongyi-MAI--Z-Image-Turbo/tokenizer/tokenizer_config.json");
    let template = ChatTemplate::new(
        tokenizer["chat_template"].as_str().expect("template"),
        "",
        "<|im_end|>",
    )
    .expect("template");
    let switches = |thinking| ChatSwitches {
        thinking: Some(thinking),
        ..ChatSwitches::default()
    };
    let message = [ChatMessage::new("user", "a fox")];
    let on = template
        .render(&message, true, &switches(true))
        .expect("render");
    assert_eq!(
        on,
        "<|im_start|>user\na fox<|im_end|>\n<|im_start|>assistant\n"
    );
    let off = template
        .render(&message, true, &switches(false))
        .expect("render");
    assert_eq!(off, format!("{on}<think>\n\n</think>\n\n"));
}

/// FLUX.2 [klein] 4B and its base as published: the transformer's shape, the text encoder deep
/// and wide enough for the three stacked layers, the 32-channel VAE with its batch norm and no
/// scale, the dynamic exponential shift under the pipeline's empirical mu, `is_distilled` on
/// the distilled model only, and the template in its own file with thinking off.
#[test]
fn flux2_klein_configs_as_published() {
    use backpack_engine::load::TextTokenizer;
    use backpack_engine::models::diffusion::flux2::{Flux2Config, TEXT_LAYERS, empirical_mu};
    use backpack_engine::models::diffusion::scheduler::{FlowMatchConfig, linear_sigmas};
    let json = |path: &str| -> Value {
        serde_json::from_slice(&std::fs::read(corpus(path)).expect(path)).expect(path)
    };
    for (repo, distilled) in [("FLUX.2-klein-4B", true), ("FLUX.2-klein-base-4B", false)] {
        let dir = format!("models/black-forest-labs--{repo}");
        let t = Flux2Config::from_json(&json(&format!("{dir}/transformer/config.json")))
            .expect("transformer");
        assert_eq!((t.dim(), t.heads, t.mlp_hidden()), (3072, 24, 9216));
        assert_eq!((t.double_layers, t.single_layers), (5, 20));
        assert_eq!((t.in_channels, t.latent_channels()), (128, 32));
        let encoder = DecoderSpec::from_file(&corpus(&format!("{dir}/text_encoder/config.json")))
            .expect("text encoder");
        assert_eq!(
            encoder.hidden * TEXT_LAYERS.len() as u32,
            t.joint_attention_dim
        );
        assert!(encoder.layers as usize >= TEXT_LAYERS[2]);
        let vae = VaeConfig::from_json(&json(&format!("{dir}/vae/config.json"))).expect("vae");
        assert_eq!((vae.latent_channels, vae.downscale()), (32, 8));
        assert_eq!((vae.scaling_factor, vae.shift_factor), (1.0, 0.0));
        assert_eq!(vae.batch_norm_eps, Some(1e-4));
        assert!(vae.quant_conv && vae.post_quant_conv);
        let sched =
            FlowMatchConfig::from_json(&json(&format!("{dir}/scheduler/scheduler_config.json")))
                .expect("scheduler");
        assert!(sched.dynamic.as_ref().is_some_and(|d| d.exponential));
        // 1024² is 64×64 packed tokens: four steps from pure noise to the clean image.
        let sigmas = sched
            .sigmas_at_mu(&linear_sigmas(4), empirical_mu(4096, 4))
            .expect("sigmas");
        assert_eq!((sigmas[0], sigmas[4], sigmas.len()), (1.0, 0.0, 5));
        let index = json(&format!("{dir}/model_index.json"));
        assert_eq!(index["_class_name"], "Flux2KleinPipeline");
        assert_eq!(index["is_distilled"].as_bool().unwrap_or(false), distilled);
    }
    // The template comes from chat_template.jinja (the tokenizer config has none): the
    // published files with the tiny fixture's vocabulary.
    let tokenizer_dir = corpus("models/black-forest-labs--FLUX.2-klein-4B/tokenizer");
    let dir = std::env::temp_dir().join(format!("backpack-klein-tokenizer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    for file in ["tokenizer_config.json", "chat_template.jinja"] {
        std::fs::copy(tokenizer_dir.join(file), dir.join(file)).expect("copy");
    }
    let tiny = corpus("../fixtures/models/tiny-qwen3/tokenizer.json");
    std::fs::copy(tiny, dir.join("tokenizer.json")).expect("tokenizer.json");
    let tokenizer = TextTokenizer::from_dir(&dir).expect("tokenizer");
    let switches = ChatSwitches {
        thinking: Some(false),
        ..ChatSwitches::default()
    };
    let rendered = tokenizer
        .render_chat(&[ChatMessage::new("user", "a fox")], true, &switches)
        .expect("render");
    assert_eq!(
        rendered,
        "<|im_start|>user\na fox<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Raw answers with tool calls from llama.cpp's and vLLM's own tests, one or more per family,
/// read into the calls those engines read from them, the text around them kept as the reply;
/// streamed a few characters at a time, the same calls come out.
#[test]
fn tool_calls_read_as_the_engines_read_them() {
    use backpack_engine::models::tool_calls::{ToolCallStream, ToolFormat, assemble_calls};
    let recorded = json("tool-calls/outputs.json");
    let cases = recorded["cases"].as_array().expect("cases");
    for case in cases {
        let format: ToolFormat = serde_json::from_value(case["format"].clone()).expect("format");
        let output = case["output"].as_str().expect("output");
        let source = case["source"].as_str().expect("source");
        let (content, calls) = format.parse(output, &[]);
        assert_eq!(
            content,
            case["content"].as_str().expect("content"),
            "{source}"
        );
        let want = case["calls"].as_array().expect("calls");
        assert_eq!(calls.len(), want.len(), "{source}: {calls:?}");
        for (got, want) in calls.iter().zip(want) {
            assert_eq!(got.name, want[0].as_str().expect("name"), "{source}");
            assert_eq!(got.arguments, want[1], "{source}");
            assert_eq!(
                got.id.as_deref(),
                want.get(2).and_then(Value::as_str),
                "{source}"
            );
        }
        let mut stream = ToolCallStream::new(format, Vec::new());
        let chars: Vec<char> = output.chars().collect();
        let mut pieces = Vec::new();
        for chunk in chars.chunks(3) {
            pieces.extend(stream.push(&chunk.iter().collect::<String>()));
        }
        pieces.extend(stream.finish());
        // As a client joins them: whole calls, or started ones and their fragments. A call
        // started before the model wrote its id (Nemo's `"id"` after the arguments) gets the
        // server's id instead.
        let streamed = assemble_calls(&pieces);
        assert_eq!(streamed.len(), calls.len(), "{source}: streamed");
        for (got, want) in streamed.iter().zip(&calls) {
            assert_eq!(
                (&got.name, &got.arguments),
                (&want.name, &want.arguments),
                "{source}: streamed"
            );
            if got.id.is_some() {
                assert_eq!(got.id, want.id, "{source}: streamed id");
            }
        }
    }
    assert!(cases.len() >= 14);
}

/// The published templates of every tool-calling family render a tool conversation (the
/// definitions, a call with its id, the tool's result) through Backpack's renderer, and each
/// names its own call syntax.
#[test]
fn published_tool_templates_render_a_tool_round_trip() {
    use backpack_engine::load::{ChatTemplate, FunctionCall, ToolCall};
    use backpack_engine::models::tool_calls::ToolFormat;
    let tools = vec![serde_json::json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "Weather now",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    }})];
    let mut call = ChatMessage::new("assistant", "");
    call.tool_calls.push(ToolCall {
        id: "abcDEF123".into(),
        kind: "function".into(),
        function: FunctionCall {
            name: "get_weather".into(),
            arguments: serde_json::json!({"city": "Paris"}),
        },
    });
    let mut result = ChatMessage::new("tool", "{\"temp\": 21}");
    result.tool_call_id = Some("abcDEF123".into());
    result.name = Some("get_weather".into());
    let conversation = [ChatMessage::new("user", "Weather in Paris?"), call, result];
    for (dir, format, call_text) in [
        (
            "Qwen--Qwen2.5-7B-Instruct",
            ToolFormat::Hermes,
            "<tool_call>",
        ),
        (
            "Qwen--Qwen3.5-35B-A3B",
            ToolFormat::Hermes,
            "<function=get_weather>",
        ),
        (
            "meta-llama--Llama-3.1-8B-Instruct",
            ToolFormat::Llama3,
            "\"parameters\": ",
        ),
        (
            "mistralai--Mistral-Nemo-Instruct-2407",
            ToolFormat::Mistral,
            "[TOOL_CALLS]",
        ),
        (
            "mistralai--Mistral-Small-3.2-24B-Instruct-2506",
            ToolFormat::Mistral,
            "[CALL_ID]",
        ),
        (
            "google--gemma-4-31B-it",
            ToolFormat::Gemma4,
            "call:get_weather",
        ),
    ] {
        let source =
            String::from_utf8(bytes(&format!("models/{dir}/chat_template.jinja"))).expect("utf-8");
        assert_eq!(ToolFormat::detect(Some(&source)), format, "{dir}");
        let template = ChatTemplate::new(&source, "<s>", "</s>").expect(dir);
        assert!(template.knows_tools, "{dir}");
        let switches = ChatSwitches {
            tools: tools.clone(),
            ..Default::default()
        };
        let text = template
            .render(&conversation, true, &switches)
            .unwrap_or_else(|e| panic!("{dir}: {e}"));
        assert!(text.contains("get_weather"), "{dir}: the tool is described");
        assert!(
            text.contains(call_text),
            "{dir}: the call is written: {text}"
        );
        assert!(text.contains("21"), "{dir}: the result is there");
    }
}

/// Phi-4-mini's published template ignores the `tools` variable and reads a system message's
/// `tools` field instead: the definitions land there, as the model card shows them, and the
/// answer's `<|tool_call|>` is what the model's format reads.
#[test]
fn phi4_mini_gets_its_tools_in_the_system_message() {
    use backpack_engine::models::tool_calls::ToolFormat;
    let dir = with_tokenizer("models/microsoft--Phi-4-mini-instruct", "phi4");
    let tokenizer = TextTokenizer::from_dir(&dir).expect("tokenizer");
    assert_eq!(
        ToolFormat::detect(tokenizer.template_source()),
        ToolFormat::Phi4
    );
    let switches = ChatSwitches {
        tools: vec![serde_json::json!({"type": "function", "function": {
            "name": "get_weather", "parameters": {"type": "object"}}})],
        ..Default::default()
    };
    let text = tokenizer
        .render_chat(&[ChatMessage::new("user", "Weather?")], true, &switches)
        .expect("render");
    assert_eq!(
        text,
        "<|system|><|tool|>[{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\"}}]<|/tool|><|end|><|user|>Weather?<|end|><|assistant|>"
    );
}

/// The official JSON-Schema-Test-Suite (draft 2020-12, the keywords structured outputs use):
/// each instance, written as compact JSON and tokenized, is taken whole by the grammar of its
/// schema when the suite calls it valid, and never when it calls it invalid. The one kind of
/// valid instance refused is another spelling of a value the grammar writes one way: a whole
/// number with a `.0` where an integer, a `const` or an `enum` asks for one, a `const` object
/// with its keys in another order. Schemas that strict mode refuses are listed with why.
#[test]
fn json_schema_grammars_agree_with_the_schema_test_suite() {
    use backpack_engine::grammar::{Constraint, GrammarVocab, Guide, Preamble};
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/models/tiny-qwen2");
    let tokenizer = TextTokenizer::from_dir(&dir).expect("tokenizer");
    let eos = tokenizer.eos_token_id().expect("an end-of-text token");
    let vocab = GrammarVocab::new(tokenizer.hf().clone(), tokenizer.vocab_size(), &[eos])
        .expect("vocabulary");
    let other_spelling = |label: &str, text: &str| {
        label.contains("property order")
            || text
                .split(|c: char| !(c.is_ascii_digit() || c == '.'))
                .any(|n| n.ends_with(".0"))
    };
    let (mut agreed, mut excepted, mut refused, mut differ) =
        (0, Vec::new(), Vec::new(), Vec::new());
    let suite = corpus("json-schema-test-suite");
    let mut files: Vec<_> = std::fs::read_dir(&suite)
        .expect("suite")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    for file in files {
        let groups: Value =
            serde_json::from_slice(&std::fs::read(&file).expect("read")).expect("suite file");
        let name = file
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_owned();
        for group in groups.as_array().expect("groups") {
            let constraint = Constraint::JsonSchema {
                schema: group["schema"].clone(),
                strict: true,
            };
            if let Err(e) = Guide::new(&vocab, &constraint, Preamble::None) {
                let tests = group["tests"].as_array().expect("tests");
                if e.to_string().contains("Unsatisfiable") {
                    // No document fits: the suite must call every instance invalid.
                    assert!(tests.iter().all(|t| t["valid"] == false), "{name}: {e}");
                    agreed += tests.len();
                } else {
                    // Strict mode refuses what it cannot hold (a keyword, a bound written
                    // as 2.0), saying what.
                    refused.push(format!(
                        "{name}: {}: {e}",
                        group["description"].as_str().unwrap_or_default()
                    ));
                }
                continue;
            }
            for case in group["tests"].as_array().expect("tests") {
                let label = format!(
                    "{name}: {} / {}",
                    group["description"].as_str().unwrap_or_default(),
                    case["description"].as_str().unwrap_or_default()
                );
                let text = serde_json::to_string(&case["data"]).expect("json");
                let ids = tokenizer.encode(&text, false).expect("encode");
                let taken = match Guide::new(&vocab, &constraint, Preamble::None) {
                    Err(e) => panic!("{label}: the schema does not compile: {e}"),
                    Ok(mut guide) => {
                        ids.iter().all(|&id| {
                            let allowed = guide
                                .mask()
                                .is_ok_and(|m| m[(id / 32) as usize] & (1 << (id % 32)) != 0);
                            allowed && guide.accept(id).is_ok()
                        }) && guide.is_complete()
                    }
                };
                let valid = case["valid"].as_bool().expect("valid");
                if taken == valid {
                    agreed += 1;
                } else if valid && other_spelling(&label, &text) {
                    excepted.push(format!("{label}: {text}"));
                } else {
                    differ.push(format!(
                        "{label}: {text} is {} but the grammar {}",
                        if valid { "valid" } else { "invalid" },
                        if taken { "takes it" } else { "refuses it" }
                    ));
                }
            }
        }
    }
    eprintln!("{agreed} instances agree; excepted: {excepted:#?}; schemas refused: {refused:#?}");
    assert!(differ.is_empty(), "{differ:#?}");
    assert!(agreed >= 350, "{agreed}");
    assert!(
        excepted.len() <= 10 && refused.len() <= 6,
        "{excepted:#?} {refused:#?}"
    );
}
