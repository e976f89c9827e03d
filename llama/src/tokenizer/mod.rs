//! Tokenizers built from GGUF metadata.
