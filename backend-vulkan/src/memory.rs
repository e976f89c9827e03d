//! Device memory: [`VulkanBuffer`] (a device-local buffer, not host-addressable; `set`/`get`/`fill`
//! go through the device's staging buffer and transfer commands) and [`VulkanBufferType`], its
//! allocator. Buffer-to-buffer copies on one device are transfer commands too ([`copy_buffers`]).

use crate::context::{Ctx, RawBuffer, Submitter, STAGING_BYTES};
use ash::vk;
use ggml_core::backend::check_range;
use ggml_core::{Buffer, BufferType, Result};
use std::any::Any;
use std::sync::Arc;

/// Alignment of tensor offsets inside Vulkan buffers.
pub const VK_ALIGNMENT: usize = 64;

/// A device-local buffer of one logical device.
pub struct VulkanBuffer {
    ctx: Arc<Ctx>,
    raw: RawBuffer,
    size: usize,
    name: String,
}

impl VulkanBuffer {
    /// The device this buffer belongs to.
    pub fn ctx(&self) -> &Arc<Ctx> {
        &self.ctx
    }

    /// The Vulkan buffer handle.
    pub fn handle(&self) -> vk::Buffer {
        self.raw.buffer
    }
}

impl Drop for VulkanBuffer {
    fn drop(&mut self) {
        self.ctx.free_raw(&self.raw);
    }
}

/// Runs `f` on chunks of at most the staging size: `(done, len)`.
fn chunked(total: usize, mut f: impl FnMut(usize, usize) -> Result<()>) -> Result<()> {
    let mut done = 0;
    while done < total {
        let len = (total - done).min(STAGING_BYTES);
        f(done, len)?;
        done += len;
    }
    Ok(())
}

fn staging_ptr(s: &Submitter) -> *mut u8 {
    s.staging
        .mapped
        .expect("the staging buffer is host-visible and mapped")
}

/// Copies `len` bytes from `src` at `src_off` to `dst` at `dst_off`, both buffers of `ctx`.
pub fn copy_buffers(
    ctx: &Ctx,
    src: vk::Buffer,
    src_off: usize,
    dst: vk::Buffer,
    dst_off: usize,
    len: usize,
) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let mut guard = ctx.lock()?;
    let s = guard.as_mut().expect("checked by lock");
    ctx.run(s, |d, cb| {
        let region = [vk::BufferCopy {
            src_offset: src_off as u64,
            dst_offset: dst_off as u64,
            size: len as u64,
        }];
        // SAFETY: both ranges were bounds-checked by the caller; `cb` is recording.
        unsafe { d.cmd_copy_buffer(cb, src, dst, &region) };
        Ok(())
    })
}

impl Buffer for VulkanBuffer {
    fn size(&self) -> usize {
        self.size
    }
    fn name(&self) -> String {
        self.name.clone()
    }
    fn host_ptr(&self) -> Option<*mut u8> {
        None
    }
    fn set(&self, offset: usize, data: &[u8]) -> Result<()> {
        check_range(offset, data.len(), self.size)?;
        let mut guard = self.ctx.lock()?;
        let s = guard.as_mut().expect("checked by lock");
        chunked(data.len(), |done, len| {
            // SAFETY: the staging buffer holds STAGING_BYTES >= len bytes and no work uses it (we hold
            // the submission lock and every submission is complete).
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr().add(done), staging_ptr(s), len) };
            let (staging, dst) = (s.staging.buffer, self.raw.buffer);
            self.ctx.run(s, |d, cb| {
                let region = [vk::BufferCopy {
                    src_offset: 0,
                    dst_offset: (offset + done) as u64,
                    size: len as u64,
                }];
                // SAFETY: the range was checked against the buffer size above.
                unsafe { d.cmd_copy_buffer(cb, staging, dst, &region) };
                Ok(())
            })
        })
    }
    fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        check_range(offset, out.len(), self.size)?;
        let mut guard = self.ctx.lock()?;
        let s = guard.as_mut().expect("checked by lock");
        chunked(out.len(), |done, len| {
            let (staging, src) = (s.staging.buffer, self.raw.buffer);
            self.ctx.run(s, |d, cb| {
                let region = [vk::BufferCopy {
                    src_offset: (offset + done) as u64,
                    dst_offset: 0,
                    size: len as u64,
                }];
                // SAFETY: the range was checked against the buffer size above.
                unsafe { d.cmd_copy_buffer(cb, src, staging, &region) };
                Ok(())
            })?;
            // SAFETY: the copy is complete; the staging buffer holds at least `len` bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(staging_ptr(s), out.as_mut_ptr().add(done), len)
            };
            Ok(())
        })
    }
    fn fill(&self, offset: usize, len: usize, value: u8) -> Result<()> {
        check_range(offset, len, self.size)?;
        // vkCmdFillBuffer wants 4-byte aligned ranges: the unaligned head and tail go through `set`.
        let start = offset.next_multiple_of(4).min(offset + len);
        let end = ((offset + len) / 4 * 4).max(start);
        self.set(offset, &vec![value; start - offset])?;
        self.set(end, &vec![value; offset + len - end])?;
        if end > start {
            let mut guard = self.ctx.lock()?;
            let s = guard.as_mut().expect("checked by lock");
            let buffer = self.raw.buffer;
            self.ctx.run(s, |d, cb| {
                // SAFETY: the aligned range lies inside the buffer (checked above).
                unsafe {
                    d.cmd_fill_buffer(
                        cb,
                        buffer,
                        start as u64,
                        (end - start) as u64,
                        u32::from_ne_bytes([value; 4]),
                    )
                };
                Ok(())
            })?;
        }
        Ok(())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The allocator of device-local buffers of one logical device.
pub struct VulkanBufferType {
    ctx: Arc<Ctx>,
    device_name: String,
}

impl VulkanBufferType {
    pub fn new(ctx: Arc<Ctx>, device_name: String) -> Self {
        VulkanBufferType { ctx, device_name }
    }
}

impl BufferType for VulkanBufferType {
    fn name(&self) -> String {
        format!("{}:device", self.device_name)
    }
    fn alignment(&self) -> usize {
        VK_ALIGNMENT
    }
    fn max_size(&self) -> usize {
        self.ctx.max_buffer()
    }
    fn is_host(&self) -> bool {
        false
    }
    fn alloc(&self, size: usize) -> Result<Arc<dyn Buffer>> {
        let raw = self.ctx.alloc_raw(
            size,
            vk::BufferUsageFlags::STORAGE_BUFFER
                | vk::BufferUsageFlags::TRANSFER_SRC
                | vk::BufferUsageFlags::TRANSFER_DST,
            false,
        )?;
        Ok(Arc::new(VulkanBuffer {
            ctx: self.ctx.clone(),
            raw,
            size,
            name: self.name(),
        }))
    }
}
