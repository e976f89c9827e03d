//! The conformance suite on the CPU backend loaded as a cdylib plugin (`libbackend_cpu.so` next to
//! the test's `deps` directory, built with cargo when missing or older than this test).

use ggml_tp_tests::run_family;
use std::path::{Path, PathBuf};
use std::process::Command;

fn plugin_path() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target profile directory");
    let name = format!(
        "{}backend_cpu{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    dir.join(name)
}

fn stale(lib: &Path) -> bool {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let exe = std::env::current_exe().ok();
    match (modified(lib), exe.as_deref().and_then(modified)) {
        (Some(l), Some(e)) => l < e,
        _ => true,
    }
}

fn build_plugin(lib: &Path) {
    let profile_dir = lib.parent().expect("profile directory");
    let release = profile_dir.file_name().is_some_and(|n| n == "release");
    let target_dir = profile_dir.parent().expect("target directory");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "-p", "backend-cpu", "--lib"])
        .arg("--target-dir")
        .arg(target_dir);
    if release {
        cmd.arg("--release");
    }
    let status = cmd.status().expect("running cargo build -p backend-cpu");
    assert!(
        status.success(),
        "cargo build -p backend-cpu failed: {status}"
    );
}

#[test]
fn cpu_plugin_conforms() {
    let lib = plugin_path();
    if stale(&lib) {
        build_plugin(&lib);
    }
    assert!(lib.exists(), "{} was not built", lib.display());
    let reg = ggml_core::registry::load_plugin(&lib)
        .unwrap_or_else(|e| panic!("loading {}: {e}", lib.display()));
    let reports = run_family("cpu", reg.devices());
    for r in &reports {
        assert!(
            r.skipped.is_empty(),
            "{} skipped cases:\n{}",
            r.backend,
            r.skipped.join("\n")
        );
        r.assert_ok();
    }
}
