//! CLIP's byte-level BPE tokenizer, assembled as transformers' `CLIPTokenizerFast` converts it,
//! and the fixed length id rows that diffusers' pipelines feed the text encoders. It reads both
//! forms repositories ship: `vocab.json` + `merges.txt` (+ `special_tokens_map.json`), as
//! Stable Diffusion repositories have them, and `tokenizer.json` alone, as transformers 5 and
//! current diffusers save them; either way with `tokenizer_config.json`.
//!
//! Where transformers 4.x's Python `CLIPTokenizer` differs (without `ftfy` it cleans text with
//! BERT's BasicTokenizer: CJK characters become separate words, format characters such as
//! U+200B/U+200D vanish), this follows the `tokenizers` pipeline, which is also what
//! transformers 5 and OpenAI's original ftfy-based cleaning give for those prompts. Special
//! tokens typed into a prompt are matched as the configs' `normalized` flags say, as in
//! transformers 4.x (transformers 5 matches them case-sensitively: `<|ENDOFTEXT|>` differs).

use std::path::{Path, PathBuf};

use serde_json::Value;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::replace::ReplacePattern;
use tokenizers::normalizers::{Lowercase, NFC, Replace, Sequence};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, NormalizerWrapper, PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::load::LoadError;
use crate::load::bpe_files::{read_bpe_json, read_merges, read_vocab};

/// CLIP's word pattern: letter runs, single digits, punctuation runs and English contractions;
/// whitespace separates words and is dropped.
const WORD_PATTERN: &str =
    r"<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+";
const BOS: &str = "<|startoftext|>";
const EOS: &str = "<|endoftext|>";
/// CLIP's context; what every Stable Diffusion tokenizer_config.json says.
const DEFAULT_MAX_LENGTH: usize = 77;

pub struct ClipTokenizer {
    inner: tokenizers::Tokenizer,
    dir: PathBuf,
    bos: u32,
    eos: u32,
    pad: u32,
    max_length: usize,
}

/// A special token as the config files write it: a string, or an AddedToken object.
#[derive(Clone)]
struct Special {
    content: String,
    /// Matched in the normalized (lower-cased) text rather than the raw prompt.
    normalized: bool,
}

fn special(v: &Value) -> Option<Special> {
    match v {
        Value::String(s) => Some(Special {
            content: s.clone(),
            normalized: false,
        }),
        Value::Object(o) => Some(Special {
            content: o.get("content")?.as_str()?.to_owned(),
            // transformers builds special AddedTokens unnormalized unless told otherwise.
            normalized: o
                .get("normalized")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        }),
        _ => None,
    }
}

fn optional_json(path: &Path) -> Result<Value, LoadError> {
    if path.is_file() {
        crate::load::read_json(path)
    } else {
        Ok(Value::Null)
    }
}

fn tokenizer_error(path: &Path, message: impl std::fmt::Display) -> LoadError {
    LoadError::Tokenizer {
        path: path.to_owned(),
        message: message.to_string(),
    }
}

/// bos/eos/unk/pad from the two config files; `special_tokens_map.json` wins as in
/// transformers, and `added_tokens_decoder` (newer configs) or else the added tokens of
/// `tokenizer.json` have the final say on flags.
fn specials(dir: &Path, added: &[Special]) -> Result<[Special; 4], LoadError> {
    let config = optional_json(&dir.join("tokenizer_config.json"))?;
    let map = optional_json(&dir.join("special_tokens_map.json"))?;
    let decoder: Vec<Special> = config
        .get("added_tokens_decoder")
        .and_then(Value::as_object)
        .map(|o| o.values().filter_map(special).collect())
        .unwrap_or_else(|| added.to_vec());
    let pick = |key: &str, default: &str| {
        let mut token = map
            .get(key)
            .and_then(special)
            .or_else(|| config.get(key).and_then(special))
            .unwrap_or(Special {
                content: default.to_owned(),
                normalized: false,
            });
        if let Some(d) = decoder.iter().find(|d| d.content == token.content) {
            token.normalized = d.normalized;
        }
        token
    };
    Ok([
        pick("bos_token", BOS),
        pick("eos_token", EOS),
        pick("unk_token", EOS),
        pick("pad_token", EOS),
    ])
}

fn max_length(dir: &Path) -> Result<usize, LoadError> {
    let path = dir.join("tokenizer_config.json");
    let config = optional_json(&path)?;
    // Configs without a real limit write a huge float sentinel; CLIP's 77 is meant then.
    let length = config
        .get("model_max_length")
        .and_then(Value::as_u64)
        .and_then(|n| usize::try_from(n).ok())
        .filter(|&n| n <= 1 << 20)
        .unwrap_or(DEFAULT_MAX_LENGTH);
    if length < 2 {
        return Err(tokenizer_error(
            &path,
            format!("model_max_length {length} leaves no room for BOS and EOS"),
        ));
    }
    Ok(length)
}

