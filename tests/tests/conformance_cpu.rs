//! The conformance suite on every CPU device of the statically linked CPU backend.

use backend_cpu as _;
use ggml_tp_tests::run_family;

#[test]
fn cpu_backend_conforms() {
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
