//! `MetaBackend`: the stream of a meta device. Computing a graph builds (or finds in its cache) the
//! graph's program, copies inputs, runs each stage on every device at once, joins partial and split
//! results between stages, and writes outputs back whole.

use crate::collective::{all_gather, all_reduce, assemble};
use crate::device::MetaDevice;
use crate::program::{build, Boundary, Program};
use ggml_core::backend::{Backend, Communicator, Device, Event};
use ggml_core::sched::structure_key;
use ggml_core::{DataRef, Error, Graph, Result, TensorId};
use parking_lot::Mutex;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// Counters of a meta stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MetaStats {
    /// Programs built from scratch.
    pub builds: u64,
    /// Graph computations that reused a cached program (same cut, subgraphs and ids).
    pub hits: u64,
    /// AllReduce calls and the bytes each device contributed to them.
    pub reductions: u64,
    pub reduced_bytes: u64,
    /// Gathers of split tensors.
    pub gathers: u64,
}

/// A stream over every device of a meta device. Partial sums are joined by the family's communicator;
/// without one (or when [`ReduceOptions::generic`](crate::device::ReduceOptions) asks) by recursive
/// doubling on the devices (`doubling`).
pub struct MetaBackend {
    device: Arc<MetaDevice>,
    backends: Vec<Arc<dyn Backend>>,
    comm: Option<Arc<dyn Communicator>>,
    program: Mutex<Option<Program>>,
    stats: Mutex<MetaStats>,
    /// Threads that drive devices 1.. while this thread drives device 0.
    driver: rayon::ThreadPool,
}

struct Done;
impl Event for Done {
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    fn is_done(&self) -> bool {
        true
    }
}

impl MetaBackend {
    pub(crate) fn new(device: Arc<MetaDevice>) -> Result<MetaBackend> {
        let backends = device
            .devices()
            .iter()
            .map(|d| d.new_backend())
            .collect::<Result<Vec<_>>>()?;
        let family = device.devices()[0].family();
        let comm = match ggml_core::registry::backend(family)
            .filter(|_| !device.reduce_options().generic)
            .and_then(|r| r.new_communicator(&backends))
        {
            Some(Ok(c)) => Some(c),
            Some(Err(e)) => return Err(e),
            None => None,
        };
        let driver = rayon::ThreadPoolBuilder::new()
            .num_threads(backends.len().saturating_sub(1).max(1))
            .thread_name(|i| format!("meta-driver-{i}"))
            .build()
            .map_err(|e| Error::Other(format!("meta: driver threads: {e}")))?;
        Ok(MetaBackend {
            device,
            backends,
            comm,
            program: Mutex::new(None),
            stats: Mutex::new(MetaStats::default()),
            driver,
        })
    }

    pub fn stats(&self) -> MetaStats {
        *self.stats.lock()
    }

    /// Compute-buffer bytes each device holds for the current program (each plans its own share).
    pub fn device_compute_memory(&self) -> Vec<usize> {
        self.program
            .lock()
            .as_ref()
            .map(|p| {
                p.scheds
                    .iter()
                    .map(|s| s.memory().iter().map(|m| m.planned).sum())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The per-device streams.
    pub fn backends(&self) -> &[Arc<dyn Backend>] {
        &self.backends
    }

    /// True when partial sums are joined by the family's communicator rather than host staging.
    pub fn has_communicator(&self) -> bool {
        self.comm.is_some()
    }

    fn run(&self, prog: &Program, meta: &Graph) -> Result<()> {
        for (t, copies) in &prog.inputs {
            let bytes = meta.get_bytes(*t)?;
            for (d, c) in copies.iter().enumerate() {
                if let Some(c) = c {
                    prog.graphs[d].set_bytes(*c, &bytes)?;
                }
            }
        }
        for stage in &prog.stages {
            self.run_stage(prog, &stage.nodes)?;
            for b in &stage.after {
                match b {
                    Boundary::Reduce { locals, doubling } => {
                        let bytes = match doubling {
                            Some(dbl) => {
                                dbl.all_reduce(self.device.devices(), &self.backends)?;
                                dbl.transfer_bytes()
                            }
                            None => all_reduce(&prog.graphs, locals, self.comm.as_deref())?,
                        };
                        let mut s = self.stats.lock();
                        s.reductions += 1;
                        s.reduced_bytes += bytes as u64;
                    }
                    Boundary::Gather {
                        layout,
                        state,
                        locals,
                        targets,
                    } => {
                        all_gather(&prog.graphs, locals, targets, *layout, state)?;
                        self.stats.lock().gathers += 1;
                    }
                }
            }
        }
        for o in &prog.outputs {
            let bytes = assemble(&prog.graphs, &o.locals, *meta.layout(o.meta), &o.state)?;
            let dst = meta.data(o.meta)?;
            dst.buffer.set(dst.offset, &bytes)?;
        }
        Ok(())
    }

    fn run_stage(&self, prog: &Program, nodes: &[Vec<TensorId>]) -> Result<()> {
        let busy: Vec<usize> = (0..nodes.len()).filter(|&d| !nodes[d].is_empty()).collect();
        let one = |d: usize| -> Result<()> {
            self.backends[d].compute(&prog.graphs[d], &nodes[d])?;
            self.backends[d].synchronize()
        };
        if busy.len() <= 1 {
            return busy.into_iter().try_for_each(one);
        }
        // Device 0's share runs on this thread, the others on the driver pool's threads.
        let results: Vec<parking_lot::Mutex<Result<()>>> = busy
            .iter()
            .map(|_| parking_lot::Mutex::new(Ok(())))
            .collect();
        self.driver.scope(|s| {
            for (i, &d) in busy.iter().enumerate().skip(1) {
                let slot = &results[i];
                s.spawn(move |_| *slot.lock() = one(d));
            }
            *results[0].lock() = one(busy[0]);
        });
        results.into_iter().try_for_each(|r| r.into_inner())?;
        Ok(())
    }
}

impl Backend for MetaBackend {
    fn name(&self) -> String {
        self.device.name()
    }
    fn device(&self) -> Arc<dyn Device> {
        self.device.clone()
    }
    fn copy_async(&self, src: &DataRef, dst: &DataRef, len: usize) -> Result<()> {
        let mut staging = vec![0u8; len];
        src.buffer.get(src.offset, &mut staging)?;
        dst.buffer.set(dst.offset, &staging)
    }
    fn compute(&self, graph: &Graph, nodes: &[TensorId]) -> Result<()> {
        let key = {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            structure_key(graph).hash(&mut h);
            nodes.hash(&mut h);
            h.finish()
        };
        let mut slot = self.program.lock();
        if slot.as_ref().is_some_and(|p| p.key == key) {
            self.stats.lock().hits += 1;
        } else {
            *slot = None;
            *slot = Some(build(
                graph,
                nodes,
                &self.device,
                &self.backends,
                key,
                self.comm.is_some(),
            )?);
            self.stats.lock().builds += 1;
        }
        self.run(slot.as_ref().expect("program set above"), graph)
    }
    fn synchronize(&self) -> Result<()> {
        self.backends.iter().try_for_each(|b| b.synchronize())
    }
    fn record_event(&self) -> Result<Arc<dyn Event>> {
        self.synchronize()?;
        Ok(Arc::new(Done))
    }
    fn wait_event(&self, event: &dyn Event) -> Result<()> {
        event.synchronize()
    }
    fn set_threads(&self, n: usize) {
        let per = (n / self.backends.len()).max(1);
        self.backends.iter().for_each(|b| b.set_threads(per));
    }
}
