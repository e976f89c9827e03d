//! Token sampling from logits, in llama.cpp's order: penalties → top-k → top-p → min-p →
//! temperature → softmax → a draw from a seeded RNG.
//!
//! [`Sampler::sample`] picks one token from a logits row (`n_vocab` values) and the history of
//! previous tokens. With `temperature <= 0` it is greedy: the argmax of the penalized logits, the
//! lowest id on ties. Otherwise the chain below narrows the candidates and draws from
//! `softmax(logit / temperature)` over what is left, with a ChaCha RNG seeded from
//! [`SamplingParams::seed`], so the same seed and the same logits give the same token sequence.
//!
//! * penalties (llama.cpp's `penalties` sampler): for every token that occurs `c > 0` times in the last
//!   `repeat_last_n` tokens of the history, a logit `<= 0` is multiplied by `repeat_penalty` and a
//!   positive one divided by it; then `c * frequency_penalty + presence_penalty` is subtracted.
//! * top-k keeps the `top_k` largest logits (0 = off), found by selection, not a full sort.
//! * top-p keeps the smallest prefix of the candidates, largest first, whose probabilities (at
//!   temperature 1) add up to `top_p` or more (1 = off). The prefix is sorted incrementally, so a
//!   262k vocabulary is never sorted whole unless the distribution is that flat.
//! * min-p keeps the tokens with `p >= min_p * p_max` (0 = off).
//!
//! NaN logits count as `-inf`; `+inf` as the largest finite `f32`. Every filter keeps at least one token.
//!
//! A logit bias ([`Sampler::with_logit_bias`], OpenAI's `logit_bias`) is added to the raw logits
//! before the chain; a bias of [`BAN_BIAS`] or less removes the token. [`log_probs`] reports the
//! log-probabilities of the raw logits (a log-softmax in f64, before bias and the chain), as
//! OpenAI's `logprobs` do.
//!
//! [`Sampler::sample_allowed`] samples among the tokens a filter allows (a grammar's mask, see
//! [`crate::constraint`]): the others get `-inf` right after the bias, before the chain.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

/// Errors of building a sampler or sampling a token.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplingError {
    #[error("invalid sampling parameter {name} = {value}: {reason}")]
    InvalidParam {
        name: &'static str,
        value: f32,
        reason: &'static str,
    },
    #[error("empty logits")]
    EmptyLogits,
    #[error("all {0} logits are NaN or -inf")]
    NoFiniteLogits(usize),
    #[error("history token {token} is out of the vocabulary (n_vocab = {n_vocab})")]
    TokenOutOfRange { token: u32, n_vocab: usize },
    #[error(
        "logit bias {bias} of token {token}: must be finite, in [-{BIAS_LIMIT}, {BIAS_LIMIT}]"
    )]
    InvalidBias { token: u32, bias: f32 },
    #[error("logit bias of token {token}, outside the vocabulary (n_vocab = {n_vocab})")]
    BiasOutOfRange { token: u32, n_vocab: usize },
    #[error("the constraint allows none of the {0} tokens that have a finite logit")]
    NothingAllowed(usize),
}

/// The largest magnitude of a logit bias (OpenAI's range).
pub const BIAS_LIMIT: f32 = 100.0;

/// A bias at or below this removes the token from the candidates.
pub const BAN_BIAS: f32 = -BIAS_LIMIT;

