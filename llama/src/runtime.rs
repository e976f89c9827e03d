//! Sessions: a model, its KV cache (and recurrent state) and a scheduler. [`Session::eval`] runs a
//! batch of tokens (a whole prompt in one graph, or one token per decode step) at the next positions
//! and returns the logits of the requested rows. Graphs are rebuilt per call; their structure repeats while the attended
//! cache length stays in one [`crate::kv::KV_PAD`] step, so the scheduler and the meta backend reuse
//! their plans.

use crate::arch::forward::{self, Inputs};
use crate::kv::{self, KvCache};
use crate::model::{Model, ModelError};
use ggml_core::sched::Scheduler;
use ggml_core::{DType, Graph};
use std::sync::Arc;

/// Options of a session.
#[derive(Clone, Copy, Debug)]
pub struct SessionOptions {
    /// Cache slots (the longest sequence).
    pub n_ctx: usize,
    /// Element type of the KV cache (F16, F32 or Q8_0).
    pub kv_type: DType,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            n_ctx: 512,
            kv_type: DType::F16,
        }
    }
}

/// Which rows of a batch get logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outputs {
    /// Every position.
    All,
    /// The last position only.
    Last,
}

/// Logits of some positions of a batch, row-major `[positions.len(), n_vocab]`.
#[derive(Clone, Debug)]
pub struct Logits {
    pub n_vocab: usize,
    /// Absolute positions of the rows.
    pub positions: Vec<usize>,
    pub data: Vec<f32>,
}

impl Logits {
    /// The logits of row `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.n_vocab..(i + 1) * self.n_vocab]
    }

    /// The logits of the last row.
    pub fn last(&self) -> &[f32] {
        self.row(self.positions.len() - 1)
    }
}

/// A model with one sequence's KV cache.
pub struct Session {
    model: Arc<Model>,
    kv: KvCache,
    sched: Scheduler,
    n_past: usize,
}

