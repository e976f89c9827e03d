//! `ggml-tp bench --synthetic` (with micro-batches) and `ggml-tp synth` end to end: the bench table
//! has a row per test, `-o json|jsonl|csv` give llama-bench's fields with rates that agree with
//! their samples, an unknown preset is refused, and `synth` writes the very bytes of the preset
//! built with the program's seed ([`ggml_tp::cli::load::SYNTHETIC_SEED`]).

use llama::model::synthetic::Preset;
use serde_json::Value;
use std::process::Command;

/// The stdout of `ggml-tp bench` on the tiny synthetic llama (pp6, tg3, two repetitions) in
/// output format `format`.
fn bench_output(format: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ggml-tp"))
        .args([
            "bench",
            "--synthetic",
            "tiny-llama-q8_0",
            "-p",
            "6",
            "-n",
            "3",
        ])
        .args(["-r", "2", "--no-progress", "-t", "1", "-o", format])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}");
    stdout
}

/// Checks one record of the pp6/tg3 run.
fn check_record(r: &Value, test: usize) {
    let (n_prompt, n_gen) = [(6, 0), (0, 3)][test];
    assert_eq!(
        (r["n_prompt"].as_u64(), r["n_gen"].as_u64()),
        (Some(n_prompt), Some(n_gen)),
        "{r}"
    );
    assert_eq!(r["n_depth"], 0);
    assert_eq!(r["model_filename"], "synthetic tiny-llama-q8_0");
    assert!(
        r["model_type"].as_str().unwrap().starts_with("llama "),
        "{r}"
    );
    assert!(r["model_n_params"].as_u64().unwrap() > 0, "{r}");
    assert!(r["model_size"].as_u64().unwrap() > 0, "{r}");
    assert!(!r["build_commit"].as_str().unwrap().is_empty(), "{r}");
    assert_eq!(
        (&r["backends"], &r["split_mode"]),
        (&Value::from("CPU"), &Value::from("none"))
    );
    assert_eq!(
        (&r["type_k"], &r["type_v"]),
        (&Value::from("f16"), &Value::from("f16"))
    );
    let time = r["test_time"].as_str().unwrap();
    assert!(
        time.len() == 20 && time.ends_with('Z') && &time[10..11] == "T",
        "{time}"
    );
    let samples: Vec<f64> = r["samples_ts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let samples_ns = r["samples_ns"].as_array().unwrap();
    assert_eq!((samples.len(), samples_ns.len()), (2, 2), "{r}");
    let tokens = (n_prompt + n_gen) as f64;
    for (ts, ns) in samples.iter().zip(samples_ns) {
        let from_ns = tokens / (ns.as_f64().unwrap() * 1e-9);
        assert!((ts - from_ns).abs() <= 1e-3 * ts, "{ts} vs {from_ns}");
    }
    let mean = samples.iter().sum::<f64>() / 2.0;
    assert!(
        (r["avg_ts"].as_f64().unwrap() - mean).abs() <= 1e-9 * mean,
        "{r}"
    );
}

#[test]
fn bench_writes_llama_bench_json_jsonl_and_csv() {
    let json: Value = serde_json::from_str(&bench_output("json")).unwrap();
    let records = json.as_array().unwrap();
    assert_eq!(records.len(), 2);
    for (i, r) in records.iter().enumerate() {
        check_record(r, i);
    }
    let lines: Vec<Value> = bench_output("jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    for (i, r) in lines.iter().enumerate() {
        check_record(r, i);
    }
    let csv = bench_output("csv");
    let rows: Vec<&str> = csv.lines().collect();
    assert_eq!(rows.len(), 3, "{csv}");
    let header: Vec<&str> = rows[0].split(',').collect();
    assert_eq!(header[..2], ["build_commit", "build_number"]);
    let column = |name: &str| header.iter().position(|&h| h == name).unwrap();
    for (row, (n_prompt, n_gen)) in rows[1..].iter().zip([("6", "0"), ("0", "3")]) {
        // Every value is quoted, as llama-bench writes them.
        let inner = row.strip_prefix('"').and_then(|r| r.strip_suffix('"'));
        let values: Vec<&str> = inner.expect(row).split("\",\"").collect();
        assert_eq!(values.len(), header.len(), "{row}");
        assert_eq!(values[column("n_prompt")], n_prompt, "{row}");
        assert_eq!(values[column("n_gen")], n_gen, "{row}");
        assert_eq!(
            values[column("model_filename")],
            "synthetic tiny-llama-q8_0"
        );
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
        .build(ggml_tp::cli::load::SYNTHETIC_SEED)
        .unwrap();
    assert_eq!(written, same.as_bytes());
}
