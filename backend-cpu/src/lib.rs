//! backend-cpu: the CPU backend of ggml-tp. Every op of the graph for every type, multi-threaded over
//! rows (a compute's ops on its stream's [`team::Team`], other calls on rayon), presented as one or several virtual devices (`cpu:0`, `cpu:1`, ...), each with its
//! own thread pool and memory budget.

pub mod comm;
pub mod device;
pub mod kernels;
pub mod matmul;
pub mod memory;
pub mod reg;
pub mod settings;
pub mod stream;
pub mod team;
pub mod view;

pub use comm::CpuCommunicator;
pub use device::{cpu_devices, default_devices, CpuDevice};
pub use memory::{CpuBuffer, CpuBufferType, CpuMemory};
pub use reg::CpuReg;
pub use stream::CpuBackend;
pub use view::TView;
