//! GPU spans of whole `compute` calls, kept with `GGML_TP_CUDA_STATS=1`: a timing event is recorded
//! on the stream before and after each call (which still runs as a captured graph when it would),
//! so the report says how long the stream was busy with each kind of call and how long it stood
//! between calls (waiting for another stream's event, for the host, or for a join's kernel). This
//! is what shows where a tensor-parallel step loses time: the per-node profile runs eagerly and
//! cannot see it. With `GGML_TP_CUDA_TRACE=N` the last N calls of each stream are also printed as a
//! timeline: host queueing and GPU span of each, in microseconds from one origin per GPU (a
//! synchronized event and the host clock read at it), so the streams of a GPU's logical devices
//! line up with each other and with the host.

use crate::cu;
use cudarc::driver::{CudaEvent, CudaStream};
use ggml_core::{Graph, Result, TensorId};
use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::time::Instant;

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

/// The common origin of a GPU's timelines: an event and the host clock when it had completed.
pub struct TraceOrigin {
    event: CudaEvent,
    host: Instant,
}

impl TraceOrigin {
    /// Records the origin on `stream` and waits for it.
    pub fn record(stream: &CudaStream) -> std::result::Result<Self, String> {
        let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let event = stream.record_event(timing).map_err(|e| format!("{e:?}"))?;
        event.synchronize().map_err(|e| format!("{e:?}"))?;
        Ok(TraceOrigin {
            event,
            host: Instant::now(),
        })
    }

    fn gpu_us(&self, at: &CudaEvent) -> Result<f64> {
        Ok(f64::from(cu("event elapsed", self.event.elapsed_ms(at))?) * 1e3)
    }

    fn host_us(&self, at: Instant) -> f64 {
        if at >= self.host {
            (at - self.host).as_secs_f64() * 1e6
        } else {
            -((self.host - at).as_secs_f64() * 1e6)
        }
    }
}

/// When the host queued a call (its start and end).
#[derive(Clone, Copy)]
pub struct HostSpan {
    pub begin: Instant,
    pub end: Instant,
}

/// One call of a timeline, in microseconds from the GPU's [`TraceOrigin`].
struct TraceEntry {
    label: String,
    host: (f64, f64),
    gpu: (f64, f64),
}

/// The last `keep` calls of a stream (`GGML_TP_CUDA_TRACE`).
struct Trace {
    origin: std::sync::Arc<TraceOrigin>,
    keep: usize,
    entries: VecDeque<TraceEntry>,
}

/// A call whose events may not have completed yet.
struct PendingCall {
    label: String,
    start: CudaEvent,
    end: CudaEvent,
    host: HostSpan,
}

/// Spans of one stream's calls: those whose events are not complete yet, and the totals of the rest.
#[derive(Default)]
pub struct CallSpans {
    pending: VecDeque<PendingCall>,
    /// End of the last call taken into the totals.
    last_end: Option<CudaEvent>,
    /// Busy microseconds of each call, per kind.
    busy_us: HashMap<String, Vec<f64>>,
    gap_us: f64,
    gaps: u64,
    trace: Option<Trace>,
}

impl CallSpans {
    /// Also keeps the timeline of the last `keep` calls, against `origin`.
    pub fn keep_trace(&mut self, origin: std::sync::Arc<TraceOrigin>, keep: usize) {
        self.trace = Some(Trace {
            origin,
            keep,
            entries: VecDeque::with_capacity(keep),
        });
    }

    /// Adds the call of kind `label` that ran between `start` and `end` on the stream and that the
    /// host queued during `host`, and takes every call whose end has passed into the totals.
    pub fn push(
        &mut self,
        label: String,
        start: CudaEvent,
        end: CudaEvent,
        host: HostSpan,
    ) -> Result<()> {
        self.pending.push_back(PendingCall {
            label,
            start,
            end,
            host,
        });
        while self.pending.front().is_some_and(|c| c.end.is_complete()) {
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
        let Some(PendingCall {
            label,
            start,
            end,
            host,
        }) = self.pending.pop_front()
        else {
            return Ok(());
        };
        if let Some(t) = &mut self.trace {
            if t.entries.len() == t.keep {
                t.entries.pop_front();
            }
            let o = &t.origin;
            t.entries.push_back(TraceEntry {
                label: label.clone(),
                host: (o.host_us(host.begin), o.host_us(host.end)),
                gpu: (o.gpu_us(&start)?, o.gpu_us(&end)?),
            });
        }
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
        if let Some(t) = &self.trace {
            s.push_str(&trace_lines(device, t.entries.iter()));
        }
        s
    }
}

/// One line per call: `trace DEVICE host BEGIN END gpu START END | LABEL` (microseconds from the
/// GPU's origin; `sort -k7 -n` merges the streams of one GPU into one timeline).
fn trace_lines<'a>(device: &str, entries: impl Iterator<Item = &'a TraceEntry>) -> String {
    let mut s = String::new();
    for e in entries {
        let _ = writeln!(
            s,
            "trace {device} host {:.1} {:.1} gpu {:.1} {:.1} | {}",
            e.host.0, e.host.1, e.gpu.0, e.gpu.1, e.label
        );
    }
    s
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

    #[test]
    fn trace_lines_carry_host_and_gpu_times() {
        let entry = |label: &str, gpu: f64| TraceEntry {
            label: label.into(),
            host: (1.0, 2.5),
            gpu: (gpu, gpu + 10.0),
        };
        let lines = trace_lines("cuda:1", [entry("a", 30.0), entry("b", 5.5)].iter());
        let first = lines.lines().next().unwrap();
        assert_eq!(first, "trace cuda:1 host 1.0 2.5 gpu 30.0 40.0 | a");
        let starts: Vec<f64> = lines
            .lines()
            .map(|l| l.split_whitespace().nth(6).unwrap().parse().unwrap())
            .collect();
        assert_eq!(starts, vec![30.0, 5.5]);
    }
}
