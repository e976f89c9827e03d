//! The llama runtime's settings, read once from the environment through [`ggml_core::env`]:
//!
//! | variable | meaning |
//! |---|---|
//! | `GGML_TP_TIMING` | keep the host time of each phase of the forward passes and print it when a session drops (off when unset, empty, `0`, `off` or `false`) |

use std::sync::OnceLock;

/// The settings of the llama runtime.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    /// `GGML_TP_TIMING`: time the phases of every forward pass.
    pub timing: bool,
}

impl Settings {
    /// The settings as the environment gives them now.
    pub fn from_env() -> Settings {
        Settings {
            timing: ggml_core::env::flag("GGML_TP_TIMING", false),
        }
    }
}

/// The settings, read on first use.
pub fn settings() -> &'static Settings {
    static SETTINGS: OnceLock<Settings> = OnceLock::new();
    SETTINGS.get_or_init(Settings::from_env)
}
