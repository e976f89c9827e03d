//! A fault-injecting device for tests of failure handling: [`FaultDevice`] wraps any device (the CPU's
//! in the tests) and, as its [`FaultPlan`] says, fails allocations (out of memory), fails compute
//! calls (a device lost mid-stream) or panics in them, after a given number of calls succeeded.
//! Everything else is the wrapped device's: buffers are its own, so its streams and the scheduler
//! treat them as usual.

use ggml_core::backend::{Backend, Buffer, BufferType, Device, DeviceCaps, DeviceKind, MemoryInfo};
use ggml_core::graph::Graph;
use ggml_core::tensor::{DataRef, TensorId};
use ggml_core::{Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

/// Calls that are let through before a fault; [`NEVER`] disarms it.
pub const NEVER: u64 = u64::MAX;

/// When the device fails. Each limit counts the calls that succeed before the fault; every later
/// call fails (or panics) too, until the limit is set again. Shared, so a test can arm a fault
/// after loading (e.g. "lose the device from the next compute on").
#[derive(Debug)]
pub struct FaultPlan {
    allocs_left: AtomicU64,
    computes_left: AtomicU64,
    panics_left: AtomicU64,
    /// Allocations and compute calls seen so far (including failed ones).
    pub allocs: AtomicU64,
    pub computes: AtomicU64,
}

impl Default for FaultPlan {
    fn default() -> FaultPlan {
        FaultPlan {
            allocs_left: AtomicU64::new(NEVER),
            computes_left: AtomicU64::new(NEVER),
            panics_left: AtomicU64::new(NEVER),
            allocs: AtomicU64::new(0),
            computes: AtomicU64::new(0),
        }
    }
}

impl FaultPlan {
    /// Allocations after the next `n` fail with [`Error::OutOfMemory`].
    pub fn fail_allocs_after(&self, n: u64) {
        self.allocs_left.store(n, Ordering::SeqCst);
    }
    /// Compute calls after the next `n` fail with [`Error::Backend`] ("device lost").
    pub fn fail_computes_after(&self, n: u64) {
        self.computes_left.store(n, Ordering::SeqCst);
    }
    /// Compute calls after the next `n` panic.
    pub fn panic_computes_after(&self, n: u64) {
        self.panics_left.store(n, Ordering::SeqCst);
    }
    /// Every fault disarmed.
    pub fn heal(&self) {
        self.fail_allocs_after(NEVER);
        self.fail_computes_after(NEVER);
        self.panic_computes_after(NEVER);
    }
}

/// Whether the fault counted by `left` strikes now (counting this call down when it does not).
fn strikes(left: &AtomicU64) -> bool {
    left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| match n {
        NEVER | 0 => None,
        n => Some(n - 1),
    })
    .is_err_and(|n| n == 0)
}

/// `inner` with the faults of `plan`.
pub struct FaultDevice {
    inner: Arc<dyn Device>,
    plan: Arc<FaultPlan>,
    this: Weak<FaultDevice>,
}

impl FaultDevice {
    pub fn new(inner: Arc<dyn Device>, plan: Arc<FaultPlan>) -> Arc<FaultDevice> {
        Arc::new_cyclic(|this| FaultDevice {
            inner,
            plan,
            this: this.clone(),
        })
    }
}

