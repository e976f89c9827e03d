//! Helpers shared by the server tests: the tiny fixture models and a one-CPU-device placement.
//! Fixtures: `GGML_TP_FIXTURES`, else `<CARGO_MANIFEST_DIR>/../../shared/fixtures`; absent, a test
//! prints `skipped: fixtures not found`.

use backend_cpu::device::cpu_devices;
use llama::Placement;
use std::path::PathBuf;

/// The fixture model `arch/<name>.gguf`, if the fixtures are there.
pub fn arch_fixture(name: &str) -> Option<PathBuf> {
    let dir = match std::env::var_os("GGML_TP_FIXTURES") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures"),
    };
    let path = dir.join(format!("arch/{name}.gguf"));
    if path.is_file() {
        Some(path)
    } else {
        println!("skipped: fixtures not found");
        None
    }
}

/// One CPU device with one thread.
pub fn single() -> Placement {
    Placement::Single(cpu_devices(1, 1).unwrap().remove(0))
}
