//! Tensor parallelism over 4 and 8 devices on the fixtures' tiny models: llama (4 query / 2 KV
//! heads), qwen3moe (8 experts), gpt-oss (sinks, MXFP4 experts), gemma4 (dense and MoE) and the
//! hybrid recurrent qwen35, qwen35moe and qwen3next split evenly over 4 and 8 devices
//! — with 2 KV heads, 8 devices means most devices hold zero-size slices of the attention — and
//! unevenly (5:1:1:1, 3:0:1:1: one device holds nothing), against llama.cpp's logits. Prompt in one
//! batch for one ratio set, 40 tokens then one token per step for the next. Runs on virtual CPU
//! devices here and on `GGML_TP_TEST_FAMILY` devices where that many exist (else it says
//! `skipped: N devices needed`).

#[path = "logits_util.rs"]
mod util;

use llama::{Model, Outputs, Session, SessionOptions};
use std::sync::Arc;
use util::{arch_dir, argmax, nmse, Mode};

const MODELS: &[&str] = &[
    "llama",
    "qwen3moe",
    "gpt-oss",
    "gemma4-dense",
    "gemma4-moe",
    "qwen35",
    "qwen35moe",
    "qwen3next",
];

fn ratio_sets() -> Vec<Vec<f32>> {
    vec![
        vec![1.0; 4],
        vec![5.0, 1.0, 1.0, 1.0],
        vec![3.0, 0.0, 1.0, 1.0],
        vec![1.0; 8],
    ]
}

#[test]
fn fixtures_match_over_four_and_eight_devices() {
    let Some(dir) = arch_dir() else { return };
    let mut failures = Vec::new();
    let mut ran = 0;
    for m in util::arch_fixtures(&dir) {
        let (name, ids, n_vocab) = (m.name.as_str(), &m.ids, m.n_vocab);
        if !MODELS.contains(&name) {
            continue;
        }
        let reference = m.reference(&dir);
        // Quantized matmuls (gpt-oss's MXFP4 experts) quantize activations to 8 bits as llama.cpp
        // does, so they follow its logits less tightly (the limit of `logits_arch`).
        let quantized = dir.join(format!("{name}.dequant.logits.f32")).exists();
        let limit = if quantized { 1e-3 } else { 1e-5 };
        for (i, ratios) in ratio_sets().into_iter().enumerate() {
            let mode = Mode::Tensor(ratios);
            if mode.needs() > util::available() {
                println!("skipped: {} devices needed", mode.needs());
                continue;
            }
            let model = Model::load(dir.join(format!("{name}.gguf")), &mode.placement())
                .unwrap_or_else(|e| panic!("{name} {mode:?}: {e}"));
            let opts = SessionOptions {
                n_ctx: 128,
                kv_type: ggml_core::DType::F32,
            };
            let mut s = Session::new(Arc::new(model), opts).unwrap();
            let stepwise = i % 2 == 1;
            let got = if stepwise {
                let mut got = s.eval(&ids[..40], Outputs::All).unwrap().data;
                for &t in &ids[40..] {
                    got.extend(s.eval(&[t], Outputs::Last).unwrap().data);
                }
                got
            } else {
                s.eval(ids, Outputs::All).unwrap().data
            };
            let mut worst: f64 = 0.0;
            let mut agree = 0;
            for p in 0..ids.len() {
                let r = p * n_vocab..(p + 1) * n_vocab;
                worst = worst.max(nmse(&got[r.clone()], &reference[r.clone()]));
                agree += usize::from(argmax(&got[r.clone()]) == argmax(&reference[r]));
            }
            let top1 = agree as f64 / ids.len() as f64;
            let line = format!(
                "{name:9} {mode:?} stepwise={stepwise}: max NMSE {worst:.2e}, top-1 {top1:.3}"
            );
            println!("{line}");
            ran += 1;
            if worst > limit || top1 < 0.98 {
                failures.push(line);
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    if util::family() == "cpu" {
        assert_eq!(ran, MODELS.len() * ratio_sets().len());
    }
}
