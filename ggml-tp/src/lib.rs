//! ggml-tp, the program over the [`llama`] runtime: the command-line tools ([`cli`], one module per
//! subcommand) and the OpenAI-compatible HTTP server ([`server`]). The binary (`src/main.rs`) only
//! runs [`cli::main`].
//!
//! Features `cuda`, `hip` and `vulkan` (all default) link those backend families into the program;
//! a family left out can still be loaded as a plugin at run time (`ggml_core::registry`).

pub mod cli;
pub mod server;
