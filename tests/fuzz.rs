//! Bounded fuzzing of every parser that reads outside input: GGUF, safetensors headers, model
//! configs (decoder, Whisper, UNet, VAE, CLIP, scheduler), tokenizer and generation-config
//! files, chat templates, audio containers, PNG and start images, the hub's JSON answers and
//! Link headers, and server-sent event streams. Seeds are real files from the fixtures and the
//! conformance corpus. Each target must give a clean error or a value: never a panic, a hang,
//! or an allocation sized by an untrusted length. `BACKPACK_FUZZ_CASES=N` runs N cases a
//! target (for longer local runs); the server's request bodies are fuzzed in tests/serve_conformance.rs.

#[path = "support/mutate.rs"]
mod mutate;

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use backpack_engine::load::{
    ChatMessage, ChatSwitches, ChatTemplate, DecoderSpec, GenerationConfig, GgufFile,
    ReasoningEffort, SafeTensors, TextTokenizer, gguf_spec, gguf_tokenizer,
};
use backpack_engine::models::diffusion::clip_tokenizer::ClipTokenizer;
use backpack_engine::models::diffusion::config::{ClipConfig, UnetConfig, VaeConfig};
use backpack_engine::models::diffusion::flux2::Flux2Config;
use backpack_engine::models::diffusion::scheduler::{
    FlowMatchConfig, SchedulerConfig, linear_sigmas,
};
use backpack_engine::models::diffusion::zimage::ZImageConfig;
use backpack_engine::models::whisper::{WhisperConfig, WhisperGeneration};
use mutate::{Scratch, fuzz};

/// The largest single allocation any case may ask for. A parser that sizes a buffer by a
/// length field it has not checked against the input asks for far more.
const MAX_ALLOCATION: usize = 1 << 30;

struct Largest;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

// Measuring allocations needs a global allocator, which Rust only offers as an unsafe trait;
// this one forwards to the system allocator and records the largest request.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Largest {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Largest = Largest;

fn assert_bounded_allocations(name: &str) {
    let largest = LARGEST.load(Ordering::Relaxed);
    assert!(
        largest <= MAX_ALLOCATION,
        "{name}: a case asked for {largest} bytes at once"
    );
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(path: &str) -> Vec<u8> {
    let path = root().join(path);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every file named `name` under `dir` (recursively), as seeds.
fn seeds_named(dir: &str, name: &str) -> Vec<Vec<u8>> {
    fn walk(dir: &Path, name: &str, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, name, out);
            } else if path.file_name().is_some_and(|n| n == name) {
                out.push(path);
            }
        }
    }
    let mut paths = Vec::new();
    walk(&root().join(dir), name, &mut paths);
    paths.sort();
    paths
        .iter()
        .map(|p| std::fs::read(p).expect("seed"))
        .collect()
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

#[test]
fn gguf_files() {
    let seeds = vec![
        read("tests/fixtures/models/tiny-llama-spm.gguf"),
        read("tests/fixtures/models/tiny-gpt2.gguf"),
        // Found here before: a NaN merge score broke the merge sort's total order.
        read("tests/fixtures/fuzz/gguf-nan-merge-score.gguf"),
    ];
    let scratch = Scratch::new("gguf");
    let path = scratch.0.join("model.gguf");
    // Metadata and the tensor table sit in the first few KB.
    fuzz("gguf", &seeds, 600, Some(8192), |bytes| {
        std::fs::write(&path, bytes).map_err(err)?;
        let file = GgufFile::open(&path).map_err(err)?;
        for tensor in file.tensors() {
            let _ = file.data(tensor).len();
        }
        gguf_spec(&file).map_err(err)?;
        let tokenizer = gguf_tokenizer(&file).map_err(err)?;
        tokenizer.encode("The fox", true).map_err(err)?;
        Ok(())
    });
    assert_bounded_allocations("gguf");
}

#[test]
fn safetensors_headers() {
    let seeds = vec![
        read("tests/fixtures/models/tiny-qwen2/model.safetensors"),
        read("tests/fixtures/models/tiny-taesd/diffusion_pytorch_model.safetensors"),
    ];
    let scratch = Scratch::new("safetensors");
    let path = scratch.0.join("model.safetensors");
    fuzz("safetensors", &seeds, 1000, Some(4096), |bytes| {
        std::fs::write(&path, bytes).map_err(err)?;
        let tensors = SafeTensors::open_files(std::slice::from_ref(&path)).map_err(err)?;
        let names: Vec<String> = tensors.names().map(str::to_owned).collect();
        for name in names {
            let view = tensors.get(&name).map_err(err)?;
            let _ = view.len();
        }
        Ok(())
    });
    assert_bounded_allocations("safetensors");
}

