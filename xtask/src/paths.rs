//! Where things are: the repository root, the git-ignored `models/` folder and the shared test fixtures.

use std::path::{Path, PathBuf};

/// Environment variable that points at the fixtures folder (default: `../shared/fixtures` from the repo root).
pub const FIXTURES_ENV: &str = "GGML_TP_FIXTURES";

/// The repository root (the parent of the `xtask` crate).
pub fn repo_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().unwrap_or(manifest_dir).to_path_buf()
}

/// The folder the real GGUF models are fetched into (git-ignored).
pub fn models_dir() -> PathBuf {
    repo_root().join("models")
}

/// The shared fixtures folder: `$GGML_TP_FIXTURES` if set, else `../shared/fixtures` beside the repo.
pub fn fixtures_dir() -> PathBuf {
    match std::env::var_os(FIXTURES_ENV) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => repo_root().join("..").join("shared").join("fixtures"),
    }
}
