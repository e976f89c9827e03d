//! ggml-core: element types and quant formats, tensors and the graph builder, the backend traits,
//! the backend registry (static and plugin), the scheduler, and the GGUF reader/writer.

pub mod backend;
pub mod dtype;
pub mod env;
pub mod error;
pub mod gguf;
pub mod graph;
pub mod host_buffer;
pub mod op;
pub mod quant;
pub mod registry;
pub mod sched;
pub mod settings;
pub mod tensor;

pub use backend::{
    Backend, Buffer, BufferType, Communicator, CompletedEvent, Device, DeviceCaps, DeviceKind,
    Event, MemoryInfo,
};
pub use dtype::{DType, QK_K};
pub use error::{Error, Result};
pub use graph::{Graph, GraphStamp};
pub use op::{GluOp, HeadShare, Op, RopeMode, RopeParams, SortOrder, UnaryOp};
pub use tensor::{DataRef, Layout, Tensor, TensorFlags, TensorId, ViewOf};
