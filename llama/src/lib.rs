//! llama: the GGUF model runtime of ggml-tp (tokenizers, architectures, KV cache, sampling, chat
//! templates, generation, slot files). The `ggml-tp` program and its HTTP server are the `ggml-tp`
//! crate; this library needs no async runtime, command-line parser or progress bar.

pub mod arch;
pub mod chat;
pub mod constraint;
mod error;
pub mod generate;
pub mod kv;
pub mod load;
pub mod model;
mod pass;
pub mod runtime;
pub mod sampling;
pub mod settings;
pub mod slot_file;
pub mod state;
pub mod tokenizer;
pub mod tool_calls;

pub use arch::shared::config::ModelConfig;
pub use arch::Arch;
pub use model::{Model, ModelError, Placement};
pub use pass::PassStats;
pub use runtime::{BatchSession, Logits, Outputs, SeqTokens, Session, SessionOptions};
