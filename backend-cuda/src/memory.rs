//! Memory of the CUDA devices: [`CudaBuffer`] (device memory from `cuMemAlloc`; `set`/`get`/`fill`
//! wait for the device's queued work, then copy and wait for the copy, bounds-checked) with its allocator
//! [`CudaBufferType`], and [`PinnedBuffer`] / [`PinnedBufferType`] (page-locked host memory for fast
//! transfers; mid-sized reads go through one as a bounce buffer). Context-wide waits are serialized
//! with stream capture ([`CaptureGuard`]). Live device bytes are counted per device
//! ([`DeviceMemory`]), which also holds a logical device to its share of the card.

use crate::{cu, err};
use cudarc::driver::{result, sys, CudaContext};
use ggml_core::backend::check_range;
use ggml_core::host_buffer::{HostBuffer, HostMemory};
use ggml_core::{Buffer, BufferType, Error, Result};
use parking_lot::{Mutex, MutexGuard};
use std::any::Any;
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Reads from device memory of these sizes go through a page-locked bounce buffer: a copy into
/// pageable memory is several times slower (the logits of a decode step are ~0.5 MB). Writes of
/// up to `STAGED_MAX` bytes go through it too: a copy from page-locked memory has landed when it
/// returns, so the write waits for the device once (before the copy), not twice.
const STAGED_MIN: usize = 64 << 10;
const STAGED_MAX: usize = 64 << 20;

/// The process's bounce buffer of [`CudaBuffer::get`] and `set` (portable: any device copies
/// through it).
static STAGING: Mutex<Option<PinnedMemory>> = parking_lot::const_mutex(None);

/// Runs `copy` on the first `len` bytes of the bounce buffer (grown as needed), under its lock.
fn with_staging(
    ctx: &Arc<CudaContext>,
    len: usize,
    copy: impl FnOnce(&mut [u8]) -> Result<()>,
) -> Result<()> {
    let mut staging = STAGING.lock();
    if staging.as_ref().is_none_or(|s| s.size < len) {
        *staging = None;
        *staging = Some(PinnedMemory::new(
            ctx.clone(),
            len.next_power_of_two().max(STAGED_MIN),
        )?);
    }
    let pinned = staging.as_ref().expect("staging set above");
    // SAFETY: the pinned buffer holds at least `len` bytes and is only used under the lock.
    let bounce = unsafe { std::slice::from_raw_parts_mut(pinned.ptr, len) };
    copy(bounce)
}

/// The device memory of one CUDA device (`cuda:K`): its context, the bytes of its live
/// [`CudaBuffer`]s, and for a logical device the share of the card it may hold (an allocation past
/// it fails with [`Error::OutOfMemory`], as on a smaller card).
pub struct DeviceMemory {
    ctx: Arc<CudaContext>,
    index: usize,
    limit: Option<usize>,
    allocated: AtomicUsize,
}

impl DeviceMemory {
    /// The memory of device `cuda:{index}` in `ctx`, limited to `limit` bytes (`None`: the card).
    pub fn new(ctx: Arc<CudaContext>, index: usize, limit: Option<usize>) -> Arc<Self> {
        Arc::new(DeviceMemory {
            ctx,
            index,
            limit,
            allocated: AtomicUsize::new(0),
        })
    }

    /// The context (physical GPU) this memory lives in.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// `K` of `cuda:K`.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The device's name, `cuda:K`.
    pub fn device_name(&self) -> String {
        format!("cuda:{}", self.index)
    }

    /// Bytes the device may hold (`None`: the whole card).
    pub fn limit(&self) -> Option<usize> {
        self.limit
    }

    /// Bytes of the device's live [`CudaBuffer`]s.
    pub fn allocated(&self) -> usize {
        self.allocated.load(Ordering::Relaxed)
    }

    /// Counts `size` more bytes, or fails when they do not fit in the limit.
    fn reserve(&self, size: usize) -> Result<()> {
        let Some(limit) = self.limit else {
            self.allocated.fetch_add(size, Ordering::Relaxed);
            return Ok(());
        };
        self.allocated
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |a| {
                a.checked_add(size).filter(|&t| t <= limit)
            })
            .map(|_| ())
            .map_err(|a| Error::OutOfMemory {
                device: self.device_name(),
                requested: size,
                available: limit.saturating_sub(a),
            })
    }

    fn release(&self, size: usize) {
        self.allocated.fetch_sub(size, Ordering::Relaxed);
    }
}

/// Held while a stream captures a CUDA graph. `cuCtxSynchronize` fails while any stream of the
/// context is capturing, even a stream captured by another thread (another session on the same
/// device), so context-wide waits take this lock first and run between captures.
static CAPTURE: Mutex<()> = parking_lot::const_mutex(());

thread_local! {
    /// Whether this thread is capturing (its own context-wide wait must not take [`CAPTURE`]: it
    /// fails instead, and the capture falls back to eager launches).
    static CAPTURING: Cell<bool> = const { Cell::new(false) };
}

