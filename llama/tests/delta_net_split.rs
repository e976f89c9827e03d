//! The hybrid (delta-net) fixtures cut by heads over a meta device: qwen35, qwen35moe (tiled key
//! heads) and qwen3next (grouped) match llama.cpp's logits in one batch and token by token, over 2
//! devices, 3 (3:1:1, where one device holds no key head) and 4 (two without a head), and every
//! delta-net layer's output goes through one AllReduce without gathering a split tensor. A prompt
//! evaluated in one batch (the chunked form of the delta rule) and the same prompt fed one token at a
//! time (the recurrent form) leave the same recurrent state, and a sharded state holds the same
//! values as the whole one.

#[path = "logits_util.rs"]
mod util;

use backend_meta::MetaDevice;
use ggml_core::DType;
use llama::{Model, Outputs, Placement, Session, SessionOptions};
use std::sync::Arc;
use util::{arch_dir, argmax, nmse, Mode};

const HYBRIDS: &[&str] = &["qwen35", "qwen35moe", "qwen3next"];

const OPTS: SessionOptions = SessionOptions {
    n_ctx: 128,
    kv_type: DType::F32,
};

/// Tensor splits with as many devices as the family offers.
fn tensor_ratios() -> Vec<Vec<f32>> {
    [vec![1.0, 1.0], vec![3.0, 1.0, 1.0], vec![1.0; 4]]
        .into_iter()
        .filter(|r| r.len() <= util::available())
        .collect()
}

fn session(dir: &std::path::Path, name: &str, placement: &Placement) -> Session {
    let model = Model::load(dir.join(format!("{name}.gguf")), placement)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    Session::new(Arc::new(model), OPTS).unwrap()
}

/// The logits of every position of `ids`: in one batch, or one token per step.
fn logits(s: &mut Session, ids: &[u32], stepwise: bool) -> Vec<f32> {
    if !stepwise {
        return s.eval(ids, Outputs::All).unwrap().data;
    }
    ids.iter()
        .flat_map(|&t| s.eval(&[t], Outputs::Last).unwrap().data)
        .collect()
}

#[test]
fn hybrid_models_cut_by_heads_match_llama_cpp() {
    let Some(dir) = arch_dir() else { return };
    let mut failures = Vec::new();
    for name in HYBRIDS {
        let m = util::arch_fixture(&dir, name);
        let reference = m.reference(&dir);
        for ratios in tensor_ratios() {
            for stepwise in [false, true] {
                let meta =
                    MetaDevice::new(util::devices(ratios.len()), Some(ratios.clone())).unwrap();
                let mut s = session(&dir, name, &Placement::Tensor(meta.clone()));
                let got = logits(&mut s, &m.ids, stepwise);
                let n = m.ids.len();
                let rows = |x: &[f32], p: usize| x[p * m.n_vocab..(p + 1) * m.n_vocab].to_vec();
                let worst = (0..n)
                    .map(|p| nmse(&rows(&got, p), &rows(&reference, p)))
                    .fold(0.0, f64::max);
                let agree = (0..n)
                    .filter(|&p| argmax(&rows(&got, p)) == argmax(&rows(&reference, p)))
                    .count();
                let stats = meta.stats();
                let passes = if stepwise { n } else { 1 } as u64;
                // One AllReduce per layer after its mixer and one after its FFN, nothing gathered.
                let n_layer = s.model().config.n_layer as u64;
                let line = format!(
                    "{name:10} {ratios:?} stepwise={stepwise}: max NMSE {worst:.2e}, top-1 \
                     {agree}/{n}, {} reductions, {} gathers in {passes} passes",
                    stats.reductions, stats.gathers
                );
                println!("{line}");
                let joined = stats.reductions == 2 * n_layer * passes && stats.gathers == 0;
                if worst > 1e-5 || agree * 50 < n * 49 || !joined {
                    failures.push(line);
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Every delta-net layer's convolution and delta-rule state of sequence 0, read back whole.
fn states(s: &Session) -> Vec<Vec<f32>> {
    let rs = s.kv().recurrent();
    let mut out = Vec::new();
    for l in 0..s.model().config.n_layer {
        let Some(layer) = rs.layer(0, l) else {
            continue;
        };
        for w in [&layer.conv, &layer.ssm] {
            let mut bytes = vec![0u8; w.layout.nbytes()];
            w.data.buffer.get(w.data.offset, &mut bytes).unwrap();
            out.push(
                bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
            );
        }
    }
    out
}

#[test]
fn chunked_prompt_and_token_steps_leave_the_same_state() {
    let Some(dir) = arch_dir() else { return };
    for name in HYBRIDS {
        let m = util::arch_fixture(&dir, name);
        // 100 tokens: one whole chunk of the chunked form and a partial one.
        let ids: Vec<u32> = m.ids.iter().chain(&m.ids).take(100).copied().collect();
        let mut whole = None;
        let mut modes = vec![Mode::None];
        modes.extend(tensor_ratios().into_iter().map(Mode::Tensor));
        for mode in modes {
            let mut chunked = session(&dir, name, &mode.placement());
            let last_chunked = chunked.eval(&ids, Outputs::Last).unwrap().data;
            let mut steps = session(&dir, name, &mode.placement());
            let last_steps = logits(&mut steps, &ids, true);
            let last_steps = &last_steps[last_steps.len() - m.n_vocab..];
            let (a, b) = (states(&chunked), states(&steps));
            assert!(!a.is_empty(), "{name}: no recurrent state");
            for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                let e = nmse(x, y);
                assert!(
                    e <= 1e-9,
                    "{name} {mode:?} state {i}: chunked vs steps NMSE {e:.2e}"
                );
            }
            let e = nmse(&last_chunked, last_steps);
            assert!(e <= 1e-9, "{name} {mode:?}: last logits NMSE {e:.2e}");
            // A sharded state holds the values of the whole one.
            let reference = whole.get_or_insert_with(|| a.clone());
            for (i, (x, y)) in a.iter().zip(reference.iter()).enumerate() {
                let e = nmse(x, y);
                assert!(
                    e <= 1e-9,
                    "{name} {mode:?} state {i}: vs one device NMSE {e:.2e}"
                );
            }
            println!("{name:10} {mode:?}: chunked and stepwise states agree");
        }
    }
}
