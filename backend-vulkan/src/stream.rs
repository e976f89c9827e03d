//! [`VulkanBackend`]: the stream of one Vulkan device. `compute` encodes the nodes into dispatches,
//! writes their parameter words to a host-visible buffer, binds each dispatch's tensors through one
//! descriptor set, records everything into one command buffer (the parameters copied to
//! device-local memory first, a compute-to-compute memory barrier between dispatches), submits it
//! and waits for the fence. Work is complete when a call returns, so events are too.

use crate::context::{compute_barrier, vk_err, Ctx, Submitter};
use crate::device::VulkanDevice;
use crate::memory::{copy_buffers, VulkanBuffer};
use crate::ops::{self, Dispatch, OP_WORDS};
use crate::pipeline::SLOTS;
use ash::vk;
use ggml_core::{Backend, Buffer, DataRef, Device, Error, Event, Graph, Result, TensorId};
use std::sync::Arc;

/// Parameter words of one dispatch: 10 per slot, then the op's words (`common.glsl`).
const PARAM_WORDS: usize = 60 + OP_WORDS;
/// Largest workgroup count per grid dimension used.
const MAX_GROUPS_X: usize = 65535;

/// An event of a stream whose work completes before each call returns.
pub struct VulkanEvent;

impl Event for VulkanEvent {
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    fn is_done(&self) -> bool {
        true
    }
}

/// A stream on one Vulkan device.
pub struct VulkanBackend {
    device: Arc<VulkanDevice>,
}

fn backend_err(msg: String) -> Error {
    Error::Backend {
        backend: "vulkan".into(),
        msg,
    }
}

impl VulkanBackend {
    pub fn new(device: Arc<VulkanDevice>) -> Self {
        VulkanBackend { device }
    }

    fn ctx(&self) -> &Arc<Ctx> {
        self.device.ctx()
    }

    /// The buffer of this device behind `data`, if it is one.
    fn own_buffer<'a>(&self, data: &'a DataRef) -> Option<&'a VulkanBuffer> {
        data.buffer
            .as_any()
            .downcast_ref::<VulkanBuffer>()
            .filter(|b| Arc::ptr_eq(b.ctx(), self.ctx()))
    }

    /// The parameter words of `d` and the buffers of its slots.
    fn bind(&self, d: &Dispatch) -> Result<([u32; PARAM_WORDS], Vec<vk::Buffer>)> {
        let mut p = [0u32; PARAM_WORDS];
        let mut buffers = Vec::with_capacity(d.slots.len());
        for (i, s) in d.slots.iter().enumerate() {
            let buf = self.own_buffer(&s.data).ok_or_else(|| {
                backend_err(format!(
                    "{}: tensor in {} is not memory of this device",
                    d.shader,
                    s.data.buffer.name()
                ))
            })?;
            let l = &s.layout;
            let code = ops::type_code(l.dtype)
                .ok_or_else(|| backend_err(format!("{}: type {}", d.shader, l.dtype)))?;
            let align = ops::alignment(l.dtype);
            let end = s.data.offset.checked_add(l.nbytes());
            if end.is_none_or(|e| e > buf.size()) {
                return Err(Error::OutOfBounds {
                    offset: s.data.offset,
                    len: l.nbytes(),
                    size: buf.size(),
                });
            }
            let fits = |v: usize| u32::try_from(v).ok();
            let misaligned = s.data.offset % align != 0 || l.nb.iter().any(|&n| n % align != 0);
            let w = &mut p[i * 10..i * 10 + 10];
            w[0] = code;
            w[1] = fits(s.data.offset).filter(|_| !misaligned).ok_or_else(|| {
                backend_err(format!("{}: tensor offset {}", d.shader, s.data.offset))
            })?;
            for k in 0..4 {
                w[2 + k] =
                    fits(l.ne[k]).ok_or_else(|| backend_err("dimension over 2^32".into()))?;
                w[6 + k] = fits(l.nb[k]).ok_or_else(|| backend_err("stride over 2^32".into()))?;
            }
            buffers.push(buf.handle());
        }
        p[60..].copy_from_slice(&d.op);
        Ok((p, buffers))
    }
}

