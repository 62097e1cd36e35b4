//! Tool calls in a model's answer, in the format its chat template taught it, read into
//! OpenAI's shape: a name, JSON arguments, and the text around them as the reply.
//!
//! The format follows from the chat template (see [`ToolFormat::detect`]); GPT-OSS's harmony
//! calls arrive already written as `<tool_call>` JSON by [`super::harmony`]. An answer whose
//! call does not parse is left as text, as vLLM and llama.cpp leave it.

mod formats;
mod fragments;
mod json_scan;

use serde_json::Value;

/// How a model writes its calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ToolFormat {
    /// `<tool_call>{"name", "arguments"}</tool_call>` (Qwen2.5, Qwen3, Hermes, GPT-OSS as
    /// rewritten, and templates that know no tools), or inside it Qwen3-Coder's and
    /// Qwen3.5's `<function=NAME><parameter=P>value</parameter></function>`.
    Hermes,
    /// A bare `{"name", "parameters"}` object, perhaps after `<|python_tag|>`; several joined
    /// by `;` (Llama 3.1–3.3).
    Llama3,
    /// `[TOOL_CALLS]` then a JSON array (Mistral v0.3, Nemo), or `[TOOL_CALLS]name[ARGS]{...}`
    /// repeated, with `[CALL_ID]id` in some (Mistral Small 3.1+, Ministral 3, Devstral).
    Mistral,
    /// `<|tool_call>call:NAME{key:<|"|>text<|"|>,n:1}<tool_call|>` (Gemma 4).
    Gemma4,
    /// `<start_function_call>call:NAME{key:<escape>text<escape>}<end_function_call>`
    /// (FunctionGemma).
    FunctionGemma,
    /// `<|tool_call|>` then one call or a list of them, `<|/tool_call|>` (Phi-4-mini); also
    /// `functools[...]`.
    Phi4,
}

/// One call read from an answer.
#[derive(Clone, Debug, PartialEq)]
pub struct ParsedCall {
    pub name: String,
    /// A JSON object (or whatever JSON value the model wrote).
    pub arguments: Value,
    /// The id the model wrote (Mistral's `[CALL_ID]`, Nemo's `"id"`), if any.
    pub id: Option<String>,
}

impl ParsedCall {
    /// The arguments as OpenAI's `arguments` text: compact JSON (a string as written).
    pub fn arguments_text(&self) -> String {
        match &self.arguments {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        }
    }
}

impl ToolFormat {
    /// The format a chat template teaches, from its text.
    pub fn detect(template: Option<&str>) -> Self {
        let Some(t) = template else {
            return Self::Hermes;
        };
        if t.contains("[TOOL_CALLS]") {
            Self::Mistral
        } else if t.contains("<|tool_call>") {
            Self::Gemma4
        } else if t.contains("<start_function_call>") || t.contains("start_function_declaration") {
            Self::FunctionGemma
        } else if t.contains("<|tool_call|>") || t.contains("<|tool|>") {
            Self::Phi4
        } else if t.contains("<tool_call>") {
            Self::Hermes
        } else if t.contains("<|python_tag|>") || t.contains("\"parameters\": ") {
            Self::Llama3
        } else {
            Self::Hermes
        }
    }

    /// The text that opens a call. `at_start`: a marker that counts only before any other
    /// non-blank text (Llama's bare JSON).
    fn markers(self) -> &'static [(&'static str, bool)] {
        match self {
            Self::Hermes => &[("<tool_call>", false)],
            Self::Llama3 => &[("<|python_tag|>", false), ("{", true)],
            Self::Mistral => &[("[TOOL_CALLS]", false)],
            Self::Gemma4 => &[("<|tool_call>", false)],
            Self::FunctionGemma => &[("<start_function_call>", false)],
            Self::Phi4 => &[("<|tool_call|>", false), ("functools[", false)],
        }
    }

    /// The text that closes one call, for formats that close each (a streamed call can then
    /// go out as soon as it is complete).
    fn closer(self) -> Option<&'static str> {
        match self {
            Self::Hermes => Some("</tool_call>"),
            Self::Gemma4 => Some("<tool_call|>"),
            Self::FunctionGemma => Some("<end_function_call>"),
            Self::Phi4 => Some("<|/tool_call|>"),
            Self::Llama3 | Self::Mistral => None,
        }
    }

    /// Special tokens the answer's text must keep for calls to be read (a tokenizer's decode
    /// drops special tokens otherwise).
    pub fn special_markers(self) -> &'static [&'static str] {
        match self {
            Self::Hermes => &["<tool_call>", "</tool_call>"],
            Self::Llama3 => &["<|python_tag|>"],
            Self::Mistral => &["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"],
            Self::Gemma4 => &["<|tool_call>", "<tool_call|>", "<|\"|>"],
            Self::FunctionGemma => &["<start_function_call>", "<end_function_call>", "<escape>"],
            Self::Phi4 => &["<|tool_call|>", "<|/tool_call|>"],
        }
    }

    /// The reply text and the calls in a whole answer. `tools` (OpenAI's definitions) type the
    /// values of formats that write them untyped (Qwen3.5's XML parameters).
    pub fn parse(self, text: &str, tools: &[Value]) -> (String, Vec<ParsedCall>) {
        let Some(start) = self.first_marker(text) else {
            return (text.to_owned(), Vec::new());
        };
        match formats::parse_calls(self, &text[start..], tools) {
            Some((calls, after)) if !calls.is_empty() => {
                let mut content = text[..start].to_owned();
                content.push_str(after.trim());
                (content.trim_end().to_owned(), calls)
            }
            _ => (text.to_owned(), Vec::new()),
        }
    }

    /// Where the first call opens in `text`.
    fn first_marker(self, text: &str) -> Option<usize> {
        self.markers()
            .iter()
            .filter_map(|&(marker, at_start)| {
                let at = text.find(marker)?;
                (!at_start || text[..at].trim().is_empty()).then_some(at)
            })
            .min()
    }
}

