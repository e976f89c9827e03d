//! A prompt in micro-batches, as `ggml-tp bench -u` and the server feed long prompts: each
//! micro-batch attends to more cache slots, so each has a graph of its own shape. The same prompt
//! again (after a reset) builds those graphs again but plans none of them (the scheduler kept the
//! plans) and gives bit-identical logits; every micro-batch's masks (causal, and the sliding
//! window's) give the logits of the whole prompt in one pass. On one CPU device the masks are
//! written straight into the compute buffer; tensor-split over two, whose memory is no host memory,
//! through the session's mask buffer.

#[path = "logits_util.rs"]
mod util;

use ggml_core::DType;
use llama::model::synthetic::Preset;
use llama::{Model, Outputs, Session, SessionOptions};
use std::sync::Arc;
use util::{nmse, Mode};

/// Prompt tokens, tokens per micro-batch: micro-batches attending to 256, 512 and 768 slots (the
/// cache length in steps of `KV_PAD`), past the sliding window of the gpt-oss preset (128).
const PROMPT: usize = 600;
const UBATCH: usize = 200;

fn opts() -> SessionOptions {
    SessionOptions {
        n_ctx: 1024,
        kv_type: DType::F32,
    }
}

/// The logits of every prompt position, micro-batch by micro-batch.
fn micro_batched(s: &mut Session, tokens: &[u32]) -> Vec<f32> {
    tokens
        .chunks(UBATCH)
        .flat_map(|chunk| s.eval(chunk, Outputs::All).unwrap().data)
        .collect()
}

#[test]
fn micro_batches_of_a_prompt_seen_before_reuse_their_plans() {
    for preset in ["tiny-llama-f16", "tiny-gpt-oss-mxfp4"] {
        let file = Preset::parse(preset).unwrap().build(3).unwrap();
        for mode in [Mode::None, Mode::Tensor(vec![1.0, 1.0])] {
            let what = format!("{preset} {mode:?}");
            let model = Arc::new(Model::from_gguf(&file, &mode.placement()).unwrap());
            let n_vocab = model.config.n_vocab as u32;
            let tokens: Vec<u32> = (0..PROMPT as u32).map(|i| (i * 37 + 5) % n_vocab).collect();
            let mut s = Session::new(model.clone(), opts()).unwrap();
            let first = micro_batched(&mut s, &tokens);
            s.reset();
            let again = micro_batched(&mut s, &tokens);
            assert!(first == again, "{what}: the kept plans give other logits");
            let stats = s.pass_stats();
            let n = PROMPT.div_ceil(UBATCH) as u64;
            assert_eq!(
                (stats.passes, stats.reused_graphs, stats.reused_plans),
                (2 * n, 0, n),
                "{what}"
            );
            assert_eq!(s.scheduler().stats().plans, n, "{what}");
            let mut whole = Session::new(model, opts()).unwrap();
            let reference = whole.eval(&tokens, Outputs::All).unwrap().data;
            let e = nmse(&first, &reference);
            assert!(
                e < 1e-9,
                "{what}: micro-batches vs the whole prompt NMSE {e}"
            );
        }
    }
}
