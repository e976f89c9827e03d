//! [`NcclCommunicator`]: AllReduce (sum) queued on the participants' own CUDA streams, so it is
//! ordered after the work already queued there and before the work queued later, with no host
//! synchronization ([`Communicator::is_stream_ordered`]). Small messages between devices that map
//! each other's memory take the one-shot peer-to-peer kernel (`p2p`), the others NCCL (group call
//! over every local rank). F32 messages from [`ReducePolicy::bf16_min_bytes`] travel as BF16
//! (converted on each stream; every rank gets the same sum). Communicators are created for a device
//! set in this process (`ncclCommInitAll`) or as one rank of a multi-process job from a unique id
//! ([`NcclCommunicator::from_unique_id`], see `rendezvous`); they are destroyed with the value.
//! NCCL takes each GPU once: logical devices of one GPU reduce through [`SameGpuCommunicator`]
//! (one summing kernel, ordered against every rank's stream with events).

use crate::memory::CudaBuffer;
use crate::nccl::{self, Nccl, RawComm, UniqueId};
use crate::p2p::{self, PeerReducer, Wire};
use crate::settings::{settings, Settings};
use crate::stream::CudaBackend;
use crate::{cu, err};
use cudarc::driver::{sys, CudaEvent};
use ggml_core::backend::{check_range, Recorder, Recording};
use ggml_core::settings::CoreSettings;
use ggml_core::{Backend, Buffer as _, Communicator, DType, DataRef, Device, Error, Result};
use parking_lot::Mutex;
use std::sync::Arc;

/// How messages are routed, by size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReducePolicy {
    /// Largest message, in bytes on the wire (4 per F32 element, 2 per BF16 one), the one-shot
    /// peer-to-peer kernel takes (0: never); its staging holds 4 times this per rank and peer.
    pub one_shot_max_bytes: usize,
    /// F32 messages of at least this many bytes travel as BF16 (`None`: never).
    pub bf16_min_bytes: Option<usize>,
}

impl Default for ReducePolicy {
    /// The crossovers measured on two NVLink H200s (BENCHMARKS.md, `allreduce_bench`): the one-shot
    /// kernel beats NCCL up to 2 MiB on the wire; BF16 transport pays from 256 KiB and is taken from
    /// 1 MiB, where it saves a third.
    fn default() -> Self {
        ReducePolicy {
            one_shot_max_bytes: 2 << 20,
            bf16_min_bytes: Some(1 << 20),
        }
    }
}

impl ReducePolicy {
    /// The default, changed by `GGML_TP_ONESHOT_MAX_BYTES` (bytes, or `off`: never) of `cuda` and
    /// `GGML_TP_ALLREDUCE_BF16_MIN_BYTES` (bytes, or `off`: never) of `core`.
    pub fn from_settings(cuda: &Settings, core: &CoreSettings) -> Self {
        let mut p = ReducePolicy::default();
        if let Some(v) = cuda.oneshot_max_bytes {
            p.one_shot_max_bytes = if v == usize::MAX { 0 } else { v };
        }
        if let Some(v) = core.allreduce_bf16_min_bytes {
            p.bf16_min_bytes = (v != usize::MAX).then_some(v);
        }
        p
    }

    /// The policy of this process's settings ([`ReducePolicy::from_settings`]).
    pub fn from_env() -> Self {
        Self::from_settings(settings(), ggml_core::settings::settings())
    }
}

/// The ways one AllReduce can go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReducePath {
    Nccl,
    /// F32 data converted to BF16 for NCCL and back.
    NcclBf16,
    OneShot,
    /// F32 data pushed as BF16 by the one-shot kernel.
    OneShotBf16,
}

struct Rank {
    backend: Arc<CudaBackend>,
    comm: RawComm,
}

/// What calls change: the one-shot kernel's call counter and the BF16 transport's buffers.
struct State {
    one_shot_calls: u64,
    wire: Vec<Option<CudaBuffer>>,
}

/// AllReduce over CUDA streams of distinct devices (see the module doc).
pub struct NcclCommunicator {
    nccl: &'static Nccl,
    ranks: Vec<Rank>,
    world: usize,
    one_shot: Option<PeerReducer>,
    policy: ReducePolicy,
    state: Mutex<State>,
}

