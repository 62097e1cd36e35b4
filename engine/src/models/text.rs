use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::decoder::{DecoderModel, ModelOptions};
use super::harmony::HarmonyTokens;
use super::speculate::{DraftStats, Speculator};
use super::tool_calls::ToolFormat;
use super::weights::WeightSource;
use crate::Error;
use crate::gpu::Gpu;
use crate::grammar::{
    Constraint, GrammarVocab, Guide, PendingVocab, Preamble, ToolDemand, forced_call_lark,
};
use crate::load::{
    ChatMessage, ChatSwitches, DecoderSpec, GenerationConfig, GgufFile, LoadError, ReasoningEffort,
    SafeTensors, TextTokenizer, gguf_spec, gguf_tokenizer,
};

/// The GGUF file `path` names: the path itself, or the one `.gguf` in a folder without
/// `config.json`.
fn gguf_path(path: &Path) -> Result<Option<std::path::PathBuf>, Error> {
    let is_gguf = |p: &Path| {
        p.extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    };
    if path.is_file() {
        return Ok(is_gguf(path).then(|| path.to_owned()));
    }
    if !path.is_dir() || path.join("config.json").exists() {
        return Ok(None);
    }
    let mut found: Vec<_> = std::fs::read_dir(path)
        .map_err(|e| LoadError::io(path, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && is_gguf(p))
        .collect();
    found.sort();
    match found.len() {
        0 => Ok(None),
        1 => Ok(found.pop()),
        _ => Err(Error::Invalid(format!(
            "{} holds several .gguf files ({}); pass the one to load",
            path.display(),
            found
                .iter()
                .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}
use crate::ops::SamplerParams;

/// What to generate from.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Prompt {
    /// Text fed as-is (special tokens written in it are recognised; BOS is added if the
    /// tokenizer's post-processor adds one).
    Raw(String),
    /// Messages put through the model's chat template, with the assistant turn opened.
    Chat(Vec<ChatMessage>),
    Tokens(Vec<u32>),
}

#[derive(Clone, Debug)]
pub struct GenerateParams {
    pub max_tokens: u32,
    pub sampler: SamplerParams,
    /// The chat template's `enable_thinking` (None: the template's default).
    pub thinking: Option<bool>,
    /// The chat template's `reasoning_effort` (None: the template's default).
    pub reasoning_effort: Option<ReasoningEffort>,
    /// A grammar the answer must follow (after any reasoning); None: free text.
    pub constraint: Option<Constraint>,
    /// Tool definitions in OpenAI's shape (`{"type": "function", "function": {...}}`), handed
    /// to the chat template.
    pub tools: Vec<serde_json::Value>,
}

impl Default for GenerateParams {
    fn default() -> Self {
        Self {
            max_tokens: 256,
            sampler: SamplerParams::default(),
            thinking: None,
            reasoning_effort: None,
            constraint: None,
            tools: Vec::new(),
        }
    }
}

impl GenerateParams {
    /// The chat template's switches these parameters set.
    pub fn switches(&self) -> ChatSwitches {
        ChatSwitches {
            thinking: self.thinking,
            reasoning_effort: self.reasoning_effort,
            tools: self.tools.clone(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StopReason {
    EndOfText,
    MaxTokens,
    ContextFull,
    Cancelled,
}

#[derive(Clone, Debug)]
pub struct GenerationStats {
    pub prompt_tokens: Vec<u32>,
    /// Generated ids, including the end-of-text token when one ended the answer.
    pub tokens: Vec<u32>,
    pub text: String,
    pub ttft: Duration,
    /// The model's time over the prompt, up to the first token: the time to first token less
    /// tokenizing (what llama.cpp's server reports as prompt processing).
    pub prompt_time: Duration,
    /// Decode speed after the first token.
    pub tokens_per_s: f64,
    pub stop: StopReason,
    /// Prompt tokens taken from the cache of the previous prompt instead of run again.
    pub cached_tokens: usize,
    /// Speculative decoding's drafts over the answer (zero without speculation).
    pub drafts: DraftStats,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ModelInfo {
    pub name: String,
    pub architecture: String,
    pub parameters: u64,
    /// Parameters one token reads (fewer than `parameters` for mixture-of-experts models).
    #[serde(default)]
    pub active_parameters: u64,
    pub weight_bytes: u64,
    /// KV cache and recurrent states.
    pub cache_bytes: u64,
    /// The recurrent states' part of `cache_bytes` (Gated DeltaNet layers): the same at any
    /// context length.
    #[serde(default)]
    pub state_bytes: u64,
    pub context: u32,
    pub dtype: String,
    pub dispatches_per_token: u32,
    pub has_chat_template: bool,
    /// The chat template can turn a reasoning model's thinking off.
    pub thinking_switch: bool,
    /// How the model writes tool calls (from its chat template).
    #[serde(default = "default_tool_format")]
    pub tool_format: ToolFormat,
    /// Answers decoded together (cache slots), each with `context` positions.
    #[serde(default = "one_slot")]
    pub slots: u32,
}

fn one_slot() -> u32 {
    1
}

fn default_tool_format() -> ToolFormat {
    ToolFormat::Hermes
}

/// A decoder on the GPU with its tokenizer: text in, token ids and text deltas out.
pub struct TextModel {
    pub model: DecoderModel,
    pub tokenizer: TextTokenizer,
    pub generation: GenerationConfig,
    pub(super) eos_ids: Vec<u32>,
    name: String,
    /// The vocabulary as grammars see it, built on its own thread from load on.
    grammar_vocab: PendingVocab,
    tool_format: ToolFormat,
    /// Special tokens kept in a chat answer's text, because they mark tool calls.
    pub(super) kept_specials: std::collections::HashMap<u32, String>,
    /// Drafts and verifies when speculative decoding is on.
    speculator: Option<Speculator>,
}

/// An answer being decoded speculatively.
struct Speculating {
    /// The prompt and the tokens returned so far.
    context: Vec<u32>,
    /// Tokens a verification gave beyond the first, handed out one by one.
    ready: std::collections::VecDeque<u32>,
    drafts: DraftStats,
}

/// What a model's files give besides its weights.
struct Parts {
    tokenizer: TextTokenizer,
    generation: GenerationConfig,
    eos_ids: Vec<u32>,
    grammar_vocab: PendingVocab,
}

impl Parts {
    /// The files' parts, with the grammar vocabulary's thread started.
    fn new(spec: &DecoderSpec, tokenizer: TextTokenizer, generation: GenerationConfig) -> Self {
        let eos_ids = eos_ids(spec, &generation, &tokenizer);
        let grammar_vocab = PendingVocab::spawn(&tokenizer, spec.vocab, &eos_ids);
        Self {
            tokenizer,
            generation,
            eos_ids,
            grammar_vocab,
        }
    }
}

/// The tokens that end an answer: the generation config's (transformers stops on those),
/// else the model's, else the tokenizer's; and a harmony answer's `<|return|>` and `<|call|>`
/// whatever else the files name (a GGUF file names one end-of-text token).
fn eos_ids(
    spec: &DecoderSpec,
    generation: &GenerationConfig,
    tokenizer: &TextTokenizer,
) -> Vec<u32> {
    let mut eos_ids = generation.eos_token_ids.clone();
    if eos_ids.is_empty() {
        eos_ids = spec.eos_token_ids.clone();
    }
    if eos_ids.is_empty() {
        eos_ids.extend(tokenizer.eos_token_id());
    }
    if let Some(harmony) = HarmonyTokens::of(tokenizer) {
        for id in harmony.stops() {
            if !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        }
    }
    eos_ids
}

/// Text the tokenizer encodes once at load (see `TextModel::assemble`).
const TOKENIZER_WARM_UP: &str = "Warming up: the quick brown fox jumps over the lazy dog, \
    1234567890 times (ÉTÉ, naïve, 東京).";

impl TextModel {
    /// Loads an HF model folder (`config.json`, safetensors, `tokenizer.json`, …) or a GGUF
    /// file, and the draft model `opts.speculate` names, if any.
    pub fn load(gpu: &Gpu, path: &Path, opts: &ModelOptions) -> Result<Self, Error> {
        let mut text = Self::load_alone(gpu, path, opts)?;
        if let Some(how) = &opts.speculate {
            text.speculator = Some(Speculator::new(gpu, &text, how, opts)?);
        }
        Ok(text)
    }

    fn load_alone(gpu: &Gpu, path: &Path, opts: &ModelOptions) -> Result<Self, Error> {
        if !path.exists() {
            return Err(LoadError::Missing {
                path: path.to_owned(),
            }
            .into());
        }
        if let Some(gguf) = gguf_path(path)? {
            return Self::load_gguf(gpu, &gguf, opts);
        }
        if !path.is_dir() {
            return Err(Error::Invalid(format!(
                "{}: expected a model folder (config.json, *.safetensors, and tokenizer.json or vocab.json + merges.txt) or a .gguf file",
                path.display()
            )));
        }
        let spec = DecoderSpec::from_file(&path.join("config.json"))?;
        let tokenizer = TextTokenizer::from_dir(path)?;
        let parts = Parts::new(&spec, tokenizer, GenerationConfig::from_dir(path)?);
        let weights = SafeTensors::open_dir(path)?;
        let model = DecoderModel::build(gpu, &spec, WeightSource::Files(&weights), opts)?;
        Ok(Self::assemble(path, model, parts))
    }

    /// Loads a GGUF file: metadata, tokenizer and chat template from the file itself.
    fn load_gguf(gpu: &Gpu, path: &Path, opts: &ModelOptions) -> Result<Self, Error> {
        let file = GgufFile::open(path)?;
        let spec = gguf_spec(&file)?;
        let parts = Parts::new(&spec, gguf_tokenizer(&file)?, GenerationConfig::default());
        let model = DecoderModel::build(gpu, &spec, WeightSource::Gguf(&file, &spec), opts)?;
        Ok(Self::assemble(path, model, parts))
    }

    fn assemble(path: &Path, model: DecoderModel, parts: Parts) -> Self {
        let Parts {
            tokenizer,
            generation,
            eos_ids,
            grammar_vocab,
        } = parts;
        // A tokenizer's first encode also sets up its caches (about 0.25 ms of a 500-token
        // prompt with SmolLM2's): done here, it stays out of the first answer's wait.
        let _ = tokenizer.encode(TOKENIZER_WARM_UP, false);
        let tool_format = if HarmonyTokens::of(&tokenizer).is_some() {
            // The harmony stream writes calls as `<tool_call>` JSON.
            ToolFormat::Hermes
        } else {
            ToolFormat::detect(tokenizer.template_source())
        };
        let kept_specials = tool_format
            .special_markers()
            .iter()
            .filter_map(|m| Some((tokenizer.token_to_id(m)?, (*m).to_owned())))
            .collect();
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        Self {
            model,
            tokenizer,
            generation,
            eos_ids,
            name,
            grammar_vocab,
            tool_format,
            kept_specials,
            speculator: None,
        }
    }

    pub fn info(&self) -> ModelInfo {
        let spec = self.model.spec();
        ModelInfo {
            name: self.name.clone(),
            architecture: format!("{:?}", spec.arch),
            parameters: spec.parameters(),
            active_parameters: spec.active_parameters(),
            weight_bytes: self.model.weight_bytes(),
            cache_bytes: self.model.cache_bytes(),
            state_bytes: self.model.state_bytes(),
            context: self.model.capacity(),
            dtype: format!("{:?}", self.model.dtype()).to_lowercase(),
            dispatches_per_token: self.model.dispatches_per_token(),
            has_chat_template: self.tokenizer.has_chat_template(),
            thinking_switch: self.tokenizer.has_thinking_switch(),
            tool_format: self.tool_format,
            slots: self.model.slots(),
        }
    }

    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    pub fn tokenize(&self, prompt: &Prompt) -> Result<Vec<u32>, Error> {
        self.tokenize_with(prompt, &ChatSwitches::default())
    }

    /// As [`TextModel::tokenize`], with the chat template's switches set.
    pub fn tokenize_with(
        &self,
        prompt: &Prompt,
        switches: &ChatSwitches,
    ) -> Result<Vec<u32>, Error> {
        Ok(match prompt {
            Prompt::Raw(text) => self.tokenizer.encode(text, true)?,
            Prompt::Chat(messages) => self.tokenizer.encode_chat(messages, true, switches)?,
            Prompt::Tokens(ids) => ids.clone(),
        })
    }

    /// Generates until an end-of-text token, `max_tokens`, a full context, or `cancelled`
    /// saying so (asked before every token). `on_token` gets each id with its text delta, which
    /// is always whole UTF-8 characters. A chat answer in GPT-OSS's harmony format arrives with
    /// its reasoning between `<think>` and `</think>` (see [`super::harmony`]).
    pub fn generate(
        &mut self,
        prompt: &Prompt,
        params: &GenerateParams,
        cancelled: &dyn Fn() -> bool,
        mut on_token: impl FnMut(u32, &str),
    ) -> Result<GenerationStats, Error> {
        let mut answer = self.prepare(prompt, params)?;
        if params.max_tokens == 0 {
            return Ok(answer.finish());
        }
        if cancelled() {
            answer.stats.stop = StopReason::Cancelled;
            return Ok(answer.finish());
        }
        let mut token = self.prefill_answer(&mut answer, params)?;
        // Speculation drafts free text only: a grammar's mask needs each token in turn.
        let mut speculating = match &mut self.speculator {
            Some(s) if answer.guide.is_none() => {
                s.start(&params.sampler);
                Some(Speculating {
                    context: answer.stats.prompt_tokens.clone(),
                    ready: Default::default(),
                    drafts: DraftStats::default(),
                })
            }
            _ => None,
        };
        loop {
            if let Some(s) = &mut speculating {
                s.context.push(token);
            }
            let piece = self.take_token(&mut answer, token, cancelled())?;
            on_token(token, &piece.delta);
            if piece.stop.is_some() {
                break;
            }
            token = self.next_token(
                token,
                &mut answer.guide,
                speculating.as_mut(),
                params,
                answer.stats.tokens.len(),
            )?;
        }
        if let Some(s) = speculating {
            answer.stats.drafts = s.drafts;
        }
        Ok(answer.finish())
    }

    /// The token after `fed`, the last one returned: a grammar's masked step (the grammar takes
    /// `fed` and gives the next mask while the GPU runs the step's forward pass), the next of
    /// a verification's tokens, a speculative round, or a plain step.
    fn next_token(
        &mut self,
        fed: u32,
        guide: &mut Option<Guide>,
        speculating: Option<&mut Speculating>,
        params: &GenerateParams,
        returned: usize,
    ) -> Result<u32, Error> {
        if let Some(g) = guide {
            return self.model.decode_masked(|| {
                g.accept(fed)?;
                Ok(g.mask()?)
            });
        }
        let (Some(s), Some(speculator)) = (speculating, &mut self.speculator) else {
            return self.model.decode();
        };
        if let Some(next) = s.ready.pop_front() {
            return Ok(next);
        }
        let limit = params.max_tokens as usize - returned;
        let mut more = speculator.step(
            &mut self.model,
            &s.context,
            &params.sampler,
            limit,
            &mut s.drafts,
        )?;
        let first = more.remove(0);
        s.ready.extend(more);
        Ok(first)
    }

    /// The grammar state of a constrained answer, if `params` asks for one.
    pub(super) fn start_guide(
        &mut self,
        prompt: &Prompt,
        params: &GenerateParams,
        prompt_tokens: &[u32],
        harmony: bool,
    ) -> Result<Option<Guide>, Error> {
        let (constraint, preamble) = match &params.constraint {
            None => return Ok(None),
            Some(Constraint::ToolCall { function, parallel }) => {
                let demand = ToolDemand {
                    tools: &params.tools,
                    function: function.as_deref(),
                    parallel: *parallel,
                };
                let special = |t: &str| self.tokenizer.special_token_id(t);
                let lark = forced_call_lark(self.tool_format, harmony, &demand, &special)?;
                // Harmony's call grammar opens its own channel; others may think first.
                let preamble = if harmony {
                    Preamble::None
                } else {
                    self.preamble(prompt, prompt_tokens, false)
                };
                (Constraint::Lark(lark), preamble)
            }
            Some(c) => (c.clone(), self.preamble(prompt, prompt_tokens, harmony)),
        };
        Ok(Some(Guide::new(
            self.grammar_vocab()?,
            &constraint,
            preamble,
        )?))
    }

    /// The grammar view of the vocabulary (waiting for its thread the first time).
    fn grammar_vocab(&mut self) -> Result<&GrammarVocab, Error> {
        Ok(self.grammar_vocab.get()?)
    }

    /// What may precede a constrained answer: GPT-OSS's analysis channel, or the thinking of
    /// a model whose template has it (already opened when the prompt ends in `<think>`).
    fn preamble(&self, prompt: &Prompt, prompt_tokens: &[u32], harmony: bool) -> Preamble {
        if !matches!(prompt, Prompt::Chat(_)) {
            return Preamble::None;
        }
        if harmony {
            Preamble::Harmony
        } else if self.tokenizer.opens_reasoning(prompt_tokens) {
            Preamble::Reasoning { opened: true }
        } else if self.tokenizer.has_thinking_switch() {
            Preamble::Reasoning { opened: false }
        } else {
            Preamble::None
        }
    }
}
