//! The CPU devices: [`CpuDevice`] (one share of the host's threads and memory, with its own rayon
//! pool) and [`cpu_devices`], which splits the host into N virtual devices `cpu:0`, `cpu:1`, ...

use crate::kernels;
use crate::memory::{CpuBufferType, MemAccount};
use crate::stream::CpuBackend;
use ggml_core::{
    Backend, Buffer, BufferType, Device, DeviceCaps, DeviceKind, Graph, Layout, MemoryInfo, Result,
    TensorId,
};
use rayon::{ThreadPool, ThreadPoolBuilder};
use std::sync::{Arc, Weak};

/// One virtual CPU device.
pub struct CpuDevice {
    index: usize,
    threads: usize,
    pool: Arc<ThreadPool>,
    me: Weak<CpuDevice>,
    account: Arc<MemAccount>,
    buffer_type: Arc<CpuBufferType>,
}

thread_local! {
    /// True on the worker threads of CPU device pools.
    static DEVICE_WORKER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// True when the current thread is a worker of a CPU device's pool (any device's).
pub fn on_device_worker() -> bool {
    DEVICE_WORKER.with(|w| w.get())
}

/// Builds a rayon pool of `threads` threads (at least 1) named after the device.
pub fn build_pool(name: &str, threads: usize) -> Result<Arc<ThreadPool>> {
    let name = name.to_string();
    ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .thread_name(move |i| format!("{name}-{i}"))
        .start_handler(|_| DEVICE_WORKER.with(|w| w.set(true)))
        .build()
        .map(Arc::new)
        .map_err(|e| ggml_core::Error::Backend {
            backend: "cpu".into(),
            msg: format!("thread pool: {e}"),
        })
}

impl CpuDevice {
    /// Device `index` with `threads` worker threads and a memory budget of `budget` bytes.
    pub fn new(index: usize, threads: usize, budget: usize) -> Result<Arc<Self>> {
        let name = format!("cpu:{index}");
        let account = MemAccount::new(name.clone(), budget);
        let pool = build_pool(&name, threads)?;
        let buffer_type = Arc::new(CpuBufferType::new(account.clone()));
        Ok(Arc::new_cyclic(|me| CpuDevice {
            index,
            threads: threads.max(1),
            pool,
            me: me.clone(),
            buffer_type,
            account,
        }))
    }

    /// This device as a shared handle.
    pub fn arc(&self) -> Arc<CpuDevice> {
        self.me.upgrade().expect("a CpuDevice lives in an Arc")
    }

    pub fn index(&self) -> usize {
        self.index
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The device's thread pool; kernels run inside it.
    pub fn pool(&self) -> Arc<ThreadPool> {
        self.pool.clone()
    }

    /// Bytes currently allocated on this device.
    pub fn used_memory(&self) -> usize {
        self.account.used()
    }
}

/// Total system memory in bytes from /proc/meminfo (8 GiB when unreadable).
pub fn system_memory() -> usize {
    let fallback = 8usize << 30;
    let Ok(text) = std::fs::read_to_string("/proc/meminfo") else {
        return fallback;
    };
    text.lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
        .map_or(fallback, |kb| kb.saturating_mul(1024))
}

/// `n` virtual devices sharing `threads_total` threads (each gets at least one) and the system memory.
pub fn cpu_devices(n: usize, threads_total: usize) -> Result<Vec<Arc<CpuDevice>>> {
    let n = n.max(1);
    let budget = system_memory() / n;
    (0..n)
        .map(|i| {
            let share = threads_total / n + usize::from(i < threads_total % n);
            CpuDevice::new(i, share.max(1), budget)
        })
        .collect()
}

/// Devices from the settings: `GGML_TP_CPU_DEVICES` (default 1) sharing `GGML_TP_THREADS` (default:
/// all cores); see [`crate::settings`].
pub fn default_devices() -> Result<Vec<Arc<CpuDevice>>> {
    let s = crate::settings::settings();
    cpu_devices(s.devices, s.threads)
}

impl Device for CpuDevice {
    fn name(&self) -> String {
        format!("cpu:{}", self.index)
    }
    fn description(&self) -> String {
        format!("CPU share {} ({} threads)", self.index, self.threads)
    }
    fn kind(&self) -> DeviceKind {
        DeviceKind::Cpu
    }
    fn family(&self) -> &'static str {
        "cpu"
    }
    fn memory(&self) -> MemoryInfo {
        let total = self.account.budget();
        MemoryInfo {
            free: total.saturating_sub(self.account.used()),
            total,
            allocated: Some(self.account.used()),
        }
    }
    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            async_ops: false,
            host_buffer: false,
            events: false,
        }
    }
    fn supports_op(&self, graph: &Graph, node: TensorId) -> bool {
        let t = graph.tensor(node);
        let src: Vec<&Layout> = t.src.iter().map(|&s| graph.layout(s)).collect();
        kernels::supports(&t.op, &src, &t.layout)
    }
    fn can_access(&self, buffer: &dyn Buffer) -> bool {
        buffer.host_ptr().is_some()
    }
    fn owns(&self, buffer: &dyn Buffer) -> bool {
        buffer
            .as_any()
            .downcast_ref::<crate::memory::CpuBuffer>()
            .is_some_and(|b| Arc::ptr_eq(b.memory().account(), &self.account))
    }
    fn buffer_type(&self) -> Arc<dyn BufferType> {
        self.buffer_type.clone()
    }
    fn new_backend(&self) -> Result<Arc<dyn Backend>> {
        Ok(Arc::new(CpuBackend::new(self.arc())))
    }
}