/// The knobs of [`Sampler`]; the defaults are llama.cpp's.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; `<= 0` means greedy.
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 turns it off.
    pub top_k: usize,
    /// Nucleus sampling threshold in `[0, 1]`; 1 turns it off.
    pub top_p: f32,
    /// Keep tokens with `p >= min_p * p_max`; in `[0, 1]`, 0 turns it off.
    pub min_p: f32,
    /// Repetition penalty (> 0); 1 turns it off.
    pub repeat_penalty: f32,
    /// How many of the last history tokens the penalties look at; 0 turns them off
    /// (`usize::MAX` = the whole history).
    pub repeat_last_n: usize,
    /// Subtracted once from the logit of every token present in the window; 0 turns it off.
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per occurrence in the window; 0 turns it off.
    pub frequency_penalty: f32,
    /// Seed of the RNG of the draws.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0x5EED,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding: the argmax, no penalties.
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        }
    }

    /// Checks every parameter; [`Sampler::new`] calls it.
    pub fn validate(&self) -> Result<(), SamplingError> {
        let check = |name, value: f32, ok: bool, reason| {
            if ok {
                Ok(())
            } else {
                Err(SamplingError::InvalidParam {
                    name,
                    value,
                    reason,
                })
            }
        };
        let unit = |v: f32| (0.0..=1.0).contains(&v);
        check(
            "temperature",
            self.temperature,
            !self.temperature.is_nan(),
            "must not be NaN",
        )?;
        check("top_p", self.top_p, unit(self.top_p), "must be in [0, 1]")?;
        check("min_p", self.min_p, unit(self.min_p), "must be in [0, 1]")?;
        check(
            "repeat_penalty",
            self.repeat_penalty,
            self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0,
            "must be finite and > 0",
        )?;
        check(
            "presence_penalty",
            self.presence_penalty,
            self.presence_penalty.is_finite(),
            "must be finite",
        )?;
        check(
            "frequency_penalty",
            self.frequency_penalty,
            self.frequency_penalty.is_finite(),
            "must be finite",
        )
    }

    fn has_penalties(&self) -> bool {
        self.repeat_last_n > 0
            && (self.repeat_penalty != 1.0
                || self.presence_penalty != 0.0
                || self.frequency_penalty != 0.0)
    }
}

/// One token of the final distribution: its id, its logit (penalized, then divided by the
/// temperature; when greedy only penalized) and its probability.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    pub id: u32,
    pub logit: f32,
    pub p: f32,
}

/// Larger logit first, then lower id: a total order once NaN is gone, so selections are deterministic.
fn by_logit_desc(a: &Candidate, b: &Candidate) -> Ordering {
    b.logit
        .partial_cmp(&a.logit)
        .unwrap_or(Ordering::Equal)
        .then(a.id.cmp(&b.id))
}

/// A seeded token sampler; keeps its scratch buffers between calls.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha20Rng,
    cands: Vec<Candidate>,
    counts: HashMap<u32, u32>,
    /// Added to the raw logits before the chain (token, bias).
    logit_bias: Vec<(u32, f32)>,
}

impl Sampler {
    /// A sampler with validated `params`, its RNG seeded from `params.seed`.
    pub fn new(params: SamplingParams) -> Result<Sampler, SamplingError> {
        params.validate()?;
        Ok(Sampler {
            rng: ChaCha20Rng::seed_from_u64(params.seed),
            params,
            cands: Vec::new(),
            counts: HashMap::new(),
            logit_bias: Vec::new(),
        })
    }

    /// This sampler adding `bias` (token, value in `[-100, 100]`) to the raw logits before the
    /// chain; `-100` bans the token. Tokens past the vocabulary are refused when sampling.
    pub fn with_logit_bias(mut self, bias: Vec<(u32, f32)>) -> Result<Sampler, SamplingError> {
        if let Some(&(token, bias)) = bias
            .iter()
            .find(|(_, b)| !(b.is_finite() && b.abs() <= BIAS_LIMIT))
        {
            return Err(SamplingError::InvalidBias { token, bias });
        }
        self.logit_bias = bias;
        Ok(self)
    }

    /// The parameters.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Restarts the RNG from `seed`.
    pub fn reseed(&mut self, seed: u64) {
        self.params.seed = seed;
        self.rng = ChaCha20Rng::seed_from_u64(seed);
    }

    /// Picks the next token from `logits` (one row, `n_vocab` values) after `history` (the
    /// previous tokens, oldest first).
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> Result<u32, SamplingError> {
        self.draw(logits, history, None)
    }

    /// [`Sampler::sample`] among the tokens `allowed` accepts (a grammar's mask).
    pub fn sample_allowed(
        &mut self,
        logits: &[f32],
        history: &[u32],
        allowed: &dyn Fn(u32) -> bool,
    ) -> Result<u32, SamplingError> {
        self.draw(logits, history, Some(allowed))
    }