/// A piece of a streamed answer once calls are recognised. Calls are numbered from 0 in the
/// order they open, whether read whole or started.
#[derive(Clone, Debug, PartialEq)]
pub enum StreamPiece {
    Text(String),
    /// A call read whole.
    Call(ParsedCall),
    /// A call whose arguments follow in [`StreamPiece::CallArguments`] as they are written:
    /// its name, and the id the model wrote, if it wrote one before its arguments.
    CallStart {
        name: String,
        id: Option<String>,
    },
    /// More of call `call`'s arguments: their pieces joined are its
    /// [`ParsedCall::arguments_text`].
    CallArguments {
        call: usize,
        text: String,
    },
}

/// Reads calls out of a streamed answer: text passes through until a call may be opening (a
/// marker, or the first characters of one, are held back). A call whose name and JSON
/// arguments are being written is started and its arguments sent as far as they are settled
/// (see [`fragments`]); in formats that close each call, a call is complete as soon as it is
/// closed; otherwise the rest is kept from the first marker on and read whole at the end.
/// Text that turns out not to be a call is released then.
pub struct ToolCallStream {
    format: ToolFormat,
    tools: Vec<Value>,
    /// Text not yet released: a possible marker's start, or everything from a marker on.
    held: String,
    /// A marker has been seen.
    calling: bool,
    /// Non-blank text has been released (a start-only marker no longer counts).
    spoke: bool,
    /// A call went out and no text since: blanks between calls are not the reply.
    after_call: bool,
    /// The arguments sent so far of each call started in what is held.
    started: Vec<String>,
    /// Calls numbered so far (read whole or started).
    numbered: usize,
    /// The number of the first call in what is held.
    held_base: usize,
    /// Reads the calls being written in what is held; renewed whenever the held text is cut.
    reader: fragments::Reader,
}

impl ToolCallStream {
    pub fn new(format: ToolFormat, tools: Vec<Value>) -> Self {
        Self {
            format,
            tools,
            held: String::new(),
            calling: false,
            spoke: false,
            after_call: false,
            started: Vec::new(),
            numbered: 0,
            held_base: 0,
            reader: fragments::Reader::default(),
        }
    }

    /// The pieces `delta` completes.
    pub fn push(&mut self, delta: &str) -> Vec<StreamPiece> {
        self.held.push_str(delta);
        let mut pieces = Vec::new();
        loop {
            if self.calling {
                match self.closed_call() {
                    Some(calls) => pieces.extend(self.settle(calls)),
                    None => {
                        self.send_progress(&mut pieces);
                        return pieces;
                    }
                }
            }
            pieces.extend(self.release_text());
            if !self.calling {
                return pieces;
            }
        }
    }

    /// The calls of the first closed block in what is held, taken out of it; None while the
    /// block is open, or when it does not read as calls (the end decides then).
    fn closed_call(&mut self) -> Option<Vec<ParsedCall>> {
        let closer = self.format.closer()?;
        let end = self.held.find(closer)? + closer.len();
        let (content, calls) = self.format.parse(&self.held[..end], &self.tools);
        if calls.is_empty() || !content.trim().is_empty() {
            return None;
        }
        self.held.drain(..end);
        self.reader = fragments::Reader::default();
        self.calling = false;
        self.spoke = true;
        self.after_call = true;
        Some(calls)
    }

