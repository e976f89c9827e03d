//! [`CudaDevice`]: one CUDA device (`cuda:K`): a whole GPU, or one of the N logical devices a GPU is
//! presented as (`GGML_TP_CUDA_LOGICAL`, see [`crate::reg::cuda_devices_with`]). The physical GPU
//! ([`CudaGpu`]) holds the primary context, the name, and the kernels and communication kernels
//! (compiled with NVRTC on first use, once per GPU, shared by its logical devices); each device has
//! its own memory accounting (a logical device is held to its share of the card), buffer types, and
//! the streams opened on it (so that a communicator handed `dyn Backend`s finds them).

use crate::kernels::Kernels;
use crate::memory::{CudaBuffer, CudaBufferType, DeviceMemory, PinnedBufferType};
use crate::p2p::CommKernels;
use crate::spans::TraceOrigin;
use crate::stream::CudaBackend;
use crate::{cu, err};
use cudarc::driver::{CudaContext, CudaStream};
use ggml_core::{
    Backend, Buffer, BufferType, Device, DeviceCaps, DeviceKind, Graph, Layout, MemoryInfo, Result,
    TensorId,
};
use ggml_gpu::dispatch;
use parking_lot::Mutex;
use std::sync::{Arc, OnceLock, Weak};

/// One physical GPU: its primary context and what every device on it shares.
pub struct CudaGpu {
    ctx: Arc<CudaContext>,
    name: String,
    cc: (i32, i32),
    kernels: OnceLock<std::result::Result<Arc<Kernels>, String>>,
    comm_kernels: OnceLock<std::result::Result<Arc<CommKernels>, String>>,
    /// The origin of its streams' timelines (`GGML_TP_CUDA_TRACE`), recorded by the first stream
    /// that traces.
    trace_origin: OnceLock<std::result::Result<Arc<TraceOrigin>, String>>,
}

impl CudaGpu {
    /// Opens GPU `ordinal` (its primary context). Call only after [`crate::probe::probe`] passed.
    pub fn open(ordinal: usize) -> Result<Arc<Self>> {
        let ctx = cu(&format!("open GPU {ordinal}"), CudaContext::new(ordinal))?;
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        let cc = cu("compute capability", ctx.compute_capability())?;
        Ok(Arc::new(CudaGpu {
            ctx,
            name,
            cc,
            kernels: OnceLock::new(),
            comm_kernels: OnceLock::new(),
            trace_origin: OnceLock::new(),
        }))
    }

    /// The common origin of the timelines of this GPU's streams, recorded on `stream` if it is the
    /// first to ask.
    pub fn trace_origin(&self, stream: &CudaStream) -> Result<Arc<TraceOrigin>> {
        self.trace_origin
            .get_or_init(|| TraceOrigin::record(stream).map(Arc::new))
            .clone()
            .map_err(|e| err(format!("timeline origin: {e}")))
    }

