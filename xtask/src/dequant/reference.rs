//! The Python reference: runs `scripts/dequant_ref.py` (gguf-py + numpy) and reads its per-tensor hashes,
//! or has it dump one tensor as raw f32 when a hash differs.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread::JoinHandle;

use anyhow::{anyhow, bail, Context, Result};
use serde::Deserialize;

use crate::{paths, process};

/// One line of `dequant_ref.py hashes`.
#[derive(Debug, Deserialize)]
pub struct RefTensor {
    pub name: String,
    /// gguf-py's type name (`Q4_K`, `F32`, ...).
    #[serde(rename = "type")]
    pub dtype: String,
    pub n_elements: u64,
    /// sha256 of the little-endian f32 values; absent when gguf-py skipped the tensor.
    pub sha256: Option<String>,
    /// Why gguf-py could not dequantize the tensor.
    pub skipped: Option<String>,
}

fn script() -> PathBuf {
    paths::repo_root().join("scripts").join("dequant_ref.py")
}

/// The reference hashes, computed by a child process that runs while the caller does its own work.
pub struct PendingHashes(JoinHandle<Result<Vec<RefTensor>>>);

/// Starts `dequant_ref.py hashes FILE` in the background.
pub fn start_hashes(python: &OsString, gguf: &Path) -> Result<PendingHashes> {
    let mut cmd = Command::new(python);
    cmd.arg(script())
        .arg("hashes")
        .arg(gguf)
        .stdout(Stdio::piped());
    let what = process::describe(&cmd);
    let child = process::spawn(&mut cmd)?;
    Ok(PendingHashes(std::thread::spawn(move || {
        let out = child
            .wait_with_output()
            .with_context(|| format!("waiting for `{what}`"))?;
        if !out.status.success() {
            bail!("`{what}` failed ({}); see its messages above", out.status);
        }
        let text = String::from_utf8(out.stdout)
            .with_context(|| format!("`{what}` printed invalid UTF-8"))?;
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                serde_json::from_str(l).with_context(|| format!("bad line from `{what}`: {l}"))
            })
            .collect()
    })))
}

impl PendingHashes {
    /// Waits for the reference hashes.
    pub fn wait(self) -> Result<Vec<RefTensor>> {
        self.0
            .join()
            .map_err(|_| anyhow!("the thread reading dequant_ref.py's output panicked"))?
    }
}

/// Tensor `name` of `gguf` dequantized by gguf-py (via a temporary raw f32 file).
pub fn dump_tensor(python: &OsString, gguf: &Path, name: &str) -> Result<Vec<f32>> {
    let tmp = std::env::temp_dir().join(format!("xtask-dequant-{}.f32", std::process::id()));
    let result = process::run(
        Command::new(python)
            .arg(script())
            .arg("dump")
            .arg(gguf)
            .arg(name)
            .arg(&tmp),
    )
    .and_then(|()| std::fs::read(&tmp).with_context(|| format!("reading {}", tmp.display())));
    let _ = std::fs::remove_file(&tmp);
    let bytes = result?;
    if bytes.len() % 4 != 0 {
        bail!(
            "the dump of `{name}` is {} bytes, not a whole number of f32",
            bytes.len()
        );
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}