    fn draw(
        &mut self,
        logits: &[f32],
        history: &[u32],
        allowed: Option<&dyn Fn(u32) -> bool>,
    ) -> Result<u32, SamplingError> {
        self.filtered(logits, history, allowed)?;
        if self.cands.len() == 1 {
            return Ok(self.cands[0].id);
        }
        let r: f64 = self.rng.gen();
        let mut cum = 0.0f64;
        for c in &self.cands {
            cum += f64::from(c.p);
            if r < cum {
                return Ok(c.id);
            }
        }
        // Rounding left the sum of the probabilities below r: take the last possible token.
        let last = self.cands.iter().rev().find(|c| c.p > 0.0);
        Ok(last.unwrap_or(&self.cands[0]).id)
    }

    /// The distribution [`Sampler::sample`] draws from: the candidates that survive the chain, with
    /// their probabilities (summing to 1). When greedy, the argmax alone with `p = 1`. Sorted by
    /// decreasing logit when top-k or top-p ran, else in id order.
    pub fn distribution(
        &mut self,
        logits: &[f32],
        history: &[u32],
    ) -> Result<&[Candidate], SamplingError> {
        self.filtered(logits, history, None)
    }

    /// The distribution over the tokens `allowed` accepts (all when `None`).
    fn filtered(
        &mut self,
        logits: &[f32],
        history: &[u32],
        allowed: Option<&dyn Fn(u32) -> bool>,
    ) -> Result<&[Candidate], SamplingError> {
        if logits.is_empty() {
            return Err(SamplingError::EmptyLogits);
        }
        self.load(logits);
        self.bias()?;
        if let Some(allowed) = allowed {
            let finite = self.cands.iter().filter(|c| c.logit > f32::NEG_INFINITY);
            let n_finite = finite.count();
            for c in self.cands.iter_mut().filter(|c| !allowed(c.id)) {
                c.logit = f32::NEG_INFINITY;
            }
            if self.cands.iter().all(|c| c.logit == f32::NEG_INFINITY) {
                return Err(SamplingError::NothingAllowed(n_finite));
            }
        }
        self.penalize(history)?;
        let max = self
            .cands
            .iter()
            .copied()
            .min_by(by_logit_desc)
            .unwrap_or(self.cands[0]);
        if max.logit == f32::NEG_INFINITY {
            return Err(SamplingError::NoFiniteLogits(logits.len()));
        }
        // -inf logits have no probability at any temperature: drop them at once.
        self.cands.retain(|c| c.logit > f32::NEG_INFINITY);
        let p = &self.params;
        if p.temperature <= 0.0 {
            self.cands.clear();
            self.cands.push(Candidate { p: 1.0, ..max });
            return Ok(&self.cands);
        }
        let (top_k, top_p, min_p, temperature) = (p.top_k, p.top_p, p.min_p, p.temperature);
        if top_k > 0 {
            let k = top_k.min(self.cands.len());
            sort_prefix(&mut self.cands, k);
            self.cands.truncate(k);
        }
        if top_p < 1.0 {
            self.top_p(top_p, top_k > 0);
        }
        if min_p > 0.0 {
            let threshold = max.logit + min_p.ln();
            self.cands
                .retain(|c| c.logit >= threshold || c.id == max.id);
        }
        softmax(&mut self.cands, max.logit, temperature);
        Ok(&self.cands)
    }

    /// Copies `logits` into the candidates, with NaN as -inf and +inf as `f32::MAX`.
    fn load(&mut self, logits: &[f32]) {
        self.cands.clear();
        self.cands
            .extend(logits.iter().enumerate().map(|(i, &l)| Candidate {
                id: i as u32,
                logit: if l.is_nan() {
                    f32::NEG_INFINITY
                } else {
                    l.min(f32::MAX)
                },
                p: 0.0,
            }));
    }

