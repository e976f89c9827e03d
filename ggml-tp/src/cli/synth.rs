//! `ggml-tp synth PRESET -o FILE`: writes a random-weight model with published shapes
//! ([`llama::model::synthetic`]) as a GGUF file, the same bytes `bench --synthetic PRESET` measures,
//! so that other programs can be measured on an identical model.

use super::load::SYNTHETIC_SEED;
use super::{CliError, CliResult};
use llama::model::synthetic::Preset;
use std::io::Write;
use std::path::PathBuf;

/// Options of `synth`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The preset, SHAPE-TYPE, e.g. llama3-8b-q4_0 or qwen3.5-27b-q8_0 (an unknown one lists all).
    pub preset: String,
    /// Output GGUF file.
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
    /// Seed of the weights (default: the one `bench --synthetic` uses).
    #[arg(long, default_value_t = SYNTHETIC_SEED)]
    pub seed: u64,
}

pub fn run(args: &Args) -> CliResult {
    let preset = Preset::parse(&args.preset)?;
    let file = preset.build(args.seed)?;
    let ctx = |e: std::io::Error| CliError::from(e).context(args.output.display());
    let mut out = std::fs::File::create(&args.output).map_err(ctx)?;
    out.write_all(file.as_bytes()).map_err(ctx)?;
    out.sync_all().map_err(ctx)?;
    eprintln!(
        "wrote {} ({:.1} MiB) to {}",
        preset.name(),
        file.as_bytes().len() as f64 / (1 << 20) as f64,
        args.output.display()
    );
    Ok(())
}
