//! The model's vocabulary as llguidance sees it: the bytes each token stands for, special
//! tokens marked apart (a grammar names them as `<|name|>`, text never matches them), and the
//! tokens that end an answer.

use std::sync::Arc;

use llguidance::ParserFactory;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use super::GrammarError;
use crate::load::TextTokenizer;

/// Built once per model (the trie of a 150k vocabulary takes tens of milliseconds); every
/// constrained answer starts its parser from it.
pub struct GrammarVocab {
    factory: ParserFactory,
}

/// The trie with the model's own tokenizer behind it, for the few places llguidance tokenizes
/// text itself (forced prefixes).
struct ModelTokEnv {
    trie: TokTrie,
    tokenizer: tokenizers::Tokenizer,
}

impl TokenizerEnv for ModelTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            self.tokenizer
                .encode(text, false)
                .map(|e| e.get_ids().to_vec())
                .unwrap_or_default()
        })
    }
}

/// A [`GrammarVocab`] built on a thread of its own from the moment a model's tokenizer is read,
/// so that neither loading nor the first constrained answer waits for it.
pub struct PendingVocab(Pending);

enum Pending {
    Building(std::thread::JoinHandle<Result<GrammarVocab, GrammarError>>),
    Done(Result<GrammarVocab, String>),
}

impl PendingVocab {
    /// Starts building the vocabulary of `tokenizer` (see [`GrammarVocab::new`]).
    pub fn spawn(tokenizer: &TextTokenizer, vocab: u32, eos: &[u32]) -> Self {
        let hf = tokenizer.hf().clone();
        let eos = eos.to_vec();
        let handle = std::thread::Builder::new()
            .name("grammar vocabulary".into())
            .spawn(move || GrammarVocab::new(hf, vocab, &eos));
        Self(match handle {
            Ok(h) => Pending::Building(h),
            Err(e) => Pending::Done(Err(e.to_string())),
        })
    }

    /// The vocabulary, waiting for it if it is still being built.
    pub fn get(&mut self) -> Result<&GrammarVocab, GrammarError> {
        if matches!(self.0, Pending::Building(_)) {
            let placeholder = Pending::Done(Err("building it panicked".into()));
            if let Pending::Building(handle) = std::mem::replace(&mut self.0, placeholder) {
                self.0 = Pending::Done(match handle.join() {
                    Ok(result) => result.map_err(|e| e.to_string()),
                    Err(_) => Err("building it panicked".into()),
                });
            }
        }
        match &self.0 {
            Pending::Done(Ok(v)) => Ok(v),
            Pending::Done(Err(e)) => Err(GrammarError::Vocabulary(e.clone())),
            Pending::Building(_) => Err(GrammarError::Vocabulary("still building".into())),
        }
    }
}

impl GrammarVocab {
    /// `vocab`: the width of the model's logits (may exceed the tokenizer's, padded); `eos`:
    /// the tokens that end an answer (at least one).
    pub fn new(hf: tokenizers::Tokenizer, vocab: u32, eos: &[u32]) -> Result<Self, GrammarError> {
        let json = hf
            .to_string(false)
            .map_err(|e| GrammarError::Vocabulary(e.to_string()))?;
        let json: serde_json::Value =
            serde_json::from_str(&json).map_err(|e| GrammarError::Vocabulary(e.to_string()))?;
        // The reader asserts on shapes it does not expect (a tokenizer of another kind).
        let words = std::panic::catch_unwind(|| {
            llguidance::token_bytes_from_tokenizer_json(&json).map_err(|e| e.to_string())
        })
        .unwrap_or_else(|_| Err("its decoder is of a kind the reader does not know".into()))
        .map_err(GrammarError::Vocabulary)?;
        let words = padded(words, vocab);
        let Some(&first_eos) = eos.first() else {
            return Err(GrammarError::Vocabulary(
                "the model names no end-of-text token".into(),
            ));
        };
        if let Some(bad) = eos.iter().find(|&&id| id >= vocab) {
            return Err(GrammarError::Vocabulary(format!(
                "end-of-text token {bad} is outside the vocabulary of {vocab}"
            )));
        }
        let info = TokRxInfo::new(vocab, first_eos);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(eos);
        let env: TokEnv = Arc::new(ModelTokEnv {
            trie,
            tokenizer: hf,
        });
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::Vocabulary(e.to_string()))?;
        factory.quiet();
        Ok(Self { factory })
    }

    pub(super) fn factory(&self) -> &ParserFactory {
        &self.factory
    }

    pub fn vocab_size(&self) -> usize {
        self.factory.tok_env().tok_trie().vocab_size()
    }
}

/// Exactly `vocab` words: ids the tokenizer lacks (or padding past it) become special
/// placeholders no text matches; ids past the logits are dropped.
fn padded(mut words: Vec<Vec<u8>>, vocab: u32) -> Vec<Vec<u8>> {
    words.resize(vocab as usize, Vec::new());
    for (id, w) in words.iter_mut().enumerate() {
        if w.is_empty() {
            let mut name = format!("<[{id}]>").into_bytes();
            name.insert(0, TokTrie::SPECIAL_TOKEN_MARKER);
            *w = name;
        }
    }
    words
}
