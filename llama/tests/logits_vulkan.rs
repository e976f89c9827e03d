//! SmolLM2-135M (Q4_1) on Vulkan against llama.cpp's logits of `fixtures/reference/smollm2-135m`
//! (prompts p1 and p2, F16 KV cache as in the reference), in split mode none (`vulkan:0`) and tensor
//! parallel over two logical devices opened on the first physical device, with the fixtures
//! README's limits: KL mean ≤ 0.02, KL max ≤ 0.3, NMSE mean ≤ 0.01 (cases of ≥ 8 positions), NMSE max
//! ≤ 0.15, argmax equal where the reference margin ≥ 1.0. Prints `skipped: models not found` without
//! the model and `skipped: no Vulkan device` without a Vulkan driver (in CI, Mesa's lavapipe runs it).

#[path = "logits_util.rs"]
mod util;

use backend_meta::MetaDevice;
use ggml_core::Device;
use llama::{Model, Outputs, Placement, Session, SessionOptions};
use std::sync::Arc;
use std::time::Instant;
use util::{argmax, fixtures, kl, margin, model_file, nmse};

const MODEL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The README's limits over the positions of one case; a description of what broke them.
fn check_limits(what: &str, got: &[&[f32]], reference: &[&[f32]]) -> Result<(), String> {
    let n = got.len();
    let kls: Vec<f64> = got.iter().zip(reference).map(|(c, r)| kl(r, c)).collect();
    let nmses: Vec<f64> = got.iter().zip(reference).map(|(c, r)| nmse(c, r)).collect();
    let misses = got
        .iter()
        .zip(reference)
        .filter(|(c, r)| margin(r) >= 1.0 && argmax(c) != argmax(r))
        .count();
    let (kl_mean, nmse_mean) = (
        kls.iter().sum::<f64>() / n as f64,
        nmses.iter().sum::<f64>() / n as f64,
    );
    let (kl_max, nmse_max) = (
        kls.iter().cloned().fold(0.0, f64::max),
        nmses.iter().cloned().fold(0.0, f64::max),
    );
    let line = format!(
        "{what}: {n} positions, KL mean {kl_mean:.2e} max {kl_max:.2e}, NMSE mean {nmse_mean:.2e} max {nmse_max:.2e}, argmax misses {misses}"
    );
    println!("{line}");
    let ok = kl_mean <= 0.02
        && kl_max <= 0.3
        && (n < 8 || nmse_mean <= 0.01)
        && nmse_max <= 0.15
        && misses == 0;
    ok.then_some(()).ok_or(line)
}

#[test]
fn smollm2_on_vulkan_matches_llama_cpp() {
    let Some(fx) = fixtures() else {
        println!("skipped: fixtures not found");
        return;
    };
    let Some(path) = model_file(MODEL) else {
        return;
    };
    let devices: Vec<Arc<dyn Device>> = match backend_vulkan::open_devices(2) {
        Ok(d) => d
            .into_iter()
            .take(2)
            .map(|d| d as Arc<dyn Device>)
            .collect(),
        Err(reason) => {
            println!("skipped: no Vulkan device ({reason})");
            return;
        }
    };
    println!("{}: {}", devices[0].name(), devices[0].description());
    let dir = fx.join("reference/smollm2-135m");
    let placements = [
        ("none", Placement::Single(devices[0].clone())),
        (
            "tensor",
            Placement::Tensor(MetaDevice::new(devices.clone(), None).unwrap()),
        ),
    ];
    let mut failures = Vec::new();
    for (mode, placement) in &placements {
        let start = Instant::now();
        let model = Arc::new(Model::load(&path, placement).unwrap());
        let mut s = Session::new(model, SessionOptions::default()).unwrap();
        let n_vocab = s.model().config.n_vocab;
        for case in ["p1", "p2"] {
            let tokens: Vec<u32> = util::read_i32(&dir.join(format!("{case}.tokens.i32")))
                .into_iter()
                .map(|t| t as u32)
                .collect();
            let reference = util::read_f32(&dir.join(format!("{case}.logits.f32")));
            s.reset();
            let logits = s.eval(&tokens, Outputs::All).unwrap();
            let got: Vec<&[f32]> = (0..tokens.len()).map(|p| logits.row(p)).collect();
            let want: Vec<&[f32]> = reference.chunks_exact(n_vocab).collect();
            assert_eq!(want.len(), tokens.len(), "{case}: reference positions");
            if let Err(e) = check_limits(&format!("smollm2-135m {case} split {mode}"), &got, &want)
            {
                failures.push(e);
            }
        }
        println!(
            "split {mode}: load and both prompts in {:.1} s",
            start.elapsed().as_secs_f64()
        );
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