impl Device for FaultDevice {
    fn name(&self) -> String {
        self.inner.name()
    }
    fn description(&self) -> String {
        format!("{} with injected faults", self.inner.description())
    }
    fn kind(&self) -> DeviceKind {
        self.inner.kind()
    }
    fn family(&self) -> &'static str {
        self.inner.family()
    }
    fn memory(&self) -> MemoryInfo {
        self.inner.memory()
    }
    fn caps(&self) -> DeviceCaps {
        self.inner.caps()
    }
    fn supports_op(&self, graph: &Graph, node: TensorId) -> bool {
        self.inner.supports_op(graph, node)
    }
    fn can_access(&self, buffer: &dyn Buffer) -> bool {
        self.inner.can_access(buffer)
    }
    fn owns(&self, buffer: &dyn Buffer) -> bool {
        self.inner.owns(buffer)
    }
    fn buffer_type(&self) -> Arc<dyn BufferType> {
        Arc::new(FaultBufferType {
            inner: self.inner.buffer_type(),
            plan: self.plan.clone(),
            device: self.name(),
        })
    }
    fn host_buffer_type(&self) -> Option<Arc<dyn BufferType>> {
        self.inner.host_buffer_type()
    }
    fn new_backend(&self) -> Result<Arc<dyn Backend>> {
        let device = self
            .this
            .upgrade()
            .ok_or_else(|| Error::Other("the fault device was dropped".into()))?;
        Ok(Arc::new(FaultBackend {
            inner: self.inner.new_backend()?,
            device,
        }))
    }
}

/// The wrapped device's memory, with allocations failing as planned.
struct FaultBufferType {
    inner: Arc<dyn BufferType>,
    plan: Arc<FaultPlan>,
    device: String,
}

impl BufferType for FaultBufferType {
    fn name(&self) -> String {
        self.inner.name()
    }
    fn alignment(&self) -> usize {
        self.inner.alignment()
    }
    fn max_size(&self) -> usize {
        self.inner.max_size()
    }
    fn is_host(&self) -> bool {
        self.inner.is_host()
    }
    fn alloc(&self, size: usize) -> Result<Arc<dyn Buffer>> {
        self.plan.allocs.fetch_add(1, Ordering::SeqCst);
        if strikes(&self.plan.allocs_left) {
            return Err(Error::OutOfMemory {
                device: self.device.clone(),
                requested: size,
                available: 0,
            });
        }
        self.inner.alloc(size)
    }
}

/// The wrapped device's stream, with compute calls failing or panicking as planned.
struct FaultBackend {
    inner: Arc<dyn Backend>,
    device: Arc<FaultDevice>,
}

impl Backend for FaultBackend {
    fn name(&self) -> String {
        self.inner.name()
    }
    fn device(&self) -> Arc<dyn Device> {
        self.device.clone()
    }
    fn set_async(&self, dst: &DataRef, data: &[u8]) -> Result<()> {
        self.inner.set_async(dst, data)
    }
    fn get_async(&self, src: &DataRef, out: &mut [u8]) -> Result<()> {
        self.inner.get_async(src, out)
    }
    fn copy_async(&self, src: &DataRef, dst: &DataRef, len: usize) -> Result<()> {
        self.inner.copy_async(src, dst, len)
    }
    fn compute(&self, graph: &Graph, nodes: &[TensorId]) -> Result<()> {
        let plan = &self.device.plan;
        plan.computes.fetch_add(1, Ordering::SeqCst);
        if strikes(&plan.panics_left) {
            panic!("injected fault: {} panics in compute", self.name());
        }
        if strikes(&plan.computes_left) {
            return Err(Error::Backend {
                backend: self.name(),
                msg: "injected fault: the device was lost".into(),
            });
        }
        self.inner.compute(graph, nodes)
    }
    fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }
    fn record_event(&self) -> Result<Arc<dyn ggml_core::backend::Event>> {
        self.inner.record_event()
    }
    fn wait_event(&self, event: &dyn ggml_core::backend::Event) -> Result<()> {
        self.inner.wait_event(event)
    }
    fn set_threads(&self, n: usize) {
        self.inner.set_threads(n)
    }
    fn drive(&self, job: &mut (dyn FnMut() + Send)) {
        self.inner.drive(job)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_strikes_after_its_count_and_stays() {
        let left = AtomicU64::new(2);
        let seen: Vec<bool> = (0..4).map(|_| strikes(&left)).collect();
        assert_eq!(seen, [false, false, true, true]);
        let never = AtomicU64::new(NEVER);
        assert!((0..4).all(|_| !strikes(&never)));
    }
}