#[test]
fn model_configs() {
    let mut seeds = seeds_named("tests/fixtures/models", "config.json");
    seeds.extend(seeds_named("tests/conformance", "config.json"));
    let scratch = Scratch::new("configs");
    let path = scratch.0.join("config.json");
    fuzz("configs", &seeds, 4000, None, |bytes| {
        let value: serde_json::Value = serde_json::from_slice(bytes).map_err(err)?;
        let results = [
            DecoderSpec::from_json(&value).map(|_| ()).map_err(err),
            UnetConfig::from_json(&value).map(|_| ()).map_err(err),
            VaeConfig::from_json(&value).map(|_| ()).map_err(err),
            ClipConfig::from_json(&value).map(|_| ()).map_err(err),
            ZImageConfig::from_json(&value)
                .map(|c| {
                    let _ = (c.head_dim(), c.ffn_hidden(), c.patch_features());
                })
                .map_err(err),
            Flux2Config::from_json(&value)
                .map(|c| {
                    let _ = (c.dim(), c.mlp_hidden(), c.latent_channels());
                })
                .map_err(err),
        ];
        std::fs::write(&path, bytes).map_err(err)?;
        let whisper = WhisperConfig::from_file(&path).map(|_| ()).map_err(err);
        results
            .into_iter()
            .chain([whisper])
            .find(Result::is_ok)
            .unwrap_or(Err("no reader took it".into()))
    });
}

#[test]
fn scheduler_configs() {
    let mut seeds = seeds_named("tests/fixtures/models", "scheduler_config.json");
    seeds.extend(seeds_named("tests/conformance", "scheduler_config.json"));
    fuzz("scheduler", &seeds, 1000, None, |bytes| {
        let value: serde_json::Value = serde_json::from_slice(bytes).map_err(err)?;
        if let Ok(flow) = FlowMatchConfig::from_json(&value) {
            if let Ok(sigmas) = flow.sigmas(&linear_sigmas(4), 4096) {
                assert!(sigmas.iter().all(|s| s.is_finite()), "{sigmas:?}");
            }
            // FLUX.2's empirical mu, at a small and a large image.
            for tokens in [16, 16384] {
                let mu = backpack_engine::models::diffusion::flux2::empirical_mu(tokens, 4);
                if let Ok(sigmas) = flow.sigmas_at_mu(&linear_sigmas(4), mu) {
                    assert!(sigmas.iter().all(|s| s.is_finite()), "{sigmas:?}");
                }
            }
            return Ok(());
        }
        let config = SchedulerConfig::from_json(&value).map_err(err)?;
        let _ = config.default_kind();
        Ok(())
    });
}

#[test]
fn generation_configs() {
    let mut seeds = seeds_named("tests/fixtures/models", "generation_config.json");
    seeds.extend(seeds_named("tests/conformance", "generation_config.json"));
    let scratch = Scratch::new("generation");
    fuzz("generation_config", &seeds, 1000, None, |bytes| {
        std::fs::write(scratch.0.join("generation_config.json"), bytes).map_err(err)?;
        let text = GenerationConfig::from_dir(&scratch.0).map_err(err);
        let whisper = WhisperGeneration::from_dir(&scratch.0).map_err(err);
        text.and(whisper).map(|_| ())
    });
}