    /// Adds the logit bias; the candidates are in id order.
    fn bias(&mut self) -> Result<(), SamplingError> {
        let n_vocab = self.cands.len();
        for &(token, bias) in &self.logit_bias {
            let c = self
                .cands
                .get_mut(token as usize)
                .ok_or(SamplingError::BiasOutOfRange { token, n_vocab })?;
            c.logit = if bias <= BAN_BIAS {
                f32::NEG_INFINITY
            } else {
                (c.logit + bias).min(f32::MAX)
            };
        }
        Ok(())
    }

    /// Applies the repetition, frequency and presence penalties; the candidates are in id order.
    fn penalize(&mut self, history: &[u32]) -> Result<(), SamplingError> {
        let p = &self.params;
        if !p.has_penalties() {
            return Ok(());
        }
        let window = &history[history.len().saturating_sub(p.repeat_last_n)..];
        self.counts.clear();
        for &t in window {
            if t as usize >= self.cands.len() {
                return Err(SamplingError::TokenOutOfRange {
                    token: t,
                    n_vocab: self.cands.len(),
                });
            }
            *self.counts.entry(t).or_insert(0) += 1;
        }
        for (&t, &count) in &self.counts {
            let logit = &mut self.cands[t as usize].logit;
            if *logit <= 0.0 {
                *logit *= p.repeat_penalty;
            } else {
                *logit /= p.repeat_penalty;
            }
            *logit -= count as f32 * p.frequency_penalty + p.presence_penalty;
            // A penalty below 1 can push a huge logit to +inf; keep the softmax finite.
            *logit = logit.min(f32::MAX);
        }
        Ok(())
    }

    /// Keeps the smallest prefix (largest logits first) whose temperature-1 probabilities add up to
    /// `top_p`. `sorted` says the candidates already are in decreasing order (top-k ran).
    fn top_p(&mut self, top_p: f32, sorted: bool) {
        let n = self.cands.len();
        let max = self.cands.iter().map(|c| c.logit).fold(f32::MIN, f32::max);
        let total: f64 = self
            .cands
            .iter()
            .map(|c| f64::from(c.logit - max).exp())
            .sum();
        let target = f64::from(top_p) * total;
        let mut cum = 0.0f64;
        let mut done = 0;
        let mut prefix = if sorted { n } else { n.min(64) };
        loop {
            if !sorted {
                sort_prefix(&mut self.cands, prefix);
            }
            for (i, c) in self.cands[..prefix].iter().enumerate().skip(done) {
                cum += f64::from(c.logit - max).exp();
                if cum >= target {
                    self.cands.truncate(i + 1);
                    return;
                }
            }
            if prefix == n {
                return;
            }
            done = prefix;
            prefix = n.min(prefix * 4);
        }
    }
}

/// Puts the `k` largest candidates first, in decreasing order; the others follow in any order.
/// A small `k` takes one pass with a heap of `k`, a larger one a selection; then the `k` are sorted.
fn sort_prefix(cands: &mut [Candidate], k: usize) {
    let n = cands.len();
    if k == 0 {
        return;
    }
    if k < n && k <= n / 16 {
        let kth = kth_best(cands, k);
        let mut front = 0;
        for i in 0..n {
            if by_logit_desc(&cands[i], &kth) != Ordering::Greater {
                cands.swap(front, i);
                front += 1;
            }
        }
    } else if k < n {
        cands.select_nth_unstable_by(k, by_logit_desc);
    }
    cands[..k].sort_unstable_by(by_logit_desc);
}

/// A candidate ranked so that a max-heap keeps the worst of the best at its top.
struct Ranked(Candidate);

impl PartialEq for Ranked {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Ranked {}

impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> Ordering {
        by_logit_desc(&self.0, &other.0)
    }
}

/// The `k`-th best candidate (`1 <= k <= cands.len()`), in one pass.
fn kth_best(cands: &[Candidate], k: usize) -> Candidate {
    let mut heap: BinaryHeap<Ranked> = cands[..k].iter().map(|&c| Ranked(c)).collect();
    for &c in &cands[k..] {
        if let Some(mut worst) = heap.peek_mut() {
            if by_logit_desc(&c, &worst.0) == Ordering::Less {
                *worst = Ranked(c);
            }
        }
    }
    heap.peek().map_or(cands[0], |r| r.0)
}

