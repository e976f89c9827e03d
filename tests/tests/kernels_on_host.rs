//! The GPU kernels compiled for the host (`ggml_tp_tests::emulated`), where CI checks their
//! numerics: the conformance suite with warps of 32 (CUDA) and wavefronts of 64 (HIP on CDNA),
//! and the kernel cases of `kernel_cases/` (model sizes, long rows, long KV, the fusions) with
//! warps of 32.

use ggml_core::Device;
use ggml_tp_tests::emulated::{device, Flavor};
use ggml_tp_tests::run_suite;
use std::process::Command;
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

/// The tensor-core prompt attention cases again with blocks of 4 warps (`GGML_TP_ATTN_MMA_WARPS`,
/// read once per process: a child process of this binary); the case itself runs the default 8.
#[test]
fn prompt_attention_in_blocks_of_four_warps() {
    let case = "kernel_cases::attention::flash_attn_prefill_tensor_cores";
    let out = Command::new(std::env::current_exe().expect("path of the test binary"))
        .args(["--exact", case, "--nocapture", "--test-threads", "1"])
        .env("GGML_TP_ATTN_MMA_WARPS", "4")
        .output()
        .expect("run the test binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{case} with blocks of 4 warps failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("prompt attention in blocks of 4 warps") && stdout.contains("1 passed"),
        "the child did not run {case} with blocks of 4 warps:\n{stdout}"
    );
}
