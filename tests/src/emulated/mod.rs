//! The GPU kernels on the host, for machines without a GPU (CI's): a device whose streams run the
//! shared dispatch of `ggml_gpu::dispatch` (the one the CUDA and HIP backends drive) with
//! every kernel of the shared sources compiled for the host ([`program`]: one fiber per GPU
//! thread, real barriers and warp shuffles) and its BLAS calls computed on the host ([`blas`]).
//! Numerics, indexing, launch shapes, barrier placement and warp-size assumptions of the kernels
//! are checked this way; speed and the vendor runtimes (streams, graphs, NCCL) are not.
//!
//! Two flavors: [`Flavor::Cuda`] (warps of 32, mixed-precision BLAS with batched products, as the
//! CUDA backend) and [`Flavor::Hip`] (wavefronts of 64, F32 BLAS without batched products, as the
//! HIP backend on CDNA GPUs).

mod blas;
mod program;

pub use program::{source, HostProgram};

use ggml_core::backend::check_range;
use ggml_core::host_buffer::HostBuffer;
use ggml_core::{
    Backend, Buffer, BufferType, DataRef, Device, DeviceCaps, DeviceKind, Error, Event, Graph,
    Layout, MemoryInfo, Result, TensorId,
};
use ggml_gpu::dispatch::{
    compute_nodes, supports, BatchedGemmCall, GemmCall, GemmTypes, Launch, Runner, TDesc,
};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

/// Which vendor backend the emulated device resembles.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Flavor {
    /// Warps of 32; BLAS with F16/BF16 operands and strided batched products (cuBLAS).
    Cuda,
    /// Wavefronts of 64; BLAS with F32 operands only and no batched products (the HIP backend).
    Hip,
}

impl Flavor {
    pub fn warp_size(self) -> u32 {
        match self {
            Flavor::Cuda => 32,
            Flavor::Hip => 64,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Flavor::Cuda => "emulated-cuda",
            Flavor::Hip => "emulated-hip",
        }
    }
}

/// The kernels of each flavor, built once per process.
fn program(flavor: Flavor) -> Result<Arc<HostProgram>> {
    static PROGRAMS: OnceLock<Mutex<HashMap<Flavor, Arc<HostProgram>>>> = OnceLock::new();
    let mut programs = PROGRAMS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(p) = programs.get(&flavor) {
        return Ok(p.clone());
    }
    let p = Arc::new(HostProgram::load(flavor)?);
    programs.insert(flavor, p.clone());
    Ok(p)
}

/// A device of `flavor` whose kernels run on the host (compiled on first use; an error says why
/// when no C++ compiler is found or the kernels do not compile).
pub fn device(flavor: Flavor) -> Result<Arc<dyn Device>> {
    Ok(devices(flavor, 1)?.remove(0))
}

/// `n` devices of `flavor` (`<flavor>:0` ..), each owning its own memory, as GPUs do: a split
/// over them copies between devices or reduces through host staging.
pub fn devices(flavor: Flavor, n: usize) -> Result<Vec<Arc<dyn Device>>> {
    let program = program(flavor)?;
    Ok((0..n)
        .map(|ordinal| {
            Arc::new(EmulatedDevice {
                flavor,
                ordinal,
                program: program.clone(),
            }) as Arc<dyn Device>
        })
        .collect())
}

#[derive(Clone)]
struct EmulatedDevice {
    flavor: Flavor,
    ordinal: usize,
    program: Arc<HostProgram>,
}

impl EmulatedDevice {
    fn is_own(&self, buffer: &dyn Buffer) -> bool {
        buffer
            .as_any()
            .downcast_ref::<DeviceMemory>()
            .is_some_and(|m| m.ordinal == self.ordinal && m.flavor == self.flavor)
    }
}

/// Memory of one emulated device: host memory the host copies through `Buffer`, which kernels of
/// that device alone address.
struct DeviceMemory {
    host: HostBuffer,
    flavor: Flavor,
    ordinal: usize,
}

impl Buffer for DeviceMemory {
    fn size(&self) -> usize {
        self.host.size()
    }
    fn name(&self) -> String {
        format!("{}:{}", self.flavor.name(), self.ordinal)
    }
    fn host_ptr(&self) -> Option<*mut u8> {
        None
    }
    fn set(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.host.set(offset, data)
    }
    fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.host.get(offset, out)
    }
    fn fill(&self, offset: usize, len: usize, value: u8) -> Result<()> {
        self.host.fill(offset, len, value)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

struct DeviceMemoryType {
    flavor: Flavor,
    ordinal: usize,
}

impl BufferType for DeviceMemoryType {
    fn name(&self) -> String {
        format!("{}:{}", self.flavor.name(), self.ordinal)
    }
    fn alignment(&self) -> usize {
        256
    }
    fn is_host(&self) -> bool {
        false
    }
    fn alloc(&self, size: usize) -> Result<Arc<dyn Buffer>> {
        Ok(Arc::new(DeviceMemory {
            host: HostBuffer::new(size)?,
            flavor: self.flavor,
            ordinal: self.ordinal,
        }))
    }
}

impl Device for EmulatedDevice {
    fn name(&self) -> String {
        format!("{}:{}", self.flavor.name(), self.ordinal)
    }
    fn description(&self) -> String {
        format!(
            "the shared GPU kernels on the host, warps of {}",
            self.flavor.warp_size()
        )
    }
    fn kind(&self) -> DeviceKind {
        DeviceKind::Gpu
    }
    fn family(&self) -> &'static str {
        self.flavor.name()
    }
    fn memory(&self) -> MemoryInfo {
        MemoryInfo {
            free: 1 << 34,
            total: 1 << 34,
            allocated: None,
        }
    }
    fn caps(&self) -> DeviceCaps {
        DeviceCaps::default()
    }
    fn supports_op(&self, graph: &Graph, node: TensorId) -> bool {
        let t = graph.tensor(node);
        let src: Vec<&Layout> = t.src.iter().map(|&s| graph.layout(s)).collect();
        supports(&t.op, &src, &t.layout)
    }
    fn launch_groups(&self, graph: &Graph, nodes: &[TensorId]) -> Vec<Vec<TensorId>> {
        ggml_gpu::dispatch::launch_groups(graph, nodes)
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
        Arc::new(DeviceMemoryType {
            flavor: self.flavor,
            ordinal: self.ordinal,
        })
    }
    fn new_backend(&self) -> Result<Arc<dyn Backend>> {
        Ok(Arc::new(EmulatedStream {
            device: Arc::new(self.clone()),
            scratch: Mutex::default(),
        }))
    }
}