// SAFETY: the raw NCCL communicators are only used under `state`'s lock, and destroyed in `drop`.
unsafe impl Send for NcclCommunicator {}
unsafe impl Sync for NcclCommunicator {}

fn nccl_lib() -> Result<&'static Nccl> {
    nccl::library().map_err(err)
}

/// Fails when two of `backends` have the same `key` (the device, or the GPU ordinal for NCCL).
fn check_distinct(backends: &[Arc<CudaBackend>], key: fn(&CudaBackend) -> usize) -> Result<()> {
    for (i, a) in backends.iter().enumerate() {
        if let Some(b) = backends[..i].iter().find(|b| key(b) == key(a)) {
            return Err(err(format!(
                "communicator: {} and {} are the same {} (GPU {})",
                b.cuda_device().name(),
                a.cuda_device().name(),
                if Arc::ptr_eq(b.cuda_device(), a.cuda_device()) {
                    "device"
                } else {
                    "GPU, which NCCL takes once"
                },
                a.cuda_device().ordinal()
            )));
        }
    }
    Ok(())
}

/// Device addresses of `data` (one buffer per rank of `ranks`, `len` bytes each, in the rank's
/// device memory).
fn pointers(data: &[DataRef], ranks: &[&CudaBackend], len: usize) -> Result<Vec<u64>> {
    if data.len() != ranks.len() {
        return Err(err(format!(
            "all_reduce over {} buffers, communicator of {} local ranks",
            data.len(),
            ranks.len()
        )));
    }
    let mut ptrs = Vec::with_capacity(data.len());
    for (d, r) in data.iter().zip(ranks) {
        check_range(d.offset, len, d.buffer.size())?;
        let dev = r.cuda_device();
        let b = d
            .buffer
            .as_any()
            .downcast_ref::<CudaBuffer>()
            .filter(|b| Arc::ptr_eq(b.pool(), dev.pool()))
            .ok_or_else(|| {
                err(format!(
                    "all_reduce: {} is not memory of {}",
                    d.buffer.name(),
                    dev.name()
                ))
            })?;
        ptrs.push(b.device_ptr() + d.offset as u64);
    }
    Ok(ptrs)
}

impl NcclCommunicator {
    /// A communicator over `backends` (streams of distinct devices of this process) with the
    /// policy of the environment ([`ReducePolicy::from_env`]).
    pub fn new(backends: Vec<Arc<CudaBackend>>) -> Result<Self> {
        Self::with_policy(backends, ReducePolicy::from_env())
    }

    /// A communicator over `backends` (streams of distinct devices of this process).
    pub fn with_policy(backends: Vec<Arc<CudaBackend>>, policy: ReducePolicy) -> Result<Self> {
        if backends.is_empty() {
            return Err(err("communicator over no stream"));
        }
        check_distinct(&backends, |b| b.cuda_device().ordinal())?;
        let nccl = nccl_lib()?;
        let list: Vec<i32> = backends
            .iter()
            .map(|b| b.cuda_device().ordinal() as i32)
            .collect();
        let comms = nccl.init_all(&list).map_err(err)?;
        let one_shot = PeerReducer::new(&backends, policy.one_shot_max_bytes)?;
        let ranks: Vec<Rank> = backends
            .into_iter()
            .zip(comms)
            .map(|(backend, comm)| Rank { backend, comm })
            .collect();
        Ok(NcclCommunicator {
            nccl,
            world: ranks.len(),
            state: Mutex::new(State {
                one_shot_calls: 0,
                wire: ranks.iter().map(|_| None).collect(),
            }),
            ranks,
            one_shot,
            policy,
        })
    }

    /// Rank `rank` of a job of `n_ranks` processes (one stream each), joined through the unique id
    /// rank 0 created ([`crate::rendezvous`]). Blocks until every rank joined. `all_reduce` then
    /// takes this process's one buffer.
    pub fn from_unique_id(
        rank: usize,
        n_ranks: usize,
        backend: Arc<CudaBackend>,
        id: UniqueId,
    ) -> Result<Self> {
        if rank >= n_ranks {
            return Err(err(format!("rank {rank} of a job of {n_ranks}")));
        }
        let nccl = nccl_lib()?;
        cu(
            "bind context",
            backend.cuda_device().context().bind_to_thread(),
        )?;
        let comm = nccl.init_rank(n_ranks, id, rank).map_err(err)?;
        Ok(NcclCommunicator {
            nccl,
            ranks: vec![Rank { backend, comm }],
            world: n_ranks,
            one_shot: None,
            policy: ReducePolicy::from_env(),
            state: Mutex::new(State {
                one_shot_calls: 0,
                wire: vec![None],
            }),
        })
    }

