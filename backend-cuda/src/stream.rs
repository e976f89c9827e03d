//! [`CudaBackend`]: one CUDA stream of a device with its cuBLAS handle and a scratch area for
//! converted operands. Copies are queued on the stream (device to device, across devices through
//! peer copies, and to and from host memory); events are CUDA events.

use crate::device::CudaDevice;
use crate::kernels::{self, Kernels};
use crate::memory::CudaBuffer;
use crate::{cu, err};
use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::driver::{result, sys, CudaEvent, CudaStream};
use ggml_core::backend::check_range;
use ggml_core::{Backend, Buffer as _, DataRef, Device, Event, Graph, Result, TensorId};
use parking_lot::Mutex;
use std::sync::Arc;

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

/// A stream on one CUDA device.
pub struct CudaBackend {
    device: Arc<CudaDevice>,
    stream: Arc<CudaStream>,
    kernels: Arc<Kernels>,
    blas: Mutex<BlasHandle>,
    scratch: Mutex<Scratch>,
}

impl CudaBackend {
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
        Ok(CudaBackend {
            device,
            stream,
            kernels,
            blas: Mutex::new(handle),
            scratch: Mutex::new(Scratch::default()),
        })
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
                self.device.context().clone(),
                format!("{} scratch", self.device.name()),
                size,
            )?));
        }
        Ok(s.slots[slot].as_ref().expect("slot filled").device_ptr())
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
    fn compute(&self, graph: &Graph, nodes: &[TensorId]) -> Result<()> {
        self.bind()?;
        for &node in nodes {
            let t = graph.tensor(node);
            if t.op.is_view() || t.is_leaf() || t.nelements() == 0 {
                continue;
            }
            kernels::compute_node(self, graph, node).map_err(|e| match e {
                ggml_core::Error::Backend { backend, msg } => ggml_core::Error::Backend {
                    backend,
                    msg: format!("{} at node {}: {msg}", t.op.name(), t.name),
                },
                other => other,
            })?;
        }
        Ok(())
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
