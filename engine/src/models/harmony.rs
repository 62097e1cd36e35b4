//! GPT-OSS's harmony format on the way out. An answer is a run of messages, each a header
//! (`<|start|>assistant`, then `<|channel|>` and the channel's name, perhaps a recipient and
//! `<|constrain|>` with a content type) and a body after `<|message|>` that ends at `<|end|>`,
//! `<|return|>` (the answer is done) or `<|call|>` (a tool is called). The `analysis` channel
//! holds the reasoning, `final` the reply, `commentary` preambles and tool calls.
//!
//! [`HarmonyStream`] turns the tokens into text deltas in the `<think>` convention every
//! reasoning model's answer follows here (see [`super::reasoning`]): analysis bodies between
//! `<think>` and `</think>`, the other bodies as the reply, headers left out. A message to
//! `functions.NAME` (a tool call, its recipient in the role or the channel header) is written
//! as `<tool_call>{"name": NAME, "arguments": BODY}</tool_call>`, which
//! [`super::tool_calls`] reads as for any other model.

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
    /// A header so far: the role after `<|start|>` (with any recipient), then the channel's
    /// name (with any recipient and content type) after `<|channel|>`.
    Header {
        role: Vec<u32>,
        channel: Option<Vec<u32>>,
    },
    /// A message body (its channel decided whether `<think>` is open); `call`: a tool call's
    /// arguments.
    Body { call: bool },
}

/// Closes a call written as `<tool_call>` JSON.
const CALL_CLOSE: &str = "}\n</tool_call>";

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
            self.part = match std::mem::replace(&mut self.part, Part::Between) {
                Part::Header { role, .. } => Part::Header {
                    role,
                    channel: Some(Vec::new()),
                },
                _ => Part::Header {
                    role: Vec::new(),
                    channel: Some(Vec::new()),
                },
            };
            return Ok(String::new());
        }
        if id == t.message {
            let (channel, recipient) = match &self.part {
                Part::Header { role, channel } => {
                    let role = tokenizer.decode(role, true)?;
                    let channel = tokenizer.decode(channel.as_deref().unwrap_or_default(), true)?;
                    let recipient = [&role, &channel].into_iter().find_map(|h| {
                        let at = h.find("to=")?;
                        h[at + 3..].split_whitespace().next().map(str::to_owned)
                    });
                    (
                        channel.split_whitespace().next().map(str::to_owned),
                        recipient,
                    )
                }
                _ => (None, None),
            };
            let function = recipient.and_then(|r| r.strip_prefix("functions.").map(str::to_owned));
            let reasoning = function.is_none() && channel.as_deref() == Some("analysis");
            self.part = Part::Body {
                call: function.is_some(),
            };
            self.body = StreamDecoder::default();
            let mut text = if reasoning && !self.thinking {
                self.thinking = true;
                "<think>\n".to_owned()
            } else if !reasoning && self.thinking {
                self.thinking = false;
                "\n</think>\n\n".to_owned()
            } else {
                String::new()
            };
            if let Some(name) = function {
                let name = serde_json::Value::String(name);
                text.push_str(&format!("<tool_call>\n{{\"name\": {name}, \"arguments\": "));
            }
            return Ok(text);
        }
        if id == t.end || id == t.start || Some(id) == t.ret || Some(id) == t.call {
            let rest = self.finish_body(tokenizer)?;
            // A new message's role (and recipient) run up to its channel: a header too.
            self.part = if id == t.start {
                Part::Header {
                    role: Vec::new(),
                    channel: None,
                }
            } else {
                Part::Between
            };
            return Ok(rest);
        }
        match &mut self.part {
            Part::Header { role, channel } => {
                channel.as_mut().unwrap_or(role).push(id);
                Ok(String::new())
            }
            Part::Body { .. } => self.body.push(tokenizer, id),
            // Text outside any message (a model that skipped its header): the reply.
            Part::Between => {
                self.part = Part::Body { call: false };
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
        let mut rest = self.finish_body(tokenizer)?;
        if std::mem::take(&mut self.thinking) {
            rest.push_str("\n</think>\n\n");
        }
        self.part = Part::Between;
        Ok(rest)
    }

    /// What a body still holds back, and the close of a call's JSON.
    fn finish_body(&mut self, tokenizer: &TextTokenizer) -> Result<String, LoadError> {
        Ok(match self.part {
            Part::Body { call } => {
                let mut rest = self.body.finish(tokenizer)?;
                if call {
                    rest.push_str(CALL_CLOSE);
                }
                self.part = Part::Between;
                rest
            }
            _ => String::new(),
        })
    }
}
