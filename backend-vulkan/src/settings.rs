//! backend-vulkan's settings, read once from the environment through [`ggml_core::env`]:
//!
//! | variable | meaning |
//! |---|---|
//! | `GGML_TP_VULKAN_BASE` | use the base shaders (32-bit words, shared memory only) on every device (a switch; default off: 16-bit storage and subgroups where the device has them) |
//! | `GGML_TP_VULKAN_DEVICES` | open each physical device this many times, for tests of several devices on one GPU (a positive count; default 1) |

use crate::instance::Variant;
use ggml_core::env;
use std::sync::OnceLock;

/// The Vulkan backend's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// `GGML_TP_VULKAN_BASE`: [`Variant::Base`] when on, else [`Variant::Auto`].
    pub variant: Variant,
    /// `GGML_TP_VULKAN_DEVICES`: logical devices opened per physical device by the registry.
    pub copies: usize,
}

impl Settings {
    /// The settings as the environment gives them now.
    pub fn from_env() -> Settings {
        Settings {
            variant: if env::flag("GGML_TP_VULKAN_BASE", false) {
                Variant::Base
            } else {
                Variant::Auto
            },
            copies: env::count("GGML_TP_VULKAN_DEVICES").unwrap_or(1),
        }
    }
}

/// The settings, read on first use.
pub fn settings() -> &'static Settings {
    static SETTINGS: OnceLock<Settings> = OnceLock::new();
    SETTINGS.get_or_init(Settings::from_env)
}