impl Session {
    pub fn new(model: Arc<Model>, opts: SessionOptions) -> Result<Session, ModelError> {
        let kv = KvCache::new(&model, opts.n_ctx, opts.kv_type)?;
        let sched = Scheduler::new(model.placement().backends()?);
        Ok(Session {
            model,
            kv,
            sched,
            n_past: 0,
        })
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Positions already in the cache.
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// The scheduler (its statistics show plan reuse).
    pub fn scheduler(&self) -> &Scheduler {
        &self.sched
    }

    /// The KV cache (its tensors, e.g. to save and restore a sequence's state).
    pub fn kv(&self) -> &KvCache {
        &self.kv
    }

    /// Declares the first `n` cache positions valid, after their K and V (and, for a model with
    /// delta-net layers, the recurrent state after them) were written into [`Session::kv`]'s
    /// tensors from outside (a restored state).
    pub fn set_n_past(&mut self, n: usize) -> Result<(), ModelError> {
        if n > self.kv.n_ctx() {
            return Err(ModelError::Input(format!(
                "{n} positions exceed the context of {}",
                self.kv.n_ctx()
            )));
        }
        self.n_past = n;
        Ok(())
    }

    /// Forgets every position.
    pub fn reset(&mut self) {
        self.n_past = 0;
    }

    /// Keeps the first `n` positions (later ones are overwritten by the next batch). A model with
    /// delta-net layers keeps a recurrent state that summarises every position: it can only go back
    /// to 0 or stay where it is, and any other `n` below [`Session::n_past`] is an error.
    pub fn truncate(&mut self, n: usize) -> Result<(), ModelError> {
        let want = self.n_past.min(n);
        if self.reusable_prefix(n) != want {
            return Err(ModelError::Input(format!(
                "cannot truncate {} positions to {n}: the recurrent state of the delta-net layers \
                 can only be cleared (truncate to 0) or kept whole",
                self.n_past
            )));
        }
        self.n_past = want;
        Ok(())
    }

    /// The most of the first `n` positions that [`Session::truncate`] can keep: all of them for
    /// attention-only models, else the whole cache when `n >= n_past` and none otherwise.
    pub fn reusable_prefix(&self, n: usize) -> usize {
        if n >= self.n_past || self.kv.recurrent().is_empty() {
            self.n_past.min(n)
        } else {
            0
        }
    }

    /// Keeps the longest reusable prefix of the first `n` positions and returns its length.
    pub fn keep_prefix(&mut self, n: usize) -> usize {
        self.n_past = self.reusable_prefix(n);
        self.n_past
    }

    /// Runs `tokens` at positions `n_past..`, appends them to the cache and returns the logits of
    /// the requested rows. When the computation fails on a model with delta-net layers, their
    /// recurrent state may be half updated: the session then holds no position.
    pub fn eval(&mut self, tokens: &[u32], which: Outputs) -> Result<Logits, ModelError> {
        let cfg = &self.model.config;
        let t = tokens.len();
        if t == 0 {
            return Err(ModelError::Input("an empty batch".into()));
        }
        let end = self.n_past + t;
        if end > self.kv.n_ctx() {
            return Err(ModelError::Input(format!(
                "{end} positions exceed the context of {}",
                self.kv.n_ctx()
            )));
        }
        if let Some(&bad) = tokens.iter().find(|&&x| x as usize >= cfg.n_vocab) {
            return Err(ModelError::Input(format!(
                "token {bad} outside the vocabulary of {}",
                cfg.n_vocab
            )));
        }
        if self.n_past == 0 {
            // A new sequence: its recurrent state starts from zero.
            self.kv.recurrent().clear()?;
        }
        let n_kv = self.kv.n_kv_for(end);
        let mut g = Graph::new();
        let has_swa = cfg.n_swa > 0 && cfg.swa_layers.iter().any(|&s| s);
        let out_rows: Vec<usize> = match which {
            Outputs::All => (0..t).collect(),
            Outputs::Last => vec![t - 1],
        };
        let inp = Inputs {
            tokens: g.new_input(DType::I32, &[t])?,
            pos: g.new_input(DType::I32, &[t])?,
            mask: g.new_input(DType::F32, &[n_kv, t])?,
            mask_swa: if has_swa {
                Some(g.new_input(DType::F32, &[n_kv, t])?)
            } else {
                None
            },
            out_ids: if out_rows.len() < t {
                Some(g.new_input(DType::I32, &[out_rows.len()])?)
            } else {
                None
            },
        };
        let logits = forward::build(&mut g, &self.model, &self.kv, &inp, t, n_kv)?;
        self.sched.alloc(&mut g)?;
        let ids: Vec<i32> = tokens.iter().map(|&x| x as i32).collect();
        g.set_i32(inp.tokens, &ids)?;
        let pos: Vec<i32> = (self.n_past..end).map(|p| p as i32).collect();
        g.set_i32(inp.pos, &pos)?;
        g.set_f32(inp.mask, &kv::mask(self.n_past, t, n_kv, 0))?;
        if let Some(m) = inp.mask_swa {
            g.set_f32(m, &kv::mask(self.n_past, t, n_kv, cfg.n_swa))?;
        }
        if let Some(o) = inp.out_ids {
            let rows: Vec<i32> = out_rows.iter().map(|&r| r as i32).collect();
            g.set_i32(o, &rows)?;
        }
        if let Err(e) = self.sched.compute(&g) {
            if !self.kv.recurrent().is_empty() {
                // The recurrent state may be half updated: the sequence starts over.
                self.n_past = 0;
            }
            return Err(e.into());
        }
        let data = g.get_f32(logits)?;
        let positions = out_rows.iter().map(|r| self.n_past + r).collect();
        self.n_past = end;
        Ok(Logits {
            n_vocab: cfg.n_vocab,
            positions,
            data,
        })
    }
}
