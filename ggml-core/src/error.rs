//! The error type shared by the core crate and the backends.

use crate::dtype::DType;

/// Errors of graph construction, memory, backends, the registry and the scheduler.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("shape error in {op}: {msg}")]
    Shape { op: &'static str, msg: String },
    #[error("type {dtype} is not supported by {what}")]
    UnsupportedType { dtype: DType, what: String },
    #[error("op {op} is not supported by backend {backend}")]
    UnsupportedOp { op: String, backend: String },
    #[error("out of memory on {device}: asked for {requested} bytes, {available} available")]
    OutOfMemory {
        device: String,
        requested: usize,
        available: usize,
    },
    #[error("access out of bounds: offset {offset} + {len} bytes > buffer size {size}")]
    OutOfBounds {
        offset: usize,
        len: usize,
        size: usize,
    },
    #[error("tensor {0} has no data: it is neither allocated nor a view of allocated data")]
    NoData(String),
    #[error("backend error ({backend}): {msg}")]
    Backend { backend: String, msg: String },
    #[error("plugin {path}: {msg}")]
    Plugin { path: String, msg: String },
    #[error("no device named {0}")]
    NoDevice(String),
    #[error(transparent)]
    Gguf(#[from] crate::gguf::GgufError),
    #[error("io error: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Other(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
