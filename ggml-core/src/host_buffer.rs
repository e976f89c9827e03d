//! Plain host memory as a [`Buffer`]: an anonymous memory map, page-aligned, zero-filled and committed
//! by the OS only where touched (so a large, sparsely used arena costs little). Used for staging,
//! composite-device arenas and tests.

use crate::backend::{check_range, Buffer, BufferType};
use crate::error::{Error, Result};
use memmap2::MmapMut;
use std::any::Any;
use std::cell::UnsafeCell;
use std::sync::Arc;

/// A host address range with the bounds-checked copies every host-memory buffer needs
/// (`Buffer::set`/`get`/`fill`), so each buffer kind only owns its allocation.
#[derive(Clone, Copy, Debug)]
pub struct HostSpan {
    ptr: *mut u8,
    len: usize,
}

impl HostSpan {
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes for as long as the span is used.
    pub unsafe fn new(ptr: *mut u8, len: usize) -> HostSpan {
        HostSpan { ptr, len }
    }

    /// Copies `data` to `offset`.
    pub fn set(&self, offset: usize, data: &[u8]) -> Result<()> {
        check_range(offset, data.len(), self.len)?;
        // SAFETY: the range is inside the span (checked); `copy` allows overlap.
        unsafe { std::ptr::copy(data.as_ptr(), self.ptr.add(offset), data.len()) };
        Ok(())
    }

    /// Copies `out.len()` bytes from `offset`.
    pub fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        check_range(offset, out.len(), self.len)?;
        // SAFETY: as for `set`.
        unsafe { std::ptr::copy(self.ptr.add(offset), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Fills `len` bytes at `offset` with `value`.
    pub fn fill(&self, offset: usize, len: usize, value: u8) -> Result<()> {
        check_range(offset, len, self.len)?;
        // SAFETY: as for `set`.
        unsafe { std::ptr::write_bytes(self.ptr.add(offset), value, len) };
        Ok(())
    }
}

/// Host memory backed by an anonymous mapping.
pub struct HostBuffer {
    map: UnsafeCell<Option<MmapMut>>,
    size: usize,
    ptr: *mut u8,
}

// SAFETY: the mapping lives as long as the buffer; concurrent access to the same bytes is ordered by
// the scheduler, as for every buffer.
unsafe impl Send for HostBuffer {}
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    /// A zero-filled buffer of `size` bytes.
    pub fn new(size: usize) -> Result<HostBuffer> {
        if size == 0 {
            return Ok(HostBuffer {
                map: UnsafeCell::new(None),
                size: 0,
                ptr: std::ptr::NonNull::dangling().as_ptr(),
            });
        }
        let mut map = MmapMut::map_anon(size).map_err(|e| Error::OutOfMemory {
            device: format!("host ({e})"),
            requested: size,
            available: 0,
        })?;
        let ptr = map.as_mut_ptr();
        Ok(HostBuffer {
            map: UnsafeCell::new(Some(map)),
            size,
            ptr,
        })
    }
}

impl HostBuffer {
    fn span(&self) -> HostSpan {
        // SAFETY: the mapping (or the dangling pointer of an empty buffer) covers `size` bytes for
        // the buffer's life.
        unsafe { HostSpan::new(self.ptr, self.size) }
    }
}

impl Buffer for HostBuffer {
    fn size(&self) -> usize {
        self.size
    }
    fn name(&self) -> String {
        "host".into()
    }
    fn host_ptr(&self) -> Option<*mut u8> {
        Some(self.ptr)
    }
    fn set(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.span().set(offset, data)
    }
    fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.span().get(offset, out)
    }
    fn fill(&self, offset: usize, len: usize, value: u8) -> Result<()> {
        self.span().fill(offset, len, value)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        self.map.get_mut().take();
    }
}

/// Allocates [`HostBuffer`]s.
#[derive(Clone, Copy, Debug, Default)]
pub struct HostBufferType;

impl BufferType for HostBufferType {
    fn name(&self) -> String {
        "host".into()
    }
    fn alignment(&self) -> usize {
        64
    }
    fn is_host(&self) -> bool {
        true
    }
    fn alloc(&self, size: usize) -> Result<Arc<dyn Buffer>> {
        Ok(Arc::new(HostBuffer::new(size)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_get_fill_and_bounds() {
        let b = HostBuffer::new(100).unwrap();
        b.set(10, &[1, 2, 3]).unwrap();
        b.fill(13, 2, 9).unwrap();
        let mut out = [0u8; 6];
        b.get(9, &mut out).unwrap();
        assert_eq!(out, [0, 1, 2, 3, 9, 9]);
        assert!(b.set(99, &[1, 2]).is_err());
        assert!(b.get(usize::MAX, &mut out).is_err());
        assert_eq!(HostBuffer::new(0).unwrap().size(), 0);
    }
}
