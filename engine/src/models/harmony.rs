//! GPT-OSS's harmony format on the way out. An answer is a run of messages, each a header
//! (`<|start|>assistant`, then `<|channel|>` and the channel's name, perhaps a recipient and
//! `<|constrain|>` with a content type) and a body after `<|message|>` that ends at `<|end|>`,
//! `<|return|>` (the answer is done) or `<|call|>` (a tool is called). The `analysis` channel
//! holds the reasoning, `final` the reply, `commentary` preambles and tool calls.
//!
//! [`HarmonyStream`] turns the tokens into text deltas in the `<think>` convention every
//! reasoning model's answer follows here (see [`super::reasoning`]): analysis bodies between
//! `<think>` and `</think>`, the other bodies as the reply, headers left out.

use crate::load::{LoadError, StreamDecoder, TextTokenizer};

/// The harmony format's control tokens in a tokenizer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HarmonyTokens {
    start: u32,
    channel: u32,
    message: u32,
    end: u32,
    ret: Option<u32>,
    call: Option<u32>,
}

impl HarmonyTokens {
    /// The control tokens, where the tokenizer has the harmony format's (o200k_harmony).
    pub fn of(tokenizer: &TextTokenizer) -> Option<Self> {
        let id = |t: &str| tokenizer.token_to_id(t);
        Some(Self {
            start: id("<|start|>")?,
            channel: id("<|channel|>")?,
            message: id("<|message|>")?,
            end: id("<|end|>")?,
            ret: id("<|return|>"),
            call: id("<|call|>"),
        })
    }

    /// The tokens that end an answer: `<|return|>` (done) and `<|call|>` (a tool is called).
    pub fn stops(&self) -> impl Iterator<Item = u32> {
        self.ret.into_iter().chain(self.call)
    }
}

#[derive(Debug)]
enum Part {
    /// Between messages.
    Between,
    /// A header so far: the role after `<|start|>`, then the channel's name (with any
    /// recipient and content type) after `<|channel|>`.
    Header(Vec<u32>),
    /// A message body (its channel decided whether `<think>` is open).
    Body,
}

/// Harmony tokens in, text deltas out.
pub struct HarmonyStream {
    tokens: HarmonyTokens,
    part: Part,
    body: StreamDecoder,
    /// Inside `<think>`: an analysis body has been shown and no reply since.
    thinking: bool,
}

impl HarmonyStream {
    pub fn new(tokens: HarmonyTokens) -> Self {
        Self {
            tokens,
            // The prompt ends with `<|start|>assistant`: the answer opens with its header.
            part: Part::Between,
            body: StreamDecoder::default(),
            thinking: false,
        }
    }

    /// The text `id` adds.
    pub fn push(&mut self, tokenizer: &TextTokenizer, id: u32) -> Result<String, LoadError> {
        let t = self.tokens;
        if id == t.channel {
            self.part = Part::Header(Vec::new());
            return Ok(String::new());
        }
        if id == t.message {
            let reasoning = match &self.part {
                Part::Header(ids) => {
                    let header = tokenizer.decode(ids, true)?;
                    header.split_whitespace().next() == Some("analysis")
                }
                _ => false,
            };
            self.part = Part::Body;
            self.body = StreamDecoder::default();
            return Ok(if reasoning && !self.thinking {
                self.thinking = true;
                "<think>\n".into()
            } else if !reasoning && self.thinking {
                self.thinking = false;
                "\n</think>\n\n".into()
            } else {
                String::new()
            });
        }
        if id == t.end || id == t.start || Some(id) == t.ret || Some(id) == t.call {
            let rest = match self.part {
                Part::Body => self.body.finish(tokenizer)?,
                _ => String::new(),
            };
            // A new message's role (and recipient) run up to its channel: a header too.
            self.part = if id == t.start {
                Part::Header(Vec::new())
            } else {
                Part::Between
            };
            return Ok(rest);
        }
        match &mut self.part {
            Part::Header(ids) => {
                ids.push(id);
                Ok(String::new())
            }
            Part::Body => self.body.push(tokenizer, id),
            // Text outside any message (a model that skipped its header): the reply.
            Part::Between => {
                self.part = Part::Body;
                self.body = StreamDecoder::default();
                let close = if std::mem::take(&mut self.thinking) {
                    "\n</think>\n\n"
                } else {
                    ""
                };
                Ok(format!("{close}{}", self.body.push(tokenizer, id)?))
            }
        }
    }

    /// What is held back at the end: the rest of a body, and the closing of reasoning that
    /// no reply followed.
    pub fn finish(&mut self, tokenizer: &TextTokenizer) -> Result<String, LoadError> {
        let mut rest = match self.part {
            Part::Body => self.body.finish(tokenizer)?,
            _ => String::new(),
        };
        if std::mem::take(&mut self.thinking) {
            rest.push_str("\n</think>\n\n");
        }
        self.part = Part::Between;
        Ok(rest)
    }
}
