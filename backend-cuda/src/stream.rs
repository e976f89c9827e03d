//! [`CudaBackend`]: one CUDA stream of a device with its cuBLAS handle (and workspace) and a scratch
//! area for converted operands. Copies are queued on the stream (device to device, across devices
//! through peer copies, and to and from host memory); events are CUDA events. `compute` runs through
//! the stream's CUDA graph cache (`graph_cache`): repeated subgraphs replay a captured graph.

use crate::device::CudaDevice;
use crate::graph_cache::{self, GraphCache, GraphStats, Plan};
use crate::kernels::Kernels;
use crate::memory::CudaBuffer;
use crate::profile::{self, Diagnostics};
use crate::settings::settings;
use crate::spans;
use crate::{cu, err};
use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::driver::{result, sys, CudaEvent, CudaGraph, CudaStream, PushKernelArg as _};
use ggml_core::backend::check_range;
use ggml_core::{Backend, Buffer as _, DataRef, Device, Event, Graph, Result, TensorId};
use ggml_gpu::dispatch;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A cuBLAS handle bound to one stream.
pub struct BlasHandle(pub blas_sys::cublasHandle_t);

// SAFETY: the handle is only used under the backend's mutex.
unsafe impl Send for BlasHandle {}

impl Drop for BlasHandle {
    fn drop(&mut self) {
        // SAFETY: created in `CudaBackend::new`, destroyed once.
        let _ = unsafe { blas::destroy_handle(self.0) };
    }
}

/// Device scratch allocations reused across ops of one stream (stream order keeps them safe).
#[derive(Default)]
pub struct Scratch {
    slots: Vec<Option<Arc<CudaBuffer>>>,
}

/// Bytes of the cuBLAS workspace of each stream (cuBLAS's own default on Hopper), given to cuBLAS up
/// front so that no captured call allocates.
const BLAS_WORKSPACE: usize = 32 << 20;

/// A stream on one CUDA device.
pub struct CudaBackend {
    device: Arc<CudaDevice>,
    stream: Arc<CudaStream>,
    kernels: Arc<Kernels>,
    graphs: Mutex<GraphCache>,
    blas: Mutex<BlasHandle>,
    _blas_workspace: CudaBuffer,
    scratch: Mutex<Scratch>,
    /// Per-node profile or counters, when the environment asks for them ([`profile`]).
    diagnostics: Option<Mutex<Diagnostics>>,
    profiling: bool,
    /// The stream's work is being captured into a recording of several streams
    /// ([`crate::record`]): `compute` launches straight into the capture.
    recording: AtomicBool,
}

