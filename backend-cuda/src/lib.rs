//! backend-cuda: the CUDA backend of ggml-tp. Devices `cuda:0`, `cuda:1`, ... with device memory and
//! pinned host buffers, one stream per backend, the kernels of `ggml-gpu` (vendor-neutral sources
//! and dispatch) compiled at run time with NVRTC for each device's compute capability, cuBLAS for
//! float matrix products, CUDA graph replay of repeated subgraphs, and a stream-ordered AllReduce
//! communicator (NCCL, and a one-shot peer-to-peer kernel for small messages; one process per GPU
//! through a rendezvous). A GPU can be presented as several logical devices (`GGML_TP_CUDA_LOGICAL`:
//! own streams, a share of the memory, copies and a same-GPU AllReduce within the card), so that
//! every tensor-parallel path runs on one GPU. Every CUDA library is loaded at run time: without a driver the family
//! reports zero devices and says why ([`probe`]). Its environment variables are read once
//! ([`settings`]).

pub mod comm;
pub mod device;
pub mod graph_cache;
pub mod kernels;
pub mod memory;
pub mod nccl;
pub mod p2p;
pub mod probe;
pub mod profile;
mod record;
pub mod reg;
pub mod rendezvous;
pub mod settings;
pub mod spans;
pub mod stream;

pub use comm::{NcclCommunicator, ReducePath, ReducePolicy, SameGpuCommunicator};
pub use device::{CudaDevice, CudaGpu, Share};
pub use graph_cache::GraphStats;
pub use memory::{
    CudaBuffer, CudaBufferType, DeviceMemory, PinnedBuffer, PinnedBufferType, PinnedMemory,
};
pub use reg::{cuda_devices, cuda_devices_with, CudaReg};
pub use rendezvous::Rendezvous;
pub use stream::CudaBackend;

/// A backend error of this family.
pub(crate) fn err(msg: impl Into<String>) -> ggml_core::Error {
    ggml_core::Error::Backend {
        backend: "cuda".into(),
        msg: msg.into(),
    }
}

/// Maps a CUDA library error to a backend error that says what was being done.
pub(crate) fn cu<T, E: std::fmt::Debug>(
    what: &str,
    r: std::result::Result<T, E>,
) -> ggml_core::Result<T> {
    r.map_err(|e| err(format!("{what}: {e:?}")))
}
