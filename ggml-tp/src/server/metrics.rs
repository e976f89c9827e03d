//! Server counters, gauges and the histogram of sequences per forward pass, shared by the HTTP
//! handlers and the inference worker, rendered in the Prometheus text format by `GET /metrics`.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters (monotonic) and gauges (current values) of one server.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Completion requests accepted into a slot or the queue.
    pub requests: AtomicU64,
    /// Requests answered with an error status (bad input, full queue, ...).
    pub requests_failed: AtomicU64,
    /// Requests refused because the slots and the queue were full.
    pub requests_rejected: AtomicU64,
    /// Requests whose client went away before the end.
    pub requests_cancelled: AtomicU64,
    /// Requests that ran to a finish reason.
    pub requests_completed: AtomicU64,
    /// Prompt tokens of accepted requests.
    pub prompt_tokens: AtomicU64,
    /// Prompt tokens whose KV entries were reused from a slot's cache.
    pub prompt_tokens_cached: AtomicU64,
    /// Tokens sampled.
    pub tokens_generated: AtomicU64,
    /// Decode steps of the worker (each advances every active slot once).
    pub steps: AtomicU64,
    /// Tokens evaluated by forward passes (prompt chunks and decode tokens).
    pub batch_tokens: AtomicU64,
    /// Sequences (slots) per forward pass.
    pub batch_sequences: Histogram,
    /// Slots serving a request now.
    pub slots_active: AtomicU64,
    /// Slots in all.
    pub slots_total: AtomicU64,
    /// Requests waiting for a slot now.
    pub queue_length: AtomicU64,
}

/// Upper bounds of the [`Histogram`] buckets (a last bucket, `+Inf`, takes the rest).
const BUCKETS: [u64; 7] = [1, 2, 4, 8, 16, 32, 64];

/// A Prometheus histogram of small counts.
#[derive(Debug, Default)]
pub struct Histogram {
    /// Observations per bucket of [`BUCKETS`], then of `+Inf` (not cumulative).
    counts: [AtomicU64; BUCKETS.len() + 1],
    sum: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, v: u64) {
        let b = BUCKETS
            .iter()
            .position(|&le| v <= le)
            .unwrap_or(BUCKETS.len());
        self.counts[b].fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(v, Ordering::Relaxed);
    }

    /// Appends the exposition of histogram `name` (cumulative buckets, sum and count).
    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = write!(
            out,
            "# HELP ggml_tp_{name} {help}\n# TYPE ggml_tp_{name} histogram\n"
        );
        let mut total = 0;
        for (i, c) in self.counts.iter().enumerate() {
            total += c.load(Ordering::Relaxed);
            let le = BUCKETS
                .get(i)
                .map_or_else(|| "+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(out, "ggml_tp_{name}_bucket{{le=\"{le}\"}} {total}");
        }
        let sum = self.sum.load(Ordering::Relaxed);
        let _ = write!(
            out,
            "ggml_tp_{name}_sum {sum}\nggml_tp_{name}_count {total}\n"
        );
    }
}

impl Metrics {
    /// Records a forward pass over `n_seqs` sequences and `n_tokens` tokens.
    pub fn pass(&self, n_seqs: usize, n_tokens: usize) {
        self.batch_sequences.observe(n_seqs as u64);
        Metrics::add(&self.batch_tokens, n_tokens);
    }

    pub fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn add(counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub fn set(gauge: &AtomicU64, n: usize) {
        gauge.store(n as u64, Ordering::Relaxed);
    }

    /// The Prometheus text exposition of every metric, names prefixed `ggml_tp_`.
    pub fn render(&self) -> String {
        let rows: [(&str, &str, &str, &AtomicU64); 13] = [
            (
                "requests_total",
                "counter",
                "Completion requests accepted.",
                &self.requests,
            ),
            (
                "requests_failed_total",
                "counter",
                "Requests answered with an error status.",
                &self.requests_failed,
            ),
            (
                "requests_rejected_total",
                "counter",
                "Requests refused because slots and queue were full.",
                &self.requests_rejected,
            ),
            (
                "requests_cancelled_total",
                "counter",
                "Requests whose client disconnected before the end.",
                &self.requests_cancelled,
            ),
            (
                "requests_completed_total",
                "counter",
                "Requests that ran to a finish reason.",
                &self.requests_completed,
            ),
            (
                "prompt_tokens_total",
                "counter",
                "Prompt tokens of accepted requests.",
                &self.prompt_tokens,
            ),
            (
                "prompt_tokens_cached_total",
                "counter",
                "Prompt tokens reused from a slot's KV cache.",
                &self.prompt_tokens_cached,
            ),
            (
                "tokens_generated_total",
                "counter",
                "Tokens generated.",
                &self.tokens_generated,
            ),
            (
                "steps_total",
                "counter",
                "Worker steps (each advances every active slot once).",
                &self.steps,
            ),
            (
                "batch_tokens_total",
                "counter",
                "Tokens evaluated by forward passes (prompt chunks and decode tokens).",
                &self.batch_tokens,
            ),
            (
                "slots_active",
                "gauge",
                "Slots serving a request.",
                &self.slots_active,
            ),
            ("slots_total", "gauge", "Slots in all.", &self.slots_total),
            (
                "queue_length",
                "gauge",
                "Requests waiting for a slot.",
                &self.queue_length,
            ),
        ];
        let mut out = String::new();
        for (name, kind, help, value) in rows {
            let v = value.load(Ordering::Relaxed);
            // Writing into a String cannot fail.
            let _ = write!(
                out,
                "# HELP ggml_tp_{name} {help}\n# TYPE ggml_tp_{name} {kind}\nggml_tp_{name} {v}\n"
            );
        }
        self.batch_sequences.render(
            &mut out,
            "batch_sequences",
            "Sequences (slots) per forward pass.",
        );
        out
    }
}
