//! The kernel cases of `kernel_cases/` (the sizes where the kernels change path, the fusions) on
//! the first CUDA device. Prints `skipped: no CUDA device` without one, as on CI, where
//! `kernels_on_host` runs the same cases on the kernels compiled for the host.

use backend_cuda as _;
use ggml_core::Device;
use std::sync::Arc;

#[path = "kernel_cases/mod.rs"]
mod kernel_cases;

/// The first CUDA device, or `None` after printing why there is none.
fn kernel_device() -> Option<Arc<dyn Device>> {
    ggml_tp_tests::family_devices("cuda", "CUDA").map(|mut d| d.remove(0))
}
