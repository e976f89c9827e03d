//! [`HipBackend`]: one HIP stream of a device with its hipBLAS handle and a scratch area for
//! converted operands. Copies are queued on the stream (device to device, across devices through
//! peer copies, and to and from host memory); events are HIP events. Nodes are dispatched by
//! `ggml_gpu::dispatch` through the [`Runner`] of `crate::runner`.

use crate::blas::BlasHandle;
use crate::device::{DeviceCtx, HipDevice};
use crate::err;
use crate::ffi::hip::{self, Stream};
use crate::kernels::Kernels;
use crate::memory::HipBuffer;
use ggml_core::backend::check_range;
use ggml_core::{Backend, Buffer as _, DataRef, Device, Event, Graph, Result, TensorId};
use ggml_gpu::dispatch;
use parking_lot::Mutex;
use std::ffi::c_void;
use std::sync::Arc;

/// A HIP stream, destroyed on drop.
pub struct HipStream {
    ctx: DeviceCtx,
    raw: Stream,
}

// SAFETY: HIP streams may be used from any thread.
unsafe impl Send for HipStream {}
unsafe impl Sync for HipStream {}

impl HipStream {
    /// A new non-blocking stream on the device of `ctx`.
    pub fn new(ctx: DeviceCtx) -> Result<Self> {
        ctx.bind()?;
        let mut raw: Stream = std::ptr::null_mut();
        // SAFETY: creates a stream on the current device, destroyed once in `drop`.
        ctx.call("hipStreamCreateWithFlags", unsafe {
            (ctx.runtime().hip.hipStreamCreateWithFlags)(&mut raw, hip::STREAM_NON_BLOCKING)
        })?;
        Ok(HipStream { ctx, raw })
    }

    pub fn raw(&self) -> Stream {
        self.raw
    }

    /// Waits for the work queued on this stream.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the stream is live.
        self.ctx.call("hipStreamSynchronize", unsafe {
            (self.ctx.runtime().hip.hipStreamSynchronize)(self.raw)
        })
    }
}

impl Drop for HipStream {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            let hip = &self.ctx.runtime().hip;
            // SAFETY: created in `new`, destroyed once after its work completed.
            unsafe {
                (hip.hipStreamSynchronize)(self.raw);
                (hip.hipStreamDestroy)(self.raw);
            }
        }
    }
}

/// Device scratch allocations reused across ops of one stream (stream order keeps them safe).
#[derive(Default)]
struct Scratch {
    slots: Vec<Option<Arc<HipBuffer>>>,
}

/// A stream on one HIP device. Fields drop in order: the hipBLAS handle and scratch memory before
/// the stream they are used on, the stream (which waits for its work) before the kernels' module.
pub struct HipBackend {
    blas: Mutex<BlasHandle>,
    scratch: Mutex<Scratch>,
    stream: HipStream,
    kernels: Arc<Kernels>,
    device: Arc<HipDevice>,
}

impl HipBackend {
    pub fn new(device: Arc<HipDevice>) -> Result<Self> {
        let kernels = device.kernels()?;
        let stream = HipStream::new(*device.ctx())?;
        let blas = BlasHandle::new(*device.ctx(), &stream)?;
        Ok(HipBackend {
            blas: Mutex::new(blas),
            scratch: Mutex::new(Scratch::default()),
            stream,
            kernels,
            device,
        })
    }

    pub fn hip_device(&self) -> &Arc<HipDevice> {
        &self.device
    }

    pub fn stream(&self) -> &HipStream {
        &self.stream
    }

    fn ctx(&self) -> &DeviceCtx {
        self.device.ctx()
    }

    pub(crate) fn blas(&self) -> parking_lot::MutexGuard<'_, BlasHandle> {
        self.blas.lock()
    }

    pub(crate) fn kernels(&self) -> &Kernels {
        &self.kernels
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
            s.slots[slot] = Some(Arc::new(HipBuffer::new(
                *self.ctx(),
                format!("{} scratch", self.device.name()),
                size,
            )?));
        }
        Ok(s.slots[slot].as_ref().expect("slot filled").device_ptr())
    }

    /// Queues a copy of `len` bytes between host and device memory.
    fn memcpy_async(
        &self,
        dst: *mut c_void,
        src: *const c_void,
        len: usize,
        kind: i32,
    ) -> Result<()> {
        // SAFETY: the caller checked both ranges; the stream is synchronized before host memory
        // involved in the copy is released (see the callers).
        self.ctx().call("hipMemcpyAsync", unsafe {
            (self.ctx().runtime().hip.hipMemcpyAsync)(dst, src, len, kind, self.stream.raw())
        })
    }
}

fn hip_buffer(d: &DataRef) -> Option<&HipBuffer> {
    d.buffer.as_any().downcast_ref::<HipBuffer>()
}

/// A recorded point of a HIP stream.
pub struct HipStreamEvent {
    ctx: DeviceCtx,
    raw: hip::Event,
}

// SAFETY: HIP events may be used from any thread.
unsafe impl Send for HipStreamEvent {}
unsafe impl Sync for HipStreamEvent {}

impl Drop for HipStreamEvent {
    fn drop(&mut self) {
        // SAFETY: created in `record_event`, destroyed once.
        let _ = unsafe { (self.ctx.runtime().hip.hipEventDestroy)(self.raw) };
    }
}

