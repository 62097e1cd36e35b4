//! Model families and the text model that ties a decoder to its tokenizer. Llama (Llama 2/3.x,
//! SmolLM2, TinyLlama, Mistral), Qwen2/Qwen2.5, Qwen3, Phi-3 and GPT-2 share one GPU decoder;
//! their differences (weight names, norms, biases, positions, MLP) are resolved while loading.

mod answer;
mod decoder;
pub mod diffusion;
mod expert_uploads;
pub mod harmony;
mod host_tensor;
pub mod reasoning;
pub mod speculate;
mod text;
pub mod tool_calls;
mod weight_rows;
mod weights;
pub mod whisper;

pub use answer::{Answer, AnswerStep, Piece, PromptProgress};
pub use decoder::{
    BatchRow, DecoderModel, MIN_SHARED_TOKENS, ModelOptions, UNREPORTED_MEMORY_SLOTS,
};
pub use text::{GenerateParams, GenerationStats, ModelInfo, Prompt, StopReason, TextModel};
pub use weights::WeightSource;
