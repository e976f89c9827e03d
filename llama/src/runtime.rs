//! Sessions: a model, its KV cache (and the recurrent state of delta-net layers) and a scheduler.
//! [`BatchSession`] keeps several sequences in one cache (a region and a recurrent state each) and
//! [`BatchSession::eval`] runs tokens of several of them in one forward pass (prompt chunks of some
//! next to decode tokens of others), so the weights are read once for all; a model with delta-net
//! layers runs one sequence per pass. [`Session`] is a batch session of one sequence:
//! [`Session::eval`] runs a batch of its tokens (a whole prompt in one graph, or one token per
//! decode step) at its next positions and returns the logits of the requested rows. A batch of
//! the previous one's make-up runs the previous graph again (see `pass.rs`).

use crate::kv::KvCache;
use crate::model::{Model, ModelError};
use crate::pass::{Part, PassStats, Passes};
use ggml_core::sched::Scheduler;
use ggml_core::DType;
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

/// A model with one sequence's KV cache (and recurrent state): a [`BatchSession`] of one sequence.
pub struct Session {
    batch: BatchSession,
}

/// The sequence of a [`Session`] in its batch session.
const ONE: usize = 0;

impl Session {
    pub fn new(model: Arc<Model>, opts: SessionOptions) -> Result<Session, ModelError> {
        Ok(Session {
            batch: BatchSession::new(model, opts, 1)?,
        })
    }

    pub fn model(&self) -> &Arc<Model> {
        self.batch.model()
    }

    /// Positions already in the cache.
    pub fn n_past(&self) -> usize {
        self.batch.n_past[ONE]
    }

    /// The scheduler.
    pub fn scheduler(&self) -> &Scheduler {
        self.batch.scheduler()
    }

    /// Forward passes run, and how many ran the previous pass's graph again.
    pub fn pass_stats(&self) -> PassStats {
        self.batch.pass_stats()
    }

    /// The KV cache.
    pub fn kv(&self) -> &KvCache {
        self.batch.kv()
    }

    /// Forgets every position.
    pub fn reset(&mut self) {
        self.batch.n_past[ONE] = 0;
    }

    /// Keeps the first `n` positions (later ones are overwritten by the next batch). A model with
    /// delta-net layers keeps a recurrent state that summarises every position: it can only go back
    /// to 0 or stay where it is, and any other `n` below [`Session::n_past`] is an error.
    pub fn truncate(&mut self, n: usize) -> Result<(), ModelError> {
        self.batch.truncate(ONE, n)
    }

    /// The most of the first `n` positions that [`Session::truncate`] can keep: all of them for
    /// attention-only models, else the whole cache when `n >= n_past` and none otherwise.
    pub fn reusable_prefix(&self, n: usize) -> usize {
        self.batch.prefix(ONE, n)
    }

    /// Keeps the longest reusable prefix of the first `n` positions and returns its length.
    pub fn keep_prefix(&mut self, n: usize) -> usize {
        self.batch.keep(ONE, n)
    }

    /// Runs `tokens` at positions `n_past..`, appends them to the cache and returns the logits of
    /// the requested rows. When the computation fails on a model with delta-net layers, their
    /// recurrent state may be half updated: the session then holds no position.
    pub fn eval(&mut self, tokens: &[u32], which: Outputs) -> Result<Logits, ModelError> {
        let part = SeqTokens {
            seq: ONE,
            tokens,
            outputs: which,
        };
        self.batch
            .eval(&[part])?
            .pop()
            .ok_or_else(|| ModelError::Input("no logits".into()))
    }
}

/// One sequence's tokens in a [`BatchSession::eval`] batch.
#[derive(Clone, Copy, Debug)]
pub struct SeqTokens<'a> {
    /// The sequence (`0..n_seq`).
    pub seq: usize,
    /// Its next tokens (at least one).
    pub tokens: &'a [u32],
    /// Which of them get logits.
    pub outputs: Outputs,
}

/// A model with the KV cache (and recurrent state) of several sequences, evaluated together.
pub struct BatchSession {
    model: Arc<Model>,
    kv: KvCache,
    sched: Scheduler,
    n_past: Vec<usize>,
    passes: Passes,
}

