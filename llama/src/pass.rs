//! One forward pass of a batch session: the graph of a batch (its input tensors and logits),
//! built by [`crate::arch::shared::forward`] and planned by the scheduler, then run with the batch's
//! token ids, positions, cache rows and masks written into its inputs. A [`Passes`] keeps the last
//! graph: a batch of the same make-up (sequences, their token counts, attended cache lengths and
//! outputs; typically every decode step while the cache length stays in one
//! [`crate::kv::KV_PAD`] step) runs it again with new inputs, without building or planning, which
//! saves the host that work per token. Another shape is built again, and planned again unless the
//! scheduler kept the plan of a graph of that shape (the micro-batches of a prompt as long as an
//! earlier one's). The masks are written by runs straight into their tensors' memory when that is
//! host memory, else into a buffer the session keeps (no fresh allocation of a mask per pass).
//! `GGML_TP_TIMING=1` ([`crate::settings`]) keeps the host time of each phase and prints it when
//! the session drops.

use crate::arch::shared::forward::{self, Inputs, SeqInputs};
use crate::kv::{self, KvCache};
use crate::model::{Model, ModelError};
use crate::runtime::{Logits, Outputs};
use ggml_core::sched::Scheduler;
use ggml_core::{DType, Graph, TensorId};
use std::time::{Duration, Instant};

/// One sequence's tokens in a forward pass, at positions `n_past..`.
pub(crate) struct Part<'a> {
    pub seq: usize,
    pub n_past: usize,
    pub tokens: &'a [u32],
    pub outputs: Outputs,
}

impl Part<'_> {
    /// The positions of its tokens.
    pub fn positions(&self) -> std::ops::Range<usize> {
        self.n_past..self.n_past + self.tokens.len()
    }

    /// How many positions get logits.
    fn n_outputs(&self) -> usize {
        match self.outputs {
            Outputs::All => self.tokens.len(),
            Outputs::Last => 1,
        }
    }

    /// The positions whose logits are wanted.
    fn out_positions(&self) -> Vec<usize> {
        let all = self.positions();
        match self.outputs {
            Outputs::All => all.collect(),
            Outputs::Last => vec![all.end - 1],
        }
    }
}

/// What a pass's graph depends on: per part its sequence, token count, attended cache length and
/// number of outputs.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Shape(Vec<[usize; 4]>);

impl Shape {
    fn of(kv: &KvCache, parts: &[Part]) -> Shape {
        Shape(
            parts
                .iter()
                .map(|p| {
                    [
                        p.seq,
                        p.tokens.len(),
                        kv.n_kv_for(p.positions().end),
                        p.n_outputs(),
                    ]
                })
                .collect(),
        )
    }
}

/// A planned graph and its inputs.
struct Built {
    shape: Shape,
    graph: Graph,
    inputs: Inputs,
    logits: TensorId,
}

/// How many forward passes a session ran, how many of them ran the previous pass's graph, and
/// how many built a graph whose plan the scheduler had kept.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassStats {
    pub passes: u64,
    pub reused_graphs: u64,
    pub reused_plans: u64,
}

/// Host time spent in each phase of the forward passes of a session.
#[derive(Default)]
struct PassTiming {
    phases: [Duration; 5],
}

const PHASES: [&str; 5] = ["build", "alloc", "inputs", "compute", "read"];

impl PassTiming {
    fn report(&self, stats: PassStats) -> String {
        let n = stats.passes.max(1) as f64;
        let parts: Vec<String> = PHASES
            .iter()
            .zip(&self.phases)
            .map(|(name, d)| format!("{name} {:.1}", d.as_secs_f64() * 1e6 / n))
            .collect();
        format!(
            "{} passes ({} reused a graph, {} a plan), host us per pass: {}",
            stats.passes,
            stats.reused_graphs,
            stats.reused_plans,
            parts.join(", ")
        )
    }
}

/// The forward passes of one session: the last graph, kept for reuse, and the buffer masks are
/// written in when their tensors live in device memory.
pub(crate) struct Passes {
    last: Option<Built>,
    masks: Vec<f32>,
    stats: PassStats,
    timing: Option<PassTiming>,
}

impl Passes {
    pub fn new() -> Passes {
        let timing = crate::settings::settings().timing.then(PassTiming::default);
        Passes {
            last: None,
            masks: Vec::new(),
            stats: PassStats::default(),
            timing,
        }
    }

    pub fn stats(&self) -> PassStats {
        self.stats
    }

    /// Runs one forward pass over `parts` (distinct sequences of `kv`, checked by the caller), each
    /// sequence's tokens a contiguous run of the batch; returns each part's logits. The graph of
    /// the previous pass is run again when the batch has its shape; `sched` must not have planned
    /// another graph since (the session owns both).
    pub fn run(
        &mut self,
        model: &Model,
        kv: &KvCache,
        sched: &mut Scheduler,
        parts: &[Part],
    ) -> Result<Vec<Logits>, ModelError> {
        let mut clock = Instant::now();
        let timing = &mut self.timing;
        let mut lap = |phase: usize| {
            if let Some(t) = timing.as_mut() {
                let now = Instant::now();
                t.phases[phase] += now - clock;
                clock = now;
            }
        };
        let shape = Shape::of(kv, parts);
        let reuse = self.last.as_ref().is_some_and(|b| b.shape == shape);
        if !reuse {
            // A failed build or plan leaves no graph to reuse (the scheduler may hold a partial plan).
            self.last = None;
            let mut built = build(model, kv, parts, shape)?;
            lap(0);
            let kept = sched.stats().reuses;
            sched.alloc(&mut built.graph)?;
            self.stats.reused_plans += sched.stats().reuses - kept;
            lap(1);
            self.last = Some(built);
        }
        let built = self.last.as_ref().expect("built above or reused");
        let result = run(model, kv, sched, parts, built, &mut self.masks, &mut lap);
        if result.is_err() {
            self.last = None;
        }
        self.stats.passes += 1;
        self.stats.reused_graphs += u64::from(reuse);
        result
    }
}

