//! [`CudaDevice`]: one GPU (`cuda:N`) with its primary context, memory figures from the driver, its
//! buffer types, its kernels and communication kernels (compiled with NVRTC on first use, once per
//! device), and the streams opened on it (so that a communicator handed `dyn Backend`s finds them).

use crate::kernels::Kernels;
use crate::memory::{CudaBuffer, CudaBufferType, PinnedBufferType};
use crate::p2p::CommKernels;
use crate::stream::CudaBackend;
use crate::{cu, err};
use cudarc::driver::CudaContext;
use ggml_core::{
    Backend, Buffer, BufferType, Device, DeviceCaps, DeviceKind, Graph, Layout, MemoryInfo, Result,
    TensorId,
};
use ggml_gpu::dispatch;
use parking_lot::Mutex;
use std::sync::{Arc, OnceLock, Weak};

/// One CUDA device.
pub struct CudaDevice {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    gpu: String,
    cc: (i32, i32),
    me: Weak<CudaDevice>,
    buffer_type: Arc<CudaBufferType>,
    host_type: Arc<PinnedBufferType>,
    kernels: OnceLock<std::result::Result<Arc<Kernels>, String>>,
    comm_kernels: OnceLock<std::result::Result<Arc<CommKernels>, String>>,
    backends: Mutex<Vec<Weak<CudaBackend>>>,
}

impl CudaDevice {
    /// Opens device `ordinal` (its primary context). Call only after [`crate::probe::probe`] passed.
    pub fn new(ordinal: usize) -> Result<Arc<Self>> {
        let ctx = cu(&format!("open cuda:{ordinal}"), CudaContext::new(ordinal))?;
        let gpu = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        let cc = cu("compute capability", ctx.compute_capability())?;
        let name = format!("cuda:{ordinal}");
        Ok(Arc::new_cyclic(|me| CudaDevice {
            ordinal,
            buffer_type: Arc::new(CudaBufferType::new(ctx.clone(), name)),
            host_type: Arc::new(PinnedBufferType::new(ctx.clone())),
            ctx,
            gpu,
            cc,
            me: me.clone(),
            kernels: OnceLock::new(),
            comm_kernels: OnceLock::new(),
            backends: Mutex::new(Vec::new()),
        }))
    }

    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Compute capability (major, minor).
    pub fn compute_capability(&self) -> (i32, i32) {
        self.cc
    }

    /// This device as a shared handle.
    pub fn arc(&self) -> Arc<CudaDevice> {
        self.me.upgrade().expect("a CudaDevice lives in an Arc")
    }

    /// The kernels of this device, compiled for its architecture on first call.
    pub fn kernels(&self) -> Result<Arc<Kernels>> {
        self.kernels
            .get_or_init(|| Kernels::compile(&self.ctx, self.cc).map(Arc::new))
            .clone()
            .map_err(|e| err(format!("{}: {e}", self.name())))
    }

    /// The communication kernels of this device (`p2p.cu`), compiled on first call.
    pub fn comm_kernels(&self) -> Result<Arc<CommKernels>> {
        self.comm_kernels
            .get_or_init(|| CommKernels::compile(&self.ctx, self.cc).map(Arc::new))
            .clone()
            .map_err(|e| err(format!("{}: {e}", self.name())))
    }

    /// A new stream on this device, remembered so that [`CudaDevice::backend_of`] finds it.
    pub fn open_backend(&self) -> Result<Arc<CudaBackend>> {
        let b = Arc::new(CudaBackend::new(self.arc())?);
        let mut list = self.backends.lock();
        list.retain(|w| w.strong_count() > 0);
        list.push(Arc::downgrade(&b));
        Ok(b)
    }

    /// The stream of this device behind `backend`, if it was opened by [`CudaDevice::open_backend`].
    pub fn backend_of(&self, backend: &Arc<dyn Backend>) -> Option<Arc<CudaBackend>> {
        let want = Arc::as_ptr(backend) as *const ();
        self.backends
            .lock()
            .iter()
            .filter_map(Weak::upgrade)
            .find(|b| Arc::as_ptr(b) as *const () == want)
    }

    /// True when `buffer` is device memory of this device.
    pub fn is_own(&self, buffer: &dyn Buffer) -> bool {
        buffer
            .as_any()
            .downcast_ref::<CudaBuffer>()
            .is_some_and(|b| b.ordinal() == self.ordinal)
    }
}

impl Device for CudaDevice {
    fn name(&self) -> String {
        format!("cuda:{}", self.ordinal)
    }
    fn description(&self) -> String {
        format!("{} (sm_{}{})", self.gpu, self.cc.0, self.cc.1)
    }
    fn kind(&self) -> DeviceKind {
        DeviceKind::Gpu
    }
    fn family(&self) -> &'static str {
        "cuda"
    }
    fn memory(&self) -> MemoryInfo {
        let info = self
            .ctx
            .bind_to_thread()
            .and_then(|_| cudarc::driver::result::mem_get_info());
        match info {
            Ok((free, total)) => MemoryInfo {
                free,
                total,
                allocated: Some(crate::memory::allocated_on(self.ordinal())),
            },
            Err(_) => MemoryInfo::default(),
        }
    }
    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            async_ops: true,
            host_buffer: true,
            events: true,
        }
    }
    fn supports_op(&self, graph: &Graph, node: TensorId) -> bool {
        let t = graph.tensor(node);
        let src: Vec<&Layout> = t.src.iter().map(|&s| graph.layout(s)).collect();
        dispatch::supports(&t.op, &src, &t.layout)
    }
    fn can_access(&self, buffer: &dyn Buffer) -> bool {
        self.is_own(buffer)
    }
    fn owns(&self, buffer: &dyn Buffer) -> bool {
        self.is_own(buffer)
    }
    fn buffer_type(&self) -> Arc<dyn BufferType> {
        self.buffer_type.clone()
    }
    fn host_buffer_type(&self) -> Option<Arc<dyn BufferType>> {
        Some(self.host_type.clone())
    }
    fn new_backend(&self) -> Result<Arc<dyn Backend>> {
        Ok(self.open_backend()?)
    }
}