    /// Starts the calls being written in what is held, and sends their arguments' newly
    /// settled text.
    fn send_progress(&mut self, pieces: &mut Vec<StreamPiece>) {
        for (j, p) in self
            .reader
            .progress(self.format, &self.held)
            .into_iter()
            .enumerate()
        {
            if j == self.started.len() {
                pieces.push(StreamPiece::CallStart {
                    name: p.name,
                    id: p.id,
                });
                self.started.push(String::new());
                self.numbered += 1;
            }
            let sent = &mut self.started[j];
            if let Some(more) = p.arguments.strip_prefix(sent.as_str())
                && !more.is_empty()
            {
                pieces.push(StreamPiece::CallArguments {
                    call: self.held_base + j,
                    text: more.to_owned(),
                });
                sent.push_str(more);
            }
        }
    }

    /// The pieces of the calls read from what was held: the rest of the arguments of those
    /// started, the others whole. What is held next numbers its calls after them.
    fn settle(&mut self, calls: Vec<ParsedCall>) -> Vec<StreamPiece> {
        let mut pieces = Vec::new();
        let started = std::mem::take(&mut self.started);
        for (j, call) in calls.into_iter().enumerate() {
            match started.get(j) {
                Some(sent) => {
                    // What was sent is a prefix of the compact arguments by construction.
                    let full = call.arguments_text();
                    if let Some(rest) = full.strip_prefix(sent.as_str())
                        && !rest.is_empty()
                    {
                        pieces.push(StreamPiece::CallArguments {
                            call: self.held_base + j,
                            text: rest.to_owned(),
                        });
                    }
                }
                None => {
                    pieces.push(StreamPiece::Call(call));
                    self.numbered += 1;
                }
            }
        }
        self.held_base = self.numbered;
        pieces
    }

    /// Text that cannot begin a call, released; `calling` is set where a marker is found.
    fn release_text(&mut self) -> Vec<StreamPiece> {
        let markers: Vec<&str> = self
            .format
            .markers()
            .iter()
            .filter(|&&(_, at_start)| !at_start || !self.spoke)
            .map(|&(m, _)| m)
            .collect();
        let found = markers
            .iter()
            .filter_map(|m| {
                let at = self.held.find(m)?;
                let start_only = self.format.markers().iter().any(|&(x, s)| x == *m && s);
                (!start_only || self.held[..at].trim().is_empty()).then_some(at)
            })
            .min();
        let release = match found {
            Some(at) => {
                self.calling = true;
                at
            }
            // Keep back the longest tail that could begin a marker.
            None => self.held.len() - longest_marker_prefix(&self.held, &markers),
        };
        let text: String = self.held.drain(..release).collect();
        if release > 0 {
            self.reader = fragments::Reader::default();
        }
        if text.trim().is_empty() && (self.after_call || text.is_empty()) {
            return Vec::new();
        }
        self.spoke = true;
        self.after_call = false;
        vec![StreamPiece::Text(text)]
    }

    /// The rest at the end of the answer: its calls, or its text if they do not parse.
    pub fn finish(&mut self) -> Vec<StreamPiece> {
        let held = std::mem::take(&mut self.held);
        self.reader = fragments::Reader::default();
        if !self.calling {
            return if held.is_empty() || (self.after_call && held.trim().is_empty()) {
                Vec::new()
            } else {
                vec![StreamPiece::Text(held)]
            };
        }
        let (content, calls) = self.format.parse(&held, &self.tools);
        let mut pieces = Vec::new();
        if !content.is_empty() {
            pieces.push(StreamPiece::Text(content));
        }
        pieces.extend(self.settle(calls));
        pieces
    }
}

/// The calls a client assembles from streamed pieces: whole calls as they are, started ones
/// with their fragments joined and read as JSON.
pub fn assemble_calls(pieces: &[StreamPiece]) -> Vec<ParsedCall> {
    let mut calls: Vec<(ParsedCall, Option<String>)> = Vec::new();
    for piece in pieces {
        match piece {
            StreamPiece::Text(_) => {}
            StreamPiece::Call(call) => calls.push((call.clone(), None)),
            StreamPiece::CallStart { name, id } => calls.push((
                ParsedCall {
                    name: name.clone(),
                    arguments: Value::Null,
                    id: id.clone(),
                },
                Some(String::new()),
            )),
            StreamPiece::CallArguments { call, text } => {
                if let Some((_, Some(joined))) = calls.get_mut(*call) {
                    joined.push_str(text);
                }
            }
        }
    }
    calls
        .into_iter()
        .map(|(mut call, joined)| {
            if let Some(text) = joined {
                call.arguments = serde_json::from_str(&text).unwrap_or(Value::String(text));
            }
            call
        })
        .collect()
}

