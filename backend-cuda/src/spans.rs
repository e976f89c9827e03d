//! GPU spans of whole `compute` calls, kept with `GGML_TP_CUDA_STATS=1`: a timing event is recorded
//! on the stream before and after each call (which still runs as a captured graph when it would),
//! so the report says how long the stream was busy with each kind of call and how long it stood
//! between calls (waiting for another stream's event, for the host, or for a join's kernel). This
//! is what shows where a tensor-parallel step loses time: the per-node profile runs eagerly and
//! cannot see it.

use crate::cu;
use cudarc::driver::CudaEvent;
use ggml_core::{Graph, Result, TensorId};
use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;

/// Kinds of call the report lists (the longest in all first).
const REPORT_KINDS: usize = 12;

/// The kind of a call as the report groups it: its node count and first and last ops.
pub fn call_label(graph: &Graph, nodes: &[TensorId]) -> String {
    let op = |n: Option<&TensorId>| n.map_or("-", |&id| graph.tensor(id).op.name());
    format!(
        "{} nodes, {} .. {}",
        nodes.len(),
        op(nodes.first()),
        op(nodes.last())
    )
}

/// Spans of one stream's calls: those whose events are not complete yet, and the totals of the rest.
#[derive(Default)]
pub struct CallSpans {
    pending: VecDeque<(String, CudaEvent, CudaEvent)>,
    /// End of the last call taken into the totals.
    last_end: Option<CudaEvent>,
    /// Busy microseconds of each call, per kind.
    busy_us: HashMap<String, Vec<f64>>,
    gap_us: f64,
    gaps: u64,
}

impl CallSpans {
    /// Adds the call of kind `label` that ran between `start` and `end` on the stream, and takes
    /// every call whose end has passed into the totals.
    pub fn push(&mut self, label: String, start: CudaEvent, end: CudaEvent) -> Result<()> {
        self.pending.push_back((label, start, end));
        while self.pending.front().is_some_and(|c| c.2.is_complete()) {
            self.take_front()?;
        }
        Ok(())
    }

    /// Takes every call into the totals (the caller has synchronized the stream).
    pub fn finish(&mut self) -> Result<()> {
        while !self.pending.is_empty() {
            self.take_front()?;
        }
        Ok(())
    }

    fn take_front(&mut self) -> Result<()> {
        let Some((label, start, end)) = self.pending.pop_front() else {
            return Ok(());
        };
        let busy = cu("event elapsed", start.elapsed_ms(&end))?;
        if let Some(prev) = &self.last_end {
            let gap = cu("event elapsed", prev.elapsed_ms(&start))?;
            self.gap_us += f64::from(gap.max(0.0)) * 1e3;
            self.gaps += 1;
        }
        self.busy_us
            .entry(label)
            .or_default()
            .push(f64::from(busy.max(0.0)) * 1e3);
        self.last_end = Some(end);
        Ok(())
    }

    /// The busy and idle totals, then per kind (longest in all first) the count, total, median and
    /// smallest span.
    pub fn report(&self, device: &str) -> String {
        let busy: f64 = self.busy_us.values().flatten().sum();
        let calls: usize = self.busy_us.values().map(Vec::len).sum();
        let mut s = format!(
            "{device} call spans: {calls} calls, GPU busy {:.3} ms, {:.3} ms between calls ({} gaps)\n",
            busy / 1e3,
            self.gap_us / 1e3,
            self.gaps
        );
        let mut kinds: Vec<(&String, Vec<f64>)> = self
            .busy_us
            .iter()
            .map(|(k, v)| {
                let mut v = v.clone();
                v.sort_by(f64::total_cmp);
                (k, v)
            })
            .collect();
        kinds.sort_by(|a, b| b.1.iter().sum::<f64>().total_cmp(&a.1.iter().sum::<f64>()));
        let _ = writeln!(
            s,
            "{:>7} {:>10} {:>10} {:>10}  call",
            "count", "total ms", "median us", "min us"
        );
        for (label, v) in kinds.iter().take(REPORT_KINDS) {
            let _ = writeln!(
                s,
                "{:>7} {:>10.3} {:>10.1} {:>10.1}  {label}",
                v.len(),
                v.iter().sum::<f64>() / 1e3,
                v[v.len() / 2],
                v[0]
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ggml_core::DType;

    #[test]
    fn calls_are_labelled_by_size_and_end_ops() {
        let mut g = Graph::new();
        let a = g.new_input(DType::F32, &[8, 2]).unwrap();
        let x = g.new_input(DType::F32, &[8, 1]).unwrap();
        let n = g.rms_norm(x, 1e-6).unwrap();
        let y = g.mul_mat(a, n).unwrap();
        assert_eq!(call_label(&g, &[n, y]), "2 nodes, rms_norm .. mul_mat");
        assert_eq!(call_label(&g, &[]), "0 nodes, - .. -");
    }

    #[test]
    fn an_empty_report_has_its_totals() {
        let r = CallSpans::default().report("cuda:0");
        assert!(r.starts_with("cuda:0 call spans: 0 calls"), "{r}");
    }
}