    /// The CUDA device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// The driver's name of the GPU (`NVIDIA H200`).
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Which part of its GPU a device is: share `index` (0-based) of `count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Share {
    pub index: usize,
    pub count: usize,
}

impl Share {
    /// The whole GPU.
    pub const WHOLE: Share = Share { index: 0, count: 1 };
}

/// One CUDA device.
pub struct CudaDevice {
    index: usize,
    share: Share,
    gpu: Arc<CudaGpu>,
    me: Weak<CudaDevice>,
    mem: Arc<DeviceMemory>,
    buffer_type: Arc<CudaBufferType>,
    host_type: Arc<PinnedBufferType>,
    backends: Mutex<Vec<Weak<CudaBackend>>>,
}

impl CudaDevice {
    /// Device `cuda:{index}`: `share` of `gpu` (a logical device holds `1 / share.count` of the
    /// card's memory).
    pub fn new(gpu: Arc<CudaGpu>, index: usize, share: Share) -> Result<Arc<Self>> {
        let ctx = gpu.ctx.clone();
        let limit = if share.count > 1 {
            Some(cu("total memory", ctx.total_mem())? / share.count)
        } else {
            None
        };
        let mem = DeviceMemory::new(ctx.clone(), index, limit);
        Ok(Arc::new_cyclic(|me| CudaDevice {
            index,
            share,
            buffer_type: Arc::new(CudaBufferType::new(mem.clone())),
            host_type: Arc::new(PinnedBufferType::new(ctx)),
            mem,
            gpu,
            me: me.clone(),
            backends: Mutex::new(Vec::new()),
        }))
    }

    /// `K` of `cuda:K`.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The CUDA ordinal of the physical GPU (logical devices of one GPU share it).
    pub fn ordinal(&self) -> usize {
        self.gpu.ordinal()
    }

    /// Which part of its GPU this device is.
    pub fn share(&self) -> Share {
        self.share
    }

    /// The physical GPU.
    pub fn gpu(&self) -> &Arc<CudaGpu> {
        &self.gpu
    }

    /// The GPU's primary context (shared by its logical devices).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.gpu.ctx
    }

    /// The device's memory accounting, for [`CudaBuffer::new`].
    pub fn pool(&self) -> &Arc<DeviceMemory> {
        &self.mem
    }

    /// Compute capability (major, minor).
    pub fn compute_capability(&self) -> (i32, i32) {
        self.gpu.cc
    }

    /// This device as a shared handle.
    pub fn arc(&self) -> Arc<CudaDevice> {
        self.me.upgrade().expect("a CudaDevice lives in an Arc")
    }

    /// The kernels of this device's GPU, compiled for its architecture on first call.
    pub fn kernels(&self) -> Result<Arc<Kernels>> {
        let g = &self.gpu;
        g.kernels
            .get_or_init(|| Kernels::compile(&g.ctx, g.cc).map(Arc::new))
            .clone()
            .map_err(|e| err(format!("{}: {e}", self.name())))
    }

    /// The communication kernels of this device's GPU (`p2p.cu`), compiled on first call.
    pub fn comm_kernels(&self) -> Result<Arc<CommKernels>> {
        let g = &self.gpu;
        g.comm_kernels
            .get_or_init(|| CommKernels::compile(&g.ctx, g.cc).map(Arc::new))
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
            .is_some_and(|b| Arc::ptr_eq(b.pool(), &self.mem))
    }
}

impl Device for CudaDevice {
    fn name(&self) -> String {
        format!("cuda:{}", self.index)
    }
    /// `NVIDIA H200 (sm_90)`, or for a logical device `NVIDIA H200 (logical 2 of 2 of GPU 0, sm_90)`.
    fn description(&self) -> String {
        let (major, minor) = self.gpu.cc;
        match self.share {
            Share { count: 1, .. } => format!("{} (sm_{major}{minor})", self.gpu.name),
            Share { index, count } => format!(
                "{} (logical {} of {count} of GPU {}, sm_{major}{minor})",
                self.gpu.name,
                index + 1,
                self.ordinal()
            ),
        }
    }
    fn kind(&self) -> DeviceKind {
        DeviceKind::Gpu
    }
    fn family(&self) -> &'static str {
        "cuda"
    }
    /// The driver's figures of the card; for a logical device its share: total = card / N,
    /// free = min(card free, total - own live bytes).
    fn memory(&self) -> MemoryInfo {
        let info = self
            .gpu
            .ctx
            .bind_to_thread()
            .and_then(|_| cudarc::driver::result::mem_get_info());
        let allocated = self.mem.allocated();
        match (info, self.mem.limit()) {
            (Ok((free, total)), None) => MemoryInfo {
                free,
                total,
                allocated: Some(allocated),
            },
            (Ok((free, _)), Some(share)) => MemoryInfo {
                free: free.min(share.saturating_sub(allocated)),
                total: share,
                allocated: Some(allocated),
            },
            (Err(_), _) => MemoryInfo::default(),
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
    fn launch_groups(&self, graph: &Graph, nodes: &[TensorId]) -> Vec<Vec<TensorId>> {
        dispatch::launch_groups(graph, nodes)
    }
    fn weight_dtype(&self, dtype: ggml_core::DType, ne0: usize) -> ggml_core::DType {
        ggml_gpu::dispatch::weight_dtype(dtype, ne0)
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
