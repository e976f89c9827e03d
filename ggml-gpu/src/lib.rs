//! ggml-gpu: the vendor-neutral GPU layer of ggml-tp, shared by the CUDA and HIP backends and by the
//! host emulation of the test suite (`ggml-tp-tests`, which compiles the same kernels for the CPU).
//! It holds the kernel program ([`kernels`]: the `.cu` sources, the vendor preludes and the program
//! assembled for one vendor) and its dispatch ([`dispatch`]: which kernel computes a graph node, the
//! launch shape and arguments, the fusions of adjacent nodes, and the [`dispatch::Runner`] contract
//! each backend implements on its stream). Nothing here links a vendor library: a backend compiles
//! the program with its run-time compiler (NVRTC, hiprtc) and executes the dispatch's launches and
//! BLAS calls. Its switches are read once from the environment ([`settings`]).

pub mod dispatch;
pub mod kernels;
pub mod settings;
