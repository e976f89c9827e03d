//! Host memory of the CPU devices: [`CpuMemory`] (a 64-byte aligned allocation) behind the shared host
//! buffer as [`CpuBuffer`], its allocator [`CpuBufferType`], and per-device accounting against a memory
//! budget ([`MemAccount`]).

use ggml_core::host_buffer::{HostBuffer, HostMemory};
use ggml_core::{Buffer, BufferType, Error, Result};
use std::alloc::{alloc_zeroed, dealloc, Layout as AllocLayout};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Alignment of CPU buffers and of tensor offsets inside them.
pub const CPU_ALIGNMENT: usize = 64;

/// Bytes in use on one device against its budget. Allocations reserve, drops release.
#[derive(Debug)]
pub struct MemAccount {
    device: String,
    budget: usize,
    used: AtomicUsize,
}

impl MemAccount {
    /// Name of the device this account belongs to.
    pub fn device(&self) -> &str {
        &self.device
    }

    pub fn new(device: impl Into<String>, budget: usize) -> Arc<Self> {
        Arc::new(MemAccount {
            device: device.into(),
            budget,
            used: AtomicUsize::new(0),
        })
    }

    pub fn budget(&self) -> usize {
        self.budget
    }

    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    /// Reserves `size` bytes, or fails with `OutOfMemory` when the budget would be exceeded.
    pub fn reserve(&self, size: usize) -> Result<()> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(size).filter(|&n| n <= self.budget)
            })
            .map(|_| ())
            .map_err(|u| Error::OutOfMemory {
                device: self.device.clone(),
                requested: size,
                available: self.budget.saturating_sub(u),
            })
    }

    pub fn release(&self, size: usize) {
        self.used.fetch_sub(size, Ordering::AcqRel);
    }
}

/// A 64-byte aligned host allocation (possibly empty), accounted on its device until dropped.
pub struct CpuMemory {
    ptr: NonNull<u8>,
    size: usize,
    account: Arc<MemAccount>,
}

/// A CPU device's buffer: its [`CpuMemory`] behind the shared host-memory [`HostBuffer`].
pub type CpuBuffer = HostBuffer<CpuMemory>;

impl CpuMemory {
    /// The account (device) this memory is charged to.
    pub fn account(&self) -> &Arc<MemAccount> {
        &self.account
    }
}

// SAFETY: the memory is a plain heap block; concurrent access ordering is the scheduler's job (see
// `Buffer`), and the buffer copies through raw pointers without creating overlapping references.
unsafe impl Send for CpuMemory {}
unsafe impl Sync for CpuMemory {}

impl CpuMemory {
    /// Allocates `size` zeroed bytes against `account`.
    pub fn new(size: usize, account: Arc<MemAccount>) -> Result<Self> {
        account.reserve(size)?;
        if size == 0 {
            let ptr = NonNull::new(CPU_ALIGNMENT as *mut u8).expect("non-null");
            return Ok(CpuMemory { ptr, size, account });
        }
        let oom = |account: &MemAccount| {
            account.release(size);
            Error::OutOfMemory {
                device: account.device.clone(),
                requested: size,
                available: account.budget.saturating_sub(account.used()),
            }
        };
        let Ok(layout) = AllocLayout::from_size_align(size, CPU_ALIGNMENT) else {
            return Err(oom(&account));
        };
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        match NonNull::new(raw) {
            Some(ptr) => Ok(CpuMemory { ptr, size, account }),
            None => Err(oom(&account)),
        }
    }
}

impl Drop for CpuMemory {
    fn drop(&mut self) {
        if self.size > 0 {
            // SAFETY: allocated in `new` with this size and alignment.
            unsafe {
                dealloc(
                    self.ptr.as_ptr(),
                    AllocLayout::from_size_align_unchecked(self.size, CPU_ALIGNMENT),
                )
            };
        }
        self.account.release(self.size);
    }
}

// SAFETY: the allocation (or the aligned dangling pointer of an empty block) covers `size` bytes for
// the value's life.
unsafe impl HostMemory for CpuMemory {
    fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.size
    }
    fn name(&self) -> String {
        format!("{}:host", self.account.device)
    }
}

/// The allocator of one CPU device.
pub struct CpuBufferType {
    account: Arc<MemAccount>,
}

impl CpuBufferType {
    pub fn new(account: Arc<MemAccount>) -> Self {
        CpuBufferType { account }
    }
}

impl BufferType for CpuBufferType {
    fn name(&self) -> String {
        format!("{}:host", self.account.device)
    }
    fn alignment(&self) -> usize {
        CPU_ALIGNMENT
    }
    fn max_size(&self) -> usize {
        self.account.budget.min(isize::MAX as usize - CPU_ALIGNMENT)
    }
    fn is_host(&self) -> bool {
        true
    }
    fn alloc(&self, size: usize) -> Result<Arc<dyn Buffer>> {
        Ok(Arc::new(CpuBuffer::from_memory(CpuMemory::new(
            size,
            self.account.clone(),
        )?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_accounting_and_bounds() {
        let acc = MemAccount::new("cpu:t", 1000);
        let bt = CpuBufferType::new(acc.clone());
        let a = bt.alloc(600).unwrap();
        assert_eq!(a.host_ptr().unwrap() as usize % CPU_ALIGNMENT, 0);
        assert_eq!(acc.used(), 600);
        assert!(matches!(bt.alloc(500), Err(Error::OutOfMemory { .. })));
        let z = bt.alloc(0).unwrap();
        assert_eq!(z.size(), 0);
        z.set(0, &[]).unwrap();
        a.set(598, &[1, 2]).unwrap();
        assert!(a.set(599, &[1, 2]).is_err());
        assert!(a.fill(usize::MAX, 2, 0).is_err());
        a.fill(10, 5, 7).unwrap();
        let mut out = [0u8; 7];
        a.get(9, &mut out).unwrap();
        assert_eq!(out, [0, 7, 7, 7, 7, 7, 0]);
        assert!(a.get(595, &mut out).is_err());
        drop(a);
        assert_eq!(acc.used(), 0);
        let big = MemAccount::new("cpu:big", usize::MAX);
        assert!(matches!(
            CpuBufferType::new(big.clone()).alloc(usize::MAX / 2),
            Err(Error::OutOfMemory { .. })
        ));
        assert_eq!(big.used(), 0);
    }
}
