use std::path::Path;

use serde_json::Value;

use super::error::{LoadError, read_json};
use super::template::{ChatMessage, ChatSwitches, ChatTemplate};

/// Defaults from `generation_config.json`.
#[derive(Clone, Debug, Default)]
pub struct GenerationConfig {
    pub eos_token_ids: Vec<u32>,
    pub bos_token_id: Option<u32>,
    pub do_sample: Option<bool>,
    pub temperature: Option<f32>,
    pub top_k: Option<u32>,
    pub top_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
}

impl GenerationConfig {
    pub fn from_dir(dir: &Path) -> Result<Self, LoadError> {
        let path = dir.join("generation_config.json");
        if !path.is_file() {
            return Ok(Self::default());
        }
        let c = read_json(&path)?;
        let ids = |v: Option<&Value>| -> Vec<u32> {
            match v {
                Some(Value::Number(n)) => n.as_u64().map(|n| vec![n as u32]).unwrap_or_default(),
                Some(Value::Array(a)) => a
                    .iter()
                    .filter_map(|n| n.as_u64().map(|n| n as u32))
                    .collect(),
                _ => Vec::new(),
            }
        };
        Ok(Self {
            eos_token_ids: ids(c.get("eos_token_id")),
            bos_token_id: c
                .get("bos_token_id")
                .and_then(Value::as_u64)
                .map(|v| v as u32),
            do_sample: c.get("do_sample").and_then(Value::as_bool),
            temperature: c
                .get("temperature")
                .and_then(Value::as_f64)
                .map(|v| v as f32),
            top_k: c.get("top_k").and_then(Value::as_u64).map(|v| v as u32),
            top_p: c.get("top_p").and_then(Value::as_f64).map(|v| v as f32),
            repetition_penalty: c
                .get("repetition_penalty")
                .and_then(Value::as_f64)
                .map(|v| v as f32),
        })
    }
}

/// Runs a `tokenizers` call on outside input, turning a panic inside the library (some of its
/// deserializers `expect` on malformed sections) into an error that names the file.
pub(crate) fn without_panics<T>(
    path: &Path,
    f: impl FnOnce() -> Result<T, String>,
) -> Result<T, LoadError> {
    let outcome =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|panic| {
            let detail = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            Err(format!(
                "the tokenizer library could not read it ({detail})"
            ))
        });
    outcome.map_err(|message| LoadError::Tokenizer {
        path: path.to_owned(),
        message,
    })
}

/// The model's tokenizer with its chat template and special tokens.
pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    template: Option<ChatTemplate>,
    eos_token: Option<String>,
}

/// `bos_token` and friends are either a string or an AddedToken object with `content`.
fn token_string(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_owned),
        _ => None,
    }
}

impl TextTokenizer {
    pub fn from_dir(dir: &Path) -> Result<Self, LoadError> {
        let path = dir.join("tokenizer.json");
        let config_path = dir.join("tokenizer_config.json");
        let config = if config_path.is_file() {
            read_json(&config_path)?
        } else {
            Value::Null
        };
        // Older repositories ship vocab.json + merges.txt and no tokenizer.json.
        let has_pair = dir.join("vocab.json").is_file() && dir.join("merges.txt").is_file();
        let inner = if path.is_file() {
            without_panics(&path, || {
                tokenizers::Tokenizer::from_file(&path).map_err(|e| e.to_string())
            })?
        } else if has_pair {
            super::bpe_files::byte_level_from_files(dir, &config)?
        } else {
            return Err(LoadError::Missing { path });
        };
        let bos = token_string(config.get("bos_token")).unwrap_or_default();
        let eos_token = token_string(config.get("eos_token"));
        let jinja_path = dir.join("chat_template.jinja");
        let source = if jinja_path.is_file() {
            Some(std::fs::read_to_string(&jinja_path).map_err(|e| LoadError::io(&jinja_path, e))?)
        } else {
            match config.get("chat_template") {
                Some(Value::String(s)) => Some(s.clone()),
                // A list of named templates: use the default one.
                Some(Value::Array(list)) => list
                    .iter()
                    .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                    .or_else(|| list.first())
                    .and_then(|t| t.get("template"))
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                _ => None,
            }
        };
        let template = source
            .map(|s| ChatTemplate::new(&s, &bos, eos_token.as_deref().unwrap_or_default()))
            .transpose()?;
        Ok(Self {
            inner,
            template,
            eos_token,
        })
    }

    /// A tokenizer assembled elsewhere (GGUF metadata) with its template and EOS token.
    pub fn from_parts(
        inner: tokenizers::Tokenizer,
        template: Option<ChatTemplate>,
        eos_token: Option<String>,
    ) -> Self {
        Self {
            inner,
            template,
            eos_token,
        }
    }

