//! [`HipDevice`]: one AMD GPU (`hip:N`) with its name, gfx target, wavefront size and memory, its
//! buffer types, and its kernels (compiled with hiprtc on first use, once per device).
//! [`DeviceCtx`] makes a device current on the calling thread before each HIP call.

use crate::ffi::hip;
use crate::kernels::Kernels;
use crate::memory::{HipBuffer, HipBufferType, PinnedBufferType};
use crate::probe::Runtime;
use crate::stream::HipBackend;
use crate::{check, err};
use ggml_core::{
    Backend, Buffer, BufferType, Device, DeviceCaps, DeviceKind, Graph, Layout, MemoryInfo, Result,
    TensorId,
};
use std::sync::{Arc, OnceLock, Weak};

/// A device ordinal with the loaded runtime.
#[derive(Clone, Copy)]
pub struct DeviceCtx {
    runtime: &'static Runtime,
    ordinal: i32,
}

impl DeviceCtx {
    pub fn new(runtime: &'static Runtime, ordinal: usize) -> DeviceCtx {
        DeviceCtx {
            runtime,
            ordinal: ordinal as i32,
        }
    }

    pub fn runtime(&self) -> &'static Runtime {
        self.runtime
    }

    pub fn ordinal(&self) -> usize {
        self.ordinal as usize
    }

    /// The HIP ordinal, as the C API takes it.
    pub fn id(&self) -> i32 {
        self.ordinal
    }

    /// A HIP call's result code as a backend error naming `what`.
    pub fn call(&self, what: &str, code: hip::HipError) -> Result<()> {
        check(self.runtime.hip.check(what, code))
    }

    /// Makes this device current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        // SAFETY: a plain call with a device ordinal.
        self.call("hipSetDevice", unsafe {
            (self.runtime.hip.hipSetDevice)(self.ordinal)
        })
    }

    /// Waits for all work queued on the device.
    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: a plain call on the current device.
        self.call("hipDeviceSynchronize", unsafe {
            (self.runtime.hip.hipDeviceSynchronize)()
        })
    }
}

/// The gfx target from the device properties, when the runtime has the ROCm 6 layout and its
/// fields agree with the separately queried warp size and memory (else `None`: hiprtc then
/// compiles for the current device).
fn gfx_target(ctx: &DeviceCtx, warp_size: i32, total_memory: usize) -> Option<String> {
    let props = ctx.runtime().props.as_ref()?;
    // Room beyond the struct, in case a runtime writes a larger one.
    let mut buf = vec![0u8; 4 * hip::DEVICE_PROP_SIZE];
    // SAFETY: `buf` is larger than `hipDeviceProp_tR0600`.
    let code = unsafe { (props.hipGetDevicePropertiesR0600)(buf.as_mut_ptr(), ctx.id()) };
    (code == hip::SUCCESS)
        .then(|| gfx_target_from_props(&buf, warp_size, total_memory))
        .flatten()
}

/// `gcnArchName` of a `hipDeviceProp_tR0600` in `props`, checked against two fields known
/// otherwise; `None` when they disagree (another layout) or the name is not a gfx target.
fn gfx_target_from_props(props: &[u8], warp_size: i32, total_memory: usize) -> Option<String> {
    let field = |offset: usize, len: usize| props.get(offset..offset + len);
    let warp = i32::from_ne_bytes(field(hip::DEVICE_PROP_WARP_SIZE, 4)?.try_into().ok()?);
    let total = usize::from_ne_bytes(
        field(hip::DEVICE_PROP_TOTAL_GLOBAL_MEM, 8)?
            .try_into()
            .ok()?,
    );
    if warp != warp_size || total != total_memory {
        return None;
    }
    let name = field(hip::DEVICE_PROP_GCN_ARCH_NAME, hip::GCN_ARCH_NAME_LEN)?;
    let end = name.iter().position(|&b| b == 0)?;
    let arch = std::str::from_utf8(&name[..end]).ok()?;
    arch.starts_with("gfx").then(|| arch.to_string())
}

/// One HIP device.
pub struct HipDevice {
    ctx: DeviceCtx,
    gpu: String,
    arch: Option<String>,
    warp_size: u32,
    me: Weak<HipDevice>,
    buffer_type: Arc<HipBufferType>,
    host_type: Arc<PinnedBufferType>,
    kernels: OnceLock<std::result::Result<Arc<Kernels>, String>>,
}

