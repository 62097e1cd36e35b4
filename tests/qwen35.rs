//! Qwen3.5 beyond the shared goldens (tests/models.rs runs its tiny models through those):
//! prompts longer than Gated DeltaNet's prefill chunks against transformers, GGUF files that
//! store a layer's input projections in several formats, as published quantizations do, and
//! the chat template's opened reasoning.

mod common;

use backpack_engine::load::quant::{dequantize, quantize_q4_0, quantize_q8_0};
use backpack_engine::load::{GgmlType, GgufFile, GgufValue, write_gguf};
use backpack_engine::models::{ModelOptions, Prompt, TextModel};
use backpack_engine::ops::{SamplerParams, WeightDType};
use common::goldens::{fixtures, golden, load_path, max_diff, model_tolerance, tolerance};
use common::gpu;

/// What transformers computed for a prompt past Gated DeltaNet's chunks
/// (tests/reference/qwen35_long_prompt.py).
#[derive(serde::Deserialize)]
struct LongPromptGolden {
    prompt_ids: Vec<u32>,
    positions: Vec<usize>,
    prompt_logits: Vec<Vec<f32>>,
    greedy_tokens: Vec<u32>,
    top2_margins: Vec<f32>,
}

/// A 150-token prompt crosses two of transformers' 64-token chunks of the delta rule, and its
/// greedy continuation the next boundary: the tiny Qwen3.5 models, from their folders and GGUF
/// files, give transformers' logits around each boundary and its greedy tokens, with the
/// prompt in one step (chunked) and in steps of 20 (chunked steps and a short recurrent one).
#[test]
fn qwen3_5_prompts_past_the_delta_rule_chunks_match_transformers() {
    for name in ["tiny-qwen3-5", "tiny-qwen3-5-moe"] {
        let path = fixtures().join("goldens").join(format!("{name}-long.json"));
        let text = std::fs::read_to_string(&path).expect("long-prompt golden");
        let g: LongPromptGolden = serde_json::from_str(&text).expect("golden");
        for (file, prefill_chunk) in [(name.to_owned(), 512), (format!("{name}.gguf"), 20)] {
            let what = format!("{file} in prompt steps of {prefill_chunk}");
            let dtype = WeightDType::F32;
            let options = ModelOptions {
                dtype,
                prefill_chunk: Some(prefill_chunk),
                lookahead: false,
                ..Default::default()
            };
            let mut m = TextModel::load(&gpu(), &fixtures().join("models").join(&file), &options)
                .expect("load");
            let vocab = m.model.spec().vocab as usize;
            let got = m.model.prompt_logits(&g.prompt_ids).expect("prompt logits");
            let mut worst = 0.0f32;
            for (&pos, want) in g.positions.iter().zip(&g.prompt_logits) {
                let diff = max_diff(&got[pos * vocab..(pos + 1) * vocab], want);
                worst = worst.max(diff);
                assert!(
                    diff <= model_tolerance(name, dtype),
                    "{what}: position {pos} differs by {diff}"
                );
            }
            eprintln!("{what}: largest prompt-logit difference {worst}");
            m.model.set_sampler(&SamplerParams::default());
            let mut token = m.model.prefill(&g.prompt_ids).expect("prefill");
            for (step, &want) in g.greedy_tokens.iter().enumerate() {
                // A near tie in the golden may legitimately flip, and every later step with it.
                if g.top2_margins[step] < 2.0 * tolerance(dtype) {
                    break;
                }
                assert_eq!(token, want, "{what}: greedy token {step}");
                token = m.model.decode().expect("decode");
            }
        }
    }
}