    /// Ranks of the whole job (this process's [`Communicator::size`] of them are local).
    pub fn world_size(&self) -> usize {
        self.world
    }

    pub fn policy(&self) -> ReducePolicy {
        self.policy
    }

    /// True when the one-shot peer-to-peer kernel is available (every pair maps the other's memory).
    pub fn has_one_shot(&self) -> bool {
        self.one_shot.is_some()
    }

    /// The path [`Communicator::all_reduce`] takes for `count` elements of `dtype`.
    pub fn path_for(&self, dtype: DType, count: usize) -> ReducePath {
        let bytes = count * dtype.type_size();
        let bf16 = dtype == DType::F32 && self.policy.bf16_min_bytes.is_some_and(|m| bytes >= m);
        let wire = match (dtype, bf16) {
            (DType::F32, false) => Some(Wire::F32),
            (DType::F32, true) => Some(Wire::F32AsBf16),
            (DType::BF16, _) => Some(Wire::Bf16),
            _ => None,
        };
        let one_shot = match (&self.one_shot, wire) {
            // The reducer's staging holds `one_shot_max_bytes` on the wire.
            (Some(r), Some(w)) => count <= r.max_count(w),
            _ => false,
        };
        match (one_shot, bf16) {
            (true, false) => ReducePath::OneShot,
            (true, true) => ReducePath::OneShotBf16,
            (false, false) => ReducePath::Nccl,
            (false, true) => ReducePath::NcclBf16,
        }
    }

    /// Queues the AllReduce of `count` elements of `dtype` through `path` on every local rank's
    /// stream (for benchmarks and tests; [`Communicator::all_reduce`] picks the path by size).
    pub fn all_reduce_using(
        &self,
        data: &[DataRef],
        dtype: DType,
        count: usize,
        path: ReducePath,
    ) -> Result<()> {
        let unsupported = |what: &str| Error::UnsupportedType {
            dtype,
            what: what.into(),
        };
        let ranks: Vec<&CudaBackend> = self.ranks.iter().map(|r| r.backend.as_ref()).collect();
        let ptrs = pointers(data, &ranks, count * dtype.type_size())?;
        if count == 0 {
            return Ok(());
        }
        let mut state = self.state.lock();
        match path {
            ReducePath::Nccl => self.nccl_all_reduce(&ptrs, count, nccl_type(dtype)?),
            ReducePath::NcclBf16 if dtype == DType::F32 => {
                self.nccl_all_reduce_bf16(&mut state, &ptrs, count)
            }
            ReducePath::OneShot | ReducePath::OneShotBf16 => {
                let r = self
                    .one_shot
                    .as_ref()
                    .ok_or_else(|| err("no one-shot all-reduce: the devices lack peer access"))?;
                let wire = match (dtype, path) {
                    (DType::F32, ReducePath::OneShot) => Wire::F32,
                    (DType::F32, _) => Wire::F32AsBf16,
                    (DType::BF16, _) => Wire::Bf16,
                    _ => return Err(unsupported("one-shot all-reduce")),
                };
                state.one_shot_calls += 1;
                r.all_reduce(&ptrs, count, wire, state.one_shot_calls)
            }
            ReducePath::NcclBf16 => Err(unsupported("BF16 transport (F32 data only)")),
        }
    }

    /// One grouped `ncclAllReduce` per local rank, each on the rank's stream.
    fn nccl_all_reduce(&self, ptrs: &[u64], count: usize, ty: i32) -> Result<()> {
        self.nccl.group_start().map_err(err)?;
        let mut failed = None;
        for (r, &p) in self.ranks.iter().zip(ptrs) {
            let queued = cu(
                "bind context",
                r.backend.cuda_device().context().bind_to_thread(),
            )
            .and_then(|_| {
                // SAFETY: `p` addresses `count` elements on the rank's device (checked by
                // `pointers`); the stream is the rank's live stream.
                unsafe {
                    self.nccl.all_reduce_in_place(
                        p,
                        count,
                        ty,
                        r.comm,
                        r.backend.stream().cu_stream() as *mut _,
                    )
                }
                .map_err(err)
            });
            if let Err(e) = queued {
                failed = Some(e);
                break;
            }
        }
        let ended = self.nccl.group_end().map_err(err);
        match failed {
            Some(e) => Err(e),
            None => ended,
        }
    }

