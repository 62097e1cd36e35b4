//! The tokenizer and chat template of a GGUF file, rebuilt from `tokenizer.ggml.*` metadata
//! the way transformers rebuilds them when it loads a GGUF: byte-level BPE or SentencePiece
//! BPE with byte fallback, as a tokenizer.json value for the tokenizers library.

use serde_json::{Value, json};

use super::error::LoadError;
use super::gguf::{GgufFile, GgufValue};
use super::gguf_model::invalid;
use super::template::ChatTemplate;
use super::tokenizer::TextTokenizer;

/// Pre-tokenizers of the `tokenizer.ggml.pre` names Backpack knows, as tokenizer.json values.
fn pre_tokenizer(pre: &str) -> Option<Value> {
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let split = |pattern: &str| {
        json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false},
            byte_level(false),
        ]})
    };
    Some(match pre {
        "gpt2" | "gpt-2" | "default" => byte_level(true),
        // SmolLM: every digit on its own, then GPT-2's split.
        "smollm" => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            byte_level(true),
        ]}),
        "llama3" | "llama-bpe" => split(
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ),
        // Phi-4-mini and other o200k vocabularies.
        "gpt-4o" => split(concat!(
            r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
            r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
            r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        )),
        "qwen2" => split(
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ),
        // Qwen3.5's 248k vocabulary: Qwen2's split with combining marks kept in their words
        // (llama.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN35, the tokenizer.json pattern).
        "qwen35" => split(
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ),
        _ => return None,
    })
}

/// `tokenizer.ggml.merges` as `[left, right]` pairs.
fn merge_pairs(merges: &[&str]) -> Vec<Value> {
    merges
        .iter()
        .map(|m| match m.split_once(' ') {
            Some((l, r)) => json!([l, r]),
            None => json!([m, ""]),
        })
        .collect()
}

/// The merges a SentencePiece BPE vocabulary implies when the file lists none: every split of a
/// token into two tokens, best score first (ties: longer left piece, then longer right piece,
/// then vocabulary order), as transformers rebuilds them. Merging the pair whose product scores
/// highest is what SentencePiece's BPE does.
fn merges_from_scores(tokens: &[&str], scores: &[f32]) -> Vec<Value> {
    use std::collections::HashMap;
    let mut id: HashMap<&str, usize> = HashMap::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        id.insert(t, i);
    }
    // A repeated token keeps its first position in the order and its last score.
    let mut score: HashMap<&str, f32> = HashMap::with_capacity(tokens.len());
    let mut order = Vec::with_capacity(tokens.len());
    for (t, s) in tokens.iter().zip(scores) {
        if score.insert(t, *s).is_none() {
            order.push(*t);
        }
    }
    let mut merges: Vec<(&str, &str, f32)> = Vec::new();
    for token in order {
        let start = merges.len();
        for (at, _) in token.char_indices().skip(1) {
            let (l, r) = token.split_at(at);
            if id.contains_key(l) && id.contains_key(r) {
                merges.push((l, r, score[token]));
            }
        }
        merges[start..].sort_by_key(|(l, r, _)| (id[l], id[r]));
    }
    let chars = |s: &str| s.chars().count();
    merges.sort_by(|a, b| {
        // total_cmp: a NaN score in a corrupt file must not break the sort's order.
        b.2.total_cmp(&a.2)
            .then_with(|| chars(b.0).cmp(&chars(a.0)))
            .then_with(|| chars(b.1).cmp(&chars(a.1)))
    });
    merges.into_iter().map(|(l, r, _)| json!([l, r])).collect()
}

