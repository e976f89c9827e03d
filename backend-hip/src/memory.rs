//! Memory of the HIP devices: [`HipBuffer`] (device memory from `hipMalloc`; `set`/`get`/`fill`
//! wait for the device's queued work, then copy synchronously, bounds-checked) with its allocator
//! [`HipBufferType`], and [`PinnedBuffer`] / [`PinnedBufferType`] (page-locked host memory from
//! `hipHostAlloc`, portable to every device).

use crate::device::DeviceCtx;
use crate::ffi::hip;
use ggml_core::backend::check_range;
use ggml_core::host_buffer::{HostBuffer, HostMemory};
use ggml_core::{Buffer, BufferType, Error, Result};
use std::any::Any;
use std::ffi::c_void;
use std::sync::Arc;

/// Alignment of tensor offsets inside HIP buffers.
pub const HIP_ALIGNMENT: usize = 256;

/// A block of device memory on one HIP device.
pub struct HipBuffer {
    ptr: u64,
    size: usize,
    ctx: DeviceCtx,
    device: String,
}

impl HipBuffer {
    /// Allocates `size` bytes on the device of `ctx` (zero-filled).
    pub fn new(ctx: DeviceCtx, device: String, size: usize) -> Result<Self> {
        let mut b = HipBuffer {
            ptr: 0,
            size,
            ctx,
            device,
        };
        if size == 0 {
            return Ok(b);
        }
        ctx.bind()?;
        let hip = &ctx.runtime().hip;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: the device is current; the pointer is freed once in `drop`.
        let code = unsafe { (hip.hipMalloc)(&mut p, size) };
        if code == hip::ERROR_OUT_OF_MEMORY {
            let (mut free, mut total) = (0usize, 0usize);
            // SAFETY: writes two sizes for the current device.
            unsafe { (hip.hipMemGetInfo)(&mut free, &mut total) };
            return Err(Error::OutOfMemory {
                device: b.device.clone(),
                requested: size,
                available: free,
            });
        }
        ctx.call(&format!("hipMalloc of {size} bytes on {}", b.device), code)?;
        b.ptr = p as u64;
        b.fill(0, size, 0)?;
        Ok(b)
    }

    /// Device address of byte 0.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// Device ordinal of this memory.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// Address of byte `offset`, as the C API takes it.
    fn at(&self, offset: usize) -> *mut c_void {
        (self.ptr + offset as u64) as *mut c_void
    }
}

impl Drop for HipBuffer {
    fn drop(&mut self) {
        if self.size > 0 && self.ctx.synchronize().is_ok() {
            // SAFETY: allocated in `new`, freed once; no queued work uses it after the synchronize.
            let _ = unsafe { (self.ctx.runtime().hip.hipFree)(self.ptr as *mut c_void) };
        }
    }
}

