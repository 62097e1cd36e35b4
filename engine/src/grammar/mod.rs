//! Constrained decoding: an answer held to a grammar (a JSON schema, any JSON object, a Lark
//! grammar, or GBNF as llama.cpp takes it). Before each sampling step the grammar's state gives
//! the set of tokens that may come next; the GPU sampler drops every other one.
//!
//! The grammar engine is llguidance (the one llama.cpp, vLLM and SGLang use): an Earley parser
//! over lexemes, with a token trie that computes a 150k-token mask in well under a millisecond
//! and handles tokens that span several lexemes (`"},"` closes a string and an object at
//! once). This module turns requests into its Lark dialect and the model's vocabulary into its
//! token bytes.

mod gbnf;
mod guide;
mod tools;
mod vocab;

pub use gbnf::gbnf_to_lark;
pub use guide::Guide;
pub use tools::{ToolDemand, forced_call_lark};
pub use vocab::{GrammarVocab, PendingVocab};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use thiserror::Error;

/// What an answer must follow.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Constraint {
    /// Any JSON object (OpenAI's `response_format: {type: json_object}`).
    JsonObject,
    /// A document valid under `schema`. `strict`: a keyword the grammar cannot enforce is an
    /// error; otherwise it is ignored (OpenAI's `json_schema.strict`).
    JsonSchema { schema: Value, strict: bool },
    /// GBNF, llama.cpp's grammar format (`root ::= ...`).
    Gbnf(String),
    /// llguidance's Lark dialect (may embed `%json {...}` and special tokens).
    Lark(String),
    /// A call of one of the request's tools (`function`: that one), in the model's own call
    /// syntax; resolved against the model by [`forced_call_lark`].
    ToolCall {
        function: Option<String>,
        parallel: bool,
    },
}

/// Text the answer starts with before the constrained part: a reasoning model's thinking, or
/// a harmony model's analysis channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preamble {
    None,
    /// `<think>` ... `</think>` may come first (`opened`: the prompt already opened it).
    Reasoning {
        opened: bool,
    },
    /// GPT-OSS: an optional analysis message, then the final channel.
    Harmony,
}

#[derive(Debug, Error)]
pub enum GrammarError {
    /// The grammar or schema itself is at fault (the request's error).
    #[error("{0}")]
    Invalid(String),
    /// The model's tokenizer could not be read as bytes per token.
    #[error("the tokenizer cannot drive constrained decoding: {0}")]
    Vocabulary(String),
    /// The parser failed mid-answer.
    #[error("the grammar stopped matching: {0}")]
    Matcher(String),
}

/// Whitespace allowed between JSON tokens: a newline and indentation, or a few spaces, but
/// never unbounded (a model can otherwise fill its whole budget with blank lines).
pub(crate) const JSON_WHITESPACE: &str = r"\x20{1,2}|\x0D?\x0A[\x20\x09]{0,24}";

impl Constraint {
    /// The llguidance Lark grammar for this constraint, after `preamble`.
    pub fn to_lark(&self, preamble: Preamble) -> Result<String, GrammarError> {
        let body = match self {
            Self::JsonObject => json_rule(&json!({"type": "object"}), false),
            Self::JsonSchema { schema, strict } => {
                if !schema.is_object() && !schema.is_boolean() {
                    return Err(GrammarError::Invalid(
                        "a JSON schema must be an object".into(),
                    ));
                }
                json_rule(schema, !strict)
            }
            Self::Lark(text) => return Ok(with_preamble(text, preamble)),
            Self::ToolCall { .. } => {
                return Err(GrammarError::Invalid(
                    "a tool call's grammar depends on the model; resolve it first".into(),
                ));
            }
            Self::Gbnf(text) => return Ok(with_preamble(&gbnf_to_lark(text)?, preamble)),
        };
        Ok(with_preamble(
            &format!("start: body\nbody: {body}\n"),
            preamble,
        ))
    }
}

