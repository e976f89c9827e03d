//! The error of loading and running models, shared by every layer of the runtime: the weight loader
//! ([`crate::load`]), the architectures ([`crate::arch`]), the model ([`crate::model`]) and the
//! sessions.

use ggml_core::gguf::GgufError;

/// Errors of loading and running models.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(
        "unknown architecture {0:?} (supported: llama, qwen2, qwen3, qwen3moe, gemma3, gpt-oss, gemma4, qwen35, qwen35moe, qwen3next)"
    )]
    UnknownArch(String),
    #[error("metadata key {0:?} is missing")]
    MissingKey(String),
    #[error("metadata key {key:?}: {msg}")]
    BadKey { key: String, msg: String },
    /// A count or size (of a metadata key, a tensor, or given by the caller) outside its
    /// [`crate::load::limits`] bound.
    #[error("{key:?} = {value} is out of range {min}..={max}")]
    OutOfRange {
        key: String,
        value: u128,
        min: usize,
        max: usize,
    },
    /// A tensor the model builds whose size does not fit the address space.
    #[error("too large: {0}")]
    TooLarge(String),
    #[error("tensor {0:?} is missing")]
    MissingTensor(String),
    #[error("tensor {name:?}: {msg}")]
    BadTensor { name: String, msg: String },
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error("bad input: {0}")]
    Input(String),
    #[error("bad placement: {0}")]
    Placement(String),
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Core(#[from] ggml_core::Error),
}