impl CudaBackend {
    /// A new stream on `device`; prefer [`CudaDevice::open_backend`], which also lets the family's
    /// communicator find the stream.
    pub fn new(device: Arc<CudaDevice>) -> Result<Self> {
        let kernels = device.kernels()?;
        let ctx = device.context().clone();
        let stream = cu("create stream", ctx.new_stream())?;
        let handle = cu("cublasCreate", blas::create_handle())?;
        let handle = BlasHandle(handle);
        // SAFETY: both handles are live; the stream outlives the cuBLAS handle (same owner).
        cu("cublasSetStream", unsafe {
            blas::set_stream(handle.0, stream.cu_stream() as _)
        })?;
        let settings = settings();
        let profiling = settings.profile;
        let workspace = CudaBuffer::new(
            device.pool(),
            format!("{} cuBLAS workspace", device.name()),
            BLAS_WORKSPACE,
        )?;
        // SAFETY: the workspace lives as long as the handle (same owner, dropped after it).
        let status = unsafe {
            blas_sys::cublasSetWorkspace_v2(
                handle.0,
                workspace.device_ptr() as *mut _,
                BLAS_WORKSPACE,
            )
        };
        if status != blas_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(err(format!("cublasSetWorkspace: {status:?}")));
        }
        let diagnostics = Self::diagnostics(&device, &stream, settings)?;
        Ok(CudaBackend {
            device,
            stream,
            kernels,
            graphs: Mutex::new(GraphCache::new(settings.graphs)),
            blas: Mutex::new(handle),
            _blas_workspace: workspace,
            scratch: Mutex::new(Scratch::default()),
            diagnostics,
            profiling,
            recording: AtomicBool::new(false),
        })
    }

    /// The diagnostics the settings ask for, with the timeline's origin when they trace.
    fn diagnostics(
        device: &CudaDevice,
        stream: &CudaStream,
        settings: &crate::settings::Settings,
    ) -> Result<Option<Mutex<Diagnostics>>> {
        if !settings.profile && !settings.stats {
            return Ok(None);
        }
        let mut d = Diagnostics::default();
        if settings.trace_calls > 0 && !settings.profile {
            let origin = device.gpu().trace_origin(stream)?;
            d.spans.keep_trace(origin, settings.trace_calls);
        }
        Ok(Some(Mutex::new(d)))
    }

    /// Queues what `queue` queues on this stream; with `GGML_TP_CUDA_STATS` between two timing
    /// events, kept as a call span of kind `label` (made only then), its host time counted with the
    /// `compute` calls' when `is_compute`.
    pub(crate) fn timed(
        &self,
        label: impl FnOnce() -> String,
        is_compute: bool,
        queue: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let Some(d) = self.diagnostics.as_ref().filter(|_| !self.profiling) else {
            return queue();
        };
        if self.recording.load(Ordering::Relaxed) {
            return queue();
        }
        let timing = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let begin = Instant::now();
        let first = cu("record event", self.stream.record_event(timing))?;
        let r = queue();
        let last = cu("record event", self.stream.record_event(timing))?;
        let host = spans::HostSpan {
            begin,
            end: Instant::now(),
        };
        let mut d = d.lock();
        if is_compute {
            d.add_compute(host.end - host.begin);
        }
        d.spans.push(label(), first, last, host)?;
        r
    }

    /// Whether the stream profiles each node (`GGML_TP_CUDA_PROFILE`).
    pub(crate) fn is_profiling(&self) -> bool {
        self.profiling
    }

    /// Marks the stream as captured by a recording of several streams ([`crate::record`]).
    pub(crate) fn set_recording(&self, on: bool) {
        self.recording.store(on, Ordering::Relaxed);
    }

    /// Counters of the CUDA graph cache.
    pub fn graph_stats(&self) -> GraphStats {
        self.graphs.lock().stats()
    }

    /// Turns CUDA graph capture on or off for this stream (initially on unless
    /// `GGML_TP_CUDA_GRAPHS=0`).
    pub fn set_graphs(&self, on: bool) {
        self.graphs.lock().set_enabled(on);
    }

    pub fn cuda_device(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub fn kernels(&self) -> &Kernels {
        &self.kernels
    }

    pub(crate) fn blas(&self) -> parking_lot::MutexGuard<'_, BlasHandle> {
        self.blas.lock()
    }

    /// A device address of at least `bytes` bytes in scratch slot `slot`, valid for work queued on
    /// this stream until the next call for the same slot.
    pub(crate) fn scratch(&self, slot: usize, bytes: usize) -> Result<u64> {
        let mut s = self.scratch.lock();
        if s.slots.len() <= slot {
            s.slots.resize(slot + 1, None);
        }
        let fits = s.slots[slot].as_ref().is_some_and(|b| b.size() >= bytes);
        if !fits {
            if s.slots[slot].is_some() {
                self.synchronize()?;
            }
            let size = bytes.next_power_of_two().max(1 << 16);
            s.slots[slot] = Some(Arc::new(CudaBuffer::new(
                self.device.pool(),
                format!("{} scratch", self.device.name()),
                size,
            )?));
        }
        Ok(s.slots[slot].as_ref().expect("slot filled").device_ptr())
    }

    /// The scratch buffers as they are now (a captured graph keeps those it was captured with).
    fn scratch_buffers(&self) -> Vec<Arc<CudaBuffer>> {
        self.scratch
            .lock()
            .slots
            .iter()
            .flatten()
            .cloned()
            .collect()
    }

    /// Launches the kernels of `nodes` one by one.
    fn launch_nodes(&self, graph: &Graph, nodes: &[TensorId]) -> Result<()> {
        dispatch::compute_nodes(self, graph, nodes)
    }

    /// Captures the launches of `nodes` into a CUDA graph (nothing runs). `None` when a launch
    /// failed or could not be captured.
    fn capture(&self, graph: &Graph, nodes: &[TensorId]) -> Option<CudaGraph> {
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        let _capturing = crate::memory::CaptureGuard::enter();
        self.stream.begin_capture(mode).ok()?;
        let launched = self.launch_nodes(graph, nodes);
        let flags = sys::CUgraphInstantiate_flags(0);
        let captured = self.stream.end_capture(flags);
        match (launched, captured) {
            (Ok(()), Ok(g)) => g,
            _ => None,
        }
    }

    /// Queues `nodes` through the graph cache, a graph per run of
    /// [`graph_cache::NODES_PER_GRAPH`] launched nodes.
    fn compute_in_runs(&self, graph: &Graph, nodes: &[TensorId]) -> Result<()> {
        let runs = (self.graphs.lock()).runs_of(graph, nodes, graph_cache::NODES_PER_GRAPH);
        runs.into_iter()
            .try_for_each(|run| self.compute_through_graphs(graph, &nodes[run]))
    }

    /// Queues `nodes` through the graph cache.
    fn compute_through_graphs(&self, graph: &Graph, nodes: &[TensorId]) -> Result<()> {
        let mut cache = self.graphs.lock();
        let key = match cache.key_of(graph, nodes) {
            Some((_, 0)) => return Ok(()),
            Some((key, _)) if cache.enabled() => key,
            _ => return self.launch_nodes(graph, nodes),
        };
        match cache.plan(key) {
            Plan::Eager => self.launch_nodes(graph, nodes),
            Plan::Replay => cache.replay(key),
            Plan::Capture => match self.capture(graph, nodes) {
                Some(g) => {
                    cache.store(key, g, self.scratch_buffers());
                    cache.replay(key)
                }
                None => {
                    cache.capture_failed(key);
                    self.launch_nodes(graph, nodes)
                }
            },
        }
    }

    /// Queues `nodes` behind a hold kernel with a timing event after each launch (a node or a fused
    /// chain), waits, and adds each launch's GPU time to the profile.
    fn launch_profiled(
        &self,
        graph: &Graph,
        nodes: &[TensorId],
        diagnostics: &Mutex<Diagnostics>,
    ) -> Result<()> {
        let launched = dispatch::fusion_groups(graph, nodes);
        let timing = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let cycles = profile::hold_cycles(launched.len());
        let mut hold = self.stream.launch_builder(self.kernels.get("k_hold")?);
        hold.arg(&cycles);
        // SAFETY: k_hold takes one u64 and touches no memory.
        cu("k_hold", unsafe {
            hold.launch(cudarc::driver::LaunchConfig::for_num_elems(1))
        })?;
        let mut events = vec![cu("record event", self.stream.record_event(timing))?];
        for group in &launched {
            self.launch_nodes(graph, group)?;
            events.push(cu("record event", self.stream.record_event(timing))?);
        }
        let mut d = diagnostics.lock();
        for (i, group) in launched.iter().enumerate() {
            let ms = cu("event elapsed", events[i].elapsed_ms(&events[i + 1]))?;
            let gpu = Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3);
            let labels: Vec<String> = group
                .iter()
                .map(|&n| profile::node_label(graph, n))
                .collect();
            d.add_node(labels.join(" + "), gpu);
        }
        d.add_profiled_call();
        Ok(())
    }

    fn bind(&self) -> Result<()> {
        cu("bind context", self.device.context().bind_to_thread())
    }

    fn cu_stream(&self) -> sys::CUstream {
        self.stream.cu_stream()
    }
}