impl HipDevice {
    /// Opens device `ordinal` of the loaded runtime.
    pub fn new(runtime: &'static Runtime, ordinal: usize) -> Result<Arc<Self>> {
        let ctx = DeviceCtx::new(runtime, ordinal);
        let hip = &runtime.hip;
        ctx.bind()?;
        let mut name = [0u8; 256];
        // SAFETY: `name` has room for the 256 bytes passed.
        ctx.call("hipDeviceGetName", unsafe {
            (hip.hipDeviceGetName)(name.as_mut_ptr() as *mut _, name.len() as i32, ctx.id())
        })?;
        let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        let gpu = String::from_utf8_lossy(&name[..end]).trim().to_string();
        let mut warp_size = 0;
        // SAFETY: writes one int.
        ctx.call("hipDeviceGetAttribute(warp size)", unsafe {
            (hip.hipDeviceGetAttribute)(&mut warp_size, hip::ATTRIBUTE_WARP_SIZE, ctx.id())
        })?;
        if warp_size != 32 && warp_size != 64 {
            return Err(err(format!(
                "hip:{ordinal}: unexpected warp size {warp_size}"
            )));
        }
        let mut total = 0usize;
        // SAFETY: writes one size.
        ctx.call("hipDeviceTotalMem", unsafe {
            (hip.hipDeviceTotalMem)(&mut total, ctx.id())
        })?;
        let arch = gfx_target(&ctx, warp_size, total);
        let name = format!("hip:{ordinal}");
        Ok(Arc::new_cyclic(|me| HipDevice {
            buffer_type: Arc::new(HipBufferType::new(ctx, name, total)),
            host_type: Arc::new(PinnedBufferType::new(ctx)),
            ctx,
            gpu,
            arch,
            warp_size: warp_size as u32,
            me: me.clone(),
            kernels: OnceLock::new(),
        }))
    }

    pub fn ctx(&self) -> &DeviceCtx {
        &self.ctx
    }

    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// The gfx target (e.g. `gfx90a:sramecc+:xnack-`), when the runtime reports it.
    pub fn arch(&self) -> Option<&str> {
        self.arch.as_deref()
    }

    /// Lanes per wavefront (64 on CDNA, 32 on RDNA).
    pub fn warp_size(&self) -> u32 {
        self.warp_size
    }

    /// This device as a shared handle.
    pub fn arc(&self) -> Arc<HipDevice> {
        self.me.upgrade().expect("a HipDevice lives in an Arc")
    }

    /// The kernels of this device, compiled for its target on first call.
    pub fn kernels(&self) -> Result<Arc<Kernels>> {
        self.kernels
            .get_or_init(|| Kernels::compile(self.ctx, self.arch(), self.warp_size).map(Arc::new))
            .clone()
            .map_err(|e| err(format!("{}: {e}", self.name())))
    }

    /// True when `buffer` is device memory of this device.
    pub fn is_own(&self, buffer: &dyn Buffer) -> bool {
        buffer
            .as_any()
            .downcast_ref::<HipBuffer>()
            .is_some_and(|b| b.ordinal() == self.ordinal())
    }
}

impl Device for HipDevice {
    fn name(&self) -> String {
        format!("hip:{}", self.ordinal())
    }
    fn description(&self) -> String {
        let arch = self.arch.as_deref().unwrap_or("gfx target unknown");
        format!("{} ({arch}, wave{})", self.gpu, self.warp_size)
    }
    fn kind(&self) -> DeviceKind {
        DeviceKind::Gpu
    }
    fn family(&self) -> &'static str {
        "hip"
    }
    fn memory(&self) -> MemoryInfo {
        let (mut free, mut total) = (0usize, 0usize);
        let hip = &self.ctx.runtime().hip;
        let ok = self.ctx.bind().is_ok()
            // SAFETY: writes two sizes for the current device.
            && unsafe { (hip.hipMemGetInfo)(&mut free, &mut total) } == hip::SUCCESS;
        if ok {
            MemoryInfo {
                free,
                total,
                allocated: None,
            }
        } else {
            MemoryInfo::default()
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
        ggml_gpu::dispatch::supports(&t.op, &src, &t.layout)
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
        self.buffer_type.clone()
    }
    fn host_buffer_type(&self) -> Option<Arc<dyn BufferType>> {
        Some(self.host_type.clone())
    }
    fn new_backend(&self) -> Result<Arc<dyn Backend>> {
        Ok(Arc::new(HipBackend::new(self.arc())?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(warp: i32, total: usize, arch: &str) -> Vec<u8> {
        let mut p = vec![0u8; hip::DEVICE_PROP_SIZE];
        p[hip::DEVICE_PROP_WARP_SIZE..][..4].copy_from_slice(&warp.to_ne_bytes());
        p[hip::DEVICE_PROP_TOTAL_GLOBAL_MEM..][..8].copy_from_slice(&total.to_ne_bytes());
        p[hip::DEVICE_PROP_GCN_ARCH_NAME..][..arch.len()].copy_from_slice(arch.as_bytes());
        p
    }

    #[test]
    fn gfx_target_is_read_only_from_a_consistent_layout() {
        let gib64 = 64 << 30;
        let p = props(64, gib64, "gfx90a:sramecc+:xnack-");
        assert_eq!(
            gfx_target_from_props(&p, 64, gib64).as_deref(),
            Some("gfx90a:sramecc+:xnack-")
        );
        assert_eq!(
            gfx_target_from_props(&p, 32, gib64),
            None,
            "warp size disagrees"
        );
        assert_eq!(
            gfx_target_from_props(&p, 64, 1 << 30),
            None,
            "memory disagrees"
        );
        let p = props(32, gib64, "Navi 31");
        assert_eq!(gfx_target_from_props(&p, 32, gib64), None, "not a gfx name");
        assert_eq!(
            gfx_target_from_props(&p[..300], 32, gib64),
            None,
            "too short"
        );
    }
}
