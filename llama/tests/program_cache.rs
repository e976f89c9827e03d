//! The meta device's programs per graph shape under a model session, over two devices of the test
//! family: a 54-token prompt in four micro-batches (16, 16, 16, 6) then 10 decode steps plans one
//! program per shape (three), and the same prompt and steps again after a reset plan none; the
//! logits of both rounds are the same and match llama.cpp's for the fixtures' tiny llama.

#[path = "logits_util.rs"]
mod util;

use backend_meta::MetaDevice;
use llama::{Model, Outputs, Placement, Session, SessionOptions};
use std::sync::Arc;
use util::{arch_dir, nmse};

/// Tokens of the prompt's micro-batches; the rest of the fixture's ids are decoded one by one.
const MICRO_BATCHES: [usize; 4] = [16, 16, 16, 6];

/// The logits of every position: the prompt in micro-batches, then one token per step.
fn prompt_then_decode(s: &mut Session, ids: &[u32]) -> Vec<f32> {
    s.reset();
    let mut logits = Vec::new();
    let mut at = 0;
    for n in MICRO_BATCHES {
        logits.extend(s.eval(&ids[at..at + n], Outputs::All).unwrap().data);
        at += n;
    }
    for &t in &ids[at..] {
        logits.extend(s.eval(&[t], Outputs::Last).unwrap().data);
    }
    logits
}

#[test]
fn micro_batches_and_decode_plan_each_shape_once() {
    let Some(dir) = arch_dir() else { return };
    let fixture = util::arch_fixture(&dir, "llama");
    let (ids, n_vocab) = (&fixture.ids, fixture.n_vocab);
    assert!(ids.len() > MICRO_BATCHES.iter().sum::<usize>() + 1);
    let meta = MetaDevice::new(util::devices(2), None).unwrap();
    let model = Model::load(dir.join("llama.gguf"), &Placement::Tensor(meta.clone())).unwrap();
    let opts = SessionOptions {
        n_ctx: 128,
        kv_type: ggml_core::DType::F32,
    };
    let mut s = Session::new(Arc::new(model), opts).unwrap();

    let first = prompt_then_decode(&mut s, ids);
    let after_first = meta.stats();
    // Shapes: 16 prompt tokens, 6 prompt tokens, 1 decode token (every batch attends the whole
    // 128-slot cache).
    assert_eq!(after_first.builds, 3, "{after_first:?}");
    let passes = (MICRO_BATCHES.len() + ids.len() - MICRO_BATCHES.iter().sum::<usize>()) as u64;
    assert_eq!(after_first.hits, passes - 3, "{after_first:?}");

    let second = prompt_then_decode(&mut s, ids);
    let after_second = meta.stats();
    assert_eq!(
        after_second.builds, 3,
        "nothing planned again: {after_second:?}"
    );
    assert_eq!(after_second.hits, 2 * passes - 3, "{after_second:?}");
    assert_eq!(after_second.evictions, 0, "{after_second:?}");
    assert_eq!(first, second, "the same logits from the cached programs");

    let reference = fixture.reference(&dir);
    let worst = (0..ids.len())
        .map(|p| {
            let r = p * n_vocab..(p + 1) * n_vocab;
            nmse(&first[r.clone()], &reference[r])
        })
        .fold(0.0, f64::max);
    assert!(worst <= 1e-5, "worst nmse {worst}");
}