/// The right to capture: no context-wide wait runs in another thread while it is held.
pub(crate) struct CaptureGuard {
    _lock: MutexGuard<'static, ()>,
}

impl CaptureGuard {
    pub(crate) fn enter() -> CaptureGuard {
        let lock = CAPTURE.lock();
        CAPTURING.with(|c| c.set(true));
        CaptureGuard { _lock: lock }
    }
}

impl Drop for CaptureGuard {
    fn drop(&mut self) {
        CAPTURING.with(|c| c.set(false));
    }
}

/// Waits for every stream of `ctx` (bound to this thread), never while another thread captures.
fn synchronize_context(ctx: &CudaContext) -> Result<()> {
    if CAPTURING.with(|c| c.get()) {
        return cu("synchronize", ctx.synchronize());
    }
    let _no_capture = CAPTURE.lock();
    cu("synchronize", ctx.synchronize())
}

/// Alignment of tensor offsets inside CUDA buffers.
pub const CUDA_ALIGNMENT: usize = 256;

/// A block of device memory on one CUDA device.
pub struct CudaBuffer {
    ptr: sys::CUdeviceptr,
    size: usize,
    mem: Arc<DeviceMemory>,
    ctx: Arc<CudaContext>,
    label: String,
}

impl CudaBuffer {
    /// Allocates `size` bytes of the device of `mem` (zero-filled), called `label`.
    pub fn new(mem: &Arc<DeviceMemory>, label: String, size: usize) -> Result<Self> {
        let (mem, ctx) = (mem.clone(), mem.ctx.clone());
        if size == 0 {
            return Ok(CudaBuffer {
                ptr: 0,
                size,
                mem,
                ctx,
                label,
            });
        }
        mem.reserve(size)?;
        let ptr = Self::malloc(&ctx, &label, size).inspect_err(|_| mem.release(size))?;
        let b = CudaBuffer {
            ptr,
            size,
            mem,
            ctx,
            label,
        };
        b.fill(0, size, 0)?;
        Ok(b)
    }

    /// `cuMemAlloc` of `size` bytes in `ctx`.
    fn malloc(ctx: &CudaContext, label: &str, size: usize) -> Result<sys::CUdeviceptr> {
        cu("bind context", ctx.bind_to_thread())?;
        // SAFETY: the context is current; the pointer is freed once in `drop`.
        unsafe { result::malloc_sync(size) }.map_err(|e| {
            let free = result::mem_get_info().map(|m| m.0).unwrap_or(0);
            if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                Error::OutOfMemory {
                    device: label.to_string(),
                    requested: size,
                    available: free,
                }
            } else {
                err(format!("cuMemAlloc of {size} bytes on {label}: {e:?}"))
            }
        })
    }

    /// Device address of byte 0.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// The context (device) owning this memory.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Ordinal of the physical GPU holding this memory (logical devices of one GPU share it).
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// The memory (device) this block is counted in.
    pub fn pool(&self) -> &Arc<DeviceMemory> {
        &self.mem
    }

    /// Binds the context and waits for every stream of the device, before a synchronous copy.
    fn quiesce(&self) -> Result<()> {
        cu("bind context", self.ctx.bind_to_thread())?;
        synchronize_context(&self.ctx)
    }
}

impl Drop for CudaBuffer {
    fn drop(&mut self) {
        if self.size > 0 && self.quiesce().is_ok() {
            // SAFETY: allocated in `new`, freed once; no queued work uses it after the synchronize.
            if unsafe { result::free_sync(self.ptr) }.is_ok() {
                self.mem.release(self.size);
            }
        }
    }
}

