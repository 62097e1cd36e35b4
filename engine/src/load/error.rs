use std::path::PathBuf;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum LoadError {
    #[error("{path}: no such file or directory")]
    Missing { path: PathBuf },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: invalid JSON: {message}")]
    Json { path: PathBuf, message: String },
    #[error("{path}: {message}")]
    Config { path: PathBuf, message: String },
    #[error("unsupported model architecture {name:?} (supported: llama, mistral, qwen2, gpt2)")]
    UnsupportedArchitecture { name: String },
    #[error("{path}: corrupt safetensors file: {message}")]
    CorruptWeights { path: PathBuf, message: String },
    #[error("{path}: corrupt GGUF file: {message}")]
    CorruptGguf { path: PathBuf, message: String },
    #[error("tensor {name:?} is missing from the model's weights")]
    MissingTensor { name: String },
    #[error("tensor {name:?} has shape {actual:?}, expected {expected:?}")]
    ShapeMismatch {
        name: String,
        actual: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error("tensor {name:?} has unsupported dtype {dtype} (supported: F32, F16, BF16)")]
    UnsupportedDType { name: String, dtype: String },
    #[error("{path}: tokenizer: {message}")]
    Tokenizer { path: PathBuf, message: String },
    #[error("chat template: {0}")]
    Template(String),
}

impl LoadError {
    pub(crate) fn io(path: &std::path::Path, source: std::io::Error) -> Self {
        if source.kind() == std::io::ErrorKind::NotFound {
            Self::Missing {
                path: path.to_owned(),
            }
        } else {
            Self::Io {
                path: path.to_owned(),
                source,
            }
        }
    }
}

/// Reads and parses a JSON file with errors that name it.
pub(crate) fn read_json(path: &std::path::Path) -> Result<serde_json::Value, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|e| LoadError::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| LoadError::Json {
        path: path.to_owned(),
        message: e.to_string(),
    })
}
