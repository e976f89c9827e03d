//! The `ggml-tp` command-line program: one module per subcommand, each with its clap `Args` and a
//! `run` function, plus the options shared by every command that loads a model ([`load`]).
//!
//! To add a subcommand: write `cli/<name>.rs` with `pub struct Args` (deriving `clap::Args`) and
//! `pub fn run(args: &Args) -> CliResult`, then add a variant to [`Command`] and a line to
//! [`Command::run`].

pub mod bench;
pub mod chat;
pub mod devices;
pub mod load;
pub mod logits;
pub mod perplexity;
pub mod run;
pub mod serve;
pub mod synth;

// Links the GPU families of the enabled features into the registry (registered through `inventory`).
#[cfg(feature = "cuda")]
use backend_cuda as _;
#[cfg(feature = "hip")]
use backend_hip as _;
#[cfg(feature = "vulkan")]
use backend_vulkan as _;
use clap::{Parser, Subcommand};
use std::fmt;

/// An error of a command: one line for the user.
#[derive(Debug)]
pub struct CliError(String);

impl CliError {
    pub fn new(msg: impl Into<String>) -> CliError {
        CliError(msg.into())
    }

    /// The same error with `context: ` in front.
    pub fn context(self, context: impl fmt::Display) -> CliError {
        CliError(format!("{context}: {}", self.0))
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // One line, whatever the underlying error wrote.
        let one_line: Vec<&str> = self.0.lines().map(str::trim).collect();
        f.write_str(&one_line.join("; "))
    }
}

impl<E: std::error::Error> From<E> for CliError {
    fn from(e: E) -> CliError {
        CliError(e.to_string())
    }
}

/// The result of a command.
pub type CliResult<T = ()> = Result<T, CliError>;

/// Runs GGUF language models on one device, with layers spread over several devices, or with
/// tensor parallelism.
#[derive(Parser, Debug)]
#[command(name = "ggml-tp", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// List every backend family and its devices.
    Devices(devices::Args),
    /// Generate text from a prompt, streaming it to stdout.
    Run(run::Args),
    /// Chat over stdin with the model's chat template.
    Chat(chat::Args),
    /// Write the logits of a prompt's every position.
    Logits(logits::Args),
    /// Perplexity over a text file; KL divergence against saved logits.
    Perplexity(perplexity::Args),
    /// Prompt processing and generation speed, as a table.
    Bench(bench::Args),
    /// OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, /v1/models, ...).
    Serve(serve::Args),
    /// Write a random-weight model with published shapes as a GGUF file.
    Synth(synth::Args),
}

impl Command {
    pub fn run(&self) -> CliResult {
        match self {
            Command::Devices(a) => devices::run(a),
            Command::Run(a) => run::run(a),
            Command::Chat(a) => chat::run(a),
            Command::Logits(a) => logits::run(a),
            Command::Perplexity(a) => perplexity::run(a),
            Command::Bench(a) => bench::run(a),
            Command::Serve(a) => serve::run(a),
            Command::Synth(a) => synth::run(a),
        }
    }
}

/// Parses the command line and runs it; the process exit code.
pub fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command.run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
