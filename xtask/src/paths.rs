//! Where things are: the repository root, the git-ignored `models/` folder (an override), the user's
//! model cache that every clone shares, and the shared test fixtures.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Environment variable that points at the fixtures folder (default: `../shared/fixtures` from the repo root).
pub const FIXTURES_ENV: &str = "GGML_TP_FIXTURES";

/// The repository root (the parent of the `xtask` crate).
pub fn repo_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().unwrap_or(manifest_dir).to_path_buf()
}

/// The repository's own models folder (git-ignored): a model file there wins over the cache's.
pub fn models_dir() -> PathBuf {
    repo_root().join("models")
}

/// The user's cache folder shared by every clone on the machine: `$XDG_CACHE_HOME/ggml-tp`, else
/// `~/.cache/ggml-tp`.
pub fn cache_dir() -> Result<PathBuf> {
    ggml_core::env::cache_dir().context(
        "neither XDG_CACHE_HOME nor HOME is set to an absolute path: set one of them for the cache",
    )
}

/// The model cache the real models are fetched into: `models` in [`cache_dir`].
pub fn models_cache_dir() -> Result<PathBuf> {
    Ok(cache_dir()?.join("models"))
}

/// The shared fixtures folder: `$GGML_TP_FIXTURES` if set, else `../shared/fixtures` beside the repo.
pub fn fixtures_dir() -> PathBuf {
    match std::env::var_os(FIXTURES_ENV) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => repo_root().join("..").join("shared").join("fixtures"),
    }
}