#[test]
fn text_tokenizers() {
    let seeds = vec![
        read("tests/fixtures/models/tiny-qwen2/tokenizer.json"),
        read("tests/fixtures/models/tiny-llama/tokenizer.json"),
        // Found here before: inputs on which the tokenizers library panics while reading a
        // decoder section, and while encoding with a merge of a token it lacks.
        read("tests/fixtures/fuzz/tokenizer-decoder-section.json"),
        read("tests/fixtures/fuzz/tokenizer-merge-missing.json"),
    ];
    let config = read("tests/fixtures/models/tiny-qwen2/tokenizer_config.json");
    let scratch = Scratch::new("tokenizer");
    std::fs::write(scratch.0.join("tokenizer_config.json"), &config).expect("config");
    fuzz("tokenizer.json", &seeds, 400, None, |bytes| {
        std::fs::write(scratch.0.join("tokenizer.json"), bytes).map_err(err)?;
        let tokenizer = TextTokenizer::from_dir(&scratch.0).map_err(err)?;
        let ids = tokenizer
            .encode("Hello, world! 日本語", true)
            .map_err(err)?;
        tokenizer.decode(&ids, false).map_err(err)?;
        Ok(())
    });
    let mut configs = seeds_named("tests/fixtures/models", "tokenizer_config.json");
    configs.extend(seeds_named("tests/conformance", "tokenizer_config.json"));
    let tokenizer = read("tests/fixtures/models/tiny-qwen2/tokenizer.json");
    std::fs::write(scratch.0.join("tokenizer.json"), &tokenizer).expect("tokenizer");
    fuzz("tokenizer_config.json", &configs, 400, None, |bytes| {
        std::fs::write(scratch.0.join("tokenizer_config.json"), bytes).map_err(err)?;
        let tokenizer = TextTokenizer::from_dir(&scratch.0).map_err(err)?;
        if tokenizer.has_chat_template() {
            tokenizer
                .encode_chat(
                    &[ChatMessage::new("user", "Hi")],
                    true,
                    &ChatSwitches::default(),
                )
                .map_err(err)?;
        }
        Ok(())
    });
}

#[test]
fn clip_tokenizers() {
    let scratch = Scratch::new("clip");
    let json_form = root().join("tests/fixtures/tokenizers/clip-tiny-json");
    std::fs::copy(
        json_form.join("tokenizer_config.json"),
        scratch.0.join("tokenizer_config.json"),
    )
    .expect("config");
    let seeds = vec![std::fs::read(json_form.join("tokenizer.json")).expect("seed")];
    fuzz("clip tokenizer.json", &seeds, 200, None, |bytes| {
        std::fs::write(scratch.0.join("tokenizer.json"), bytes).map_err(err)?;
        let tokenizer = ClipTokenizer::from_dir(&scratch.0).map_err(err)?;
        tokenizer.encode_padded("a photo of a cat").map_err(err)?;
        Ok(())
    });
    let pair = Scratch::new("clip-pair");
    let source = root().join("tests/fixtures/tokenizers/clip-tiny");
    for file in [
        "vocab.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    ] {
        std::fs::copy(source.join(file), pair.0.join(file)).expect("copy");
    }
    let seeds = vec![std::fs::read(source.join("merges.txt")).expect("seed")];
    fuzz("clip merges.txt", &seeds, 200, None, |bytes| {
        std::fs::write(pair.0.join("merges.txt"), bytes).map_err(err)?;
        let tokenizer = ClipTokenizer::from_dir(&pair.0).map_err(err)?;
        tokenizer.encode_padded("a photo of a cat").map_err(err)?;
        Ok(())
    });
}

#[test]
fn chat_templates() {
    let mut seeds: Vec<Vec<u8>> = Vec::new();
    for config in seeds_named("tests/fixtures/models", "tokenizer_config.json")
        .into_iter()
        .chain(seeds_named("tests/conformance", "tokenizer_config.json"))
    {
        let value: serde_json::Value = serde_json::from_slice(&config).expect("json");
        if let Some(t) = value.get("chat_template").and_then(|t| t.as_str()) {
            seeds.push(t.as_bytes().to_vec());
        }
    }
    seeds.extend(seeds_named("tests/conformance", "chat_template.jinja"));
    seeds.push(b"{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}".to_vec());
    let messages = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Hi"),
        ChatMessage::new("assistant", "Hello"),
        ChatMessage::new("user", "Again"),
    ];
    fuzz("chat_template", &seeds, 1500, None, |bytes| {
        let source = String::from_utf8_lossy(bytes);
        let template = ChatTemplate::new(&source, "<s>", "</s>").map_err(err)?;
        let switches = ChatSwitches {
            thinking: Some(false),
            reasoning_effort: Some(ReasoningEffort::High),
            tools: vec![serde_json::json!({"type": "function", "function": {
                "name": "get_weather",
                "description": "Weather now",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}
            }})],
        };
        template.render(&messages, true, &switches).map_err(err)?;
        Ok(())
    });
}