/// Makes sure `s` has a parameter buffer of `bytes` and a descriptor pool of `sets` sets.
fn reserve(ctx: &Ctx, s: &mut Submitter, bytes: usize, sets: usize) -> Result<()> {
    if s.params.as_ref().is_none_or(|p| p.upload.size < bytes) {
        if let Some(old) = s.params.take() {
            ctx.free_params(&old);
        }
        s.params = Some(ctx.alloc_params(bytes.next_power_of_two())?);
    }
    let d = &ctx.device;
    match s.descriptors {
        Some((pool, n)) if n >= sets => {
            // SAFETY: no set from the pool is in use (every submission is complete).
            unsafe { d.reset_descriptor_pool(pool, vk::DescriptorPoolResetFlags::empty()) }
                .map_err(|e| vk_err("vkResetDescriptorPool", e))?;
        }
        old => {
            let n = sets.next_power_of_two().max(64);
            // SAFETY: the old pool's sets are no longer used; the new pool is owned by `s`.
            unsafe {
                if let Some((pool, _)) = old {
                    d.destroy_descriptor_pool(pool, None);
                    s.descriptors = None;
                }
                let sizes = [vk::DescriptorPoolSize {
                    ty: vk::DescriptorType::STORAGE_BUFFER,
                    descriptor_count: (n * (SLOTS + 1)) as u32,
                }];
                let pool = d
                    .create_descriptor_pool(
                        &vk::DescriptorPoolCreateInfo::default()
                            .max_sets(n as u32)
                            .pool_sizes(&sizes),
                        None,
                    )
                    .map_err(|e| vk_err("vkCreateDescriptorPool", e))?;
                s.descriptors = Some((pool, n));
            }
        }
    }
    Ok(())
}

