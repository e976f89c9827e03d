//! The conformance suite on every CPU device of the statically linked CPU backend: at the SIMD level
//! the environment gives (the best the CPU has by default), and again at every lower level the CPU
//! supports (`scalar`, and `avx2` on an AVX-512 machine) by re-running this test binary with
//! `GGML_TP_SIMD` set, since the level is read once per process.

use backend_cpu::matmul::{simd, SimdLevel};
use ggml_tp_tests::run_family;
use std::process::Command;

#[test]
fn cpu_backend_conforms() {
    let level = simd::level();
    // A forced level must be the one in effect (no silent fallback to another).
    if let Some(want) = backend_cpu::settings::settings().simd.as_deref() {
        assert_eq!(level.name(), want, "GGML_TP_SIMD={want} not in effect");
    }
    println!("SIMD level {}", level.name());
    let reports = run_family("cpu", ggml_core::registry::devices());
    for r in &reports {
        // The CPU backend implements every op: nothing may be skipped.
        assert!(
            r.skipped.is_empty(),
            "{} skipped cases:\n{}",
            r.backend,
            r.skipped.join("\n")
        );
        r.assert_ok();
    }
}

/// [`cpu_backend_conforms`] at every available SIMD level below the best one (which that test covers
/// by default), each in a child process of this binary with `GGML_TP_SIMD` set.
#[test]
fn cpu_backend_conforms_at_every_simd_level() {
    let exe = std::env::current_exe().expect("path of the test binary");
    let best = SimdLevel::best();
    for level in SimdLevel::available().into_iter().filter(|&l| l != best) {
        let out = Command::new(&exe)
            .args([
                "--exact",
                "cpu_backend_conforms",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env("GGML_TP_SIMD", level.name())
            .output()
            .expect("run the test binary");
        let stdout = String::from_utf8_lossy(&out.stdout);
        println!("GGML_TP_SIMD={}:\n{stdout}", level.name());
        assert!(
            out.status.success(),
            "conformance suite at GGML_TP_SIMD={} failed:\n{stdout}\n{}",
            level.name(),
            String::from_utf8_lossy(&out.stderr)
        );
        // The child ran the suite (not zero tests through a filter that matched nothing).
        assert!(
            stdout.contains(&format!("SIMD level {}", level.name())) && stdout.contains("1 passed"),
            "the child at GGML_TP_SIMD={} did not run the suite:\n{stdout}",
            level.name()
        );
    }
}
