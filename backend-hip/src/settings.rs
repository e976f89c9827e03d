//! backend-hip's settings, read once from the environment through [`ggml_core::env`]:
//!
//! | variable | meaning |
//! |---|---|
//! | `ROCM_PATH` | the ROCm installation whose `lib` folder is searched first for the ROCm libraries (then `/opt/rocm/lib`, then the loader's path) |

use std::path::PathBuf;
use std::sync::OnceLock;

/// The HIP backend's settings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    /// `ROCM_PATH`.
    pub rocm_path: Option<PathBuf>,
}

impl Settings {
    /// The settings as the environment gives them now.
    pub fn from_env() -> Settings {
        Settings {
            rocm_path: ggml_core::env::path("ROCM_PATH"),
        }
    }
}

/// The settings, read on first use.
pub fn settings() -> &'static Settings {
    static SETTINGS: OnceLock<Settings> = OnceLock::new();
    SETTINGS.get_or_init(Settings::from_env)
}
