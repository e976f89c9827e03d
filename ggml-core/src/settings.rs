//! ggml-core's settings, read once from the environment through [`crate::env`]:
//!
//! | variable | meaning |
//! |---|---|
//! | `GGML_TP_PLUGIN_DIR` | where backend plugins are looked for (default: the executable's folder) |
//! | `GGML_TP_ALLREDUCE_BF16_MIN_BYTES` | partial sums of at least this many bytes cross devices as BF16, on every reduce path (a byte count, or `off`; default: each path's own) |

use std::path::PathBuf;
use std::sync::OnceLock;

/// The settings every crate shares.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CoreSettings {
    /// `GGML_TP_PLUGIN_DIR`.
    pub plugin_dir: Option<PathBuf>,
    /// `GGML_TP_ALLREDUCE_BF16_MIN_BYTES` ([`usize::MAX`] for `off`); none: the reduce path decides.
    pub allreduce_bf16_min_bytes: Option<usize>,
}

impl CoreSettings {
    /// The settings as the environment gives them now.
    pub fn from_env() -> CoreSettings {
        CoreSettings {
            plugin_dir: crate::env::path("GGML_TP_PLUGIN_DIR"),
            allreduce_bf16_min_bytes: crate::env::bytes("GGML_TP_ALLREDUCE_BF16_MIN_BYTES"),
        }
    }
}

/// The settings, read on first use.
pub fn settings() -> &'static CoreSettings {
    static SETTINGS: OnceLock<CoreSettings> = OnceLock::new();
    SETTINGS.get_or_init(CoreSettings::from_env)
}