impl Event for HipStreamEvent {
    fn synchronize(&self) -> Result<()> {
        // SAFETY: the event is live.
        self.ctx.call("hipEventSynchronize", unsafe {
            (self.ctx.runtime().hip.hipEventSynchronize)(self.raw)
        })
    }
    fn is_done(&self) -> bool {
        // SAFETY: the event is live. Not ready is hipErrorNotReady; anything else but success is an
        // error that `synchronize` reports.
        let code = unsafe { (self.ctx.runtime().hip.hipEventQuery)(self.raw) };
        code != hip::ERROR_NOT_READY
    }
}

impl Backend for HipBackend {
    fn name(&self) -> String {
        self.device.name()
    }
    fn device(&self) -> Arc<dyn Device> {
        self.device.clone()
    }
    /// Queues the copy and waits for it: `data` is only borrowed for the call, and HIP may still
    /// read pageable memory after an asynchronous copy returns.
    fn set_async(&self, dst: &DataRef, data: &[u8]) -> Result<()> {
        check_range(dst.offset, data.len(), dst.buffer.size())?;
        match hip_buffer(dst) {
            Some(b) if !data.is_empty() => {
                self.ctx().bind()?;
                let to = (b.device_ptr() + dst.offset as u64) as *mut c_void;
                let from = data.as_ptr() as *const c_void;
                self.memcpy_async(to, from, data.len(), hip::MEMCPY_HOST_TO_DEVICE)?;
                self.synchronize()
            }
            Some(_) => Ok(()),
            None => {
                self.synchronize()?;
                dst.buffer.set(dst.offset, data)
            }
        }
    }
    fn get_async(&self, src: &DataRef, out: &mut [u8]) -> Result<()> {
        check_range(src.offset, out.len(), src.buffer.size())?;
        match hip_buffer(src) {
            Some(b) if !out.is_empty() => {
                self.ctx().bind()?;
                let from = (b.device_ptr() + src.offset as u64) as *const c_void;
                let to = out.as_mut_ptr() as *mut c_void;
                self.memcpy_async(to, from, out.len(), hip::MEMCPY_DEVICE_TO_HOST)?;
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
        check_range(src.offset, len, src.buffer.size())?;
        check_range(dst.offset, len, dst.buffer.size())?;
        if len == 0 {
            return Ok(());
        }
        self.ctx().bind()?;
        match (hip_buffer(src), hip_buffer(dst)) {
            (Some(s), Some(d)) => {
                let from = (s.device_ptr() + src.offset as u64) as *const c_void;
                let to = (d.device_ptr() + dst.offset as u64) as *mut c_void;
                if s.ordinal() == d.ordinal() {
                    self.memcpy_async(to, from, len, hip::MEMCPY_DEVICE_TO_DEVICE)
                } else {
                    let (dd, sd) = (d.ordinal() as i32, s.ordinal() as i32);
                    let hip = &self.ctx().runtime().hip;
                    // SAFETY: both ranges checked; both buffers are live device memory.
                    self.ctx().call("hipMemcpyPeerAsync", unsafe {
                        (hip.hipMemcpyPeerAsync)(to, dd, from, sd, len, self.stream.raw())
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
                    "copy_async: destination is neither HIP nor host memory",
                )),
            },
            (None, Some(_)) => match src.host_ptr() {
                Some(h) => {
                    // SAFETY: the source range lies in its host buffer.
                    let data = unsafe { std::slice::from_raw_parts(h as *const u8, len) };
                    self.set_async(dst, data)
                }
                None => Err(err("copy_async: source is neither HIP nor host memory")),
            },
            (None, None) => {
                let mut staging = vec![0u8; len];
                self.synchronize()?;
                src.buffer.get(src.offset, &mut staging)?;
                dst.buffer.set(dst.offset, &staging)
            }
        }
    }
    fn compute(&self, graph: &Graph, nodes: &[TensorId]) -> Result<()> {
        self.ctx().bind()?;
        dispatch::compute_nodes(self, graph, nodes)
    }
    fn queues_work(&self) -> bool {
        true
    }
    fn synchronize(&self) -> Result<()> {
        self.ctx().bind()?;
        self.stream.synchronize()
    }
    fn record_event(&self) -> Result<Arc<dyn Event>> {
        let ctx = *self.ctx();
        ctx.bind()?;
        let hip = &ctx.runtime().hip;
        let mut raw: hip::Event = std::ptr::null_mut();
        // SAFETY: creates an event on the current device, destroyed once by `HipStreamEvent`.
        ctx.call("hipEventCreateWithFlags", unsafe {
            (hip.hipEventCreateWithFlags)(&mut raw, hip::EVENT_DISABLE_TIMING)
        })?;
        let event = HipStreamEvent { ctx, raw };
        // SAFETY: event and stream are live and on the same device.
        ctx.call("hipEventRecord", unsafe {
            (hip.hipEventRecord)(raw, self.stream.raw())
        })?;
        Ok(Arc::new(event))
    }
    /// Foreign events cannot be waited for on the device through the trait, so the host waits.
    fn wait_event(&self, event: &dyn Event) -> Result<()> {
        event.synchronize()
    }
}