    /// The `tokenizers` tokenizer underneath (its vocabulary and decoder, for grammars).
    pub fn hf(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    pub fn vocab_size(&self) -> u32 {
        self.inner.get_vocab_size(true) as u32
    }

    pub fn has_chat_template(&self) -> bool {
        self.template.is_some()
    }

    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos_token
            .as_deref()
            .and_then(|t| self.inner.token_to_id(t))
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The id of `token` where it is a special (control) token of the vocabulary.
    pub fn special_token_id(&self, token: &str) -> Option<u32> {
        self.inner
            .get_added_tokens_decoder()
            .into_iter()
            .find(|(_, t)| t.special && t.content == token)
            .map(|(id, _)| id)
    }

    /// Tokenizes `text`; `add_special_tokens` adds BOS etc. as the tokenizer's post-processor
    /// says (what `tokenizer(text)` does in transformers).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, LoadError> {
        without_panics(Path::new("tokenizer.json"), || {
            self.inner
                .encode(text, add_special_tokens)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| e.to_string())
        })
    }

    /// Renders the chat template and tokenizes the result without adding special tokens again,
    /// as `apply_chat_template(..., tokenize=True)` does.
    pub fn encode_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        switches: &ChatSwitches,
    ) -> Result<Vec<u32>, LoadError> {
        let text = self.render_chat(messages, add_generation_prompt, switches)?;
        self.encode(&text, false)
    }

    /// Whether a rendered chat prompt ends by opening `<think>`, as Qwen3.5's and
    /// Qwen3-thinking-2507's generation prompts do when thinking is on: the answer then starts
    /// inside the reasoning and closes it with `</think>`.
    pub fn opens_reasoning(&self, prompt: &[u32]) -> bool {
        // The tag is one token in those vocabularies and a few in others; eight cover it and
        // the whitespace after it.
        let tail = &prompt[prompt.len().saturating_sub(8)..];
        self.decode(tail, false)
            .is_ok_and(|text| text.trim_end().ends_with("<think>"))
    }

    /// Whether the chat template has a thinking switch (see [`ChatTemplate::render`]).
    pub fn has_thinking_switch(&self) -> bool {
        self.template.as_ref().is_some_and(|t| t.thinking_switch)
    }

    pub fn render_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        switches: &ChatSwitches,
    ) -> Result<String, LoadError> {
        let template = self.template.as_ref().ok_or_else(|| {
            LoadError::Template(
                "the model has no chat template (tokenizer_config.json chat_template or chat_template.jinja); use a raw prompt".into(),
            )
        })?;
        let uses_tools = !switches.tools.is_empty()
            || messages
                .iter()
                .any(|m| m.role == "tool" || !m.tool_calls.is_empty());
        if uses_tools && !template.knows_tools && template.source.contains("<|tool|>") {
            // Phi-4-mini reads the definitions from the system message's `tools` field.
            let messages = super::tool_prompt::in_system_field(messages, &switches.tools);
            let switches = ChatSwitches {
                tools: Vec::new(),
                ..switches.clone()
            };
            return template.render(&messages, add_generation_prompt, &switches);
        }
        if uses_tools && !template.knows_tools {
            let messages = super::tool_prompt::without_tool_support(messages, &switches.tools);
            let switches = ChatSwitches {
                tools: Vec::new(),
                ..switches.clone()
            };
            return template.render(&messages, add_generation_prompt, &switches);
        }
        template.render(messages, add_generation_prompt, switches)
    }

    /// The chat template's text, if the model has one.
    pub fn template_source(&self) -> Option<&str> {
        self.template.as_ref().map(|t| t.source.as_str())
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, LoadError> {
        without_panics(Path::new("tokenizer.json"), || {
            self.inner
                .decode(ids, skip_special_tokens)
                .map_err(|e| e.to_string())
        })
    }
}

/// Turns a growing list of token ids into text deltas that are always whole UTF-8 characters:
/// a character split across byte-level tokens is held back until its last byte arrives.
#[derive(Default)]
pub struct StreamDecoder {
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
}

impl StreamDecoder {
    pub fn push(&mut self, tokenizer: &TextTokenizer, id: u32) -> Result<String, LoadError> {
        self.ids.push(id);
        // Decode a window that starts a few tokens back, so tokenizers that strip leading
        // spaces or merge across tokens decode the same as the full sequence would.
        let prefix = tokenizer.decode(&self.ids[self.prefix_offset..self.read_offset], true)?;
        let full = tokenizer.decode(&self.ids[self.prefix_offset..], true)?;
        if full.len() > prefix.len() && !full.ends_with('\u{FFFD}') && full.starts_with(&prefix) {
            let delta = full[prefix.len()..].to_owned();
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            return Ok(delta);
        }
        Ok(String::new())
    }

    /// Whatever is still held back at the end (an incomplete character becomes U+FFFD).
    pub fn finish(&mut self, tokenizer: &TextTokenizer) -> Result<String, LoadError> {
        let prefix = tokenizer.decode(&self.ids[self.prefix_offset..self.read_offset], true)?;
        let full = tokenizer.decode(&self.ids[self.prefix_offset..], true)?;
        self.prefix_offset = self.ids.len();
        self.read_offset = self.ids.len();
        Ok(full
            .strip_prefix(prefix.as_str())
            .map(str::to_owned)
            .unwrap_or_default())
    }
}