fn pipeline(
    bpe: BPE,
    specials: &[Special],
    path: &Path,
) -> Result<tokenizers::Tokenizer, LoadError> {
    let err = |e: tokenizers::Error| tokenizer_error(path, e);
    let mut inner = tokenizers::Tokenizer::new(bpe);
    let whitespace = Replace::new(ReplacePattern::Regex(r"\s+".into()), " ").map_err(err)?;
    inner.with_normalizer(Some(Sequence::new(vec![
        NormalizerWrapper::NFC(NFC),
        NormalizerWrapper::Replace(whitespace),
        NormalizerWrapper::Lowercase(Lowercase),
    ])));
    let words = Split::new(
        SplitPattern::Regex(WORD_PATTERN.into()),
        SplitDelimiterBehavior::Removed,
        true,
    )
    .map_err(err)?;
    // Byte-level symbols without a prefix space; its GPT-2 split (`use_regex`) is kept as
    // transformers' converter has it, though it rarely splits a CLIP word further.
    inner.with_pre_tokenizer(Some(PreSequence::new(vec![
        PreTokenizerWrapper::Split(words),
        PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true)),
    ])));
    let mut seen: Vec<&str> = Vec::new();
    let added: Vec<AddedToken> = specials
        .iter()
        .filter(|s| {
            // The first declaration of a content wins (pad often repeats eos).
            let new = !seen.contains(&s.content.as_str());
            seen.push(&s.content);
            new
        })
        .map(|s| AddedToken::from(s.content.clone(), true).normalized(s.normalized))
        .collect();
    inner.add_special_tokens(&added);
    Ok(inner)
}

/// The vocabulary and merges, with the files they came from (for errors).
struct BpeSource {
    vocab: Vocab,
    merges: Vec<(String, String)>,
    /// The added tokens' flags, when the files carry them (tokenizer.json).
    added: Vec<Special>,
    vocab_path: PathBuf,
    merges_path: PathBuf,
}

/// Where the vocabulary comes from: the `vocab.json` + `merges.txt` pair when both are there,
/// else `tokenizer.json`. An error names the pair's missing file when neither form is whole.
fn read_vocab_and_merges(dir: &Path) -> Result<BpeSource, LoadError> {
    let vocab_path = dir.join("vocab.json");
    let merges_path = dir.join("merges.txt");
    let json_path = dir.join("tokenizer.json");
    let pair_whole = vocab_path.is_file() && merges_path.is_file();
    if !pair_whole && json_path.is_file() {
        let bpe = read_bpe_json(&json_path)?;
        return Ok(BpeSource {
            vocab: bpe.vocab,
            merges: bpe.merges,
            added: bpe.added_tokens.iter().filter_map(special).collect(),
            vocab_path: json_path.clone(),
            merges_path: json_path,
        });
    }
    Ok(BpeSource {
        vocab: read_vocab(&vocab_path)?,
        merges: read_merges(&merges_path)?,
        added: Vec::new(),
        vocab_path,
        merges_path,
    })
}

impl ClipTokenizer {
    pub fn from_dir(dir: &Path) -> Result<Self, LoadError> {
        let BpeSource {
            vocab,
            merges,
            added,
            vocab_path,
            merges_path,
        } = read_vocab_and_merges(dir)?;
        let specials = specials(dir, &added)?;
        let id = |s: &Special| {
            vocab.get(&s.content).copied().ok_or_else(|| {
                tokenizer_error(
                    &vocab_path,
                    format!("special token {:?} is not in the vocabulary", s.content),
                )
            })
        };
        let [bos, eos, unk, pad] = &specials;
        let (bos_id, eos_id, pad_id) = (id(bos)?, id(eos)?, id(pad)?);
        id(unk)?;
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .unk_token(unk.content.clone())
            .end_of_word_suffix("</w>".into())
            .build()
            .map_err(|e| tokenizer_error(&merges_path, e))?;
        Ok(Self {
            inner: pipeline(bpe, &specials, dir)?,
            dir: dir.to_owned(),
            bos: bos_id,
            eos: eos_id,
            pad: pad_id,
            max_length: max_length(dir)?,
        })
    }

