//! ggml-core: element types and quant formats, tensors and the graph builder, the backend traits,
//! the backend registry (static and plugin), the scheduler, and the GGUF reader/writer.

pub mod dtype;
pub mod error;
pub mod gguf;
pub mod quant;

pub use dtype::{DType, QK_K};
pub use error::{Error, Result};