/// The length of the longest suffix of `text` that is a proper prefix of a marker.
fn longest_marker_prefix(text: &str, markers: &[&str]) -> usize {
    let mut best = 0;
    for m in markers {
        for len in (1..m.len()).rev() {
            if len <= best {
                break;
            }
            if m.is_char_boundary(len)
                && text.len() >= len
                && text.is_char_boundary(text.len() - len)
                && text.ends_with(&m[..len])
            {
                best = len;
                break;
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream_all(format: ToolFormat, text: &str, step: usize) -> Vec<StreamPiece> {
        let mut s = ToolCallStream::new(format, Vec::new());
        let mut out = Vec::new();
        let chars: Vec<char> = text.chars().collect();
        for chunk in chars.chunks(step) {
            out.extend(s.push(&chunk.iter().collect::<String>()));
        }
        out.extend(s.finish());
        out
    }

    fn text_of(pieces: &[StreamPiece]) -> String {
        pieces
            .iter()
            .filter_map(|p| match p {
                StreamPiece::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn streams_release_text_and_read_calls_at_the_end() {
        let answer =
            "Let me check.<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>";
        for step in [1, 3, 7, 100] {
            let pieces = stream_all(ToolFormat::Hermes, answer, step);
            assert_eq!(text_of(&pieces), "Let me check.", "step {step}");
            let calls = assemble_calls(&pieces);
            assert_eq!(calls.len(), 1, "step {step}");
            assert_eq!(calls[0].name, "f");
            assert_eq!(calls[0].arguments, serde_json::json!({"x": 1}));
        }
    }

    #[test]
    fn calls_start_and_send_their_arguments_while_written() {
        let mut s = ToolCallStream::new(ToolFormat::Hermes, Vec::new());
        // A block arriving whole goes out whole.
        let first = "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n";
        let pieces = s.push(first);
        assert!(
            matches!(&pieces[..], [StreamPiece::Call(c)] if c.name == "a"),
            "{pieces:?}"
        );
        // The next starts once its name is known; its arguments follow as they settle.
        let pieces = s.push("<tool_call>\n{\"name\": \"write\", \"arguments\": {\"text\": \"hel");
        assert_eq!(
            pieces,
            [
                StreamPiece::CallStart {
                    name: "write".into(),
                    id: None
                },
                StreamPiece::CallArguments {
                    call: 1,
                    text: "{\"text\":\"hel".into()
                }
            ]
        );
        assert!(s.push("\\").is_empty(), "half an escape is held");
        let pieces = s.push("n\"}}\n</tool_call>");
        assert_eq!(
            pieces,
            [StreamPiece::CallArguments {
                call: 1,
                text: "\\n\"}".into()
            }]
        );
        assert!(s.finish().is_empty());
    }

    #[test]
    fn a_marker_prefix_that_is_not_a_marker_is_released() {
        let pieces = stream_all(ToolFormat::Hermes, "a <tool b", 2);
        assert_eq!(text_of(&pieces), "a <tool b");
        // Llama's bare JSON counts only at the start.
        let pieces = stream_all(ToolFormat::Llama3, "use {braces}", 1);
        assert_eq!(text_of(&pieces), "use {braces}");
        // A call that does not parse comes back as text.
        let pieces = stream_all(ToolFormat::Hermes, "x<tool_call>{not json</tool_call>", 4);
        assert_eq!(text_of(&pieces), "x<tool_call>{not json</tool_call>");
    }

    #[test]
    fn formats_follow_the_template() {
        assert_eq!(ToolFormat::detect(None), ToolFormat::Hermes);
        assert_eq!(
            ToolFormat::detect(Some("{{ '[TOOL_CALLS]' }}")),
            ToolFormat::Mistral
        );
        assert_eq!(
            ToolFormat::detect(Some("{{ '<|python_tag|>' }}")),
            ToolFormat::Llama3
        );
    }

    /// A file written as one argument, tens of thousands of characters with an escape every
    /// few dozen, streamed a few characters at a time: its fragments join into the arguments
    /// the whole call carries. (Each token's reading resumes where the last stopped; read
    /// from the start every token, this took minutes.)
    #[test]
    fn a_long_argument_streams_whole() {
        let line = "    let value = compute(\\\"input\\\", 42); // caf\\u00e9 \\ud83d\\ude00\\n";
        let content = line.repeat(700);
        let text = format!(
            "<tool_call>\n{{\"name\": \"write_file\", \"arguments\": {{\"path\": \"a.rs\", \"content\": \"{content}\"}}}}\n</tool_call>"
        );
        let pieces = stream_all(ToolFormat::Hermes, &text, 4);
        let calls = assemble_calls(&pieces);
        assert_eq!(calls.len(), 1);
        let want: Value = serde_json::from_str(&format!("\"{content}\"")).expect("content");
        assert_eq!(calls[0].arguments["content"], want);
        let fragments = pieces
            .iter()
            .filter(|p| matches!(p, StreamPiece::CallArguments { .. }))
            .count();
        assert!(fragments > 1000, "{fragments} fragments");
    }
}