    /// The prompt's token ids without BOS/EOS and without truncation.
    fn tokens(&self, text: &str) -> Result<Vec<u32>, LoadError> {
        crate::load::without_panics(&self.dir, || {
            self.inner
                .encode(text, false)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| e.to_string())
        })
    }

    /// Ids of `text` as the diffusers pipelines feed the text encoder: BOS, the prompt's tokens
    /// truncated so that with EOS the row is at most `max_length`, EOS, then the pad token up
    /// to exactly `max_length`.
    pub fn encode_padded(&self, text: &str) -> Result<Vec<u32>, LoadError> {
        let tokens = self.tokens(text)?;
        let kept = tokens.len().min(self.max_length - 2);
        let mut ids = Vec::with_capacity(self.max_length);
        ids.push(self.bos);
        ids.extend_from_slice(&tokens[..kept]);
        ids.push(self.eos);
        ids.resize(self.max_length, self.pad);
        Ok(ids)
    }

    /// How many prompt tokens truncation drops (the UI warns about them).
    pub fn overflow(&self, text: &str) -> Result<usize, LoadError> {
        Ok(self.tokens(text)?.len().saturating_sub(self.max_length - 2))
    }

    pub fn eos_id(&self) -> u32 {
        self.eos
    }

    pub fn bos_id(&self) -> u32 {
        self.bos
    }

    pub fn pad_id(&self) -> u32 {
        self.pad
    }

    pub fn max_length(&self) -> usize {
        self.max_length
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixtures() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
    }

    #[test]
    fn matches_transformers_goldens() {
        let goldens: Value = serde_json::from_str(
            &std::fs::read_to_string(fixtures().join("goldens/clip_tokenizer.json"))
                .expect("goldens"),
        )
        .expect("golden JSON");
        let folders = goldens["folders"].as_object().expect("folders");
        assert_eq!(folders.len(), 2);
        for (name, folder) in folders {
            let tokenizer =
                ClipTokenizer::from_dir(&fixtures().join("tokenizers").join(name)).expect(name);
            assert_eq!(tokenizer.max_length(), 77);
            assert_eq!(
                Some(u64::from(tokenizer.bos_id())),
                folder["bos_id"].as_u64()
            );
            assert_eq!(
                Some(u64::from(tokenizer.eos_id())),
                folder["eos_id"].as_u64()
            );
            assert_eq!(
                Some(u64::from(tokenizer.pad_id())),
                folder["pad_id"].as_u64()
            );
            let cases = folder["cases"].as_array().expect("cases");
            assert!(cases.len() >= 40);
            for case in cases {
                let prompt = case["prompt"].as_str().expect("prompt");
                let expected: Vec<u32> = serde_json::from_value(case["ids"].clone()).expect("ids");
                let got = tokenizer.encode_padded(prompt).expect("encode");
                assert_eq!(got, expected, "{name}: {prompt:?}");
                assert_eq!(
                    Some(tokenizer.overflow(prompt).expect("overflow") as u64),
                    case["overflow"].as_u64(),
                    "{name}: overflow of {prompt:?}"
                );
            }
        }
    }

    /// The form transformers 5 and current diffusers save (tokenizer.json + tokenizer_config.json,
    /// written by transformers 5.24 itself): the ids transformers 5 gives, and the ids of the
    /// vocab.json + merges.txt form of the same tokenizer. The forms differ on one prompt only,
    /// an upper-cased special token, which transformers 5 matches case-sensitively.
    #[test]
    fn tokenizer_json_alone_gives_the_ids_of_vocab_and_merges() {
        let golden: Value = serde_json::from_str(
            &std::fs::read_to_string(fixtures().join("goldens/clip_tokenizer_json.json"))
                .expect("golden"),
        )
        .expect("json");
        for (name, folder) in golden["folders"].as_object().expect("folders") {
            let dir = fixtures().join("tokenizers").join(name);
            assert!(!dir.join("vocab.json").exists() && dir.join("tokenizer.json").is_file());
            let json_form = ClipTokenizer::from_dir(&dir).expect("tokenizer.json form loads");
            let from = folder["from"].as_str().expect("from");
            let pair_form =
                ClipTokenizer::from_dir(&fixtures().join("tokenizers").join(from)).expect("pair");
            assert_eq!(json_form.bos_id(), pair_form.bos_id());
            assert_eq!(json_form.eos_id(), pair_form.eos_id());
            assert_eq!(json_form.pad_id(), pair_form.pad_id(), "{name}");
            for case in folder["cases"].as_array().expect("cases") {
                let prompt = case["prompt"].as_str().expect("prompt");
                let expected: Vec<u32> = serde_json::from_value(case["ids"].clone()).expect("ids");
                let got = json_form.encode_padded(prompt).expect("encode");
                assert_eq!(got, expected, "{name}: {prompt:?}");
                if prompt != "<|ENDOFTEXT|>" {
                    let pair = pair_form.encode_padded(prompt).expect("encode");
                    assert_eq!(got, pair, "{name}: {prompt:?}");
                }
            }
        }
    }

    #[test]
    fn merges_are_read_as_strings_or_pairs() {
        let dir = std::env::temp_dir().join(format!("clip-json-merges-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let source = fixtures().join("tokenizers/clip-tiny-json");
        std::fs::copy(
            source.join("tokenizer_config.json"),
            dir.join("tokenizer_config.json"),
        )
        .expect("copy");
        let mut json: Value = serde_json::from_str(
            &std::fs::read_to_string(source.join("tokenizer.json")).expect("read"),
        )
        .expect("json");
        let pairs = ClipTokenizer::from_dir(&source).expect("pairs");
        // tokenizers before 0.20 wrote each merge as one "a b" string.
        let strings: Vec<Value> = json["model"]["merges"]
            .as_array()
            .expect("merges")
            .iter()
            .map(|m| {
                Value::String(format!(
                    "{} {}",
                    m[0].as_str().expect("a"),
                    m[1].as_str().expect("b")
                ))
            })
            .collect();
        json["model"]["merges"] = Value::Array(strings);
        std::fs::write(dir.join("tokenizer.json"), json.to_string()).expect("write");
        let from_strings = ClipTokenizer::from_dir(&dir).expect("strings");
        let prompt = "a photograph of an astronaut riding a horse";
        assert_eq!(
            from_strings.encode_padded(prompt).expect("encode"),
            pairs.encode_padded(prompt).expect("encode")
        );
        json["model"]["merges"] = serde_json::json!([["a"]]);
        std::fs::write(dir.join("tokenizer.json"), json.to_string()).expect("write");
        let message = ClipTokenizer::from_dir(&dir)
            .err()
            .expect("refused")
            .to_string();
        assert!(
            message.contains("tokenizer.json") && message.contains("merge 0"),
            "{message}"
        );
        std::fs::remove_file(dir.join("tokenizer.json")).expect("rm");
        let message = ClipTokenizer::from_dir(&dir)
            .err()
            .expect("refused")
            .to_string();
        assert!(message.contains("vocab.json"), "{message}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn pad_token_follows_the_config() {
        let sd1 = ClipTokenizer::from_dir(&fixtures().join("tokenizers/clip-tiny")).expect("sd1");
        let sdxl =
            ClipTokenizer::from_dir(&fixtures().join("tokenizers/clip-tiny-pad-bang")).expect("xl");
        assert_eq!(sd1.pad_id(), sd1.eos_id());
        assert_eq!(sdxl.pad_id(), 0, "\"!\" is the first byte token");
        let ids = sdxl.encode_padded("a cat").expect("encode");
        assert_eq!(ids[0], sdxl.bos_id());
        assert_eq!(ids[3], sdxl.eos_id());
        assert!(ids[4..].iter().all(|&id| id == 0));
    }

    fn copy_fixture(to: &Path) {
        std::fs::create_dir_all(to).expect("mkdir");
        for file in [
            "vocab.json",
            "merges.txt",
            "tokenizer_config.json",
            "special_tokens_map.json",
        ] {
            std::fs::copy(
                fixtures().join("tokenizers/clip-tiny").join(file),
                to.join(file),
            )
            .expect("copy");
        }
    }

    #[test]
    fn broken_folders_are_clear_errors() {
        let dir = std::env::temp_dir().join(format!("clip-tokenizer-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let message = |dir: &Path| match ClipTokenizer::from_dir(dir) {
            Ok(_) => panic!("{} loaded", dir.display()),
            Err(e) => e.to_string(),
        };

        copy_fixture(&dir);
        std::fs::remove_file(dir.join("merges.txt")).expect("rm");
        let m = message(&dir);
        assert!(
            m.contains("merges.txt") && m.contains("no such file"),
            "{m}"
        );

        copy_fixture(&dir);
        std::fs::write(dir.join("vocab.json"), "{\"a\": 0,").expect("write");
        let m = message(&dir);
        assert!(
            m.contains("vocab.json") && m.contains("invalid JSON"),
            "{m}"
        );

        copy_fixture(&dir);
        std::fs::write(dir.join("merges.txt"), "#version: 0.2\na b c\n").expect("write");
        let m = message(&dir);
        assert!(m.contains("line 2"), "{m}");

        copy_fixture(&dir);
        std::fs::write(dir.join("merges.txt"), "#version: 0.2\nq zzz</w>\n").expect("write");
        let m = message(&dir);
        assert!(m.contains("merges.txt"), "{m}");

        copy_fixture(&dir);
        std::fs::write(dir.join("vocab.json"), "{\"a\": 0}").expect("write");
        std::fs::write(dir.join("merges.txt"), "#version: 0.2\n").expect("write");
        let m = message(&dir);
        assert!(
            m.contains("<|startoftext|>") && m.contains("not in the vocabulary"),
            "{m}"
        );

        let _ = std::fs::remove_dir_all(&dir);
    }
}
