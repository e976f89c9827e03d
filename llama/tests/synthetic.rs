//! Synthetic models (`--synthetic PRESET`): the tiny presets have the hyper-parameters of the
//! fixtures' tiny models of the same architecture, so their metadata and tensor names and shapes must
//! equal those files' (which llama.cpp loads) — the check that the large presets follow the same
//! conventions. A synthetic model loads and gives finite logits that agree between split mode none
//! and tensor over two CPU devices, and `ggml-tp bench --synthetic` (with micro-batches) / `ggml-tp
//! synth` run end to end.

#[path = "logits_util.rs"]
mod util;

use ggml_core::gguf::GgufFile;
use llama::model::synthetic::Preset;
use llama::{Model, Outputs, Session, SessionOptions};
use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use util::{arch_dir, nmse, Mode};

/// Metadata other than the tokenizer's and the names, as comparable strings.
fn hparams(f: &GgufFile) -> BTreeMap<String, String> {
    f.metadata()
        .iter()
        .filter(|(k, _)| !k.starts_with("tokenizer.") && !k.starts_with("general."))
        .map(|(k, v)| (k.clone(), v.describe()))
        .collect()
}

/// Tensor names with their shapes.
fn shapes(f: &GgufFile) -> BTreeMap<String, Vec<u64>> {
    f.tensors()
        .iter()
        .map(|t| (t.name.clone(), t.dims().to_vec()))
        .collect()
}

#[test]
fn tiny_presets_have_the_layout_of_the_fixtures() {
    let Some(dir) = arch_dir() else { return };
    for (preset, fixture) in [
        ("tiny-llama-f16", "llama"),
        ("tiny-qwen3moe-q8_0", "qwen3moe"),
        ("tiny-gpt-oss-mxfp4", "gpt-oss"),
    ] {
        let synth = Preset::parse(preset).unwrap().build(1).unwrap();
        let file = GgufFile::open(dir.join(format!("{fixture}.gguf"))).unwrap();
        assert_eq!(hparams(&synth), hparams(&file), "{preset} vs {fixture}");
        assert_eq!(shapes(&synth), shapes(&file), "{preset} vs {fixture}");
    }
}

#[test]
fn synthetic_models_run_in_none_and_tensor_mode() {
    let tokens: Vec<u32> = (0..24).map(|i| (i * 37 + 5) % 500).collect();
    for preset in [
        "tiny-llama-q4_0",
        "tiny-qwen3moe-bf16",
        "tiny-gpt-oss-mxfp4",
    ] {
        let file = Preset::parse(preset).unwrap().build(3).unwrap();
        let logits = |mode: Mode| {
            let model = Model::from_gguf(&file, &mode.placement()).unwrap();
            let mut s = Session::new(Arc::new(model), SessionOptions::default()).unwrap();
            s.eval(&tokens, Outputs::All).unwrap().data
        };
        let one = logits(Mode::None);
        let two = logits(Mode::Tensor(vec![1.0, 1.0]));
        assert!(one.iter().all(|x| x.is_finite()), "{preset}");
        let e = nmse(&two, &one);
        assert!(e < 1e-6, "{preset}: tensor vs none NMSE {e}");
    }
}

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
        .build(llama::cli::load::SYNTHETIC_SEED)
        .unwrap();
    assert_eq!(written, same.as_bytes());
}