/// `%json {...}` with the whitespace rule; `lenient` ignores keywords the grammar cannot
/// enforce instead of refusing them.
fn json_rule(schema: &Value, lenient: bool) -> String {
    let mut schema = match schema {
        Value::Bool(true) => json!({}),
        Value::Bool(false) => json!({"not": {}}),
        other => other.clone(),
    };
    if let Some(map) = schema.as_object_mut() {
        map.insert(
            "x-guidance".into(),
            json!({
                "whitespace_flexible": true,
                "whitespace_pattern": JSON_WHITESPACE,
                "lenient": lenient,
            }),
        );
    }
    format!("%json {schema}")
}

/// Renames the grammar's `start` and puts the preamble before it.
fn with_preamble(lark: &str, preamble: Preamble) -> String {
    let head = match preamble {
        Preamble::None => return lark.to_owned(),
        // A lazy lexeme ends at the first `</think>`; the whitespace after it is the model's.
        Preamble::Reasoning { opened: true } => "start: THINK_REST? constrained_start\n",
        Preamble::Reasoning { opened: false } => {
            "start: (\"<think>\" THINK_REST)? constrained_start\n"
        }
        Preamble::Harmony => {
            "start: (<|channel|> \"analysis\" <|message|> ANALYSIS <|end|> <|start|> \"assistant\")? <|channel|> \"final\" <|message|> constrained_start\nANALYSIS: /(.|\\n)*/\n"
        }
    };
    let renamed = rename_start(lark);
    let think = match preamble {
        Preamble::Reasoning { .. } => "THINK_REST[lazy]: /(.|\\n)*<\\/think>[\\n ]{0,4}/\n",
        _ => "",
    };
    format!("{head}{think}{renamed}")
}

/// `start` becomes `constrained_start` wherever it names the rule.
fn rename_start(lark: &str) -> String {
    let mut out = String::with_capacity(lark.len() + 32);
    let bytes = lark.as_bytes();
    let mut i = 0;
    let mut in_string: Option<u8> = None;
    while i < bytes.len() {
        let c = bytes[i];
        if let Some(q) = in_string {
            out.push(c as char);
            if c == b'\\' && i + 1 < bytes.len() {
                out.push(bytes[i + 1] as char);
                i += 2;
                continue;
            }
            if c == q {
                in_string = None;
            }
            i += 1;
            continue;
        }
        if c == b'"' || c == b'/' {
            in_string = Some(c);
            out.push(c as char);
            i += 1;
            continue;
        }
        let boundary_before = i == 0 || !is_ident(bytes[i - 1]);
        if boundary_before && lark[i..].starts_with("start") {
            let end = i + "start".len();
            if end >= bytes.len() || !is_ident(bytes[end]) {
                out.push_str("constrained_start");
                i = end;
                continue;
            }
        }
        // Copy one UTF-8 character whole.
        let ch = lark[i..].chars().next().unwrap_or('\u{FFFD}');
        out.push(ch);
        i += ch.len_utf8().max(1);
    }
    out
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_is_renamed_only_as_a_rule_name() {
        let lark = "start: \"start\" restart /start/ start_x\nrestart: start";
        assert_eq!(
            rename_start(lark),
            "constrained_start: \"start\" restart /start/ start_x\nrestart: constrained_start"
        );
    }

    #[test]
    fn json_constraints_embed_the_schema_with_bounded_whitespace() {
        let lark = Constraint::JsonSchema {
            schema: json!({"type": "integer"}),
            strict: true,
        }
        .to_lark(Preamble::None)
        .expect("a grammar");
        assert!(lark.starts_with("start: body\nbody: %json {"), "{lark}");
        assert!(lark.contains("\"lenient\":false"), "{lark}");
        assert!(
            Constraint::JsonSchema {
                schema: json!("not a schema"),
                strict: false
            }
            .to_lark(Preamble::None)
            .is_err()
        );
    }
}
