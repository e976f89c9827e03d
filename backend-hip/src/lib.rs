//! backend-hip: the HIP backend of ggml-tp, for AMD GPUs. Devices `hip:0`, `hip:1`, ... with device
//! memory and pinned host buffers, one stream per backend, the kernel sources and dispatch of
//! `ggml-gpu` (shared with CUDA) compiled at run time with hiprtc for each device's gfx target
//! (behind the HIP vendor prelude, see [`kernels`]), hipBLAS for float matrix products and an RCCL
//! AllReduce communicator. Every ROCm library is loaded at run time through our own FFI ([`ffi`]):
//! without a HIP runtime the family reports zero devices and a one-line reason ([`probe`]). Its
//! environment is read once ([`settings`]). Untested on AMD hardware so far.

pub mod blas;
pub mod comm;
pub mod device;
pub mod ffi;
pub mod kernels;
pub mod memory;
pub mod probe;
pub mod reg;
mod runner;
pub mod settings;
pub mod stream;

pub use comm::RcclCommunicator;
pub use device::HipDevice;
pub use memory::{HipBuffer, HipBufferType, PinnedBuffer, PinnedBufferType, PinnedMemory};
pub use reg::{hip_devices, HipReg};
pub use stream::HipBackend;

/// A backend error of this family.
pub(crate) fn err(msg: impl Into<String>) -> ggml_core::Error {
    ggml_core::Error::Backend {
        backend: "hip".into(),
        msg: msg.into(),
    }
}

/// A library call's result (`Err` is its message) as a backend error.
pub(crate) fn check(r: std::result::Result<(), String>) -> ggml_core::Result<()> {
    r.map_err(err)
}
