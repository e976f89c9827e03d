//! `cargo xtask gguf-synth PRESET...`: writes the random-weight models that `ggml-tp bench
//! --synthetic` measures as GGUF files (through `ggml-tp synth`, built in release), so that other
//! programs — llama.cpp's `llama-bench` among them — run on byte-identical models.

use crate::paths::repo_root;
use crate::process;
use anyhow::{Context, Result};
use std::path::Path;
use std::process::Command;

/// The presets written when none is named: the performance issue's models.
const DEFAULT_PRESETS: &[&str] = &[
    "llama3-8b-f16",
    "llama3-8b-bf16",
    "llama3-8b-q8_0",
    "llama3-8b-q4_0",
    "qwen3-30b-a3b-q4_0",
    "gpt-oss-20b-mxfp4",
];

pub fn write(presets: &[String], out_dir: &Path) -> Result<()> {
    let root = repo_root();
    // A relative folder is taken from the repository root, wherever cargo was started.
    let out_dir = root.join(out_dir);
    let presets: Vec<String> = if presets.is_empty() {
        DEFAULT_PRESETS.iter().map(|p| p.to_string()).collect()
    } else {
        presets.to_vec()
    };
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let exe = crate::device::build_program()?;
    for p in &presets {
        let file = out_dir.join(format!("{p}.gguf"));
        process::run(Command::new(&exe).args(["synth", p, "-o"]).arg(&file))?;
    }
    Ok(())
}
