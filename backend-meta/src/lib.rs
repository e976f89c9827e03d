//! backend-meta: one sharded virtual device over a uniform set of devices (tensor parallelism).
//! Weights and KV cache are split across the devices; partial sums are joined by AllReduce.
//! The crate knows nothing about any vendor: it talks to devices only through the core traits.

pub mod buffer;
pub mod split;
