//! Several sequences in one forward pass ([`BatchSession`]) against each sequence run alone
//! ([`Session`]), on tiny random-weight fixtures of several architectures (plain F32, all matrices
//! Q8_0, sliding window, sinks with experts, experts, Gemma 4's shared-KV layers and per-layer
//! inputs) in every split mode, with an F32 KV cache.
//!
//! Four token streams start at different steps; each step evaluates the next prompt chunk of the
//! streams still reading their prompt next to the single decode token of the others, as the server
//! does. Alone, a stream's prompt goes in one pass and its decode tokens one per pass. Every row of
//! logits is compared: bit-identical for the Q8_0 model (the CPU kernels compute each token's row
//! the same way whatever else is in the batch), NMSE ≤ 1e-9 for float weights (the CPU multiplies
//! 8 or more columns with a blocked GEMM, fewer with row kernels: rounding differs). A second round
//! puts every stream in another sequence's cache region, whose stale rows must stay invisible:
//! bit-identical to the first round.
//!
//! A hybrid model (qwen35, delta-net layers) refuses several sequences in one pass but keeps one
//! recurrent state per sequence: sequences interleaved pass by pass match llama.cpp's logits.

#[path = "logits_util.rs"]
mod util;

use ggml_core::DType;
use llama::{BatchSession, Model, Outputs, SeqTokens, Session, SessionOptions};
use std::path::Path;
use std::sync::Arc;
use util::{arch_dir, nmse, Mode};

/// Prompt length and first step of each stream; every stream then decodes [`DECODE`] tokens.
const STREAMS: [(usize, usize); 4] = [(23, 0), (5, 0), (17, 2), (9, 3)];
const DECODE: usize = 12;
/// Prompt tokens per step of a stream in a batch.
const CHUNK: usize = 8;
const N_CTX: usize = 64;

fn opts() -> SessionOptions {
    SessionOptions {
        n_ctx: N_CTX,
        kv_type: DType::F32,
    }
}

/// The tokens of stream `k`: the fixture's input rotated, so every stream differs.
fn stream(ids: &[u32], k: usize) -> Vec<u32> {
    let n = STREAMS[k].0 + DECODE;
    (0..n).map(|i| ids[(i + 11 * k) % ids.len()]).collect()
}

/// Each stream alone: its logits at every position.
fn alone(model: &Arc<Model>, streams: &[Vec<u32>]) -> Vec<Vec<f32>> {
    streams
        .iter()
        .enumerate()
        .map(|(k, toks)| {
            let mut s = Session::new(model.clone(), opts()).unwrap();
            let p = STREAMS[k].0;
            let mut got = s.eval(&toks[..p], Outputs::All).unwrap().data;
            for &t in &toks[p..] {
                got.extend(s.eval(&[t], Outputs::All).unwrap().data);
            }
            got
        })
        .collect()
}

/// Every stream in `bs`, stream `k` in sequence `seq_of[k]`: its logits at every position, and
/// the most sequences one pass held.
fn batched(
    bs: &mut BatchSession,
    streams: &[Vec<u32>],
    seq_of: &[usize],
) -> (Vec<Vec<f32>>, usize) {
    let mut done = vec![0usize; streams.len()];
    let mut got = vec![Vec::new(); streams.len()];
    let mut widest = 0;
    for step in 0.. {
        let mut parts = Vec::new();
        let mut who = Vec::new();
        for (k, toks) in streams.iter().enumerate() {
            let (prompt, start) = STREAMS[k];
            if step < start || done[k] == toks.len() {
                continue;
            }
            let n = if done[k] < prompt {
                CHUNK.min(prompt - done[k])
            } else {
                1
            };
            parts.push(SeqTokens {
                seq: seq_of[k],
                tokens: &toks[done[k]..done[k] + n],
                outputs: Outputs::All,
            });
            who.push((k, n));
        }
        if parts.is_empty() {
            break;
        }
        widest = widest.max(parts.len());
        let logits = bs.eval(&parts).unwrap();
        for ((k, n), l) in who.into_iter().zip(logits) {
            assert_eq!(l.positions, (done[k]..done[k] + n).collect::<Vec<_>>());
            got[k].extend(l.data);
            done[k] += n;
        }
    }
    (got, widest)
}

/// Compares `name` batched and alone in `mode`; returns the worst NMSE of a row.
fn check(dir: &Path, name: &str, ids: &[u32], mode: &Mode, exact: bool) -> f64 {
    let model = Arc::new(Model::load(dir.join(format!("{name}.gguf")), &mode.placement()).unwrap());
    let n_vocab = model.config.n_vocab;
    let streams: Vec<Vec<u32>> = (0..STREAMS.len()).map(|k| stream(ids, k)).collect();
    let want = alone(&model, &streams);
    let mut bs = BatchSession::new(model, opts(), STREAMS.len()).unwrap();
    let (first, widest) = batched(&mut bs, &streams, &[0, 1, 2, 3]);
    assert_eq!(
        widest,
        STREAMS.len(),
        "every stream in one pass at some step"
    );
    let mut worst: f64 = 0.0;
    for (k, (g, w)) in first.iter().zip(&want).enumerate() {
        assert_eq!(g.len(), w.len());
        for (p, (gr, wr)) in g.chunks(n_vocab).zip(w.chunks(n_vocab)).enumerate() {
            let e = nmse(gr, wr);
            worst = worst.max(e);
            if exact {
                assert!(
                    gr == wr,
                    "{name} {mode:?}: stream {k} position {p} differs ({e:e})"
                );
            }
        }
    }
    // Round two: every stream in another region, after the previous stream's rows.
    for seq in 0..STREAMS.len() {
        bs.truncate(seq, 0).unwrap();
        assert_eq!(bs.n_past(seq).unwrap(), 0);
    }
    let (second, _) = batched(&mut bs, &streams, &[2, 3, 1, 0]);
    assert!(
        first == second,
        "{name} {mode:?}: other cache regions changed the logits"
    );
    worst
}

