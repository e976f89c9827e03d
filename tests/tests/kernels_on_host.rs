//! The GPU kernels compiled for the host (`ggml_tp_tests::emulated`), where CI checks their
//! numerics: the conformance suite with warps of 32 (CUDA) and wavefronts of 64 (HIP on CDNA),
//! and the kernel cases of `kernel_cases/` (model sizes, long rows, long KV, the fusions) with
//! warps of 32.

use ggml_core::Device;
use ggml_tp_tests::emulated::{device, Flavor};
use ggml_tp_tests::run_suite;
use std::sync::Arc;

#[path = "kernel_cases/mod.rs"]
mod kernel_cases;

fn emulated(flavor: Flavor) -> Arc<dyn Device> {
    device(flavor).unwrap_or_else(|e| panic!("{flavor:?} kernels on the host: {e}"))
}

/// The device of `kernel_cases`: the CUDA flavor (always present).
fn kernel_device() -> Option<Arc<dyn Device>> {
    Some(emulated(Flavor::Cuda))
}

fn conform(flavor: Flavor) {
    let report = run_suite(emulated(flavor).new_backend().unwrap());
    println!("{}", report.summary());
    report.assert_ok();
    assert!(
        report.skipped.is_empty(),
        "every case runs on the shared kernels:\n{}",
        report.skipped.join("\n")
    );
}

#[test]
fn cuda_kernels_conform_on_the_host() {
    conform(Flavor::Cuda);
}

#[test]
fn hip_kernels_conform_on_the_host() {
    conform(Flavor::Hip);
}
