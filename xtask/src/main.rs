//! `cargo xtask`: the project's tasks, written in Rust so they run wherever cargo does.
//!
//! * `models`: fetch the three real GGUF test models into the user's model cache and verify their
//!   hashes (`models/` in the repository is an override).
//! * `demo`: the README's main job: fetch SmolLM2 when it is missing, then run it with tensor
//!   parallelism over two CPU devices.
//! * `ci`: format check, clippy, the builds of every feature set, then the tests.
//! * `openai-python`: the venv with the official openai client that the server's SDK test drives.
//! * `check-dequant`: cross-check ggml-core's dequantization against the `gguf` Python package.
//! * `gguf-synth`: write the random-weight benchmark models (`ggml-tp bench --synthetic`) as GGUF.
//! * `device-pack`, `device-chunks`: pack release binaries, fixtures and model parts for a remote GPU
//!   machine that takes a limited amount of data per call.
//! * `ptxas`: each CUDA kernel's registers, stack and spills, from NVRTC and ptxas, without a GPU.

mod ci;
mod demo;
mod dequant;
mod device;
mod manifest;
mod models;
mod paths;
mod process;
mod ptxas;
mod python;
mod synth;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Project tasks for ggml-tp")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Fetch the real GGUF test models into the user's cache, `$XDG_CACHE_HOME/ggml-tp/models`
    /// (verifying size and sha256); a model in `models/` is used instead when it is there.
    Models {
        /// Fetch only this model (e.g. `smollm2-135m`); all of them if left out.
        #[arg(long, value_name = "KEY")]
        only: Option<String>,
    },
    /// The main job in one command: fetch SmolLM2 into the cache when it is missing, then run it
    /// (`ggml-tp run`, tensor parallelism over two CPU devices; tokens/s on stderr).
    Demo {
        /// The prompt.
        #[arg(short = 'p', long, default_value = "Once upon a time")]
        prompt: String,
        /// Tokens to generate.
        #[arg(short = 'n', long = "n-predict", default_value_t = 64)]
        n_predict: usize,
        /// More options for `ggml-tp run` (after `--`, e.g. `-- --temp 0.7 --seed 1`).
        #[arg(last = true)]
        extra: Vec<String>,
    },
    /// Run the CI steps in order: fmt check, clippy, builds, tests.
    Ci,
    /// Set up the venv with the pinned openai client (in the user's cache) and print its Python,
    /// for the server's SDK test: `GGML_TP_OPENAI_PYTHON=$(cargo xtask openai-python)`.
    OpenaiPython,
    /// Cross-check ggml-core's dequantization of every tensor against gguf-py.
    CheckDequant {
        /// Check only this model (from `models/` or the cache); all three if neither this nor `--file` is given.
        #[arg(long, value_name = "KEY")]
        only: Option<String>,
        /// Check this GGUF file (may be repeated) instead of the fetched models.
        #[arg(long, value_name = "PATH")]
        file: Vec<PathBuf>,
    },
    /// Write synthetic random-weight models (the presets of `ggml-tp bench --synthetic`) as GGUF
    /// files, for measuring other programs on identical models.
    GgufSynth {
        /// Presets (SHAPE-TYPE, e.g. llama3-8b-q4_0); the performance issue's six if left out.
        presets: Vec<String>,
        /// Output folder.
        #[arg(long, default_value = "models/synthetic")]
        out: PathBuf,
    },
    /// Build release binaries, strip them into a folder (git-ignored) with the fixtures they need,
    /// and check the folder against what one call to a remote GPU machine carries.
    DevicePack {
        /// Output folder, relative to the repository root (e.g. `.device-bin/final`).
        #[arg(long)]
        out: PathBuf,
        /// Integration test binaries as PKG:TEST (e.g. `ggml-tp-tests:conformance_cuda`).
        #[arg(long = "test", value_name = "PKG:TEST")]
        tests: Vec<String>,
        /// Examples as PKG:EXAMPLE (e.g. `backend-cuda:gemv_bw`).
        #[arg(long = "example", value_name = "PKG:EXAMPLE")]
        examples: Vec<String>,
        /// Add the `ggml-tp` program.
        #[arg(long)]
        program: bool,
        /// Fixture paths to copy under `fx/` (e.g. `arch`, `reference/smollm2-135m`).
        #[arg(long = "fixtures", value_name = "PATH")]
        fixtures: Vec<String>,
    },
    /// Each CUDA kernel's registers, stack frame and spills, without a GPU: NVRTC and ptxas from
    /// NVIDIA's CUDA wheels (fetched into the user's cache), the program as `ggml-tp` compiles it
    /// (or `GGML_TP_CUDA_PROGRAM`'s file).
    Ptxas {
        /// Target architecture.
        #[arg(long, default_value = "sm_90")]
        arch: String,
        /// Only kernels whose name contains this.
        #[arg(default_value = "")]
        filter: String,
    },
    /// Cut a model file into parts that each fit one call to a remote GPU machine, with a script
    /// that joins them there and checks the sha256.
    DeviceChunks {
        /// The model file (e.g. `models/gemma-3-270m-q4_k_m.gguf`).
        model: PathBuf,
        /// Output folder (one sub-folder per part).
        #[arg(long)]
        out: PathBuf,
        /// Most MiB per part.
        #[arg(long, default_value_t = device::DEFAULT_CHUNK_MIB)]
        chunk_mib: u64,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Models { only } => models::fetch_all(only.as_deref()),
        Command::Demo {
            prompt,
            n_predict,
            extra,
        } => demo::run(&demo::Demo {
            prompt,
            n_predict,
            extra,
        }),
        Command::Ci => ci::run_all(),
        Command::OpenaiPython => {
            python::openai_python().map(|p| println!("{}", p.to_string_lossy()))
        }
        Command::CheckDequant { only, file } => dequant::check(only.as_deref(), &file),
        Command::GgufSynth { presets, out } => synth::write(&presets, &out),
        Command::DevicePack {
            out,
            tests,
            examples,
            program,
            fixtures,
        } => device::pack(&device::Pack {
            tests,
            examples,
            program,
            fixtures,
            out,
        }),
        Command::Ptxas { arch, filter } => ptxas::report(&arch, &filter),
        Command::DeviceChunks {
            model,
            out,
            chunk_mib,
        } => device::chunks(&model, &out, chunk_mib),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