/// The tool-call readers on mutated answers of every family's format: no panic, and whatever
/// they return is consistent (calls have names).
#[test]
fn tool_call_answers() {
    use backpack_engine::models::tool_calls::{ToolCallStream, ToolFormat, assemble_calls};
    let seeds: Vec<Vec<u8>> = [
        "Sure.<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, {\"b\": null}]}}\n</tool_call>",
        "<tool_call>\n<function=f>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
        "{\"name\": \"f\", \"parameters\": {\"a\": 1}}; {\"name\": \"g\", \"parameters\": {}}",
        "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}, \"id\": \"abcDEF123\"}]",
        "[TOOL_CALLS]f[CALL_ID]000000001[ARGS]{\"a\": 1}[TOOL_CALLS]g[ARGS]{}",
        "<|tool_call>call:f{a:<|\"|>x<|\"|>,b:[1,{c:true}]}<tool_call|>",
        "<start_function_call>call:f{a:<escape>x<escape>}<end_function_call>",
        "<|tool_call|>[{\"name\": \"f\", \"arguments\": {}}]<|/tool_call|>",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    let formats = [
        ToolFormat::Hermes,
        ToolFormat::Llama3,
        ToolFormat::Mistral,
        ToolFormat::Gemma4,
        ToolFormat::FunctionGemma,
        ToolFormat::Phi4,
    ];
    fuzz("tool-call answers", &seeds, 1500, None, |bytes| {
        let text = String::from_utf8_lossy(bytes);
        for format in formats {
            let (_, calls) = format.parse(&text, &[]);
            if calls
                .iter()
                .any(|c| c.name.is_empty() && format != ToolFormat::Llama3)
            {
                return Err(format!("{format:?}: a call without a name"));
            }
            let mut stream = ToolCallStream::new(format, Vec::new());
            for chunk in text.as_bytes().chunks(5) {
                stream.push(&String::from_utf8_lossy(chunk));
            }
            stream.finish();
            // Whole characters at a time: the fragments a client joins give each call's
            // arguments as the whole answer reads them.
            let mut stream = ToolCallStream::new(format, Vec::new());
            let chars: Vec<char> = text.chars().collect();
            let mut pieces = Vec::new();
            for chunk in chars.chunks(3) {
                pieces.extend(stream.push(&chunk.iter().collect::<String>()));
            }
            pieces.extend(stream.finish());
            let joined = assemble_calls(&pieces);
            if joined.len() == calls.len() {
                for (got, want) in joined.iter().zip(&calls) {
                    if got.arguments != want.arguments {
                        return Err(format!(
                            "{format:?}: streamed {:?}, read whole {:?}",
                            got.arguments, want.arguments
                        ));
                    }
                }
            }
        }
        Ok(())
    });
}

/// GBNF grammars, mutated: converted or refused with an error, never a panic.
#[test]
fn gbnf_grammars() {
    let seeds: Vec<Vec<u8>> = [
        "root ::= object\nobject ::= \"{\" ws ( string \":\" ws value ( \",\" ws string \":\" ws value )* )? \"}\" ws\nvalue ::= object | string | [0-9]+ | \"true\"\nstring ::= \"\\\"\" ( [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" [\"\\\\bfnrt] )* \"\\\"\" ws\nws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n",
        "root ::= (\"yes\" | \"no\") \".\"{1,3} # answer\n",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    fuzz("GBNF grammar", &seeds, 2000, None, |bytes| {
        let _ = backpack_engine::grammar::gbnf_to_lark(&String::from_utf8_lossy(bytes));
        Ok(())
    });
}

#[test]
fn audio_containers() {
    let scratch = Scratch::new("audio");
    for (name, ext) in [
        ("tests/fixtures/audio/chirp.wav", "wav"),
        ("tests/fixtures/audio/speech_two.flac", "flac"),
        ("tests/fixtures/audio/speech_short.mp3", "mp3"),
        ("tests/fixtures/audio/speech_short.ogg", "ogg"),
    ] {
        let mut seeds = vec![read(name)];
        if ext == "wav" {
            // Found here before: a fmt chunk whose fields overflow the WAV reader's arithmetic.
            seeds.push(read("tests/fixtures/fuzz/wav-fmt-overflow.wav"));
        }
        let path = scratch.0.join(format!("input.{ext}"));
        fuzz(&format!("audio {ext}"), &seeds, 200, Some(512), |bytes| {
            std::fs::write(&path, bytes).map_err(err)?;
            let audio = backpack_engine::audio::decode_file(&path).map_err(err)?;
            let _ = audio.samples.len();
            Ok(())
        });
    }
    assert_bounded_allocations("audio");
}

#[test]
fn png_files() {
    let mut seeds = vec![
        read("assets/icons/backpack-16.png"),
        read("assets/icons/backpack-32.png"),
    ];
    let rgb: Vec<u8> = (0..8 * 6 * 3).map(|i| (i * 7) as u8).collect();
    seeds.push(
        backpack_app::image_files::png_bytes(
            8,
            6,
            &rgb,
            "a cat\nSteps: 4, Sampler: Euler, Seed: 1",
        )
        .expect("png"),
    );
    let scratch = Scratch::new("png");
    let path = scratch.0.join("image.png");
    fuzz("png", &seeds, 1500, Some(128), |bytes| {
        std::fs::write(&path, bytes).map_err(err)?;
        let image = backpack_app::image_files::read_png(&path).map_err(err)?;
        if let Some(text) = &image.parameters {
            let _ = backpack_app::image_files::parse_parameters(text);
        }
        let _ = backpack_app::image_files::init_image_floats(&image, 16, 16);
        Ok(())
    });
    assert_bounded_allocations("png");
}

#[test]
fn jpeg_and_webp_start_images() {
    let scratch = Scratch::new("start-images");
    for ext in ["jpg", "webp"] {
        let seeds = vec![read(&format!("tests/fixtures/images/start.{ext}"))];
        let path = scratch.0.join(format!("start.{ext}"));
        fuzz(
            &format!("start image {ext}"),
            &seeds,
            1000,
            Some(256),
            |bytes| {
                std::fs::write(&path, bytes).map_err(err)?;
                let image = backpack_app::image_files::read_start_image(&path).map_err(err)?;
                let _ = backpack_app::image_files::init_image_floats(&image, 8, 8);
                Ok(())
            },
        );
    }
    assert_bounded_allocations("start images");
}

#[test]
fn hub_answers() {
    use backpack_engine::hub::{next_link, parse_revision, parse_search, parse_tree_page};
    let dir = "tests/conformance/hub";
    let search = vec![read(&format!("{dir}/search.json"))];
    fuzz("hub search", &search, 2000, None, |bytes| {
        parse_search(bytes).map(|_| ())
    });
    let info = vec![
        read(&format!("{dir}/model_info.json")),
        read(&format!("{dir}/model_info_gated.json")),
    ];
    fuzz("hub model info", &info, 2000, None, |bytes| {
        parse_revision(bytes).map(|_| ())
    });
    let tree = vec![read(&format!("{dir}/tree.json"))];
    fuzz("hub tree", &tree, 2000, None, |bytes| {
        parse_tree_page(bytes).map(|_| ())
    });
    let text = String::from_utf8(read(&format!("{dir}/tree_link_header.txt"))).expect("utf-8");
    let links: Vec<Vec<u8>> = text
        .lines()
        .filter_map(|l| l.strip_prefix("Link: "))
        .map(|l| l.as_bytes().to_vec())
        .collect();
    fuzz("hub Link header", &links, 1000, None, |bytes| {
        let header = String::from_utf8_lossy(bytes);
        next_link(&header)
            .map(|_| ())
            .ok_or_else(|| "no next link".to_owned())
    });
}

#[test]
fn sse_streams() {
    use backpack_engine::remote::sse::SseDecoder;
    let seeds = vec![
        read("tests/conformance/openai/chat_completions_stream.openai-live.sse"),
        read("tests/conformance/openai/chat_completions_stream_tool_calls.openai-live.sse"),
        read("tests/conformance/openai/chat_completions_stream.hf-router-tgi.sse"),
    ];
    fuzz("sse", &seeds, 3000, None, |bytes| {
        // The same bytes in chunks of every size: a boundary may fall anywhere.
        let mut decoder = SseDecoder::default();
        let mut events = Vec::new();
        let step = 1 + bytes.len() % 7;
        for chunk in bytes.chunks(step) {
            decoder.push(chunk, &mut events)?;
        }
        decoder.finish(&mut events)?;
        for data in &events {
            if data != "[DONE]" {
                let _: serde_json::Value = serde_json::from_str(data).map_err(err)?;
            }
        }
        Ok(())
    });
}