impl Buffer for CudaBuffer {
    fn size(&self) -> usize {
        self.size
    }
    fn name(&self) -> String {
        self.label.clone()
    }
    fn host_ptr(&self) -> Option<*mut u8> {
        None
    }
    fn set(&self, offset: usize, data: &[u8]) -> Result<()> {
        check_range(offset, data.len(), self.size)?;
        if data.is_empty() {
            return Ok(());
        }
        self.quiesce()?;
        let dst = self.ptr + offset as u64;
        if data.len() <= STAGED_MAX {
            // From page-locked memory the copy returns once it has landed: no second wait.
            return with_staging(&self.ctx, data.len(), |bounce| {
                bounce.copy_from_slice(data);
                // SAFETY: the range lies inside the allocation.
                cu("cuMemcpyHtoD", unsafe {
                    result::memcpy_htod_sync(dst, bounce)
                })
            });
        }
        // SAFETY: the range lies inside the allocation.
        cu("cuMemcpyHtoD", unsafe {
            result::memcpy_htod_sync(dst, data)
        })?;
        // From pageable memory the copy returns once staged, before its DMA lands; the backends'
        // streams do not wait for the legacy stream, so wait here.
        self.quiesce()
    }
    fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        check_range(offset, out.len(), self.size)?;
        if out.is_empty() {
            return Ok(());
        }
        self.quiesce()?;
        let src = self.ptr + offset as u64;
        if (STAGED_MIN..=STAGED_MAX).contains(&out.len()) {
            return with_staging(&self.ctx, out.len(), |bounce| {
                // SAFETY: the range lies inside the allocation.
                cu("cuMemcpyDtoH", unsafe {
                    result::memcpy_dtoh_sync(bounce, src)
                })?;
                out.copy_from_slice(bounce);
                Ok(())
            });
        }
        // SAFETY: the range lies inside the allocation.
        cu("cuMemcpyDtoH", unsafe {
            result::memcpy_dtoh_sync(out, src)
        })
    }
    fn fill(&self, offset: usize, len: usize, value: u8) -> Result<()> {
        check_range(offset, len, self.size)?;
        if len == 0 {
            return Ok(());
        }
        self.quiesce()?;
        // SAFETY: the range lies inside the allocation.
        cu("cuMemsetD8", unsafe {
            result::memset_d8_sync(self.ptr + offset as u64, value, len)
        })?;
        // The memset may still run after returning (device memory): wait, as for `set`.
        self.quiesce()
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The device-memory allocator of one CUDA device.
pub struct CudaBufferType {
    mem: Arc<DeviceMemory>,
}

impl CudaBufferType {
    pub fn new(mem: Arc<DeviceMemory>) -> Self {
        CudaBufferType { mem }
    }
}

impl BufferType for CudaBufferType {
    fn name(&self) -> String {
        self.mem.device_name()
    }
    fn alignment(&self) -> usize {
        CUDA_ALIGNMENT
    }
    /// The card's memory, or a logical device's share of it.
    fn max_size(&self) -> usize {
        match self.mem.limit {
            Some(limit) => limit,
            None => self.mem.ctx.total_mem().unwrap_or(usize::MAX),
        }
    }
    fn is_host(&self) -> bool {
        false
    }
    fn alloc(&self, size: usize) -> Result<Arc<dyn Buffer>> {
        Ok(Arc::new(CudaBuffer::new(
            &self.mem,
            self.mem.device_name(),
            size,
        )?))
    }
}

/// Page-locked host memory (`cuMemHostAlloc`, portable to every context).
pub struct PinnedMemory {
    ptr: *mut u8,
    size: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: a plain host allocation; access ordering is the scheduler's job, as for every buffer.
unsafe impl Send for PinnedMemory {}
unsafe impl Sync for PinnedMemory {}

impl PinnedMemory {
    pub fn new(ctx: Arc<CudaContext>, size: usize) -> Result<Self> {
        if size == 0 {
            return Ok(PinnedMemory {
                ptr: std::ptr::NonNull::dangling().as_ptr(),
                size,
                ctx,
            });
        }
        cu("bind context", ctx.bind_to_thread())?;
        // SAFETY: freed once in `drop`; 1 = CU_MEMHOSTALLOC_PORTABLE.
        let ptr = unsafe { result::malloc_host(size, 1) }.map_err(|e| Error::OutOfMemory {
            device: format!("pinned host ({e:?})"),
            requested: size,
            available: 0,
        })? as *mut u8;
        // SAFETY: `size` bytes were just allocated.
        unsafe { std::ptr::write_bytes(ptr, 0, size) };
        Ok(PinnedMemory { ptr, size, ctx })
    }
}

impl Drop for PinnedMemory {
    fn drop(&mut self) {
        if self.size > 0 && self.ctx.bind_to_thread().is_ok() {
            let _ = synchronize_context(&self.ctx);
            // SAFETY: allocated in `new`, freed once.
            let _ = unsafe { result::free_host(self.ptr as *mut _) };
        }
    }
}

// SAFETY: the pinned allocation (or the dangling pointer of an empty block) covers `size` bytes
// for the value's life.
unsafe impl HostMemory for PinnedMemory {
    fn ptr(&self) -> *mut u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.size
    }
    fn name(&self) -> String {
        "cuda_host".into()
    }
}

/// Page-locked host memory as a buffer.
pub type PinnedBuffer = HostBuffer<PinnedMemory>;

/// Allocates [`PinnedBuffer`]s.
pub struct PinnedBufferType {
    ctx: Arc<CudaContext>,
}

impl PinnedBufferType {
    pub fn new(ctx: Arc<CudaContext>) -> Self {
        PinnedBufferType { ctx }
    }
}

impl BufferType for PinnedBufferType {
    fn name(&self) -> String {
        "cuda_host".into()
    }
    fn alignment(&self) -> usize {
        64
    }
    fn is_host(&self) -> bool {
        true
    }
    fn alloc(&self, size: usize) -> Result<Arc<dyn Buffer>> {
        Ok(Arc::new(PinnedBuffer::from_memory(PinnedMemory::new(
            self.ctx.clone(),
            size,
        )?)))
    }
}
