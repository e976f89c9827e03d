//! backend-cpu: the CPU backend of ggml-tp. Every op of the graph for every type, multi-threaded, SIMD
//! through `std::arch` with run-time detection, presented as one or several virtual devices.

pub mod matmul;
pub mod view;
