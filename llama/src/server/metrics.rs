//! Server counters and gauges, shared by the HTTP handlers and the inference worker, rendered in
//! the Prometheus text format by `GET /metrics`.

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
    /// Slots serving a request now.
    pub slots_active: AtomicU64,
    /// Slots in all.
    pub slots_total: AtomicU64,
    /// Requests waiting for a slot now.
    pub queue_length: AtomicU64,
}

impl Metrics {
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
        let rows: [(&str, &str, &str, &AtomicU64); 12] = [
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
        out
    }
}
