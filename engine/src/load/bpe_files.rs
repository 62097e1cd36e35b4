//! Byte-level BPE tokenizers from the files repositories ship when they have no
//! `tokenizer.json`: `vocab.json` (token → id) and `merges.txt` (one `a b` merge a line), with
//! the added tokens of `added_tokens.json` and `tokenizer_config.json`. Older GPT-2, Whisper and
//! Qwen2 repositories ship only these. The `tokenizers` crate reads `tokenizer.json` but has no
//! reader for the pair with a model's pre-tokenizer, so the pipeline is assembled here as
//! transformers' slow-to-fast converters assemble it (`GPT2Converter`, `Qwen2Converter`).
//! The vocabulary and merges of a `tokenizer.json` are read here too, for tokenizers (CLIP)
//! whose pipeline is built in code.

use std::path::Path;

use serde_json::Value;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::{NFC, NormalizerWrapper};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

use super::error::{LoadError, read_json};

/// Qwen2's word split (transformers' `Qwen2Tokenizer.PRETOKENIZE_REGEX`).
const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn error(path: &Path, message: impl std::fmt::Display) -> LoadError {
    LoadError::Tokenizer {
        path: path.to_owned(),
        message: message.to_string(),
    }
}

/// A `vocab.json`: a JSON object of token → id.
pub(crate) fn read_vocab(path: &Path) -> Result<Vocab, LoadError> {
    vocab_from(&read_json(path)?, path)
}

fn vocab_from(json: &Value, path: &Path) -> Result<Vocab, LoadError> {
    let object = json
        .as_object()
        .ok_or_else(|| error(path, "not a JSON object of token → id"))?;
    object
        .iter()
        .map(|(token, id)| {
            id.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .map(|id| (token.clone(), id))
                .ok_or_else(|| error(path, format!("token {token:?} has id {id}")))
        })
        .collect()
}

/// A `merges.txt`: an optional `#version` line, then one `a b` merge a line.
pub(crate) fn read_merges(path: &Path) -> Result<Vec<(String, String)>, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|e| LoadError::io(path, e))?;
    let mut merges = Vec::new();
    for (number, line) in text.lines().enumerate() {
        if line.is_empty() || (number == 0 && line.starts_with("#version")) {
            continue;
        }
        let mut parts = line.split(' ');
        match (parts.next(), parts.next(), parts.next()) {
            (Some(a), Some(b), None) if !a.is_empty() && !b.is_empty() => {
                merges.push((a.to_owned(), b.to_owned()));
            }
            _ => {
                return Err(error(
                    path,
                    format!("line {} is not two tokens: {line:?}", number + 1),
                ));
            }
        }
    }
    Ok(merges)
}

/// What a BPE `tokenizer.json` holds: vocabulary, merges and its added tokens (as written).
pub(crate) struct BpeJson {
    pub vocab: Vocab,
    pub merges: Vec<(String, String)>,
    pub added_tokens: Vec<Value>,
}

