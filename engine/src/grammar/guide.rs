//! One constrained answer: the grammar's state, the mask of tokens it allows next, and each
//! sampled token fed back.

use llguidance::Matcher;
use llguidance::api::TopLevelGrammar;

use super::{Constraint, GrammarError, GrammarVocab, Preamble};

pub struct Guide {
    matcher: Matcher,
    words: usize,
}

impl Guide {
    /// Compiles `constraint` (after `preamble`) for `vocab`. An error names what the grammar
    /// or schema got wrong.
    pub fn new(
        vocab: &GrammarVocab,
        constraint: &Constraint,
        preamble: Preamble,
    ) -> Result<Self, GrammarError> {
        let lark = constraint.to_lark(preamble)?;
        let grammar = TopLevelGrammar::from_lark(lark);
        // A position in the Lark text means something only where the request wrote it.
        let invalid = |message: &str| {
            let message = clean(message);
            GrammarError::Invalid(match constraint {
                Constraint::Lark(_) => message,
                _ => without_position(&message).to_owned(),
            })
        };
        let parser = vocab
            .factory()
            .create_parser(grammar)
            .map_err(|e| invalid(&e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(invalid(&e));
        }
        Ok(Self {
            matcher,
            words: vocab.vocab_size().div_ceil(32),
        })
    }

    /// The tokens allowed next, one bit each (bit `i % 32` of word `i / 32`); once the grammar
    /// is complete, only the end-of-text tokens.
    pub fn mask(&mut self) -> Result<Vec<u32>, GrammarError> {
        let mask = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| GrammarError::Matcher(clean(&e.to_string())))?;
        let mut words = mask.as_slice().to_vec();
        words.resize(self.words, 0);
        if words.iter().all(|&w| w == 0) {
            return Err(GrammarError::Matcher(
                "no token can continue the answer".into(),
            ));
        }
        Ok(words)
    }

    /// Advances the grammar past `token` (one the last mask allowed).
    pub fn accept(&mut self, token: u32) -> Result<(), GrammarError> {
        if self.matcher.is_stopped() {
            return Ok(());
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| GrammarError::Matcher(clean(&e.to_string())))
    }

    /// Whether the answer so far is a complete sentence of the grammar.
    pub fn is_complete(&mut self) -> bool {
        self.matcher.is_stopped() || self.matcher.is_accepting().unwrap_or(false)
    }
}

/// The message without llguidance's leading `at LINE(COLUMN): `.
fn without_position(message: &str) -> &str {
    match message
        .strip_prefix("at ")
        .and_then(|rest| rest.split_once("): "))
    {
        Some((position, rest)) if position.chars().all(|c| c.is_ascii_digit() || c == '(') => rest,
        _ => message,
    }
}

/// llguidance's messages end with a dump of the parser's state meant for its own logs: the
/// first line says what went wrong.
fn clean(message: &str) -> String {
    message.trim().lines().next().unwrap_or_default().to_owned()
}
