//! The scheduler: assigns each node of a graph to one of several backends, inserts copies where a node
//! reads memory its backend cannot reach, plans compute memory per backend with buffer reuse
//! ([`memplan`]), binds the data of every unallocated tensor, and runs the graph split by split.
//! The last [`KEPT_PLANS`] plans are kept: a graph with the structure of one of them (the same
//! shapes again, e.g. the micro-batches of another prompt of the same length) reuses it.

pub mod memplan;
mod plan;

pub use plan::structure_key;

use crate::backend::{Backend, Buffer, BufferType, Device};
use crate::error::Result;
use crate::graph::Graph;
use crate::tensor::DataRef;
use plan::Plan;
use std::sync::Arc;

/// Plans a scheduler keeps for graphs of their structure (a few KiB each, whatever the graph's
/// tensor sizes: they share the compute buffers).
pub const KEPT_PLANS: usize = 8;

/// Counters of the planning cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedStats {
    /// Graphs planned from scratch.
    pub plans: u64,
    /// Graphs that reused a kept plan.
    pub reuses: u64,
}

/// Compute memory of one backend in the last plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryReport {
    pub backend: String,
    /// Bytes of the compute buffer the plan needs.
    pub planned: usize,
    /// The largest total size of tensors alive at one step (no plan can need less).
    pub lower_bound: usize,
}

/// Runs graphs over an ordered set of backends (earlier backends are preferred).
pub struct Scheduler {
    backends: Vec<Arc<dyn Backend>>,
    devices: Vec<Arc<dyn Device>>,
    bufts: Vec<Arc<dyn BufferType>>,
    buffers: Vec<Option<Arc<dyn Buffer>>>,
    /// The kept plans, the current one (that of the graph allocated last) first, then by last use.
    plans: Vec<Plan>,
    stats: SchedStats,
}

impl Scheduler {
    pub fn new(backends: Vec<Arc<dyn Backend>>) -> Scheduler {
        let devices: Vec<Arc<dyn Device>> = backends.iter().map(|b| b.device()).collect();
        let bufts = devices.iter().map(|d| d.buffer_type()).collect();
        let buffers = vec![None; backends.len()];
        Scheduler {
            backends,
            devices,
            bufts,
            buffers,
            plans: Vec::new(),
            stats: SchedStats::default(),
        }
    }

    pub fn backends(&self) -> &[Arc<dyn Backend>] {
        &self.backends
    }

    pub fn stats(&self) -> SchedStats {
        self.stats
    }

    /// The current plan's splits: for each, the backend index and the nodes it computes, in order.
    pub fn splits(&self) -> Vec<(usize, Vec<crate::TensorId>)> {
        self.plans
            .first()
            .map(|p| {
                p.splits
                    .iter()
                    .map(|s| (s.backend, s.nodes.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Compute memory per backend of the current plan.
    pub fn memory(&self) -> Vec<MemoryReport> {
        self.plans
            .first()
            .map(|p| p.memory.clone())
            .unwrap_or_default()
    }

    /// Plans `graph` (or reuses the kept plan of a graph with the same structure) and binds memory
    /// to every tensor that has none: inputs and intermediate results. Inputs can be written after
    /// this.
    pub fn alloc(&mut self, graph: &mut Graph) -> Result<()> {
        let key = plan::structure_key(graph);
        let kept = self
            .plans
            .iter()
            .position(|p| p.key == key && p.n_tensors_before == graph.len());
        let plan = match kept {
            Some(i) => {
                self.stats.reuses += 1;
                self.plans.remove(i)
            }
            None => {
                let p = plan::build(graph, &self.devices, &self.bufts, key)?;
                self.stats.plans += 1;
                p
            }
        };
        self.plans.insert(0, plan);
        self.plans.truncate(KEPT_PLANS);
        let plan = &self.plans[0];
        for (b, &size) in plan.buffer_sizes.iter().enumerate() {
            let big_enough = self.buffers[b]
                .as_ref()
                .is_some_and(|buf| buf.size() >= size);
            let needed = size > 0 || plan.placements.iter().any(|p| p.1 == b);
            if needed && !big_enough {
                self.buffers[b] = None;
                self.buffers[b] = Some(self.bufts[b].alloc(size)?);
            }
        }
        plan.apply(graph);
        for &(t, b, offset) in &plan.placements {
            let buffer = self.buffers[b]
                .clone()
                .expect("buffer allocated for every backend with placements");
            graph.tensor_mut(t).data = Some(DataRef::new(buffer, offset));
        }
        Ok(())
    }

    /// Computes a graph prepared by [`Scheduler::alloc`].
    pub fn compute(&mut self, graph: &Graph) -> Result<()> {
        let plan = self
            .plans
            .first()
            .ok_or_else(|| crate::Error::Other("compute before alloc".into()))?;
        let mut previous: Option<usize> = None;
        for split in &plan.splits {
            let backend = &self.backends[split.backend];
            if let Some(p) = previous.filter(|&p| p != split.backend) {
                self.backends[p].synchronize()?;
            }
            for &(from, to) in &split.copies {
                let src = graph.data(from)?;
                let dst = graph.data(to)?;
                let len = graph.tensor(to).nbytes();
                if self.devices[split.backend].can_access(src.buffer.as_ref()) {
                    backend.copy_async(&src, &dst, len)?;
                } else {
                    let mut staging = vec![0u8; len];
                    src.buffer.get(src.offset, &mut staging)?;
                    backend.set_async(&dst, &staging)?;
                }
            }
            backend.compute(graph, &split.nodes)?;
            previous = Some(split.backend);
        }
        for b in &self.backends {
            b.synchronize()?;
        }
        Ok(())
    }

    /// `alloc` then `compute`; inputs must already hold data (bound leaves) for this to be useful.
    pub fn run(&mut self, graph: &mut Graph) -> Result<()> {
        self.alloc(graph)?;
        self.compute(graph)
    }
}
