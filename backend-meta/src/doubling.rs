//! The generic AllReduce for device families without a communicator: recursive doubling built from
//! copies and adds that run on the devices themselves. Any N works: ranks beyond the largest power of
//! two first fold their value into a partner and get the result back at the end. Tensors larger than a
//! threshold travel in BF16 (summed in F32 on arrival) to halve the bytes moved.
//!
//! Each device's driver thread runs its own rank (`Doubling::run_rank`): it computes and copies only
//! on its own stream, and the ranks meet at a barrier between the phases of each step. Where a device
//! cannot read its partner's memory, values travel through host staging (the sender reads its value
//! out, the receiver writes it in).

use crate::barrier::RankBarrier;
use ggml_core::backend::{Backend, Device};
use ggml_core::sched::Scheduler;
use ggml_core::{DType, DataRef, Graph, Layout, Result, TensorId};
use parking_lot::Mutex;
use std::sync::Arc;

/// One device's part of a reduction: what it sends, where it receives, and the graph that adds.
struct Kit {
    graph: Graph,
    _sched: Scheduler,
    /// The value this device sends (its partial sum, or a BF16 copy of it).
    send: DataRef,
    /// Where a partner's value lands.
    scratch: DataRef,
    /// Nodes that refresh `send` from the partial sum (the BF16 cast; empty in F32).
    prepare: Vec<TensorId>,
    /// Nodes that add `scratch` into the partial sum.
    accumulate: Vec<TensorId>,
    /// Host bytes on the way from this device to a partner that cannot read its memory.
    staging: Mutex<Vec<u8>>,
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
    /// Some device cannot read another's buffers: every transfer goes through host staging.
    staged: bool,
}

/// One transfer step: who sends what, who receives it where.
#[derive(Clone, Copy)]
struct Transfer<'a> {
    /// The value this rank sends, if it sends.
    out: Option<&'a DataRef>,
    /// The partner's value and where it lands here, if this rank receives.
    into: Option<(usize, &'a DataRef, &'a DataRef)>,
    len: usize,
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
                send: g.data(send)?,
                graph: g,
                _sched: sched,
                scratch,
                prepare,
                accumulate,
                staging: Mutex::new(Vec::new()),
            });
        }
        let staged = devices.iter().enumerate().any(|(to, dev)| {
            (0..devices.len()).any(|from| {
                from != to
                    && !(dev.can_access(kits[from].send.buffer.as_ref())
                        && dev.can_access(own[from].buffer.as_ref()))
            })
        });
        Ok(Doubling {
            kits,
            bytes: Layout::contiguous(transport, layout.ne).nbytes(),
            own_bytes: layout.nbytes(),
            own,
            transport,
            staged,
        })
    }

    /// Bytes each transfer moves.
    pub fn transfer_bytes(&self) -> usize {
        self.bytes
    }

    pub fn transport(&self) -> DType {
        self.transport
    }

    /// Sums the partials in place on every device, driving each device from a thread of its own.
    pub fn all_reduce(&self, backends: &[Arc<dyn Backend>]) -> Result<()> {
        let barrier = RankBarrier::new(self.kits.len());
        let rank = |d: usize| {
            let r = self.run_rank(d, backends, &barrier);
            if r.is_err() {
                barrier.break_all();
            }
            r
        };
        std::thread::scope(|s| {
            let others: Vec<_> = (1..self.kits.len())
                .map(|d| s.spawn(move || rank(d)))
                .collect();
            let first = rank(0);
            others
                .into_iter()
                .map(|h| h.join().expect("a doubling rank panicked"))
                .fold(first, |acc, r| acc.and(r))
        })
    }

    /// Rank `d`'s part of the sum (every rank calls it at once, on its own thread): afterwards its
    /// partial holds the total. Ranks meet at `barrier` between phases; it returns after the last.
    pub(crate) fn run_rank(
        &self,
        d: usize,
        backends: &[Arc<dyn Backend>],
        barrier: &RankBarrier,
    ) -> Result<()> {
        let n = self.kits.len();
        let p = if n.is_power_of_two() {
            n
        } else {
            n.next_power_of_two() / 2
        };
        let kit = &self.kits[d];
        let no = Transfer {
            out: None,
            into: None,
            len: self.bytes,
        };
        // Fold ranks p.. into ranks 0..n - p.
        if n > p {
            let step = if d >= p {
                Transfer {
                    out: Some(&kit.send),
                    ..no
                }
            } else if d + p < n {
                Transfer {
                    into: Some((d + p, &self.kits[d + p].send, &kit.scratch)),
                    ..no
                }
            } else {
                no
            };
            self.step(d, backends, barrier, step, true)?;
        }
        // Exchange with partner d ^ k: everyone sends its current value before anyone adds.
        let mut k = 1;
        while k < p {
            let step = if d < p {
                Transfer {
                    out: Some(&kit.send),
                    into: Some((d ^ k, &self.kits[d ^ k].send, &kit.scratch)),
                    len: self.bytes,
                }
            } else {
                no
            };
            self.step(d, backends, barrier, step, true)?;
            k *= 2;
        }
        // Give the folded ranks the result.
        if n > p {
            let len = self.own_bytes;
            let step = if d >= p {
                Transfer {
                    out: None,
                    into: Some((d - p, &self.own[d - p], &self.own[d])),
                    len,
                }
            } else if d + p < n {
                Transfer {
                    out: Some(&self.own[d]),
                    into: None,
                    len,
                }
            } else {
                Transfer { len, ..no }
            };
            self.step(d, backends, barrier, step, false)?;
        }
        barrier.wait()
    }

    /// One step of rank `d`: prepare and send its value, receive the partner's, and add it in when
    /// `add`. Every rank takes the same barriers, whatever its part in the step.
    fn step(
        &self,
        d: usize,
        backends: &[Arc<dyn Backend>],
        barrier: &RankBarrier,
        step: Transfer,
        add: bool,
    ) -> Result<()> {
        let kit = &self.kits[d];
        let backend = &backends[d];
        if add && step.out.is_some() {
            self.run(backend, d, &kit.prepare)?;
        }
        barrier.wait()?;
        if self.staged {
            if let Some(src) = step.out {
                let mut staging = kit.staging.lock();
                staging.resize(step.len, 0);
                backend.get_async(src, &mut staging)?;
            }
            barrier.wait()?;
            if let Some((from, _, dst)) = step.into {
                backend.set_async(dst, &self.kits[from].staging.lock())?;
                backend.synchronize()?;
            }
        } else if let Some((_, src, dst)) = step.into {
            backend.copy_async(src, dst, step.len)?;
            backend.synchronize()?;
        }
        if add {
            // Partners have read this rank's value before it changes.
            barrier.wait()?;
            if step.into.is_some() {
                self.run(backend, d, &kit.accumulate)?;
            }
        }
        Ok(())
    }

    fn run(&self, backend: &Arc<dyn Backend>, d: usize, nodes: &[TensorId]) -> Result<()> {
        if nodes.is_empty() {
            return Ok(());
        }
        backend.compute(&self.kits[d].graph, nodes)?;
        backend.synchronize()
    }
}