/// A stream of an emulated device: every launch runs to completion before the call returns.
struct EmulatedStream {
    device: Arc<EmulatedDevice>,
    /// Scratch slots of the dispatch, grown on demand.
    scratch: Mutex<Vec<Option<HostBuffer>>>,
}

fn fail(msg: String) -> Error {
    Error::Backend {
        backend: "emulated".into(),
        msg,
    }
}

impl Backend for EmulatedStream {
    fn name(&self) -> String {
        self.device.name()
    }
    fn device(&self) -> Arc<dyn Device> {
        self.device.clone()
    }
    fn copy_async(&self, src: &DataRef, dst: &DataRef, len: usize) -> Result<()> {
        let mut bytes = vec![0u8; len];
        src.buffer.get(src.offset, &mut bytes)?;
        dst.buffer.set(dst.offset, &bytes)
    }
    fn compute(&self, graph: &Graph, nodes: &[TensorId]) -> Result<()> {
        compute_nodes(self, graph, nodes)
    }
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    fn record_event(&self) -> Result<Arc<dyn Event>> {
        Ok(Arc::new(ggml_core::CompletedEvent))
    }
    fn wait_event(&self, _event: &dyn Event) -> Result<()> {
        Ok(())
    }
}

impl Runner for EmulatedStream {
    fn device_name(&self) -> String {
        self.device.name()
    }
    fn family(&self) -> &'static str {
        self.device.flavor.name()
    }
    fn desc(&self, graph: &Graph, id: TensorId) -> Result<TDesc> {
        let t = graph.tensor(id);
        let data = graph.data(id)?;
        let ptr = data
            .buffer
            .as_any()
            .downcast_ref::<DeviceMemory>()
            .filter(|_| self.device.is_own(data.buffer.as_ref()))
            .and_then(|m| m.host.host_ptr())
            .ok_or_else(|| {
                fail(format!(
                    "tensor {} lives in {}, not in memory of {}",
                    t.name,
                    data.buffer.name(),
                    self.device.name()
                ))
            })?;
        check_range(data.offset, t.nbytes(), data.buffer.size())?;
        TDesc::new(ptr as u64 + data.offset as u64, &t.layout)
    }
    fn scratch(&self, slot: usize, bytes: usize) -> Result<u64> {
        let mut slots = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        if slots.len() <= slot {
            slots.resize_with(slot + 1, || None);
        }
        let fits = slots[slot].as_ref().is_some_and(|b| b.size() >= bytes);
        if !fits {
            let b = HostBuffer::new(bytes.max(1))?;
            // Fresh GPU scratch holds garbage: poisoned here (NaN floats).
            b.fill(0, b.size(), 0xFF)?;
            slots[slot] = Some(b);
        }
        let b = slots[slot].as_ref().expect("slot filled above");
        Ok(b.host_ptr().expect("host memory") as u64)
    }
    fn launch(&self, l: &Launch) -> Result<()> {
        let args: Vec<*const c_void> = l.args.iter().map(|a| a.address().cast_const()).collect();
        self.device
            .program
            .run(&l.kernel, l.grid, l.threads, l.shared_bytes, &args)
    }
    fn gemm_types(&self) -> GemmTypes {
        match self.device.flavor {
            Flavor::Cuda => GemmTypes::Mixed,
            Flavor::Hip => GemmTypes::F32,
        }
    }
    fn gemm(&self, call: &GemmCall) -> Result<()> {
        // SAFETY: the dispatch's operands lie in checked tensors or scratch of this stream, with
        // the call's shapes and leading dimensions.
        unsafe { blas::gemm(call) };
        Ok(())
    }
    fn has_mma(&self) -> bool {
        self.device.flavor == Flavor::Cuda
    }
    fn has_gemm_batched(&self) -> bool {
        self.device.flavor == Flavor::Cuda
    }
    fn gemm_batched(&self, call: &BatchedGemmCall) -> Result<()> {
        // SAFETY: as for `gemm`, for every batch.
        unsafe { blas::gemm_batched(call) };
        Ok(())
    }
}