/// The vocabulary and merges of a `tokenizer.json` whose model is BPE. Merges are `"a b"`
/// strings (tokenizers before 0.20) or `["a", "b"]` pairs (0.20 on); both are read.
pub(crate) fn read_bpe_json(path: &Path) -> Result<BpeJson, LoadError> {
    let json = read_json(path)?;
    let model = json
        .get("model")
        .ok_or_else(|| error(path, "no \"model\" section"))?;
    if let Some(kind) = model.get("type").and_then(Value::as_str)
        && kind != "BPE"
    {
        return Err(error(
            path,
            format!("a {kind} model, where BPE was expected"),
        ));
    }
    let vocab = vocab_from(
        model
            .get("vocab")
            .ok_or_else(|| error(path, "the model has no vocab"))?,
        path,
    )?;
    let list = model
        .get("merges")
        .and_then(Value::as_array)
        .ok_or_else(|| error(path, "the model has no merges list"))?;
    let merges = list
        .iter()
        .enumerate()
        .map(|(number, merge)| {
            merge_pair(merge)
                .ok_or_else(|| error(path, format!("merge {number} is not two tokens: {merge}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let added_tokens = json
        .get("added_tokens")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    Ok(BpeJson {
        vocab,
        merges,
        added_tokens,
    })
}

fn merge_pair(merge: &Value) -> Option<(String, String)> {
    match merge {
        Value::String(line) => line
            .split_once(' ')
            .filter(|(a, b)| !a.is_empty() && !b.is_empty() && !b.contains(' '))
            .map(|(a, b)| (a.to_owned(), b.to_owned())),
        Value::Array(parts) => match parts.as_slice() {
            [Value::String(a), Value::String(b)] if !a.is_empty() && !b.is_empty() => {
                Some((a.clone(), b.clone()))
            }
            _ => None,
        },
        _ => None,
    }
}

/// A token the configs add to the vocabulary, with the id they give it.
struct Added {
    content: String,
    id: u32,
    special: bool,
    normalized: bool,
}

/// `added_tokens.json` ({token: id}) and `tokenizer_config.json`'s `added_tokens_decoder`
/// ({id: {content, special, normalized}}); the latter has the final say.
fn added_tokens(dir: &Path, config: &Value) -> Result<Vec<Added>, LoadError> {
    let mut added: Vec<Added> = Vec::new();
    let added_path = dir.join("added_tokens.json");
    if added_path.is_file() {
        let json = read_json(&added_path)?;
        for (content, id) in json.as_object().into_iter().flatten() {
            let id = id
                .as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| error(&added_path, format!("token {content:?} has id {id}")))?;
            added.push(Added {
                content: content.clone(),
                id,
                special: true,
                normalized: false,
            });
        }
    }
    for (id, token) in config
        .get("added_tokens_decoder")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        let (Ok(id), Some(content)) = (
            id.parse::<u32>(),
            token.get("content").and_then(Value::as_str),
        ) else {
            continue;
        };
        added.retain(|a| a.content != content);
        added.push(Added {
            content: content.to_owned(),
            id,
            special: token
                .get("special")
                .and_then(Value::as_bool)
                .unwrap_or(true),
            normalized: token
                .get("normalized")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        });
    }
    added.sort_by_key(|a| a.id);
    Ok(added)
}

/// The tokenizer of a folder with `vocab.json` + `merges.txt` and no `tokenizer.json`, for the
/// byte-level BPE classes whose conversion is known (GPT-2, Whisper, Qwen2 and their kin).
pub(crate) fn byte_level_from_files(
    dir: &Path,
    config: &Value,
) -> Result<tokenizers::Tokenizer, LoadError> {
    let vocab_path = dir.join("vocab.json");
    let merges_path = dir.join("merges.txt");
    let class = config
        .get("tokenizer_class")
        .and_then(Value::as_str)
        .unwrap_or("GPT2Tokenizer");
    let class = class.strip_suffix("Fast").unwrap_or(class);
    let qwen = matches!(class, "Qwen2Tokenizer" | "Qwen3Tokenizer");
    if !qwen
        && !matches!(
            class,
            "GPT2Tokenizer" | "WhisperTokenizer" | "CodeGenTokenizer" | "RobertaTokenizer"
        )
    {
        return Err(error(
            &dir.join("tokenizer.json"),
            format!(
                "missing, and a {class} cannot be built from vocab.json and merges.txt (GPT-2, Whisper and Qwen2 tokenizers can)"
            ),
        ));
    }
    let mut vocab = read_vocab(&vocab_path)?;
    let merges = read_merges(&merges_path)?;
    let added = added_tokens(dir, config)?;
    for token in &added {
        vocab.entry(token.content.clone()).or_insert(token.id);
    }
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| error(&merges_path, e))?;
    let mut tokenizer = tokenizers::Tokenizer::new(bpe);
    let add_prefix_space = config
        .get("add_prefix_space")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if qwen {
        tokenizer.with_normalizer(Some(NormalizerWrapper::NFC(NFC)));
        let words = Split::new(
            SplitPattern::Regex(QWEN2_PATTERN.into()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| error(&vocab_path, e))?;
        tokenizer.with_pre_tokenizer(Some(PreSequence::new(vec![
            PreTokenizerWrapper::Split(words),
            PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, false)),
        ])));
    } else {
        tokenizer.with_pre_tokenizer(Some(ByteLevel::new(add_prefix_space, true, true)));
    }
    tokenizer.with_decoder(Some(ByteLevel::default()));
    tokenizer.with_post_processor(Some(ByteLevel::new(true, false, true)));
    let (special, plain): (Vec<&Added>, Vec<&Added>) = added.iter().partition(|a| a.special);
    let as_added = |a: &&Added, special: bool| {
        AddedToken::from(a.content.clone(), special).normalized(a.normalized)
    };
    tokenizer.add_special_tokens(
        &special
            .iter()
            .map(|a| as_added(a, true))
            .collect::<Vec<_>>(),
    );
    tokenizer.add_tokens(&plain.iter().map(|a| as_added(a, false)).collect::<Vec<_>>());
    Ok(tokenizer)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    /// Writes the `vocab.json` + `merges.txt` form of a folder's `tokenizer.json` (added tokens
    /// in `added_tokens.json`) beside a copy of its `tokenizer_config.json`.
    fn pair_form_of(source: &Path, dest: &Path, class: &str) {
        std::fs::create_dir_all(dest).expect("mkdir");
        let bpe = read_bpe_json(&source.join("tokenizer.json")).expect("tokenizer.json");
        let mut added = serde_json::Map::new();
        let mut vocab = bpe.vocab.clone();
        for token in &bpe.added_tokens {
            let content = token["content"].as_str().expect("content");
            let id = token["id"].as_u64().expect("id");
            vocab.remove(content);
            added.insert(content.to_owned(), id.into());
        }
        std::fs::write(
            dest.join("vocab.json"),
            serde_json::to_string(&vocab).expect("vocab"),
        )
        .expect("write");
        let merges: String = bpe
            .merges
            .iter()
            .map(|(a, b)| format!("{a} {b}\n"))
            .collect();
        std::fs::write(dest.join("merges.txt"), format!("#version: 0.2\n{merges}")).expect("write");
        std::fs::write(
            dest.join("added_tokens.json"),
            Value::Object(added).to_string(),
        )
        .expect("write");
        let mut config = read_json(&source.join("tokenizer_config.json")).expect("config");
        config["tokenizer_class"] = Value::String(class.into());
        std::fs::write(dest.join("tokenizer_config.json"), config.to_string()).expect("write");
    }

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/models")
            .join(name)
    }

    const TEXTS: &[&str] = &[
        "Hello, world! It's a test.",
        "  leading spaces and trailing  ",
        "numbers 12345 and 3.14159, symbols $%&*",
        "café crème 日本語 emoji 🐱",
        "line one\nline two\r\n\ttabbed",
        "<|endoftext|> inside the text",
    ];

    #[test]
    fn the_pair_form_encodes_as_tokenizer_json_does() {
        let source = fixture("tiny-gpt2");
        let dest = std::env::temp_dir().join(format!("bpe-pair-{}", std::process::id()));
        pair_form_of(&source, &dest, "GPT2TokenizerFast");
        let want = tokenizers::Tokenizer::from_file(source.join("tokenizer.json")).expect("json");
        let config = read_json(&dest.join("tokenizer_config.json")).expect("config");
        let got = byte_level_from_files(&dest, &config).expect("pair form");
        for text in TEXTS {
            let w = want.encode(*text, false).expect("encode");
            let g = got.encode(*text, false).expect("encode");
            assert_eq!(g.get_ids(), w.get_ids(), "{text:?}");
            assert_eq!(
                got.decode(g.get_ids(), false).expect("decode"),
                want.decode(w.get_ids(), false).expect("decode"),
                "{text:?}"
            );
        }
        let _ = std::fs::remove_dir_all(&dest);
    }

    #[test]
    fn unknown_classes_and_broken_files_are_named() {
        let source = fixture("tiny-gpt2");
        let dest = std::env::temp_dir().join(format!("bpe-pair-bad-{}", std::process::id()));
        pair_form_of(&source, &dest, "LlamaTokenizer");
        let config = read_json(&dest.join("tokenizer_config.json")).expect("config");
        let message = byte_level_from_files(&dest, &config)
            .expect_err("refused")
            .to_string();
        assert!(message.contains("LlamaTokenizer"), "{message}");
        let gpt2 = serde_json::json!({"tokenizer_class": "GPT2Tokenizer"});
        std::fs::write(dest.join("merges.txt"), "#version: 0.2\na b c\n").expect("write");
        let message = byte_level_from_files(&dest, &gpt2)
            .expect_err("refused")
            .to_string();
        assert!(
            message.contains("merges.txt") && message.contains("line 2"),
            "{message}"
        );
        let _ = std::fs::remove_dir_all(&dest);
    }
}