/// Rebuilds the tokenizer and chat template from `tokenizer.ggml.*`: byte-level BPE
/// (`tokenizer.ggml.model = gpt2`) or SentencePiece BPE with byte fallback (`llama`), the way
/// transformers rebuilds them when it loads a GGUF.
pub fn gguf_tokenizer(file: &GgufFile) -> Result<TextTokenizer, LoadError> {
    let model = file
        .metadata("tokenizer.ggml.model")
        .and_then(GgufValue::as_str)
        .ok_or_else(|| invalid(file, "no tokenizer.ggml.model".into()))?;
    let strings = |key: &str| -> Result<Vec<&str>, LoadError> {
        file.metadata(key)
            .and_then(GgufValue::as_array)
            .ok_or_else(|| invalid(file, format!("no {key}")))?
            .iter()
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| invalid(file, format!("{key} holds a non-string")))
            })
            .collect()
    };
    let tokens = strings("tokenizer.ggml.tokens")?;
    let types: Vec<u64> = file
        .metadata("tokenizer.ggml.token_type")
        .and_then(GgufValue::as_array)
        .map(|a| a.iter().filter_map(GgufValue::as_u64).collect())
        .unwrap_or_default();
    let token_of = |key: &str| {
        file.metadata(key)
            .and_then(GgufValue::as_u64)
            .and_then(|id| Some((id, *tokens.get(id as usize)?)))
    };
    let flag = |key: &str| file.metadata(key).map(|v| *v == GgufValue::Bool(true));
    let bos = token_of("tokenizer.ggml.bos_token_id");
    let eos = token_of("tokenizer.ggml.eos_token_id");

    let (bpe, pre_tokenizer, decoder, add_bos) = match model {
        "gpt2" => {
            let pre = file
                .metadata("tokenizer.ggml.pre")
                .and_then(GgufValue::as_str)
                .unwrap_or("default");
            let pre_tokenizer = pre_tokenizer(pre).ok_or_else(|| {
                invalid(
                    file,
                    format!(
                        "tokenizer pre-type {pre:?} is not supported (gpt2, smollm, llama3, gpt-4o, qwen2, qwen35 are)"
                    ),
                )
            })?;
            let merges = merge_pairs(&strings("tokenizer.ggml.merges")?);
            let bpe = json!({"fuse_unk": false, "byte_fallback": false, "merges": merges});
            let decoder = json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true});
            (
                bpe,
                Some(pre_tokenizer),
                decoder,
                flag("tokenizer.ggml.add_bos_token") == Some(true),
            )
        }
        "llama" => {
            let merges = if file.metadata("tokenizer.ggml.merges").is_some() {
                merge_pairs(&strings("tokenizer.ggml.merges")?)
            } else {
                let scores: Vec<f32> = file
                    .metadata("tokenizer.ggml.scores")
                    .and_then(GgufValue::as_array)
                    .ok_or_else(|| {
                        invalid(
                            file,
                            "a SentencePiece vocabulary without tokenizer.ggml.scores".into(),
                        )
                    })?
                    .iter()
                    .map(|v| v.as_f64().map(|s| s as f32))
                    .collect::<Option<_>>()
                    .ok_or_else(|| {
                        invalid(file, "tokenizer.ggml.scores holds a non-number".into())
                    })?;
                if scores.len() != tokens.len() {
                    return Err(invalid(
                        file,
                        format!("{} scores for {} tokens", scores.len(), tokens.len()),
                    ));
                }
                merges_from_scores(&tokens, &scores)
            };
            let bpe = json!({"fuse_unk": true, "byte_fallback": true, "merges": merges});
            // SentencePiece writes spaces as U+2581 and (by default) starts the text with one.
            let space_prefix = flag("tokenizer.ggml.add_space_prefix") != Some(false);
            let pre_tokenizer = json!({"type": "Metaspace", "replacement": "\u{2581}",
                "prepend_scheme": if space_prefix { "first" } else { "never" }, "split": false});
            let mut steps = vec![
                json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}),
                json!({"type": "ByteFallback"}),
                json!({"type": "Fuse"}),
            ];
            if space_prefix {
                steps.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
            }
            // llama.cpp adds BOS to a SentencePiece vocabulary unless the file says otherwise.
            let add_bos = flag("tokenizer.ggml.add_bos_token") != Some(false);
            (
                bpe,
                Some(pre_tokenizer),
                json!({"type": "Sequence", "decoders": steps}),
                add_bos,
            )
        }
        other => {
            return Err(invalid(
                file,
                format!(
                    "tokenizer model {other:?} is not supported (byte-level BPE \"gpt2\" and SentencePiece \"llama\" are)"
                ),
            ));
        }
    };

    let vocab: serde_json::Map<String, Value> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| ((*t).to_owned(), json!(i)))
        .collect();
    // Unknown (2) and control (3) tokens are special; user-defined (4) ones are plain added
    // tokens. All are matched whole in text, as in the original.
    let added: Vec<Value> = types
        .iter()
        .enumerate()
        .filter(|(_, t)| matches!(**t, 2..=4))
        .filter_map(|(i, t)| {
            tokens.get(i).map(|content| {
                json!({"id": i, "content": content, "single_word": false, "lstrip": false,
                       "rstrip": false, "normalized": false, "special": *t != 4})
            })
        })
        .collect();
    let add_eos = flag("tokenizer.ggml.add_eos_token") == Some(true);
    let mut specials = serde_json::Map::new();
    let mut single = Vec::new();
    let mut pair = Vec::new();
    if let (Some((id, token)), true) = (bos, add_bos) {
        specials.insert(
            token.into(),
            json!({"id": token, "ids": [id], "tokens": [token]}),
        );
        single.push(json!({"SpecialToken": {"id": token, "type_id": 0}}));
    }
    single.push(json!({"Sequence": {"id": "A", "type_id": 0}}));
    pair.extend(single.iter().cloned());
    if let (Some((id, token)), true) = (eos, add_eos) {
        specials.insert(
            token.into(),
            json!({"id": token, "ids": [id], "tokens": [token]}),
        );
        single.push(json!({"SpecialToken": {"id": token, "type_id": 0}}));
        pair.push(json!({"SpecialToken": {"id": token, "type_id": 0}}));
    }
    if let (Some((_, token)), true) = (bos, add_bos) {
        pair.push(json!({"SpecialToken": {"id": token, "type_id": 1}}));
    }
    pair.push(json!({"Sequence": {"id": "B", "type_id": 1}}));
    if let (Some((_, token)), true) = (eos, add_eos) {
        pair.push(json!({"SpecialToken": {"id": token, "type_id": 1}}));
    }
    let post_processor = if specials.is_empty() && model == "gpt2" {
        json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true})
    } else {
        json!({"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials})
    };
    let mut bpe_model = json!({"type": "BPE", "dropout": null, "unk_token": null,
        "continuing_subword_prefix": null, "end_of_word_suffix": null, "ignore_merges": false,
        "vocab": vocab});
    if let (Value::Object(m), Value::Object(extra)) = (&mut bpe_model, bpe) {
        m.extend(extra);
    }
    let config = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": decoder,
        "model": bpe_model,
    });
    let inner: tokenizers::Tokenizer = super::tokenizer::without_panics(&file.path, || {
        serde_json::from_value(config).map_err(|e| e.to_string())
    })
    .map_err(|e| {
        invalid(
            file,
            format!("the tokenizer in the metadata is invalid: {e}"),
        )
    })?;
    let template = file
        .metadata("tokenizer.chat_template")
        .and_then(GgufValue::as_str)
        .map(|s| ChatTemplate::new(s, bos.map_or("", |(_, t)| t), eos.map_or("", |(_, t)| t)))
        .transpose()?;
    Ok(TextTokenizer::from_parts(
        inner,
        template,
        eos.map(|(_, t)| t.to_owned()),
    ))
}

