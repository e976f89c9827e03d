//! backend-cuda's settings, read once from the environment through [`ggml_core::env`] (the BF16
//! transport threshold of the reduce paths, `GGML_TP_ALLREDUCE_BF16_MIN_BYTES`, is ggml-core's, see
//! [`ggml_core::settings`]):
//!
//! | variable | meaning |
//! |---|---|
//! | `GGML_TP_CUDA_GRAPHS` | capture and replay repeated subgraphs as CUDA graphs (default on) |
//! | `GGML_TP_CUDA_PROFILE` | print the GPU time per kind of node when a backend is dropped (default off) |
//! | `GGML_TP_CUDA_STATS` | print the graph cache's counters, the host time of `compute` and the GPU span of each call (timing events around it) when a backend is dropped (default off) |
//! | `GGML_TP_CUDA_TRACE` | with the counters of `GGML_TP_CUDA_STATS`, print each stream's last N calls as a timeline (host queueing and GPU span, microseconds from one origin per GPU; default 0: none) |
//! | `GGML_TP_ONESHOT_MAX_BYTES` | largest AllReduce message (bytes on the wire) the one-shot peer-to-peer kernel takes (a byte count, or `off`: never; default 2 MiB) |
//! | `GGML_TP_CUDA_LOGICAL` | present every GPU as this many logical devices (own streams, memory held to an equal share of the card, copies and AllReduce within the card; default 1) |
//! | `GGML_TP_CUDA_PDL` | kernels launched as programmatic dependents of the one before them on compute capability 9.0 and later: a kernel's blocks start while the previous kernel's last blocks run, and wait for its results at their first instruction (default on) |
//! | `GGML_TP_NCCL_LIB` | the NCCL library tried first (default: `libnccl.so`, then `libnccl.so.2`) |
//! | `GGML_TP_CUDA_PROGRAM` | a file whose text NVRTC compiles instead of the built-in kernel program (for kernel experiments on a GPU machine without a Rust toolchain; it must define every kernel; default: none) |

use std::path::PathBuf;
use std::sync::OnceLock;

/// The CUDA backend's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// `GGML_TP_CUDA_GRAPHS`: streams start with CUDA graph capture on.
    pub graphs: bool,
    /// `GGML_TP_CUDA_PROFILE`: the per-node GPU time profile.
    pub profile: bool,
    /// `GGML_TP_CUDA_STATS`: the graph counters, host queueing time and GPU spans of calls.
    pub stats: bool,
    /// `GGML_TP_CUDA_TRACE`: calls per stream kept for the timeline (0: none); turns `stats` on.
    pub trace_calls: usize,
    /// `GGML_TP_ONESHOT_MAX_BYTES` ([`usize::MAX`] for `off`); none: the policy's default.
    pub oneshot_max_bytes: Option<usize>,
    /// `GGML_TP_NCCL_LIB`.
    pub nccl_lib: Option<PathBuf>,
    /// `GGML_TP_CUDA_LOGICAL`: logical devices per GPU (1: each GPU is one device).
    pub logical: usize,
    /// `GGML_TP_CUDA_PDL`: programmatic dependent launches where the GPU has them.
    pub dependent_launch: bool,
    /// `GGML_TP_CUDA_PROGRAM`: the kernel program's text from this file instead of the built-in one.
    pub program: Option<PathBuf>,
}

impl Default for Settings {
    /// Graphs and dependent launches on, diagnostics off, the defaults of the reduce policy and the library search.
    fn default() -> Self {
        Settings {
            graphs: true,
            profile: false,
            stats: false,
            trace_calls: 0,
            oneshot_max_bytes: None,
            nccl_lib: None,
            logical: 1,
            dependent_launch: true,
            program: None,
        }
    }
}

impl Settings {
    /// The settings as the environment gives them now.
    pub fn from_env() -> Settings {
        let d = Settings::default();
        let trace_calls = ggml_core::env::count("GGML_TP_CUDA_TRACE").unwrap_or(d.trace_calls);
        Settings {
            graphs: ggml_core::env::flag("GGML_TP_CUDA_GRAPHS", d.graphs),
            profile: ggml_core::env::flag("GGML_TP_CUDA_PROFILE", d.profile),
            stats: ggml_core::env::flag("GGML_TP_CUDA_STATS", d.stats) || trace_calls > 0,
            trace_calls,
            oneshot_max_bytes: ggml_core::env::bytes("GGML_TP_ONESHOT_MAX_BYTES"),
            nccl_lib: ggml_core::env::path("GGML_TP_NCCL_LIB"),
            logical: ggml_core::env::count("GGML_TP_CUDA_LOGICAL").unwrap_or(d.logical),
            dependent_launch: ggml_core::env::flag("GGML_TP_CUDA_PDL", d.dependent_launch),
            program: ggml_core::env::path("GGML_TP_CUDA_PROGRAM"),
        }
    }
}

/// The settings, read on first use.
pub fn settings() -> &'static Settings {
    static SETTINGS: OnceLock<Settings> = OnceLock::new();
    SETTINGS.get_or_init(Settings::from_env)
}
