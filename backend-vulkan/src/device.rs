//! [`VulkanDevice`]: one logical Vulkan device as a ggml-tp [`Device`] (`vulkan:0`, `vulkan:1`, ...,
//! family `vulkan`): memory figures, op support, buffer ownership, streams.

use crate::context::Ctx;
use crate::memory::{VulkanBuffer, VulkanBufferType};
use crate::ops;
use crate::stream::VulkanBackend;
use ggml_core::{
    Backend, Buffer, BufferType, Device, DeviceCaps, DeviceKind, Graph, Layout, MemoryInfo, Result,
    TensorId,
};
use std::sync::{Arc, Weak};

/// One logical Vulkan device.
pub struct VulkanDevice {
    index: usize,
    ctx: Arc<Ctx>,
    me: Weak<VulkanDevice>,
    buffer_type: Arc<VulkanBufferType>,
}

impl VulkanDevice {
    /// Device `vulkan:<index>` over the logical device `ctx`.
    pub fn new(index: usize, ctx: Arc<Ctx>) -> Arc<Self> {
        let buffer_type = Arc::new(VulkanBufferType::new(
            ctx.clone(),
            format!("vulkan:{index}"),
        ));
        Arc::new_cyclic(|me| VulkanDevice {
            index,
            ctx,
            me: me.clone(),
            buffer_type,
        })
    }

    pub fn index(&self) -> usize {
        self.index
    }

    /// The logical device.
    pub fn ctx(&self) -> &Arc<Ctx> {
        &self.ctx
    }

    /// True when the 16-bit storage and subgroup shader variants are in use.
    pub fn fast_shaders(&self) -> bool {
        self.ctx.pipelines.fast()
    }

    fn is_own(&self, buffer: &dyn Buffer) -> bool {
        buffer
            .as_any()
            .downcast_ref::<VulkanBuffer>()
            .is_some_and(|b| Arc::ptr_eq(b.ctx(), &self.ctx))
    }
}

impl Device for VulkanDevice {
    fn name(&self) -> String {
        format!("vulkan:{}", self.index)
    }
    fn description(&self) -> String {
        let i = &self.ctx.info;
        format!(
            "{} (Vulkan {}.{}, {} shaders, subgroup {})",
            i.name,
            ash::vk::api_version_major(i.api_version),
            ash::vk::api_version_minor(i.api_version),
            if i.fast { "16-bit/subgroup" } else { "base" },
            i.subgroup_size
        )
    }
    fn kind(&self) -> DeviceKind {
        DeviceKind::Gpu
    }
    fn family(&self) -> &'static str {
        "vulkan"
    }
    fn memory(&self) -> MemoryInfo {
        let total = self.ctx.info.device_local_bytes as usize;
        MemoryInfo {
            free: total.saturating_sub(self.ctx.used()),
            total,
            allocated: Some(self.ctx.used()),
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
        ops::supports(&t.op, &src, &t.layout)
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
    fn new_backend(&self) -> Result<Arc<dyn Backend>> {
        let me = self.me.upgrade().ok_or_else(|| ggml_core::Error::Backend {
            backend: "vulkan".into(),
            msg: "device dropped".into(),
        })?;
        Ok(Arc::new(VulkanBackend::new(me)))
    }
}