impl Backend for VulkanBackend {
    fn name(&self) -> String {
        self.device.name()
    }
    fn device(&self) -> Arc<dyn Device> {
        self.device.clone()
    }
    fn copy_async(&self, src: &DataRef, dst: &DataRef, len: usize) -> Result<()> {
        ggml_core::backend::check_range(src.offset, len, src.buffer.size())?;
        ggml_core::backend::check_range(dst.offset, len, dst.buffer.size())?;
        match (self.own_buffer(src), self.own_buffer(dst)) {
            (Some(s), Some(d)) => copy_buffers(
                self.ctx(),
                s.handle(),
                src.offset,
                d.handle(),
                dst.offset,
                len,
            ),
            _ => match (src.host_ptr(), dst.host_ptr()) {
                // SAFETY: the source range lies in its host buffer (checked above).
                (Some(p), _) => dst
                    .buffer
                    .set(dst.offset, unsafe { std::slice::from_raw_parts(p, len) }),
                // SAFETY: the destination range lies in its host buffer (checked above).
                (None, Some(p)) => src.buffer.get(src.offset, unsafe {
                    std::slice::from_raw_parts_mut(p, len)
                }),
                (None, None) => {
                    let mut staging = vec![0u8; len];
                    src.buffer.get(src.offset, &mut staging)?;
                    dst.buffer.set(dst.offset, &staging)
                }
            },
        }
    }
    fn compute(&self, graph: &Graph, nodes: &[TensorId]) -> Result<()> {
        let ctx = self.ctx();
        let target = ops::Target {
            subgroup: ctx
                .pipelines
                .fast()
                .then_some(ctx.info.subgroup_size as usize),
            cpu: ctx.info.cpu,
        };
        let mut dispatches = Vec::new();
        for &n in nodes {
            let t = graph.tensor(n);
            if t.op.is_view() || t.is_leaf() || t.nelements() == 0 {
                continue;
            }
            dispatches.push(ops::encode(graph, n, &target).map_err(|e| match e {
                Error::UnsupportedOp { op, backend } => Error::UnsupportedOp {
                    op: format!("{op} at node {}", t.name),
                    backend,
                },
                other => other,
            })?);
        }
        if dispatches.is_empty() {
            return Ok(());
        }
        let dev = &ctx.device;
        let bound: Vec<_> = dispatches
            .iter()
            .map(|d| self.bind(d))
            .collect::<Result<_>>()?;
        let pipelines: Vec<vk::Pipeline> = dispatches
            .iter()
            .map(|d| ctx.pipelines.get(dev, d.shader))
            .collect::<Result<_>>()?;
        let align = ctx.info.min_storage_align.max(4) as usize;
        let stride = (PARAM_WORDS * 4).next_multiple_of(align);
        let n = dispatches.len();

        let mut guard = ctx.lock()?;
        let s = guard.as_mut().expect("checked by lock");
        reserve(ctx, s, n * stride, n)?;
        let params = s.params.as_ref().expect("reserved");
        let (pool, _) = s.descriptors.expect("reserved");
        let base = params.upload.mapped.expect("host-visible");
        for (i, (p, _)) in bound.iter().enumerate() {
            // SAFETY: the parameter buffer holds n * stride bytes and no submitted work reads it.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    p.as_ptr() as *const u8,
                    base.add(i * stride),
                    PARAM_WORDS * 4,
                )
            };
        }
        let layouts = vec![ctx.pipelines.set_layout; n];
        // SAFETY: the pool was sized for n sets of this layout.
        let sets = unsafe {
            dev.allocate_descriptor_sets(
                &vk::DescriptorSetAllocateInfo::default()
                    .descriptor_pool(pool)
                    .set_layouts(&layouts),
            )
        }
        .map_err(|e| vk_err("vkAllocateDescriptorSets", e))?;
        let (upload, params_buffer) = (params.upload.buffer, params.device.buffer);
        for (i, (_, buffers)) in bound.iter().enumerate() {
            let pinfo = [vk::DescriptorBufferInfo {
                buffer: params_buffer,
                offset: (i * stride) as u64,
                range: (PARAM_WORDS * 4) as u64,
            }];
            let dinfo: Vec<vk::DescriptorBufferInfo> = (0..SLOTS)
                .map(|k| vk::DescriptorBufferInfo {
                    buffer: buffers.get(k).copied().unwrap_or(buffers[0]),
                    offset: 0,
                    range: vk::WHOLE_SIZE,
                })
                .collect();
            let writes = [
                vk::WriteDescriptorSet::default()
                    .dst_set(sets[i])
                    .dst_binding(0)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .buffer_info(&pinfo),
                vk::WriteDescriptorSet::default()
                    .dst_set(sets[i])
                    .dst_binding(1)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .buffer_info(&dinfo),
            ];
            // SAFETY: the sets are freshly allocated and not in use.
            unsafe { dev.update_descriptor_sets(&writes, &[]) };
        }
        let layout = ctx.pipelines.layout;
        ctx.run(s, |d, cb| {
            let region = [vk::BufferCopy {
                src_offset: 0,
                dst_offset: 0,
                size: (n * stride) as u64,
            }];
            // SAFETY: both parameter buffers hold at least n * stride bytes; `cb` is recording.
            unsafe { d.cmd_copy_buffer(cb, upload, params_buffer, &region) };
            compute_barrier(d, cb, vk::PipelineStageFlags::TRANSFER);
            for (i, disp) in dispatches.iter().enumerate() {
                if disp.groups == 0 {
                    continue;
                }
                let x = disp.groups.min(MAX_GROUPS_X);
                let y = disp.groups.div_ceil(x);
                if y > MAX_GROUPS_X {
                    return Err(backend_err(format!(
                        "{}: {} workgroups",
                        disp.shader, disp.groups
                    )));
                }
                // SAFETY: `cb` is recording; pipeline, layout and set belong to this device.
                unsafe {
                    if i > 0 {
                        compute_barrier(d, cb, vk::PipelineStageFlags::COMPUTE_SHADER);
                    }
                    d.cmd_bind_pipeline(cb, vk::PipelineBindPoint::COMPUTE, pipelines[i]);
                    d.cmd_bind_descriptor_sets(
                        cb,
                        vk::PipelineBindPoint::COMPUTE,
                        layout,
                        0,
                        &sets[i..i + 1],
                        &[],
                    );
                    d.cmd_dispatch(cb, x as u32, y as u32, 1);
                }
            }
            Ok(())
        })
    }
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    fn record_event(&self) -> Result<Arc<dyn Event>> {
        Ok(Arc::new(VulkanEvent))
    }
    fn wait_event(&self, event: &dyn Event) -> Result<()> {
        event.synchronize()
    }
}
