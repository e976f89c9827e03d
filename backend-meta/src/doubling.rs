//! The generic AllReduce for device families without a communicator: recursive doubling built from
//! copies and adds that run on the devices themselves. Any N works: ranks beyond the largest power of
//! two first fold their value into a partner and get the result back at the end. Tensors larger than a
//! threshold travel in BF16 (summed in F32 on arrival) to halve the bytes moved.

use ggml_core::backend::{Backend, Device};
use ggml_core::sched::Scheduler;
use ggml_core::{DType, DataRef, Graph, Layout, Result, TensorId};
use std::sync::Arc;

/// One device's part of a reduction: what it sends, where it receives, and the graph that adds.
struct Kit {
    graph: Graph,
    _sched: Scheduler,
    /// The value this device sends (its partial sum, or a BF16 copy of it).
    send: TensorId,
    /// Where a partner's value lands.
    scratch: DataRef,
    /// Nodes that refresh `send` from the partial sum (the BF16 cast; empty in F32).
    prepare: Vec<TensorId>,
    /// Nodes that add `scratch` into the partial sum.
    accumulate: Vec<TensorId>,
}

/// A prepared reduction of one tensor over all devices.
pub struct Doubling {
    kits: Vec<Kit>,
    /// Bytes of one transfer (in the transport type).
    bytes: usize,
    /// Bytes of one partial sum (F32).
    own_bytes: usize,
    own: Vec<DataRef>,
    transport: DType,
}

impl Doubling {
    /// Prepares the reduction of the F32 tensors `own[d]` (layout `layout`) held by `devices[d]`.
    pub fn new(
        devices: &[Arc<dyn Device>],
        backends: &[Arc<dyn Backend>],
        own: Vec<DataRef>,
        layout: Layout,
        threshold: usize,
    ) -> Result<Doubling> {
        let transport = if layout.nbytes() >= threshold {
            DType::BF16
        } else {
            DType::F32
        };
        let mut kits = Vec::with_capacity(devices.len());
        for (d, dev) in devices.iter().enumerate() {
            let tl = Layout::contiguous(transport, layout.ne);
            let scratch = DataRef::new(dev.buffer_type().alloc(tl.nbytes())?, 0);
            let mut g = Graph::new();
            let o = g.new_bound(layout, own[d].clone(), "partial", false);
            let s = g.new_bound(tl, scratch.clone(), "received", false);
            let (send, prepare) = if transport == DType::F32 {
                (o, Vec::new())
            } else {
                let c = g.cast(o, transport)?;
                g.output(c);
                (c, vec![c])
            };
            let sum = g.add(o, s)?;
            let w = g.cpy(sum, o)?;
            g.expand(w);
            let accumulate = vec![sum, w];
            let mut sched = Scheduler::new(vec![backends[d].clone()]);
            sched.alloc(&mut g)?;
            kits.push(Kit {
                graph: g,
                _sched: sched,
                send,
                scratch,
                prepare,
                accumulate,
            });
        }
        Ok(Doubling {
            kits,
            bytes: Layout::contiguous(transport, layout.ne).nbytes(),
            own_bytes: layout.nbytes(),
            own,
            transport,
        })
    }

    /// Bytes each transfer moves.
    pub fn transfer_bytes(&self) -> usize {
        self.bytes
    }

    pub fn transport(&self) -> DType {
        self.transport
    }

    fn copy(
        &self,
        devices: &[Arc<dyn Device>],
        backends: &[Arc<dyn Backend>],
        from: usize,
        to: usize,
    ) -> Result<()> {
        let src = self.kits[from].graph.data(self.kits[from].send)?;
        let dst = &self.kits[to].scratch;
        if devices[to].can_access(src.buffer.as_ref()) {
            backends[to].copy_async(&src, dst, self.bytes)
        } else {
            let mut staging = vec![0u8; self.bytes];
            backends[from].get_async(&src, &mut staging)?;
            backends[to].set_async(dst, &staging)
        }
    }

    fn run(&self, backends: &[Arc<dyn Backend>], d: usize, nodes: &[TensorId]) -> Result<()> {
        if nodes.is_empty() {
            return Ok(());
        }
        backends[d].compute(&self.kits[d].graph, nodes)?;
        backends[d].synchronize()
    }

    /// Sums the partials in place on every device.
    pub fn all_reduce(
        &self,
        devices: &[Arc<dyn Device>],
        backends: &[Arc<dyn Backend>],
    ) -> Result<()> {
        let n = self.kits.len();
        let p = if n.is_power_of_two() {
            n
        } else {
            n.next_power_of_two() / 2
        };
        // Fold ranks p.. into ranks 0..
        for r in p..n {
            self.run(backends, r, &self.kits[r].prepare)?;
            self.copy(devices, backends, r, r - p)?;
            self.run(backends, r - p, &self.kits[r - p].accumulate)?;
        }
        // Exchange with partner d ^ k: everyone sends its current value before anyone adds.
        let mut k = 1;
        while k < p {
            for d in 0..p {
                self.run(backends, d, &self.kits[d].prepare)?;
            }
            for d in 0..p {
                self.copy(devices, backends, d ^ k, d)?;
            }
            for d in 0..p {
                self.run(backends, d, &self.kits[d].accumulate)?;
            }
            k *= 2;
        }
        // Give the folded ranks the result.
        for r in p..n {
            let src = &self.own[r - p];
            let dst = &self.own[r];
            let len = self.own_bytes;
            if devices[r].can_access(src.buffer.as_ref()) {
                backends[r].copy_async(src, dst, len)?;
            } else {
                let mut staging = vec![0u8; len];
                backends[r - p].get_async(src, &mut staging)?;
                backends[r].set_async(dst, &staging)?;
            }
            backends[r].synchronize()?;
        }
        Ok(())
    }
}
