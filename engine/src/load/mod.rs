//! Reading models from disk: HF `config.json`, safetensors weights (single or sharded, mmap'd),
//! the tokenizer, chat templates and generation defaults.

pub(crate) mod bpe_files;
mod config;
mod error;
mod gguf;
mod gguf_model;
mod gguf_moe;
mod gguf_tokenizer;
mod moe;
mod python_json;
pub mod quant;
mod qwen35;
mod rope;
mod safetensors;
mod template;
mod tokenizer;
mod tool_prompt;

pub use config::{Arch, DecoderSpec, LinearLayers, MlpKind, SlidingWindow};
pub use error::LoadError;
pub(crate) use error::read_json;
pub use gguf::{GgmlType, GgufFile, GgufTensor, GgufValue, write_gguf};
pub use gguf_model::{gguf_spec, gguf_tensor_name, unpermuted_row};
pub use gguf_tokenizer::gguf_tokenizer;
pub use moe::{ExpertActivation, MAX_EXPERTS, MAX_TOP_K, MoeSpec, RouterWeights};
pub use rope::{RopeScaling, RopeSpec};
pub use safetensors::{DType, SafeTensors, TensorView};
pub use template::{
    ChatMessage, ChatSwitches, ChatTemplate, FunctionCall, ReasoningEffort, ToolCall,
};
pub(crate) use tokenizer::without_panics;
pub use tokenizer::{GenerationConfig, StreamDecoder, TextTokenizer};
