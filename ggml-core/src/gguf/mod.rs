//! GGUF v2/v3 reader and writer.

/// Errors of GGUF parsing and writing.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("invalid GGUF: {0}")]
    Invalid(String),
}
