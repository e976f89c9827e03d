//! The three real models (SmolLM2-135M Q4_1, Gemma-3-270M Q4_K_M, Qwen2.5-Coder-0.5B) against
//! llama.cpp's logits and greedy continuations of `fixtures/reference` (prompt ids from the
//! `.tokens.i32` files, F16 KV cache as in the reference), for the three prompts p1, p2, p3, in
//! every split mode: one device, layers over 2 devices, tensor parallel over 2 and 3 devices (even)
//! and over 3 devices at 3:1:1. One `#[test]` per model and mode, so they run in parallel; each
//! loads its model once for the three cases.
//!
//! With the limits the fixtures' README suggests (about twice the worst its two correct variants
//! reached):
//! * prompt logits: KL(ref ‖ ours) mean ≤ 0.02 and at any position ≤ 0.3, NMSE per position ≤ 0.15
//!   and its mean ≤ 0.01 (cases of ≥ 8 positions stored in full), the argmax equal wherever the
//!   reference's top-1 − top-2 margin is ≥ 1.0; the max abs logit difference is reported only. Where
//!   the reference stores the top 32 logits of a position (p3, Gemma's p1) instead of all, KL is the
//!   README's bucketed KL over those 32 ids plus the rest of the mass, NMSE is over the 32 ids, and
//!   the last position is compared in full;
//! * teacher-forced greedy: the prompt, then llama.cpp's 32 greedy tokens fed one per step; our
//!   argmax must equal its token at every step whose reference margin is ≥ 1.0;
//! * free-running greedy: the generation loop (greedy sampler) from the prompt must produce llama.cpp's
//!   tokens up to the first step whose reference margin is < 1.0, where a near-tie may go either way.
//!
//! The three prompts of a model run as three sequences of one [`BatchSession`] (one pass for the
//! prompts, one per teacher-forced step), so the weights are read once for all three; the
//! free-running check uses the single-sequence [`llama::Session`] of the generation loop.
//! Models come from `GGML_TP_MODELS`, else `<repo>/models`, else the user's model cache
//! (`cargo xtask models`); without them the tests print `skipped: models not found`.

#[path = "logits_util.rs"]
mod util;

