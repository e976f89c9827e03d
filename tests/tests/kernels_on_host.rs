//! The conformance suite on the GPU kernels compiled for the host (`ggml_tp_tests::emulated`):
//! every case the shared CUDA/HIP dispatch supports, with warps of 32 (CUDA) and wavefronts of 64
//! (HIP on CDNA). CI has no GPU; this is where the kernels' numerics are checked there.

use ggml_tp_tests::emulated::{device, Flavor};
use ggml_tp_tests::run_suite;

fn conform(flavor: Flavor) {
    let dev = device(flavor).unwrap_or_else(|e| panic!("{flavor:?} kernels on the host: {e}"));
    let report = run_suite(dev.new_backend().unwrap());
    println!("{}", report.summary());
    for s in report.skipped.iter().take(40) {
        println!("{s}");
    }
    report.assert_ok();
}

#[test]
fn cuda_kernels_conform_on_the_host() {
    conform(Flavor::Cuda);
}

#[test]
fn hip_kernels_conform_on_the_host() {
    conform(Flavor::Hip);
}