#[cfg(test)]
mod tests {
    use super::pre_tokenizer;

    /// Phi-4-mini's `gpt-4o` pre-tokenizer splits as o200k does: camel-case words whole with a
    /// leading space, contractions kept, digits in threes, newlines apart from spaces.
    #[test]
    fn gpt4o_pre_tokenizer_splits_like_o200k() {
        assert_eq!(
            pieces("gpt-4o", "Hello world's HTTPServer 1234567\n\n  x"),
            [
                "Hello",
                "\u{120}world's",
                "\u{120}HTTPServer",
                "\u{120}",
                "123",
                "456",
                "7",
                "\u{10a}\u{10a}",
                "\u{120}",
                "\u{120}x"
            ]
        );
    }

    /// The pieces `pre` splits `text` into (byte-level characters).
    fn pieces(pre: &str, text: &str) -> Vec<String> {
        use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};
        let json = pre_tokenizer(pre).expect("known");
        let pre: tokenizers::pre_tokenizers::PreTokenizerWrapper =
            serde_json::from_value(json).expect("a valid pre-tokenizer");
        let mut s = PreTokenizedString::from(text);
        pre.pre_tokenize(&mut s).expect("splits");
        s.get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(piece, _, _)| piece.to_owned())
            .collect()
    }

    /// Qwen3.5's `qwen35` split keeps a combining mark with its letters, where Qwen2's puts
    /// it in a piece of its own; both take digits one at a time.
    #[test]
    fn qwen35_pre_tokenizer_keeps_combining_marks_in_words() {
        // "é" as e + U+0301 (bytes CC 81).
        let text = "Cafe\u{301} 12";
        let marked = pieces("qwen35", text);
        assert_eq!(marked.len(), 4, "{marked:?}");
        assert!(marked[0].starts_with("Cafe") && marked[0].chars().count() == 6);
        assert_eq!(marked[2..], ["1", "2"]);
        let plain = pieces("qwen2", text);
        assert_eq!(plain.len(), 5, "{plain:?}");
        assert_eq!(plain[0], "Cafe");
    }
}