impl BatchSession {
    /// `n_seq` sequences of `opts.n_ctx` positions each.
    pub fn new(
        model: Arc<Model>,
        opts: SessionOptions,
        n_seq: usize,
    ) -> Result<BatchSession, ModelError> {
        let kv = KvCache::new(&model, opts.n_ctx, n_seq, opts.kv_type)?;
        let sched = Scheduler::new(model.placement().backends()?);
        Ok(BatchSession {
            model,
            kv,
            sched,
            n_past: vec![0; n_seq],
            passes: Passes::new(),
        })
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// The scheduler.
    pub fn scheduler(&self) -> &Scheduler {
        &self.sched
    }

    /// Forward passes run, and how many ran the previous pass's graph again.
    pub fn pass_stats(&self) -> PassStats {
        self.passes.stats()
    }

    /// The KV cache of every sequence (e.g. to save and restore one sequence's state).
    pub fn kv(&self) -> &KvCache {
        &self.kv
    }

    /// Whether one [`BatchSession::eval`] may hold several sequences (see
    /// [`crate::Arch::batches_sequences`]).
    pub fn batches_sequences(&self) -> bool {
        self.model.config.arch.batches_sequences()
    }

    fn check_seq(&self, seq: usize) -> Result<(), ModelError> {
        if seq >= self.n_past.len() {
            return Err(ModelError::Input(format!(
                "sequence {seq} of {}",
                self.n_past.len()
            )));
        }
        Ok(())
    }

    /// Positions of sequence `seq` already in the cache.
    pub fn n_past(&self, seq: usize) -> Result<usize, ModelError> {
        self.check_seq(seq)?;
        Ok(self.n_past[seq])
    }

    /// Declares the first `n` positions of sequence `seq` valid, after their K and V (and, for a
    /// model with delta-net layers, the recurrent state after them) were written into its region of
    /// [`BatchSession::kv`] from outside (a restored state).
    pub fn set_n_past(&mut self, seq: usize, n: usize) -> Result<(), ModelError> {
        self.check_seq(seq)?;
        check_len(&self.kv, n)?;
        self.n_past[seq] = n;
        Ok(())
    }

    /// Keeps the first `n` positions of sequence `seq` (0 forgets it). A model with delta-net layers
    /// can only go back to 0 or keep the sequence whole: any other `n` below its `n_past` is an
    /// error.
    pub fn truncate(&mut self, seq: usize, n: usize) -> Result<(), ModelError> {
        self.check_seq(seq)?;
        let want = self.n_past[seq].min(n);
        if self.prefix(seq, n) != want {
            return Err(ModelError::Input(format!(
                "cannot truncate {} positions to {n}: the recurrent state of the delta-net layers \
                 can only be cleared (truncate to 0) or kept whole",
                self.n_past[seq]
            )));
        }
        self.n_past[seq] = want;
        Ok(())
    }

    /// The most of the first `n` positions of sequence `seq` that [`BatchSession::truncate`] can
    /// keep: all of them for attention-only models, else the whole sequence when `n >= n_past` and
    /// none otherwise.
    pub fn reusable_prefix(&self, seq: usize, n: usize) -> Result<usize, ModelError> {
        self.check_seq(seq)?;
        Ok(self.prefix(seq, n))
    }

    /// Keeps the longest reusable prefix of the first `n` positions of sequence `seq` and returns
    /// its length.
    pub fn keep_prefix(&mut self, seq: usize, n: usize) -> Result<usize, ModelError> {
        self.check_seq(seq)?;
        Ok(self.keep(seq, n))
    }

    /// [`BatchSession::reusable_prefix`] of a valid `seq`.
    fn prefix(&self, seq: usize, n: usize) -> usize {
        let n_past = self.n_past[seq];
        if n >= n_past || self.kv.recurrent().is_empty() {
            n_past.min(n)
        } else {
            0
        }
    }

    /// [`BatchSession::keep_prefix`] of a valid `seq`.
    fn keep(&mut self, seq: usize, n: usize) -> usize {
        self.n_past[seq] = self.prefix(seq, n);
        self.n_past[seq]
    }

    /// Runs every part of `batch` (distinct sequences) in one forward pass, each at its sequence's
    /// next positions, appends them to their caches and returns each part's logits in batch order.
    /// Several sequences need a model that [`BatchSession::batches_sequences`]. A sequence at
    /// position 0 starts from a cleared recurrent state; when the pass fails on a model with
    /// delta-net layers, the states of its sequences may be half updated and they hold no position.
    pub fn eval(&mut self, batch: &[SeqTokens]) -> Result<Vec<Logits>, ModelError> {
        if batch.len() > 1 && !self.batches_sequences() {
            return Err(ModelError::Unsupported(format!(
                "{} sequences in one pass of {} (one at a time)",
                batch.len(),
                self.model.config.arch.name()
            )));
        }
        let mut parts = Vec::with_capacity(batch.len());
        for (i, b) in batch.iter().enumerate() {
            self.check_seq(b.seq)?;
            if batch[..i].iter().any(|o| o.seq == b.seq) {
                return Err(ModelError::Input(format!(
                    "sequence {} twice in one batch",
                    b.seq
                )));
            }
            parts.push(Part {
                seq: b.seq,
                n_past: self.n_past[b.seq],
                tokens: b.tokens,
                outputs: b.outputs,
            });
        }
        check_parts(&self.model, &self.kv, &parts)?;
        for p in parts.iter().filter(|p| p.n_past == 0) {
            self.kv.recurrent().clear(p.seq)?;
        }
        match self
            .passes
            .run(&self.model, &self.kv, &mut self.sched, &parts)
        {
            Ok(logits) => {
                for b in batch {
                    self.n_past[b.seq] += b.tokens.len();
                }
                Ok(logits)
            }
            Err(e) => {
                if !self.kv.recurrent().is_empty() {
                    // The recurrent states may be half updated: those sequences start over.
                    for b in batch {
                        self.n_past[b.seq] = 0;
                    }
                }
                Err(e)
            }
        }
    }
}

fn check_len(kv: &KvCache, n: usize) -> Result<(), ModelError> {
    if n > kv.n_ctx() {
        return Err(ModelError::Input(format!(
            "{n} positions exceed the context of {}",
            kv.n_ctx()
        )));
    }
    Ok(())
}

/// Refuses parts with no tokens, past the context or outside the vocabulary.
fn check_parts(model: &Model, kv: &KvCache, parts: &[Part]) -> Result<(), ModelError> {
    let n_vocab = model.config.n_vocab;
    if parts.is_empty() {
        return Err(ModelError::Input("an empty batch".into()));
    }
    for p in parts {
        if p.tokens.is_empty() {
            return Err(ModelError::Input(format!(
                "no tokens for sequence {}",
                p.seq
            )));
        }
        check_len(kv, p.positions().end)?;
        if let Some(&bad) = p.tokens.iter().find(|&&x| x as usize >= n_vocab) {
            return Err(ModelError::Input(format!(
                "token {bad} outside the vocabulary of {n_vocab}"
            )));
        }
    }
    Ok(())
}
