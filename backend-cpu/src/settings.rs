//! backend-cpu's settings, read once from the environment through [`ggml_core::env`]:
//!
//! | variable | meaning |
//! |---|---|
//! | `GGML_TP_SIMD` | the SIMD level of the matmul kernels and of the attention / row-conversion primitives: `scalar`, `avx2`, `avx512` or `neon` (default: the best the CPU has) |
//! | `GGML_TP_CPU_DEVICES` | how many virtual CPU devices share the machine (a positive count; default 1) |
//! | `GGML_TP_THREADS` | threads shared out over those devices (a positive count; default: all cores) |

use ggml_core::env;
use std::sync::OnceLock;

/// The CPU backend's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// `GGML_TP_SIMD`: the requested SIMD level, as given ([`crate::matmul::simd::resolve`] reads it).
    pub simd: Option<String>,
    /// `GGML_TP_CPU_DEVICES`: virtual devices of [`crate::default_devices`].
    pub devices: usize,
    /// `GGML_TP_THREADS`: threads of all those devices together.
    pub threads: usize,
}

impl Settings {
    /// The settings as the environment gives them now.
    pub fn from_env() -> Settings {
        Settings {
            simd: env::text("GGML_TP_SIMD"),
            devices: env::count("GGML_TP_CPU_DEVICES").unwrap_or(1),
            threads: env::count("GGML_TP_THREADS")
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |v| v.get())),
        }
    }
}

/// The settings, read on first use.
pub fn settings() -> &'static Settings {
    static SETTINGS: OnceLock<Settings> = OnceLock::new();
    SETTINGS.get_or_init(Settings::from_env)
}
