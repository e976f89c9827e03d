//! backend-meta: one sharded virtual device over a uniform set of devices (tensor parallelism).
//! Weights and KV cache are split across the devices; partial sums are joined by AllReduce.
//! The crate knows nothing about any vendor: it talks to devices only through the core traits.

mod barrier;
pub mod buffer;
mod cache;
mod collective;
pub mod device;
pub mod doubling;
pub mod exec;
pub mod layout;
mod program;
pub mod record;
pub mod rules;
pub mod settings;
pub mod split;
mod takeover;

pub use device::{MetaDevice, MetaError, ReduceOptions, WeightSplit};
pub use exec::{MetaBackend, MetaStats};
pub use split::{Segment, SplitState};