#[test]
fn batched_sequences_match_each_sequence_alone() {
    let Some(dir) = arch_dir() else { return };
    let modes = [
        Mode::None,
        Mode::Layers(vec![1.0, 1.0]),
        Mode::Tensor(vec![1.0, 1.0]),
        Mode::Tensor(vec![3.0, 1.0, 1.0]),
    ];
    let mut failures = Vec::new();
    for (name, exact) in [
        ("llama-q8_0", true),
        ("llama", false),
        ("gemma3", false),
        ("gpt-oss", false),
        ("qwen3moe", false),
        ("gemma4-dense", false),
        ("gemma4-moe", false),
    ] {
        let ids = util::arch_fixture(&dir, name).ids;
        for mode in modes.iter().filter(|m| m.needs() <= util::available()) {
            let worst = check(&dir, name, &ids, mode, exact);
            println!("{name:10} {mode:?}: batched vs alone, worst NMSE of a row {worst:.2e}");
            if worst > 1e-9 {
                failures.push(format!("{name} {mode:?}: {worst:e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

fn part(seq: usize, tokens: &[u32]) -> SeqTokens<'_> {
    SeqTokens {
        seq,
        tokens,
        outputs: Outputs::Last,
    }
}

#[test]
fn bad_batches_are_refused() {
    let Some(dir) = arch_dir() else { return };
    let model = Arc::new(Model::load(dir.join("llama.gguf"), &Mode::None.placement()).unwrap());
    let mut bs = BatchSession::new(model.clone(), opts(), 2).unwrap();
    let long = vec![1u32; N_CTX + 1];
    let cases: [(Vec<SeqTokens>, &str); 6] = [
        (vec![], "empty batch"),
        (vec![part(0, &[])], "no tokens"),
        (vec![part(2, &[1])], "sequence 2 of 2"),
        (vec![part(0, &[1]), part(0, &[2])], "twice"),
        (vec![part(1, &long)], "exceed the context"),
        (
            vec![part(0, &[1]), part(1, &[5000])],
            "outside the vocabulary",
        ),
    ];
    for (batch, needle) in cases {
        let e = bs.eval(&batch).unwrap_err().to_string();
        assert!(e.contains(needle), "{e:?} lacks {needle:?}");
    }
    // Nothing was appended by the refused batches.
    assert_eq!((bs.n_past(0).unwrap(), bs.n_past(1).unwrap()), (0, 0));
    assert!(bs.n_past(2).is_err());
    assert!(bs.set_n_past(0, N_CTX + 1).is_err());
    assert!(bs.truncate(7, 0).is_err());
    assert!(BatchSession::new(model, opts(), 0).is_err());
}

#[test]
fn recurrent_model_keeps_one_state_per_sequence() {
    let Some(dir) = arch_dir() else { return };
    let m = util::arch_fixture(&dir, "qwen35");
    let (ids, n_vocab) = (&m.ids, m.n_vocab);
    let reference = m.reference(&dir);
    let rows = |a: usize, b: usize| &reference[a * n_vocab..b * n_vocab];
    let model = Arc::new(Model::load(dir.join("qwen35.gguf"), &Mode::None.placement()).unwrap());
    let mut bs = BatchSession::new(model, opts(), 2).unwrap();
    assert!(!bs.batches_sequences());
    let all = |seq, tokens| SeqTokens {
        seq,
        tokens,
        outputs: Outputs::All,
    };
    let e = bs
        .eval(&[all(0, &ids[..4]), all(1, &ids[..4])])
        .unwrap_err();
    assert!(e.to_string().contains("one at a time"), "{e}");
    assert_eq!((bs.n_past(0).unwrap(), bs.n_past(1).unwrap()), (0, 0));

    // Both sequences read the same input in different chunks, one sequence per pass, interleaved:
    // each continues from its own state.
    let (mut got0, mut got1) = (Vec::new(), Vec::new());
    for (a, b) in [(0, 24), (24, 40), (40, 64)] {
        got0.extend(bs.eval(&[all(0, &ids[a..b])]).unwrap().remove(0).data);
        for i in a..b {
            got1.extend(bs.eval(&[all(1, &ids[i..i + 1])]).unwrap().remove(0).data);
        }
    }
    for (name, got) in [("chunks", &got0), ("one by one", &got1)] {
        let err = nmse(got, rows(0, 64));
        assert!(err <= 1e-5, "{name}: NMSE {err}");
    }
    // A partial truncation is refused; forgetting one sequence leaves the other's state alone.
    assert!(bs.truncate(0, 10).is_err());
    assert_eq!(bs.reusable_prefix(0, 10).unwrap(), 0);
    bs.truncate(0, 0).unwrap();
    bs.truncate(1, 40).unwrap_err();
    let again = bs.eval(&[all(0, &ids[..10])]).unwrap().remove(0).data;
    assert!(nmse(&again, rows(0, 10)) <= 1e-5);
    assert_eq!(bs.n_past(1).unwrap(), 64);
}
