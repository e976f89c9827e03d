//! llama: the GGUF model runtime of ggml-tp (tokenizers, architectures, KV cache, sampling) and the
//! `ggml-tp` command-line program.

pub mod arch;
pub mod chat;
pub mod cli;
mod error;
pub mod generate;
pub mod kv;
pub mod load;
pub mod model;
mod pass;
pub mod runtime;
pub mod sampling;
pub mod server;
pub mod state;
pub mod tokenizer;

pub use arch::shared::config::ModelConfig;
pub use arch::Arch;
pub use model::{Model, ModelError, Placement};
pub use pass::PassStats;
pub use runtime::{BatchSession, Logits, Outputs, SeqTokens, Session, SessionOptions};
