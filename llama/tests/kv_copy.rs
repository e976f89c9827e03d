//! [`KvCache::copy_sequence`](llama::kv::KvCache::copy_sequence): a sequence continued from a copy
//! of another's prompt gives the logits of the original continued the same way, for an
//! attention-only model and for hybrid models whose delta-net layers keep a recurrent state, on one
//! device and with the state sharded by heads over three (3:1:1).

#[path = "logits_util.rs"]
mod util;

use llama::runtime::{BatchSession, Outputs, SeqTokens, SessionOptions};
use llama::Model;
use std::sync::Arc;
use util::Mode;

fn one(seq: usize, tokens: &[u32]) -> SeqTokens<'_> {
    SeqTokens {
        seq,
        tokens,
        outputs: Outputs::Last,
    }
}

fn check(name: &str, mode: Mode) {
    let Some(dir) = util::arch_dir() else { return };
    let path = dir.join(format!("{name}.gguf"));
    let model = Arc::new(Model::load(path, &mode.placement()).unwrap());
    let opts = SessionOptions {
        n_ctx: 64,
        ..SessionOptions::default()
    };
    let mut bs = BatchSession::new(model, opts, 3).unwrap();
    let prompt: Vec<u32> = (0..13).map(|i| (i * 37 + 5) % 200).collect();
    bs.eval(&[one(0, &prompt)]).unwrap();
    // Sequence 2 holds something else first: the copy replaces it whole.
    bs.eval(&[one(2, &[9, 8, 7])]).unwrap();
    for to in [1, 2] {
        bs.kv().copy_sequence(0, to, prompt.len()).unwrap();
        bs.set_n_past(to, prompt.len()).unwrap();
    }
    let next = [42u32, 17];
    let want = bs.eval(&[one(0, &next)]).unwrap().remove(0);
    for to in [1, 2] {
        let got = bs.eval(&[one(to, &next)]).unwrap().remove(0);
        assert_eq!(got.last(), want.last(), "{name} {mode:?}: sequence {to}");
    }
    assert!(bs.kv().copy_sequence(0, 3, 1).is_err());
    assert!(bs.kv().copy_sequence(0, 1, 65).is_err());
}

#[test]
fn copied_prompt_continues_like_the_original() {
    check("llama", Mode::None);
}

#[test]
fn copied_recurrent_state_continues_like_the_original() {
    check("qwen35", Mode::None);
    check("qwen3next", Mode::None);
    if util::available() >= 3 {
        check("qwen35", Mode::Tensor(vec![3.0, 1.0, 1.0]));
        check("qwen3next", Mode::Tensor(vec![3.0, 1.0, 1.0]));
    }
}