/// Divides the logits by the temperature and sets the probabilities (`max` is the largest logit).
fn softmax(cands: &mut [Candidate], max: f32, temperature: f32) {
    let mut total = 0.0f64;
    for c in cands.iter_mut() {
        let w = (f64::from(c.logit - max) / f64::from(temperature)).exp();
        c.logit /= temperature;
        c.p = w as f32;
        total += w;
    }
    let inv = (1.0 / total) as f32;
    for c in cands.iter_mut() {
        c.p *= inv;
    }
}

/// The log-probability of one token and of the most likely ones, from raw logits.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogProbs {
    pub token: u32,
    pub logprob: f64,
    /// The `top` most likely tokens, most likely first (lower id on ties).
    pub top: Vec<(u32, f64)>,
}

/// The log-softmax (in f64) of `logits` at `token`, and the `top` most likely tokens with theirs;
/// NaN logits count as `-inf`. `token` must be inside `logits`.
pub fn log_probs(logits: &[f32], token: u32, top: usize) -> TokenLogProbs {
    let clean = |l: f32| {
        if l.is_nan() {
            f64::NEG_INFINITY
        } else {
            f64::from(l)
        }
    };
    let max = logits
        .iter()
        .map(|&l| clean(l))
        .fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = logits.iter().map(|&l| (clean(l) - max).exp()).sum();
    let log_z = max + sum.ln();
    let mut best: Vec<Candidate> = Vec::new();
    if top > 0 {
        let mut cands: Vec<Candidate> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| Candidate {
                id: i as u32,
                logit: if l.is_nan() { f32::NEG_INFINITY } else { l },
                p: 0.0,
            })
            .collect();
        let k = top.min(cands.len());
        sort_prefix(&mut cands, k);
        cands.truncate(k);
        best = cands;
    }
    TokenLogProbs {
        token,
        logprob: clean(logits[token as usize]) - log_z,
        top: best
            .iter()
            .map(|c| (c.id, f64::from(c.logit) - log_z))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(id: u32, logit: f32) -> Candidate {
        Candidate { id, logit, p: 0.0 }
    }

    #[test]
    fn sort_prefix_orders_the_largest() {
        let mut c: Vec<Candidate> = [3.0, 1.0, 5.0, 5.0, -1.0, 2.0]
            .iter()
            .enumerate()
            .map(|(i, &l)| cand(i as u32, l))
            .collect();
        sort_prefix(&mut c, 3);
        let ids: Vec<u32> = c[..3].iter().map(|c| c.id).collect();
        assert_eq!(ids, [2, 3, 0]);
        sort_prefix(&mut c, 6);
        let ids: Vec<u32> = c.iter().map(|c| c.id).collect();
        assert_eq!(ids, [2, 3, 0, 5, 1, 4]);
    }

    #[test]
    fn heap_and_selection_agree() {
        let c: Vec<Candidate> = (0..1000u32)
            .map(|i| cand(i, ((i * 7919) % 613) as f32 * 0.5))
            .collect();
        for k in [1, 5, 62, 63, 64, 500, 1000] {
            let mut a = c.clone();
            sort_prefix(&mut a, k);
            let mut b = c.clone();
            b.sort_unstable_by(by_logit_desc);
            assert_eq!(a[..k], b[..k], "k = {k}");
            let mut rest: Vec<u32> = a[k..].iter().map(|c| c.id).collect();
            rest.sort_unstable();
            let mut want: Vec<u32> = b[k..].iter().map(|c| c.id).collect();
            want.sort_unstable();
            assert_eq!(rest, want, "k = {k}");
        }
    }

    #[test]
    fn softmax_survives_extreme_logits() {
        let mut c = vec![cand(0, f32::MAX), cand(1, -f32::MAX), cand(2, f32::MAX)];
        softmax(&mut c, f32::MAX, 0.01);
        assert_eq!(c[0].p, 0.5);
        assert_eq!(c[1].p, 0.0);
        assert_eq!(c[2].p, 0.5);
    }
}