impl Buffer for HipBuffer {
    fn size(&self) -> usize {
        self.size
    }
    fn name(&self) -> String {
        self.device.clone()
    }
    fn host_ptr(&self) -> Option<*mut u8> {
        None
    }
    fn set(&self, offset: usize, data: &[u8]) -> Result<()> {
        check_range(offset, data.len(), self.size)?;
        if data.is_empty() {
            return Ok(());
        }
        self.ctx.synchronize()?;
        let hip = &self.ctx.runtime().hip;
        // SAFETY: the range lies inside the allocation; the copy completes before returning.
        self.ctx.call("hipMemcpy (host to device)", unsafe {
            (hip.hipMemcpy)(
                self.at(offset),
                data.as_ptr() as *const c_void,
                data.len(),
                hip::MEMCPY_HOST_TO_DEVICE,
            )
        })
    }
    fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        check_range(offset, out.len(), self.size)?;
        if out.is_empty() {
            return Ok(());
        }
        self.ctx.synchronize()?;
        let hip = &self.ctx.runtime().hip;
        // SAFETY: the range lies inside the allocation; the copy completes before returning.
        self.ctx.call("hipMemcpy (device to host)", unsafe {
            (hip.hipMemcpy)(
                out.as_mut_ptr() as *mut c_void,
                self.at(offset),
                out.len(),
                hip::MEMCPY_DEVICE_TO_HOST,
            )
        })
    }
    fn fill(&self, offset: usize, len: usize, value: u8) -> Result<()> {
        check_range(offset, len, self.size)?;
        if len == 0 {
            return Ok(());
        }
        self.ctx.synchronize()?;
        let hip = &self.ctx.runtime().hip;
        // SAFETY: the range lies inside the allocation.
        self.ctx.call("hipMemset", unsafe {
            (hip.hipMemset)(self.at(offset), i32::from(value), len)
        })?;
        self.ctx.synchronize()
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The device-memory allocator of one HIP device.
pub struct HipBufferType {
    ctx: DeviceCtx,
    device: String,
    total_memory: usize,
}

impl HipBufferType {
    pub fn new(ctx: DeviceCtx, device: String, total_memory: usize) -> Self {
        HipBufferType {
            ctx,
            device,
            total_memory,
        }
    }
}

impl BufferType for HipBufferType {
    fn name(&self) -> String {
        self.device.clone()
    }
    fn alignment(&self) -> usize {
        HIP_ALIGNMENT
    }
    fn max_size(&self) -> usize {
        self.total_memory
    }
    fn is_host(&self) -> bool {
        false
    }
    fn alloc(&self, size: usize) -> Result<Arc<dyn Buffer>> {
        Ok(Arc::new(HipBuffer::new(
            self.ctx,
            self.device.clone(),
            size,
        )?))
    }
}

/// Page-locked host memory (`hipHostAlloc`, portable to every device).
pub struct PinnedMemory {
    ptr: *mut u8,
    size: usize,
    ctx: DeviceCtx,
}

// SAFETY: a plain host allocation; access ordering is the scheduler's job, as for every buffer.
unsafe impl Send for PinnedMemory {}
unsafe impl Sync for PinnedMemory {}

impl PinnedMemory {
    pub fn new(ctx: DeviceCtx, size: usize) -> Result<Self> {
        if size == 0 {
            return Ok(PinnedMemory {
                ptr: std::ptr::NonNull::dangling().as_ptr(),
                size,
                ctx,
            });
        }
        ctx.bind()?;
        let mut p: *mut c_void = std::ptr::null_mut();
        let hip = &ctx.runtime().hip;
        // SAFETY: freed once in `drop`.
        let code = unsafe { (hip.hipHostAlloc)(&mut p, size, hip::HOST_ALLOC_PORTABLE) };
        if code != hip::SUCCESS || p.is_null() {
            return Err(Error::OutOfMemory {
                device: format!("pinned host (hipError_t {code})"),
                requested: size,
                available: 0,
            });
        }
        let ptr = p as *mut u8;
        // SAFETY: `size` bytes were just allocated.
        unsafe { std::ptr::write_bytes(ptr, 0, size) };
        Ok(PinnedMemory { ptr, size, ctx })
    }
}

impl Drop for PinnedMemory {
    fn drop(&mut self) {
        if self.size > 0 && self.ctx.synchronize().is_ok() {
            // SAFETY: allocated in `new`, freed once; no queued copy uses it after the synchronize.
            let _ = unsafe { (self.ctx.runtime().hip.hipFreeHost)(self.ptr as *mut c_void) };
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
        "hip_host".into()
    }
}

/// Page-locked host memory as a buffer.
pub type PinnedBuffer = HostBuffer<PinnedMemory>;

/// Allocates [`PinnedBuffer`]s.
pub struct PinnedBufferType {
    ctx: DeviceCtx,
}

impl PinnedBufferType {
    pub fn new(ctx: DeviceCtx) -> Self {
        PinnedBufferType { ctx }
    }
}

impl BufferType for PinnedBufferType {
    fn name(&self) -> String {
        "hip_host".into()
    }
    fn alignment(&self) -> usize {
        64
    }
    fn is_host(&self) -> bool {
        true
    }
    fn alloc(&self, size: usize) -> Result<Arc<dyn Buffer>> {
        Ok(Arc::new(PinnedBuffer::from_memory(PinnedMemory::new(
            self.ctx, size,
        )?)))
    }
}
