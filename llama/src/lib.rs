//! llama: the GGUF model runtime of ggml-tp (tokenizers, architectures, KV cache, sampling) and the
//! `ggml-tp` command-line program.

pub mod chat;
pub mod sampling;
pub mod tokenizer;