use ggml_core::gguf::GgufFile;
use llama::generate::{GenerateOptions, Generator};
use llama::sampling::{Sampler, SamplingParams};
use llama::tokenizer::Tokenizer;
use llama::{BatchSession, Logits, Model, Outputs, SeqTokens, SessionOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use util::{argmax, fixtures, kl, margin, model_file, nmse, Mode};

const CASES: [&str; 3] = ["p1", "p2", "p3"];
/// Entries of the stored top-k lists.
const TOP: usize = 32;

/// Per-case metrics over the prompt positions.
#[derive(Default, Debug)]
struct Stats {
    n: usize,
    kl_sum: f64,
    kl_max: f64,
    /// NMSE over whole rows (positions stored in full).
    full_nmse: Vec<f64>,
    /// NMSE over the stored top-32 ids (other positions).
    top_nmse: Vec<f64>,
    max_abs: f32,
    argmax_misses: Vec<usize>,
}

impl Stats {
    fn add_kl(&mut self, k: f64) {
        self.n += 1;
        self.kl_sum += k;
        self.kl_max = self.kl_max.max(k);
    }

    /// Position `p` against its full reference row.
    fn add_full(&mut self, p: usize, cand: &[f32], reference: &[f32]) {
        self.add_kl(kl(reference, cand));
        self.full_nmse.push(nmse(cand, reference));
        self.max_abs = cand
            .iter()
            .zip(reference)
            .fold(self.max_abs, |m, (a, b)| m.max((a - b).abs()));
        if margin(reference) >= 1.0 && argmax(cand) != argmax(reference) {
            self.argmax_misses.push(p);
        }
    }

    /// Position `p` against the reference's top-32 `ids` / `logits` and its log-sum-exp `lse`.
    fn add_top(&mut self, p: usize, cand: &[f32], ids: &[i32], logits: &[f32], lse: f32) {
        self.add_kl(bucketed_kl(cand, ids, logits, lse));
        let picked: Vec<f32> = ids.iter().map(|&i| cand[i as usize]).collect();
        self.top_nmse.push(nmse(&picked, logits));
        self.max_abs = picked
            .iter()
            .zip(logits)
            .fold(self.max_abs, |m, (a, b)| m.max((a - b).abs()));
        if logits[0] - logits[1] >= 1.0 && argmax(cand) != ids[0] as usize {
            self.argmax_misses.push(p);
        }
    }

    fn check(&self, what: &str) -> Result<(), String> {
        let kl_mean = self.kl_sum / self.n as f64;
        let max = |v: &[f64]| v.iter().fold(0.0f64, |m, &e| m.max(e));
        let (full_max, top_max) = (max(&self.full_nmse), max(&self.top_nmse));
        let full_mean = self.full_nmse.iter().sum::<f64>() / self.full_nmse.len().max(1) as f64;
        println!(
            "{what}: {} positions, KL mean {kl_mean:.2e} max {:.2e}, NMSE of {} full rows mean {full_mean:.2e} max {full_max:.2e}, of {} top-32 rows max {top_max:.2e}, max |d| {:.2}, argmax misses {:?}",
            self.n,
            self.kl_max,
            self.full_nmse.len(),
            self.top_nmse.len(),
            self.max_abs,
            self.argmax_misses
        );
        let ok = kl_mean <= 0.02
            && self.kl_max <= 0.3
            && (self.full_nmse.len() < 8 || full_mean <= 0.01)
            && full_max <= 0.15
            && top_max <= 0.15
            && self.argmax_misses.is_empty();
        ok.then_some(()).ok_or_else(|| format!("{what}: {self:?}"))
    }
}

/// KL(ref ‖ cand) over the reference's top-32 ids plus one bucket for the rest of the mass, the
/// reference normalised by its log-sum-exp over the whole vocabulary.
fn bucketed_kl(cand: &[f32], ids: &[i32], logits: &[f32], lse: f32) -> f64 {
    let m = cand.iter().fold(f64::NEG_INFINITY, |a, &v| a.max(v as f64));
    let cand_lse = m + cand.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
    let (mut sum, mut p_top, mut q_top) = (0.0, 0.0, 0.0);
    for (&id, &r) in ids.iter().zip(logits) {
        let lp = r as f64 - lse as f64;
        let lq = cand[id as usize] as f64 - cand_lse;
        sum += lp.exp() * (lp - lq);
        p_top += lp.exp();
        q_top += lq.exp();
    }
    let (p_rest, q_rest) = ((1.0 - p_top).max(0.0), (1.0 - q_top).max(1e-30));
    if p_rest > 0.0 {
        sum += p_rest * (p_rest / q_rest).ln();
    }
    sum
}

/// One case's reference data.
struct Case {
    name: &'static str,
    tokens: Vec<u32>,
    /// Every position's logits, when stored.
    full: Option<Vec<f32>>,
    last: Vec<f32>,
    top_ids: Vec<i32>,
    top_logits: Vec<f32>,
    lse: Vec<f32>,
    greedy: Vec<u32>,
    /// The reference's top-1 − top-2 margin at each greedy step.
    greedy_margin: Vec<f32>,
}

impl Case {
    fn read(dir: &Path, name: &'static str, n_vocab: usize) -> Case {
        let f = |s: &str| dir.join(format!("{name}.{s}"));
        let ids = |s: &str| util::read_i32(&f(s));
        let full = f("logits.f32")
            .exists()
            .then(|| util::read_f32(&f("logits.f32")));
        let last = match &full {
            Some(all) => all[all.len() - n_vocab..].to_vec(),
            None => util::read_f32(&f("last_logits.f32")),
        };
        let greedy_top = util::read_f32(&f("greedy_top32_logits.f32"));
        Case {
            name,
            tokens: ids("tokens.i32").into_iter().map(|t| t as u32).collect(),
            full,
            last,
            top_ids: ids("top32_ids.i32"),
            top_logits: util::read_f32(&f("top32_logits.f32")),
            lse: util::read_f32(&f("logsumexp.f32")),
            greedy: ids("greedy_ids.i32")
                .into_iter()
                .map(|t| t as u32)
                .collect(),
            greedy_margin: greedy_top.chunks(TOP).map(|top| top[0] - top[1]).collect(),
        }
    }

    /// Compares the prompt's logits (every position).
    fn check_prompt(&self, got: &Logits, what: &str) -> Result<(), String> {
        let n_vocab = got.n_vocab;
        let n = self.tokens.len();
        assert_eq!(got.positions.len(), n);
        let mut stats = Stats::default();
        for p in 0..n {
            let row = got.row(p);
            match &self.full {
                Some(all) => stats.add_full(p, row, &all[p * n_vocab..(p + 1) * n_vocab]),
                None if p == n - 1 => stats.add_full(p, row, &self.last),
                None => {
                    let r = p * TOP..(p + 1) * TOP;
                    stats.add_top(
                        p,
                        row,
                        &self.top_ids[r.clone()],
                        &self.top_logits[r],
                        self.lse[p],
                    );
                }
            }
        }
        stats.check(what)
    }

    /// Steps of the free-running comparison: those before the first reference margin < 1.0.
    fn sure_steps(&self) -> usize {
        self.greedy_margin.iter().take_while(|&&m| m >= 1.0).count()
    }
}

fn model_and_reference(key: &str, file: &str) -> Option<(PathBuf, PathBuf)> {
    let Some(fx) = fixtures() else {
        println!("skipped: fixtures not found");
        return None;
    };
    let path = model_file(file)?;
    Some((path, fx.join("reference").join(key)))
}

/// Every check of model `key` (GGUF `file`) in `mode`.
fn check_model(key: &str, file: &str, mode: Mode) {
    if mode.needs() > util::available() {
        println!("skipped: {mode:?} needs {} devices", mode.needs());
        return;
    }
    let Some((path, dir)) = model_and_reference(key, file) else {
        return;
    };
    let t0 = std::time::Instant::now();
    let model = Arc::new(Model::load(&path, &mode.placement()).unwrap());
    let n_vocab = model.config.n_vocab;
    let cases: Vec<Case> = CASES
        .iter()
        .map(|&c| Case::read(&dir, c, n_vocab))
        .collect();
    let mut failures = Vec::new();
    let opts = SessionOptions {
        n_ctx: 128,
        ..SessionOptions::default()
    };
    let mut s = BatchSession::new(model.clone(), opts, cases.len()).unwrap();
    let prompts: Vec<SeqTokens> = cases
        .iter()
        .enumerate()
        .map(|(seq, c)| SeqTokens {
            seq,
            tokens: &c.tokens,
            outputs: Outputs::All,
        })
        .collect();
    let prompt_logits = s.eval(&prompts).unwrap();
    for (c, got) in cases.iter().zip(&prompt_logits) {
        if let Err(e) = c.check_prompt(got, &format!("{key} {} {mode:?}", c.name)) {
            failures.push(e);
        }
    }
    failures.extend(teacher_forced(&mut s, &cases, &prompt_logits, key, &mode));
    failures.extend(free_running(&path, &model, &cases, key, &mode));
    println!("{key} {mode:?}: {:.1} s", t0.elapsed().as_secs_f64());
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Feeds every case's reference greedy tokens one per step (all cases in one pass per step); our
/// argmax must follow them wherever the reference's margin is ≥ 1.0.
fn teacher_forced(
    s: &mut BatchSession,
    cases: &[Case],
    prompt_logits: &[Logits],
    key: &str,
    mode: &Mode,
) -> Vec<String> {
    let mut last: Vec<Vec<f32>> = prompt_logits.iter().map(|l| l.last().to_vec()).collect();
    let mut misses = vec![Vec::new(); cases.len()];
    let steps = cases.iter().map(|c| c.greedy.len()).max().unwrap_or(0);
    for k in 0..steps {
        let mut parts = Vec::new();
        for (seq, c) in cases.iter().enumerate() {
            let Some(&want) = c.greedy.get(k) else {
                continue;
            };
            let got = argmax(&last[seq]);
            if c.greedy_margin[k] >= 1.0 && got != want as usize {
                misses[seq].push((k, got, want));
            }
            parts.push(SeqTokens {
                seq,
                tokens: std::slice::from_ref(&c.greedy[k]),
                outputs: Outputs::Last,
            });
        }
        let logits = s.eval(&parts).unwrap();
        for (p, l) in parts.iter().zip(logits) {
            last[p.seq] = l.last().to_vec();
        }
    }
    let mut failures = Vec::new();
    for (c, m) in cases.iter().zip(misses) {
        let what = format!("{key} {} {mode:?}", c.name);
        println!(
            "{what}: teacher-forced {} steps, misses (step, ours, llama.cpp) {m:?}",
            c.greedy.len()
        );
        if !m.is_empty() {
            failures.push(format!("{what} teacher-forced: {m:?}"));
        }
    }
    failures
}

/// Generates greedily from each prompt until the first reference step with a margin < 1.0; the
/// tokens must be llama.cpp's.
fn free_running(
    path: &Path,
    model: &Arc<Model>,
    cases: &[Case],
    key: &str,
    mode: &Mode,
) -> Vec<String> {
    let mut failures = Vec::new();
    let mut tokenizer = None;
    for c in cases {
        let n = c.sure_steps();
        let what = format!("{key} {} {mode:?}", c.name);
        if n == 0 {
            println!("{what}: free-running greedy: step 0 is a near-tie, nothing to compare");
            continue;
        }
        let tok = tokenizer
            .get_or_insert_with(|| Tokenizer::from_gguf(&GgufFile::open(path).unwrap()).unwrap());
        let mut g = Generator::new(model.clone(), SessionOptions::default()).unwrap();
        let mut sampler = Sampler::new(SamplingParams::greedy()).unwrap();
        let opts = GenerateOptions {
            max_tokens: n,
            stop: Vec::new(),
            constraint: None,
        };
        let out = g
            .generate(tok, &mut sampler, &c.tokens, &opts, |_| true)
            .unwrap();
        println!(
            "{what}: free-running greedy {n} steps: {:?}",
            out.tokens == c.greedy[..n]
        );
        if out.tokens != c.greedy[..n] {
            failures.push(format!(
                "{what} free-running: {:?}, llama.cpp {:?}",
                out.tokens,
                &c.greedy[..n]
            ));
        }
    }
    failures
}

const SMOLLM2: (&str, &str) = ("smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf");
const GEMMA3: (&str, &str) = ("gemma3-270m", "gemma-3-270m-q4_k_m.gguf");
const QWEN25: (&str, &str) = ("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct.gguf");

/// One test per model and split mode.
macro_rules! real_model_tests {
    ($($test:ident: $model:expr, $mode:expr;)*) => {$(
        #[test]
        fn $test() {
            check_model($model.0, $model.1, $mode);
        }
    )*};
}

real_model_tests! {
    smollm2_one_device: SMOLLM2, Mode::None;
    smollm2_layers_2: SMOLLM2, Mode::Layers(vec![1.0, 1.0]);
    smollm2_tensor_2: SMOLLM2, Mode::Tensor(vec![1.0, 1.0]);
    smollm2_tensor_3: SMOLLM2, Mode::Tensor(vec![1.0, 1.0, 1.0]);
    smollm2_tensor_3_1_1: SMOLLM2, Mode::Tensor(vec![3.0, 1.0, 1.0]);
    gemma3_one_device: GEMMA3, Mode::None;
    gemma3_layers_2: GEMMA3, Mode::Layers(vec![1.0, 1.0]);
    gemma3_tensor_2: GEMMA3, Mode::Tensor(vec![1.0, 1.0]);
    gemma3_tensor_3: GEMMA3, Mode::Tensor(vec![1.0, 1.0, 1.0]);
    gemma3_tensor_3_1_1: GEMMA3, Mode::Tensor(vec![3.0, 1.0, 1.0]);
    qwen25_one_device: QWEN25, Mode::None;
    qwen25_layers_2: QWEN25, Mode::Layers(vec![1.0, 1.0]);
    qwen25_tensor_2: QWEN25, Mode::Tensor(vec![1.0, 1.0]);
    qwen25_tensor_3: QWEN25, Mode::Tensor(vec![1.0, 1.0, 1.0]);
    qwen25_tensor_3_1_1: QWEN25, Mode::Tensor(vec![3.0, 1.0, 1.0]);
}