/// With Qwen3.5's published chat template, thinking on ends the prompt by opening `<think>`:
/// the answer reads as a reasoning model's (`<think>`, the reasoning, `</think>`, the reply),
/// so that the panels and the server can split it. With thinking off, it is the model's text.
#[test]
fn an_answer_the_chat_prompt_opens_in_reasoning_starts_with_the_tag() {
    use backpack_engine::models::GenerateParams;
    let src = fixtures().join("models").join("tiny-qwen3-5");
    let dir = std::env::temp_dir().join(format!("backpack-qwen35-think-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    for entry in std::fs::read_dir(&src).expect("fixture") {
        let path = entry.expect("entry").path();
        std::fs::copy(&path, dir.join(path.file_name().expect("name"))).expect("copy");
    }
    let template =
        fixtures().join("../conformance/models/Qwen--Qwen3.5-35B-A3B/chat_template.jinja");
    std::fs::copy(template, dir.join("chat_template.jinja")).expect("template");
    let mut m = load_path(&dir, WeightDType::F32);
    let prompt = Prompt::Chat(vec![backpack_engine::load::ChatMessage::new("user", "Hi")]);
    let mut answer = |thinking: Option<bool>| {
        let params = GenerateParams {
            max_tokens: 6,
            thinking,
            ..Default::default()
        };
        let mut streamed = String::new();
        let stats = m
            .generate(&prompt, &params, &|| false, |_, delta| {
                streamed.push_str(delta)
            })
            .expect("generate");
        assert_eq!(streamed, stats.text);
        stats
    };
    let on = answer(None);
    let off = answer(Some(false));
    assert!(on.text.starts_with("<think>\n"), "{:?}", on.text);
    assert!(!off.text.starts_with("<think>"), "{:?}", off.text);
    // The tag is text, not a token the model produced.
    assert_eq!(on.tokens.len(), 6);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The tiny dense Qwen3.5 GGUF rewritten with its matrices in formats chosen per tensor name
/// (`format` returns `None` to keep a tensor as stored; F32 for the small projections b and a,
/// as published files keep them). Rows that are not whole blocks stay as stored. With
/// `stored_as_f32`, the quantized matrices are written back as the F32 values their blocks
/// hold: the same numbers, in a file that uploads every matrix dense.
fn requantized(
    out: &std::path::Path,
    format: &dyn Fn(&str) -> Option<GgmlType>,
    stored_as_f32: bool,
) {
    let src = GgufFile::open(&fixtures().join("models").join("tiny-qwen3-5.gguf")).expect("gguf");
    let metadata: Vec<(&str, GgufValue)> = src
        .metadata_keys()
        .map(|k| (k, src.metadata(k).expect("value").clone()))
        .collect();
    let mut stored: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)> = Vec::new();
    for t in src.tensors() {
        let data = src.data(t);
        let values = || -> Vec<f32> {
            match t.ggml_type {
                GgmlType::F16 => data
                    .chunks_exact(2)
                    .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                    .collect(),
                GgmlType::F32 => bytemuck::pod_collect_to_vec(data),
                other => panic!("{}: {other:?} in the fixture", t.name),
            }
        };
        // Rows that are not whole 32-value blocks stay as stored.
        let blocks = t.dims[0].is_multiple_of(32);
        let (ty, bytes) = match format(&t.name).filter(|f| blocks || *f == GgmlType::F32) {
            Some(GgmlType::Q8_0) => {
                let mut q = Vec::new();
                quantize_q8_0(&values(), &mut q);
                (GgmlType::Q8_0, q)
            }
            Some(GgmlType::Q4_0) => {
                let mut q = Vec::new();
                quantize_q4_0(&values(), &mut q);
                (GgmlType::Q4_0, q)
            }
            Some(GgmlType::F32) => (GgmlType::F32, bytemuck::cast_slice(&values()).to_vec()),
            _ => (t.ggml_type, data.to_vec()),
        };
        let (ty, bytes) = if stored_as_f32 && ty.block_elems() > 1 {
            let mut back = vec![0.0f32; bytes.len() / ty.block_bytes() * ty.block_elems()];
            dequantize(ty, &bytes, &mut back);
            (GgmlType::F32, bytemuck::cast_slice(&back).to_vec())
        } else {
            (ty, bytes)
        };
        stored.push((t.name.clone(), t.dims.clone(), ty, bytes));
    }
    let tensors: Vec<(&str, &[u64], GgmlType, &[u8])> = stored
        .iter()
        .map(|(n, d, ty, b)| (n.as_str(), d.as_slice(), *ty, b.as_slice()))
        .collect();
    std::fs::write(out, write_gguf(&metadata, &tensors)).expect("write");
}

/// Published quantizations store a Gated DeltaNet layer's input projections in several formats
/// (b and a in F32, q/k/v often wider than z). Each run of one format becomes a product of its
/// own, kept in its block format (one more decode product per extra run on each of the 6
/// linear layers), and gives the logits of the same values uploaded dense, prompt and decoded
/// tokens alike.
#[test]
fn input_projections_in_several_formats_run_as_products_of_their_own() {
    let dir = std::env::temp_dir();
    let ids = &golden("tiny-qwen3-5").cases[0].prompt_ids;
    let small = |n: &str| n.contains("ssm_beta") || n.contains("ssm_alpha");
    let others = |n: &str| {
        [
            "attn_q.",
            "attn_k.",
            "attn_v.",
            "attn_output.",
            "ffn_",
            "attn_qkv",
            "attn_gate",
        ]
        .iter()
        .any(|p| n.contains(p))
    };
    // (what, the formats, extra products per linear layer)
    type Formats<'a> = &'a dyn Fn(&str) -> Option<GgmlType>;
    let layouts: [(&str, Formats<'_>, u32); 3] = [
        (
            "all Q8_0",
            &|n| (others(n) || small(n)).then_some(GgmlType::Q8_0),
            0,
        ),
        (
            "q/k/v and z Q8_0, b and a F32",
            &|n| match small(n) {
                true => Some(GgmlType::F32),
                false => others(n).then_some(GgmlType::Q8_0),
            },
            1,
        ),
        (
            "q/k/v Q8_0, z Q4_0, b and a F32",
            &|n| match (small(n), n.contains("attn_gate")) {
                (true, _) => Some(GgmlType::F32),
                (_, true) => Some(GgmlType::Q4_0),
                _ => others(n).then_some(GgmlType::Q8_0),
            },
            2,
        ),
    ];
    let mut first_dispatches = None;
    for (what, format, extra) in layouts {
        let logits = |stored_as_f32: bool| {
            let name = format!(
                "backpack-qwen35-formats-{extra}-{stored_as_f32}-{}.gguf",
                std::process::id()
            );
            let path = dir.join(name);
            requantized(&path, format, stored_as_f32);
            let mut m = load_path(&path, WeightDType::F32);
            let vocab = m.model.spec().vocab as usize;
            let prompt = m.model.prompt_logits(ids).expect("prompt logits");
            m.model.set_sampler(&SamplerParams::default());
            let mut decoded = Vec::new();
            m.model.prefill(ids).expect("prefill");
            for _ in 0..3 {
                m.model.decode().expect("decode");
                decoded.extend(m.model.last_logits().expect("logits"));
            }
            let _ = std::fs::remove_file(&path);
            (prompt, decoded, m.model.dispatches_per_token(), vocab)
        };
        let (prompt, decoded, dispatches, _) = logits(false);
        let (want_prompt, want_decoded, dense_dispatches, _) = logits(true);
        let base = *first_dispatches.get_or_insert(dispatches);
        assert_eq!(dispatches, base + 6 * extra, "{what}: decode dispatches");
        assert_eq!(dense_dispatches, base, "{what}: dense, one product");
        let top = want_prompt.iter().fold(0.0f32, |t, v| t.max(v.abs()));
        // Block products round their inputs (f16 prompt weights, int8 decode inputs); a wrong
        // layout is off by the logits' size.
        let prompt_diff = max_diff(&prompt, &want_prompt);
        assert!(
            prompt_diff < 0.02 * top,
            "{what}: prompt logits differ by {prompt_diff} (up to {top})"
        );
        let decode_diff = max_diff(&decoded, &want_decoded);
        assert!(
            decode_diff < 0.05 * top,
            "{what}: decoded logits differ by {decode_diff} (up to {top})"
        );
        eprintln!("{what}: prompt {prompt_diff}, decoded {decode_diff} of {top}");
    }
}

/// The recurrent states are counted with the cache and apart from it: the same at any context
/// length, while the attention layers' KV cache grows with it.
#[test]
fn recurrent_state_is_counted_and_does_not_grow_with_the_context() {
    let path = fixtures().join("models").join("tiny-qwen3-5");
    let load = |context: u32| {
        let options = ModelOptions {
            dtype: WeightDType::F32,
            context: Some(context),
            ..Default::default()
        };
        TextModel::load(&gpu(), &path, &options).expect("load")
    };
    let (short, long) = (load(64), load(128));
    let spec = short.model.spec();
    let linear = spec.linear.as_ref().expect("linear layers");
    let s = &linear.shape;
    let layers = linear.linear.iter().filter(|l| **l).count() as u64;
    let per_layer = s.state_values() + s.conv_state_values();
    assert_eq!(short.model.state_bytes(), 4 * layers * per_layer);
    assert_eq!(short.model.state_bytes(), long.model.state_bytes());
    // K and V of the 2 full-attention layers per position, f16 or f32.
    let kv = |m: &TextModel| m.model.cache_bytes() - m.model.state_bytes();
    let per_value = 64 * 2 * 2 * u64::from(spec.kv_heads * spec.head_dim);
    let grown = kv(&long) - kv(&short);
    assert!(grown == 2 * per_value || grown == 4 * per_value, "{grown}");
    let info = short.info();
    assert_eq!(
        (info.state_bytes, info.cache_bytes),
        (short.model.state_bytes(), short.model.cache_bytes())
    );
}

/// Every generation starts the recurrent states afresh: regenerating an answer after another
/// prompt (what regenerate and edit do in the chat) reproduces the first answer, through the
/// chunked prompt form and through prompt steps short enough for the recurrent one.
#[test]
fn regenerating_after_another_prompt_reproduces_the_answer() {
    use backpack_engine::models::GenerateParams;
    for (chunk, what) in [(512, "chunked"), (5, "recurrent")] {
        let options = ModelOptions {
            dtype: WeightDType::F32,
            prefill_chunk: Some(chunk),
            ..Default::default()
        };
        let path = fixtures().join("models").join("tiny-qwen3-5");
        let mut m = TextModel::load(&gpu(), &path, &options).expect("load");
        let params = GenerateParams {
            max_tokens: 12,
            ..Default::default()
        };
        let long = "the engine ran to the river and back again ".repeat(3);
        let mut answer = |text: &str| {
            m.generate(&Prompt::Raw(text.into()), &params, &|| false, |_, _| {})
                .expect("generate")
                .tokens
        };
        let first = answer(&long);
        let other = answer("Grüße aus dem Rucksack");
        let again = answer(&long);
        assert_eq!(first, again, "{what}");
        assert_ne!(first, other, "{what}: a different prompt");
    }
}