    /// F32 -> BF16 into each rank's wire buffer, NCCL over BF16, BF16 -> F32 back in place.
    fn nccl_all_reduce_bf16(&self, state: &mut State, ptrs: &[u64], count: usize) -> Result<()> {
        let mut wire = Vec::with_capacity(ptrs.len());
        for (r, slot) in self.ranks.iter().zip(state.wire.iter_mut()) {
            let dev = r.backend.cuda_device();
            if slot.as_ref().is_none_or(|b| b.size() < count * 2) {
                *slot = None;
                *slot = Some(CudaBuffer::new(
                    dev.pool(),
                    format!("{} all-reduce BF16 transport", dev.name()),
                    (count * 2).next_power_of_two(),
                )?);
            }
            wire.push(slot.as_ref().expect("just filled").device_ptr());
        }
        for ((r, &p), &w) in self.ranks.iter().zip(ptrs).zip(&wire) {
            p2p::convert(&r.backend, p, w, count, false)?;
        }
        self.nccl_all_reduce(&wire, count, nccl::NCCL_BFLOAT16)?;
        for ((r, &p), &w) in self.ranks.iter().zip(ptrs).zip(&wire) {
            p2p::convert(&r.backend, w, p, count, true)?;
        }
        Ok(())
    }
}

fn nccl_type(dtype: DType) -> Result<i32> {
    match dtype {
        DType::F32 => Ok(nccl::NCCL_FLOAT32),
        DType::F16 => Ok(nccl::NCCL_FLOAT16),
        DType::BF16 => Ok(nccl::NCCL_BFLOAT16),
        _ => Err(Error::UnsupportedType {
            dtype,
            what: "nccl all_reduce".into(),
        }),
    }
}

impl Drop for NcclCommunicator {
    fn drop(&mut self) {
        for r in &self.ranks {
            let _ = r.backend.synchronize();
            // SAFETY: created in `with_policy` / `from_unique_id`, destroyed once, no work pending.
            unsafe { self.nccl.destroy(r.comm) };
        }
    }
}

impl Communicator for NcclCommunicator {
    /// Local ranks: the buffers one call takes.
    fn size(&self) -> usize {
        self.ranks.len()
    }
    fn all_reduce(&self, data: &[DataRef], dtype: DType, count: usize) -> Result<()> {
        let path = self.path_for(dtype, count);
        self.all_reduce_using(data, dtype, count, path)
    }
    fn is_stream_ordered(&self) -> bool {
        true
    }
}

/// AllReduce (sum) over streams of distinct logical devices of one GPU, stream-ordered like NCCL:
/// the first rank's stream waits for every other rank's stream to reach the call (events), one
/// kernel there sums every rank's data in rank order and writes the sum back to each
/// ([`p2p::sum_same_gpu`]; one context, so every rank's memory is addressable), and every other
/// stream waits for it. F32, BF16 and F16, summed in F32.
pub struct SameGpuCommunicator {
    backends: Vec<Arc<CudaBackend>>,
    /// One reusable event per rank: the point its stream reached (rank 0's: the end of the sum).
    events: Mutex<Vec<CudaEvent>>,
}

impl SameGpuCommunicator {
    /// True when a communicator over `backends` can be made: 2 to [`p2p::MAX_RANKS`] streams of
    /// one GPU, whose communication kernels build.
    pub fn usable(backends: &[Arc<CudaBackend>]) -> bool {
        (2..=p2p::MAX_RANKS).contains(&backends.len())
            && backends[0].cuda_device().comm_kernels().is_ok()
    }

