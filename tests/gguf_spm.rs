//! A llama GGUF with a SentencePiece vocabulary (`tokenizer.ggml.model = llama`: scores, byte
//! fallback pieces, no merges in the file) against what transformers does with the same file
//! (tests/reference/make_spm_gguf.py): tokenization with and without BOS, decoding, Llama-2 chat
//! prompts, and greedy continuations of the quantized model.

mod common;

use std::path::PathBuf;

use backpack_engine::load::{ChatMessage, ChatSwitches, GgufFile, StreamDecoder, gguf_tokenizer};
use backpack_engine::models::{GenerateParams, ModelOptions, Prompt, TextModel};
use backpack_engine::ops::{SamplerParams, WeightDType};
use common::gpu;
use serde::Deserialize;

#[derive(Deserialize)]
struct Golden {
    tokenization: Vec<TokenCase>,
    chats: Vec<ChatCase>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct TokenCase {
    text: String,
    ids: Vec<u32>,
    ids_with_special: Vec<u32>,
    decoded: String,
}

#[derive(Deserialize)]
struct ChatCase {
    messages: Vec<ChatMessage>,
    prompt_ids: Vec<u32>,
    prompt_text: String,
}

#[derive(Deserialize)]
struct Case {
    prompt: String,
    prompt_ids: Vec<u32>,
    greedy_tokens: Vec<u32>,
    top2_margins: Vec<f32>,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

fn model_path() -> PathBuf {
    root().join("models/tiny-llama-spm.gguf")
}

fn golden() -> Golden {
    let text = std::fs::read_to_string(root().join("goldens/tiny-llama-spm.json")).expect("golden");
    serde_json::from_str(&text).expect("golden parses")
}

#[test]
fn sentencepiece_vocabulary_tokenizes_like_transformers() {
    let file = GgufFile::open(&model_path()).expect("fixture opens");
    let tokenizer = gguf_tokenizer(&file).expect("tokenizer rebuilds");
    let golden = golden();
    for case in &golden.tokenization {
        let ids = tokenizer.encode(&case.text, false).expect("encode");
        assert_eq!(ids, case.ids, "{:?}", case.text);
        let with_bos = tokenizer.encode(&case.text, true).expect("encode");
        assert_eq!(with_bos, case.ids_with_special, "{:?} with BOS", case.text);
        assert_eq!(
            tokenizer.decode(&ids, false).expect("decode"),
            case.decoded,
            "{:?}",
            case.text
        );
        // Streaming the ids one at a time yields the same text as decoding them at once.
        let mut stream = StreamDecoder::default();
        let mut streamed = String::new();
        for &id in &ids {
            streamed += &stream.push(&tokenizer, id).expect("stream");
        }
        streamed += &stream.finish(&tokenizer).expect("stream");
        assert_eq!(
            streamed,
            tokenizer.decode(&ids, true).expect("decode"),
            "{:?}",
            case.text
        );
    }
    for chat in &golden.chats {
        assert_eq!(
            tokenizer
                .render_chat(&chat.messages, true, &ChatSwitches::default())
                .expect("template"),
            chat.prompt_text
        );
        assert_eq!(
            tokenizer
                .encode_chat(&chat.messages, true, &ChatSwitches::default())
                .expect("chat"),
            chat.prompt_ids
        );
    }
}

#[test]
fn sentencepiece_gguf_generates_like_transformers() {
    let golden = golden();
    // f32 reproduces transformers' float32 dequantization; f16 also rounds activations and the
    // KV cache, so a step whose top-2 margin is under 0.05 may legitimately flip there.
    for (dtype, near_tie) in [(WeightDType::F32, 1e-3), (WeightDType::F16, 0.05)] {
        let opts = ModelOptions {
            dtype,
            ..Default::default()
        };
        let mut model = TextModel::load(&gpu(), &model_path(), &opts).expect("model loads");
        for case in &golden.cases {
            let prompt = Prompt::Raw(case.prompt.clone());
            assert_eq!(model.tokenize(&prompt).expect("tokenize"), case.prompt_ids);
            let params = GenerateParams {
                max_tokens: case.greedy_tokens.len() as u32,
                sampler: SamplerParams::default(),
                ..Default::default()
            };
            let stats = model
                .generate(&prompt, &params, &|| false, |_, _| {})
                .expect("generate");
            let what = format!("{dtype:?} {:?}", case.prompt);
            let n = common::assert_greedy_prefix(
                &what,
                &stats.tokens,
                &case.greedy_tokens,
                &case.top2_margins,
                near_tie,
            );
            assert!(n >= 4, "{what}: only {n} comparable tokens");
        }
    }
}
