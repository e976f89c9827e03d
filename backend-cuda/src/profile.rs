//! Diagnostics of a [`CudaBackend`](crate::CudaBackend), printed to stderr when it is dropped:
//! with `GGML_TP_CUDA_PROFILE=1` the GPU time of every launched node, summed per kind of node (op,
//! types and shapes), measured with CUDA events while a hold kernel keeps the stream busy so that
//! the events time the kernels and not the host (such calls run eagerly, without graphs); with
//! `GGML_TP_CUDA_STATS=1` the graph cache's counters, the host time spent queueing `compute` and
//! the GPU spans of the calls ([`crate::spans`]).

use crate::graph_cache::GraphStats;
use crate::spans::CallSpans;
use ggml_core::{Graph, TensorId};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Duration;

/// Clock cycles per microsecond the hold kernel assumes (about the H100/H200 boost clock; only
/// the hold's length depends on it).
const CYCLES_PER_US: u64 = 2000;

/// Host time the hold covers per launched node, generous enough for event records and launches.
const HOLD_US_PER_NODE: u64 = 40;

/// Longest hold of one call.
const MAX_HOLD_US: u64 = 200_000;

/// Lines of the profile report.
const REPORT_LINES: usize = 40;

/// Hold length in clock cycles for a call that launches `nodes` nodes.
pub fn hold_cycles(nodes: usize) -> u64 {
    (nodes as u64 * HOLD_US_PER_NODE).min(MAX_HOLD_US) * CYCLES_PER_US
}

/// The kind of a node, as the profile groups it: op, result type and shape, and each source's
/// type and shape (`~` after a shape marks a non-contiguous layout).
pub fn node_label(graph: &Graph, node: TensorId) -> String {
    let t = graph.tensor(node);
    let shape = |id: TensorId| {
        let l = graph.layout(id);
        let dims: Vec<String> = l.ne.iter().map(|d| d.to_string()).collect();
        let strided = if l.is_contiguous() { "" } else { "~" };
        format!("{}[{}]{strided}", l.dtype, dims.join("x"))
    };
    let mut s = format!("{} {}", t.op.name(), shape(node));
    for &src in &t.src {
        let _ = write!(s, " {}", shape(src));
    }
    s
}

#[derive(Default)]
struct Totals {
    count: u64,
    gpu: Duration,
}

/// Accumulated diagnostics of one backend.
#[derive(Default)]
pub struct Diagnostics {
    /// GPU spans of whole calls (with the counters, not the per-node profile).
    pub spans: CallSpans,
    by_label: HashMap<String, Totals>,
    profiled_calls: u64,
    compute_calls: u64,
    compute_host: Duration,
}

impl Diagnostics {
    /// Adds the GPU time of one node of kind `label`.
    pub fn add_node(&mut self, label: String, gpu: Duration) {
        let e = self.by_label.entry(label).or_default();
        e.count += 1;
        e.gpu += gpu;
    }

    /// Counts one profiled call.
    pub fn add_profiled_call(&mut self) {
        self.profiled_calls += 1;
    }

    /// Counts one `compute` call that took the host `host` to queue.
    pub fn add_compute(&mut self, host: Duration) {
        self.compute_calls += 1;
        self.compute_host += host;
    }

    /// The per-kind table: the kinds that took longest first.
    pub fn profile_report(&self, device: &str) -> String {
        let total: Duration = self.by_label.values().map(|t| t.gpu).sum();
        let mut rows: Vec<(&String, &Totals)> = self.by_label.iter().collect();
        rows.sort_by_key(|r| std::cmp::Reverse(r.1.gpu));
        let per_call = total.as_secs_f64() * 1e6 / self.profiled_calls.max(1) as f64;
        let mut s = format!(
            "{device} profile: {} calls, GPU {:.3} ms in all, {per_call:.1} us per call\n",
            self.profiled_calls,
            total.as_secs_f64() * 1e3,
        );
        let _ = writeln!(
            s,
            "{:>7} {:>10} {:>9} {:>6}  node",
            "count", "total ms", "mean us", "%"
        );
        for (label, t) in rows.iter().take(REPORT_LINES) {
            let ms = t.gpu.as_secs_f64() * 1e3;
            let _ = writeln!(
                s,
                "{:>7} {:>10.3} {:>9.2} {:>6.2}  {label}",
                t.count,
                ms,
                ms * 1e3 / t.count as f64,
                100.0 * t.gpu.as_secs_f64() / total.as_secs_f64().max(1e-12),
            );
        }
        if rows.len() > REPORT_LINES {
            let _ = writeln!(s, "({} more kinds)", rows.len() - REPORT_LINES);
        }
        s
    }

    /// The graph counters, host queueing time and the calls' GPU spans.
    pub fn stats_report(&self, device: &str, graphs: GraphStats) -> String {
        let host_us = self.compute_host.as_secs_f64() * 1e6;
        format!(
            "{device} graphs: {graphs:?}; compute calls {}, host {:.1} us per call; fused launches (all devices) {:?}\n{}",
            self.compute_calls,
            host_us / self.compute_calls.max(1) as f64,
            ggml_gpu::dispatch::fusion_counts(),
            self.spans.report(device)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ggml_core::DType;

    #[test]
    fn labels_group_nodes_by_op_types_and_shapes() {
        let mut g = Graph::new();
        let a = g.new_input(DType::F16, &[64, 8]).unwrap();
        let x = g.new_input(DType::F32, &[64, 1]).unwrap();
        let y = g.mul_mat(a, x).unwrap();
        let label = node_label(&g, y);
        assert!(label.contains("f16[64x8x1x1]"), "{label}");
        assert!(label.contains("f32[8x1x1x1]"), "{label}");
    }

    #[test]
    fn report_sorts_by_time_and_counts_calls() {
        let mut d = Diagnostics::default();
        d.add_node("small".into(), Duration::from_micros(5));
        d.add_node("big".into(), Duration::from_micros(60));
        d.add_node("big".into(), Duration::from_micros(40));
        d.add_profiled_call();
        let r = d.profile_report("cuda:0");
        let big = r.find("big").unwrap();
        let small = r.find("small").unwrap();
        assert!(big < small, "{r}");
        assert!(r.contains("1 calls"), "{r}");
        assert!(r.contains("105.0 us per call"), "{r}");
        d.add_compute(Duration::from_micros(30));
        let st = d.stats_report("cuda:0", GraphStats::default());
        assert!(st.contains("compute calls 1, host 30.0 us"), "{st}");
    }
}
