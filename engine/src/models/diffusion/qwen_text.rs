//! A Qwen3 decoder as a diffusion pipeline's text encoder (Z-Image, FLUX.2): the prompt put through
//! the tokenizer's chat template as one user message, then the residual stream after a given
//! number of layers at every token. The decoder is the engine's own, so the encoder can be
//! quantized on load like any text model.

use std::path::Path;

use crate::Error;
use crate::gpu::Gpu;
use crate::load::{ChatMessage, ChatSwitches, DecoderSpec, GgmlType, SafeTensors, TextTokenizer};
use crate::models::weights::WeightSource;
use crate::models::{DecoderModel, ModelOptions};
use crate::ops::WeightDType;

/// Prompts are cut to this many tokens (the pipelines' `max_sequence_length`).
pub const MAX_PROMPT_TOKENS: u32 = 512;

pub struct QwenTextEncoder {
    model: DecoderModel,
    tokenizer: TextTokenizer,
    /// The id padded prompts are filled with (the tokenizer config's `pad_token`).
    pad_id: u32,
}

/// The tokenizer config's `pad_token` (a string, or an added token's `content`), else
/// Qwen's `<|endoftext|>`.
fn pad_token(dir: &Path) -> String {
    let config = crate::load::read_json(&dir.join("tokenizer_config.json")).ok();
    let named = config
        .as_ref()
        .and_then(|c| c.get("pad_token"))
        .and_then(|p| {
            p.as_str()
                .or_else(|| p.get("content").and_then(serde_json::Value::as_str))
        });
    named.unwrap_or("<|endoftext|>").to_owned()
}

impl QwenTextEncoder {
    /// Opens `root/text_encoder` (config and weights) with `root/tokenizer`; `random` keeps
    /// the config but gives random weights (benchmarks).
    pub fn open(
        gpu: &Gpu,
        root: &Path,
        dtype: WeightDType,
        quantize: Option<GgmlType>,
        random: bool,
    ) -> Result<Self, Error> {
        let dir = root.join("text_encoder");
        let spec = DecoderSpec::from_file(&dir.join("config.json"))?;
        let tokenizer_dir = root.join("tokenizer");
        let tokenizer = TextTokenizer::from_dir(&tokenizer_dir)?;
        let pad = pad_token(&tokenizer_dir);
        let pad_id = tokenizer.token_to_id(&pad).ok_or_else(|| {
            Error::Invalid(format!(
                "{}: the pad token {pad:?} is not in the vocabulary",
                tokenizer_dir.display()
            ))
        })?;
        let options = ModelOptions {
            dtype,
            context: Some(MAX_PROMPT_TOKENS),
            prefill_chunk: Some(MAX_PROMPT_TOKENS),
            quantize,
            lookahead: false,
            ..ModelOptions::default()
        };
        let model = if random {
            DecoderModel::build(gpu, &spec, WeightSource::Random { seed: 7 }, &options)?
        } else {
            let weights = SafeTensors::open_dir(&dir)?;
            DecoderModel::build(gpu, &spec, WeightSource::Files(&weights), &options)?
        };
        Ok(Self {
            model,
            tokenizer,
            pad_id,
        })
    }

    pub fn hidden(&self) -> u32 {
        self.model.spec().hidden
    }

    pub fn layers(&self) -> u32 {
        self.model.spec().layers
    }

    pub fn weight_bytes(&self) -> u64 {
        self.model.weight_bytes()
    }

    /// The prompt's token ids: rendered as one user message with the generation prompt and
    /// `enable_thinking` as given, then cut to [`MAX_PROMPT_TOKENS`].
    pub fn tokens(&self, prompt: &str, thinking: bool) -> Result<Vec<u32>, Error> {
        let switches = ChatSwitches {
            thinking: Some(thinking),
            ..ChatSwitches::default()
        };
        let mut ids =
            self.tokenizer
                .encode_chat(&[ChatMessage::new("user", prompt)], true, &switches)?;
        ids.truncate(MAX_PROMPT_TOKENS as usize);
        Ok(ids)
    }

    /// `ids` padded with the pad token to [`MAX_PROMPT_TOKENS`] (`padding="max_length"`).
    pub fn padded(&self, ids: &[u32]) -> Vec<u32> {
        let mut out = ids.to_vec();
        out.resize(MAX_PROMPT_TOKENS as usize, self.pad_id);
        out
    }

    /// The hidden states after each of `depths` layers for `ids`, of which the first `real`
    /// are attended to (the rest are padding), `[tokens][depths.len()·hidden]`.
    pub fn hidden_states_at(
        &mut self,
        ids: &[u32],
        real: usize,
        depths: &[usize],
    ) -> Result<Vec<f32>, Error> {
        self.model.hidden_states_at(ids, real, depths)
    }

    /// The hidden states after `depth` layers for `ids`, `[tokens][hidden]`.
    pub fn hidden_states(&mut self, ids: &[u32], depth: u32) -> Result<Vec<f32>, Error> {
        self.model.hidden_states(ids, depth as usize)
    }
}
