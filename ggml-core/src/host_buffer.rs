//! Host memory as a [`Buffer`]: one implementation ([`HostBuffer`]) over any owned block of host
//! memory ([`HostMemory`]): the CPU devices' aligned blocks, the GPUs' pinned memory, and the anonymous
//! memory map of [`MappedMemory`] (page-aligned, zero-filled and committed by the OS only where
//! touched, so a large, sparsely used arena costs little; used for staging, composite-device arenas
//! and tests).

use crate::backend::{check_range, Buffer, BufferType};
use crate::error::{Error, Result};
use memmap2::MmapMut;
use std::any::Any;
use std::cell::UnsafeCell;
use std::sync::Arc;

/// A host address range with the bounds-checked copies of [`HostBuffer`].
#[derive(Clone, Copy, Debug)]
struct HostSpan {
    ptr: *mut u8,
    len: usize,
}

impl HostSpan {
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes for as long as the span is used.
    unsafe fn new(ptr: *mut u8, len: usize) -> HostSpan {
        HostSpan { ptr, len }
    }

    /// Copies `data` to `offset`.
    fn set(&self, offset: usize, data: &[u8]) -> Result<()> {
        check_range(offset, data.len(), self.len)?;
        // SAFETY: the range is inside the span (checked); `copy` allows overlap.
        unsafe { std::ptr::copy(data.as_ptr(), self.ptr.add(offset), data.len()) };
        Ok(())
    }

    /// Copies `out.len()` bytes from `offset`.
    fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        check_range(offset, out.len(), self.len)?;
        // SAFETY: as for `set`.
        unsafe { std::ptr::copy(self.ptr.add(offset), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Fills `len` bytes at `offset` with `value`.
    fn fill(&self, offset: usize, len: usize, value: u8) -> Result<()> {
        check_range(offset, len, self.len)?;
        // SAFETY: as for `set`.
        unsafe { std::ptr::write_bytes(self.ptr.add(offset), value, len) };
        Ok(())
    }
}

/// An owned block of host memory: what each kind of host-memory buffer allocates and frees (an
/// anonymous map here, an aligned heap block on CPU devices, pinned memory on GPUs). [`HostBuffer`]
/// turns any of them into a [`Buffer`].
///
/// # Safety
/// [`HostMemory::ptr`] must be valid for reads and writes of [`HostMemory::len`] bytes for as long as
/// the value lives, and may be shared between threads (access to the same bytes is ordered by the
/// scheduler, as for every buffer).
pub unsafe trait HostMemory: Send + Sync + 'static {
    /// The first byte (a dangling, aligned pointer when empty).
    fn ptr(&self) -> *mut u8;
    /// Bytes in the block.
    fn len(&self) -> usize;
    /// Whether the block is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The buffer name reported by [`Buffer::name`].
    fn name(&self) -> String;
}

/// Host memory as a [`Buffer`]: the one implementation of the bounds-checked copies over any
/// [`HostMemory`]. The default memory is an anonymous mapping ([`MappedMemory`]).
pub struct HostBuffer<M: HostMemory = MappedMemory> {
    memory: M,
}

impl<M: HostMemory> HostBuffer<M> {
    /// A buffer over `memory`.
    pub fn from_memory(memory: M) -> HostBuffer<M> {
        HostBuffer { memory }
    }

    /// The memory under the buffer.
    pub fn memory(&self) -> &M {
        &self.memory
    }

    fn span(&self) -> HostSpan {
        // SAFETY: `HostMemory` promises `len` valid bytes at `ptr` for the memory's life.
        unsafe { HostSpan::new(self.memory.ptr(), self.memory.len()) }
    }
}

impl HostBuffer {
    /// A zero-filled buffer of `size` bytes in an anonymous mapping.
    pub fn new(size: usize) -> Result<HostBuffer> {
        Ok(HostBuffer::from_memory(MappedMemory::new(size)?))
    }
}

impl<M: HostMemory> Buffer for HostBuffer<M> {
    fn size(&self) -> usize {
        self.memory.len()
    }
    fn name(&self) -> String {
        self.memory.name()
    }
    fn host_ptr(&self) -> Option<*mut u8> {
        Some(self.memory.ptr())
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

/// Host memory backed by an anonymous mapping: page-aligned, zero-filled, committed where touched.
pub struct MappedMemory {
    map: UnsafeCell<Option<MmapMut>>,
    size: usize,
    ptr: *mut u8,
}

// SAFETY: the mapping lives as long as the value; concurrent access to the same bytes is ordered by
// the scheduler, as for every buffer.
unsafe impl Send for MappedMemory {}
unsafe impl Sync for MappedMemory {}

impl MappedMemory {
    /// A zero-filled mapping of `size` bytes (none for 0).
    pub fn new(size: usize) -> Result<MappedMemory> {
        if size == 0 {
            return Ok(MappedMemory {
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
        Ok(MappedMemory {
            map: UnsafeCell::new(Some(map)),
            size,
            ptr,
        })
    }
}

// SAFETY: the mapping (or the dangling pointer of an empty block) covers `size` bytes for the
// value's life.
unsafe impl HostMemory for MappedMemory {
    fn ptr(&self) -> *mut u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.size
    }
    fn name(&self) -> String {
        "host".into()
    }
}

impl Drop for MappedMemory {
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