impl Drop for Passes {
    fn drop(&mut self) {
        if let Some(t) = &self.timing {
            eprintln!("session timing: {}", t.report(self.stats));
        }
    }
}

/// The graph of a batch of `parts` with the given shape.
fn build(model: &Model, kv: &KvCache, parts: &[Part], shape: Shape) -> Result<Built, ModelError> {
    let cfg = &model.config;
    let t: usize = parts.iter().map(|p| p.tokens.len()).sum();
    let n_out: usize = shape.0.iter().map(|s| s[3]).sum();
    let has_swa = cfg.n_swa > 0 && cfg.swa_layers.iter().any(|&s| s);
    let mut g = Graph::new();
    let mut seqs = Vec::with_capacity(parts.len());
    let mut first = 0;
    for (p, s) in parts.iter().zip(&shape.0) {
        let (n, n_kv) = (p.tokens.len(), s[2]);
        seqs.push(SeqInputs {
            seq: p.seq,
            first,
            n_tokens: n,
            kv_start: kv.row(p.seq, 0),
            n_kv,
            mask: g.new_input(DType::F32, &[n_kv, n])?,
            mask_swa: if has_swa {
                Some(g.new_input(DType::F32, &[n_kv, n])?)
            } else {
                None
            },
        });
        first += n;
    }
    let inputs = Inputs {
        tokens: g.new_input(DType::I32, &[t])?,
        pos: g.new_input(DType::I32, &[t])?,
        kv_rows: g.new_input(DType::I32, &[t])?,
        seqs,
        out_ids: if n_out < t {
            Some(g.new_input(DType::I32, &[n_out])?)
        } else {
            None
        },
    };
    let logits = forward::build(&mut g, &model.config, &model.weights, kv, &inputs, t)?;
    Ok(Built {
        shape,
        graph: g,
        inputs,
        logits,
    })
}

/// Writes the batch into the inputs of `built` (the masks through `masks`, see [`Passes`]),
/// computes it and reads the logits.
fn run(
    model: &Model,
    kv: &KvCache,
    sched: &mut Scheduler,
    parts: &[Part],
    built: &Built,
    masks: &mut Vec<f32>,
    lap: &mut dyn FnMut(usize),
) -> Result<Vec<Logits>, ModelError> {
    let (g, inp) = (&built.graph, &built.inputs);
    let per_token = |f: &dyn Fn(&Part, usize, usize) -> i32| -> Vec<i32> {
        parts
            .iter()
            .flat_map(|p| {
                p.positions()
                    .zip(p.tokens)
                    .map(move |(x, &tok)| f(p, x, tok as usize))
            })
            .collect()
    };
    g.set_i32(inp.tokens, &per_token(&|_, _, tok| tok as i32))?;
    g.set_i32(inp.pos, &per_token(&|_, x, _| x as i32))?;
    g.set_i32(inp.kv_rows, &per_token(&|p, x, _| kv.row(p.seq, x) as i32))?;
    let n_swa = model.config.n_swa;
    for (p, s) in parts.iter().zip(&inp.seqs) {
        let windows = std::iter::once((s.mask, 0)).chain(s.mask_swa.map(|m| (m, n_swa)));
        for (mask, swa) in windows {
            g.write_f32(mask, masks, |m| kv::write_mask(m, p.n_past, s.n_kv, swa))?;
        }
    }
    if let Some(o) = inp.out_ids {
        // Batch rows whose logits are wanted.
        let mut out_rows: Vec<i32> = Vec::new();
        let mut first = 0;
        for p in parts {
            out_rows.extend(
                p.out_positions()
                    .into_iter()
                    .map(|x| (first + x - p.n_past) as i32),
            );
            first += p.tokens.len();
        }
        g.set_i32(o, &out_rows)?;
    }
    lap(2);
    sched.compute(g)?;
    lap(3);
    let mut data = g.get_f32(built.logits)?;
    lap(4);
    let n_vocab = model.config.n_vocab;
    // Each part's rows, split off the end (the first part keeps the read buffer itself).
    let positions: Vec<_> = parts.iter().map(|p| p.out_positions()).collect();
    let rows: usize = positions.iter().map(Vec::len).sum();
    data.truncate(rows * n_vocab);
    let mut logits = Vec::with_capacity(parts.len());
    for positions in positions.into_iter().rev() {
        let start = data.len() - positions.len() * n_vocab;
        let rows = if start == 0 {
            std::mem::take(&mut data)
        } else {
            data.split_off(start)
        };
        logits.push(Logits {
            n_vocab,
            positions,
            data: rows,
        });
    }
    logits.reverse();
    Ok(logits)
}