    /// A communicator over `backends` (streams of distinct devices of one GPU).
    pub fn new(backends: Vec<Arc<CudaBackend>>) -> Result<Self> {
        let Some(first) = backends.first().map(|b| b.cuda_device().clone()) else {
            return Err(err("communicator over no stream"));
        };
        if let Some(b) = backends
            .iter()
            .find(|b| b.cuda_device().ordinal() != first.ordinal())
        {
            return Err(err(format!(
                "same-GPU communicator: {} is not on GPU {} of {}",
                b.cuda_device().name(),
                first.ordinal(),
                first.name()
            )));
        }
        check_distinct(&backends, |b| Arc::as_ptr(b.cuda_device()) as usize)?;
        let events = stream_events(&backends)?;
        Ok(SameGpuCommunicator {
            backends,
            events: Mutex::new(events),
        })
    }
}

/// One event per stream of `backends` (logical devices of one GPU, one context), for the joins
/// between them.
pub(crate) fn stream_events(backends: &[Arc<CudaBackend>]) -> Result<Vec<CudaEvent>> {
    let flags = Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING);
    let ctx = backends[0].cuda_device().context();
    backends
        .iter()
        .map(|_| cu("create event", ctx.new_event(flags)))
        .collect()
}

/// The first stream waits for every other stream's work so far.
pub(crate) fn gather_into_first(backends: &[Arc<CudaBackend>], events: &[CudaEvent]) -> Result<()> {
    for (b, e) in backends.iter().zip(events).skip(1) {
        cu("record event", e.record(b.stream()))?;
        cu("stream wait", backends[0].stream().wait(e))?;
    }
    Ok(())
}

/// Every other stream waits for the first stream's work so far.
pub(crate) fn spread_from_first(backends: &[Arc<CudaBackend>], events: &[CudaEvent]) -> Result<()> {
    cu("record event", events[0].record(backends[0].stream()))?;
    for b in &backends[1..] {
        cu("stream wait", b.stream().wait(&events[0]))?;
    }
    Ok(())
}

impl Communicator for SameGpuCommunicator {
    fn size(&self) -> usize {
        self.backends.len()
    }
    fn all_reduce(&self, data: &[DataRef], dtype: DType, count: usize) -> Result<()> {
        let ranks: Vec<&CudaBackend> = self.backends.iter().map(|b| b.as_ref()).collect();
        let ptrs = pointers(data, &ranks, count * dtype.type_size())?;
        if count == 0 {
            return Ok(());
        }
        let events = self.events.lock();
        let lead = &self.backends[0];
        gather_into_first(&self.backends, &events)?;
        lead.timed(
            || {
                format!(
                    "all_reduce {dtype} x{count} ({} logical devices)",
                    ptrs.len()
                )
            },
            false,
            || p2p::sum_same_gpu(lead, &ptrs, dtype, count),
        )?;
        spread_from_first(&self.backends, &events)
    }
    fn is_stream_ordered(&self) -> bool {
        true
    }
    fn recorder(&self) -> Option<&dyn Recorder> {
        Some(self)
    }
}

/// The streams' work as one CUDA graph ([`crate::record`]).
impl Recorder for SameGpuCommunicator {
    fn record(&self, issue: &mut dyn FnMut() -> Result<()>) -> Result<Box<dyn Recording>> {
        crate::record::record(&self.backends, issue)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_reads_the_settings() {
        let d = ReducePolicy::default();
        assert!(d.one_shot_max_bytes > 0);
        let unset = (Settings::default(), CoreSettings::default());
        assert_eq!(ReducePolicy::from_settings(&unset.0, &unset.1), d);
        // `GGML_TP_ONESHOT_MAX_BYTES=off`, `GGML_TP_ALLREDUCE_BF16_MIN_BYTES=1024`.
        let cuda = Settings {
            oneshot_max_bytes: Some(usize::MAX),
            ..Settings::default()
        };
        let mut core = CoreSettings {
            allreduce_bf16_min_bytes: Some(1024),
            ..CoreSettings::default()
        };
        let p = ReducePolicy::from_settings(&cuda, &core);
        assert_eq!(p.one_shot_max_bytes, 0);
        assert_eq!(p.bf16_min_bytes, Some(1024));
        // `GGML_TP_ALLREDUCE_BF16_MIN_BYTES=off`.
        core.allreduce_bf16_min_bytes = Some(usize::MAX);
        assert_eq!(
            ReducePolicy::from_settings(&cuda, &core).bf16_min_bytes,
            None
        );
    }
}