fn ggml_buffer_use(d: &DataRef, len: usize) -> Result<()> {
    check_range(d.offset, len, d.buffer.size())
}

/// A recorded point of a CUDA stream.
pub struct CudaStreamEvent(CudaEvent);

impl Event for CudaStreamEvent {
    fn synchronize(&self) -> Result<()> {
        cu("event synchronize", self.0.synchronize())
    }
    fn is_done(&self) -> bool {
        self.0.is_complete()
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> String {
        self.device.name()
    }
    fn device(&self) -> Arc<dyn Device> {
        self.device.clone()
    }
    fn set_async(&self, dst: &DataRef, data: &[u8]) -> Result<()> {
        ggml_buffer_use(dst, data.len())?;
        match dst.buffer.as_any().downcast_ref::<CudaBuffer>() {
            Some(b) if !data.is_empty() => {
                self.bind()?;
                // SAFETY: range checked; the host data is staged before the call returns.
                cu("cuMemcpyHtoDAsync", unsafe {
                    result::memcpy_htod_async(
                        b.device_ptr() + dst.offset as u64,
                        data,
                        self.cu_stream(),
                    )
                })
            }
            Some(_) => Ok(()),
            None => {
                self.synchronize()?;
                dst.buffer.set(dst.offset, data)
            }
        }
    }
    fn get_async(&self, src: &DataRef, out: &mut [u8]) -> Result<()> {
        ggml_buffer_use(src, out.len())?;
        match src.buffer.as_any().downcast_ref::<CudaBuffer>() {
            Some(b) if !out.is_empty() => {
                self.bind()?;
                // SAFETY: range checked; the stream is synchronized before `out` is released.
                cu("cuMemcpyDtoHAsync", unsafe {
                    result::memcpy_dtoh_async(
                        out,
                        b.device_ptr() + src.offset as u64,
                        self.cu_stream(),
                    )
                })?;
                self.synchronize()
            }
            Some(_) => Ok(()),
            None => {
                self.synchronize()?;
                src.buffer.get(src.offset, out)
            }
        }
    }
    fn copy_async(&self, src: &DataRef, dst: &DataRef, len: usize) -> Result<()> {
        ggml_buffer_use(src, len)?;
        ggml_buffer_use(dst, len)?;
        if len == 0 {
            return Ok(());
        }
        let s = src.buffer.as_any().downcast_ref::<CudaBuffer>();
        let d = dst.buffer.as_any().downcast_ref::<CudaBuffer>();
        self.bind()?;
        match (s, d) {
            (Some(s), Some(d)) => {
                let (sp, dp) = (
                    s.device_ptr() + src.offset as u64,
                    d.device_ptr() + dst.offset as u64,
                );
                if s.ordinal() == d.ordinal() {
                    // SAFETY: both ranges checked.
                    cu("cuMemcpyDtoDAsync", unsafe {
                        result::memcpy_dtod_async(dp, sp, len, self.cu_stream())
                    })
                } else {
                    // SAFETY: both ranges checked; contexts are live.
                    cu("cuMemcpyPeerAsync", unsafe {
                        result::memcpy_peer_async(
                            d.context().cu_ctx(),
                            dp,
                            s.context().cu_ctx(),
                            sp,
                            len,
                            self.cu_stream(),
                        )
                    })
                }
            }
            (Some(_), None) => match dst.host_ptr() {
                Some(h) => {
                    // SAFETY: the destination range lies in its host buffer.
                    let out = unsafe { std::slice::from_raw_parts_mut(h, len) };
                    self.get_async(src, out)
                }
                None => Err(err(
                    "copy_async: destination is neither CUDA nor host memory",
                )),
            },
            (None, Some(_)) => match src.host_ptr() {
                Some(h) => {
                    // SAFETY: the source range lies in its host buffer.
                    let data = unsafe { std::slice::from_raw_parts(h as *const u8, len) };
                    self.set_async(dst, data)
                }
                None => Err(err("copy_async: source is neither CUDA nor host memory")),
            },
            (None, None) => {
                let mut staging = vec![0u8; len];
                self.synchronize()?;
                src.buffer.get(src.offset, &mut staging)?;
                dst.buffer.set(dst.offset, &staging)
            }
        }
    }
    /// Queues `nodes`: eagerly the first time, then as a captured CUDA graph (see `graph_cache`);
    /// profiled node by node when the environment asks for it (see `profile`); launched straight
    /// into a recording's capture while one is under way.
    fn compute(&self, graph: &Graph, nodes: &[TensorId]) -> Result<()> {
        self.bind()?;
        if self.recording.load(Ordering::Relaxed) {
            return self.launch_nodes(graph, nodes);
        }
        match &self.diagnostics {
            Some(d) if self.profiling => self.launch_profiled(graph, nodes, d),
            _ => self.timed(
                || spans::call_label(graph, nodes),
                true,
                || self.compute_in_runs(graph, nodes),
            ),
        }
    }
    fn queues_work(&self) -> bool {
        true
    }
    fn synchronize(&self) -> Result<()> {
        cu("stream synchronize", self.stream.synchronize())
    }
    fn record_event(&self) -> Result<Arc<dyn Event>> {
        let e = cu("record event", self.stream.record_event(None))?;
        Ok(Arc::new(CudaStreamEvent(e)))
    }
    /// Foreign events cannot be waited for on the device through the trait, so the host waits.
    fn wait_event(&self, event: &dyn Event) -> Result<()> {
        event.synchronize()
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        if let Some(d) = &self.diagnostics {
            let mut d = d.lock();
            let name = self.device.name();
            if self.profiling {
                eprint!("{}", d.profile_report(&name));
            } else {
                let finished = self.stream.synchronize().is_ok() && d.spans.finish().is_ok();
                if !finished {
                    eprintln!("{name}: the calls' GPU spans could not be read");
                }
                eprint!("{}", d.stats_report(&name, self.graphs.lock().stats()));
            }
        }
    }
}
