//! backend-meta's settings, read once from the environment through [`ggml_core::env`]:
//!
//! | variable | meaning |
//! |---|---|
//! | `GGML_TP_META_STATS` | print a meta backend's counters when it drops, with the stage balance of CPU devices and the share of their drivers' time spent idle at stage ends (a switch; default off) |
//! | `GGML_TP_META_DRIVERS` | who issues the devices' work: `each` (a driver thread per device, meeting at every join), `one` (the calling thread issues every device's share of each stage and the joins, where every device's stream queues its work and the communicator is ordered on the streams: GPUs; elsewhere as `each`) or `auto` (`one` where, besides, the communicator keeps programs as recordings, see `GGML_TP_META_RECORD`: one GPU's logical devices; elsewhere `each`); default `auto` |
//! | `GGML_TP_META_RECORD` | where one thread issues the devices' work and the communicator can keep it (one GPU's logical devices), keep each program as a recording once it has run 4 times and replay it (one launch a run) instead of issuing its stages and joins call by call (a switch; default on) |
//! | `GGML_TP_META_GENERIC_REDUCE` | join partial sums by the generic recursive-doubling AllReduce even where the family has a communicator (a switch; default off) |
//!
//! The BF16 transport threshold of the generic AllReduce is the core's
//! `GGML_TP_ALLREDUCE_BF16_MIN_BYTES` ([`ggml_core::settings::CoreSettings`]).

use ggml_core::env;
use std::sync::OnceLock;

/// The meta backend's settings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    /// `GGML_TP_META_STATS`: print the counters of each meta backend when it drops.
    pub stats: bool,
    /// `GGML_TP_META_GENERIC_REDUCE`: the default of [`crate::ReduceOptions::generic`].
    pub generic_reduce: bool,
    /// `GGML_TP_META_DRIVERS`: who issues the devices' work.
    pub drivers: Drivers,
    /// `GGML_TP_META_RECORD`: programs issued from one thread are kept as recordings.
    pub record: bool,
}

impl Settings {
    /// The settings as the environment gives them now.
    pub fn from_env() -> Settings {
        Settings {
            stats: env::flag("GGML_TP_META_STATS", false),
            generic_reduce: env::flag("GGML_TP_META_GENERIC_REDUCE", false),
            drivers: match env::choice("GGML_TP_META_DRIVERS", &["each", "one", "auto"]) {
                Some(0) => Drivers::Each,
                Some(1) => Drivers::One,
                _ => Drivers::Auto,
            },
            record: env::flag("GGML_TP_META_RECORD", true),
        }
    }
}

/// Who issues the devices' work (`GGML_TP_META_DRIVERS`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Drivers {
    /// A driver thread per device.
    Each,
    /// The calling thread, where every stream queues its work and the joins are stream-ordered.
    One,
    /// `One` where the communicator also keeps programs as recordings, else `Each`.
    #[default]
    Auto,
}

/// The settings, read on first use.
pub fn settings() -> &'static Settings {
    static SETTINGS: OnceLock<Settings> = OnceLock::new();
    SETTINGS.get_or_init(Settings::from_env)
}
