//! `ggml-tp bench --synthetic` (with micro-batches) and `ggml-tp synth` end to end: the bench table
//! has a row per test, an unknown preset is refused, and `synth` writes the very bytes of the
//! preset built with the program's seed ([`ggml_tp::cli::load::SYNTHETIC_SEED`]).

use llama::model::synthetic::Preset;
use std::process::Command;

#[test]
fn bench_and_synth_commands_take_presets() {
    let exe = env!("CARGO_BIN_EXE_ggml-tp");
    let out = Command::new(exe)
        .args([
            "bench",
            "--synthetic",
            "tiny-llama-q8_0",
            "-p",
            "8,2",
            "-u",
            "4",
            "-n",
            "4,3",
            "-r",
            "1",
        ])
        .args(["--no-progress", "-t", "1"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("memory in use per device: cpu:0"),
        "{stderr}"
    );
    for test in ["pp8 ub4", "pp2 |", "tg4", "tg3"] {
        assert!(
            stdout
                .lines()
                .any(|l| l.contains("synthetic tiny-llama-q8_0") && l.contains(test)),
            "{stdout}"
        );
    }
    let bad = Command::new(exe)
        .args(["bench", "--synthetic", "llama3-8b-q5_k", "-r", "1"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown synthetic preset"));

    let path = std::env::temp_dir().join(format!("ggml-tp-synth-{}.gguf", std::process::id()));
    let out = Command::new(exe)
        .args(["synth", "tiny-gpt-oss-mxfp4", "-o"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success());
    let written = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let same = Preset::parse("tiny-gpt-oss-mxfp4")
        .unwrap()
        .build(ggml_tp::cli::load::SYNTHETIC_SEED)
        .unwrap();
    assert_eq!(written, same.as_bytes());
}
