//! [`Ctx`]: one logical device and its compute queue. Owns raw buffer allocation (device-local or
//! host-visible memory), the submission machinery (one command pool and buffer, a fence, a staging
//! buffer for host transfers) and the compute pipelines ([`crate::pipeline::Pipelines`]). All work on
//! one device is recorded and submitted under one lock and waited for with the fence.

use crate::instance::{Instance, PhysicalInfo};
use crate::pipeline::Pipelines;
use ash::vk;
use ggml_core::{Error, Result};
use parking_lot::{Mutex, MutexGuard};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Bytes of the staging buffer used for host transfers (larger transfers go in chunks).
pub const STAGING_BYTES: usize = 8 << 20;

/// A Vulkan error as a backend error.
pub fn vk_err(what: &str, e: vk::Result) -> Error {
    Error::Backend {
        backend: "vulkan".into(),
        msg: format!("{what}: {e}"),
    }
}

/// A buffer and its memory; freed with [`Ctx::free_raw`].
pub struct RawBuffer {
    pub buffer: vk::Buffer,
    pub memory: vk::DeviceMemory,
    pub size: usize,
    /// Host address of the mapped memory (host-visible buffers only).
    pub mapped: Option<*mut u8>,
}

/// The parameter words of one compute call: written by the host into `upload` (host-visible) and
/// copied at the start of the call into `device` (device-local), which the shaders read, so that
/// their many small parameter reads do not cross the bus on discrete GPUs.
pub struct ParamBuffers {
    pub upload: RawBuffer,
    pub device: RawBuffer,
}

/// Recording state, used under [`Ctx::lock`].
pub struct Submitter {
    pool: vk::CommandPool,
    pub cb: vk::CommandBuffer,
    fence: vk::Fence,
    pub staging: RawBuffer,
    /// Parameter words of dispatches (grown on demand).
    pub params: Option<ParamBuffers>,
    /// Descriptor pool for the sets of one compute call, and how many sets it holds.
    pub descriptors: Option<(vk::DescriptorPool, usize)>,
}

/// A logical device opened on one physical device.
pub struct Ctx {
    pub instance: Arc<Instance>,
    pub info: PhysicalInfo,
    pub device: ash::Device,
    queue: vk::Queue,
    memory: vk::PhysicalDeviceMemoryProperties,
    submit: Mutex<Option<Submitter>>,
    pub pipelines: Pipelines,
    used: AtomicUsize,
}

// SAFETY: Vulkan handles are plain identifiers; the queue, command pool and staging memory are only
// used under the `submit` lock, as Vulkan's external synchronisation rules require.
unsafe impl Send for Ctx {}
unsafe impl Sync for Ctx {}
unsafe impl Send for RawBuffer {}
unsafe impl Sync for RawBuffer {}

impl Ctx {
    /// Opens a logical device with one compute queue on `info`'s physical device.
    pub fn new(instance: Arc<Instance>, info: PhysicalInfo) -> Result<Arc<Ctx>> {
        let priorities = [1.0f32];
        let queues = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(info.queue_family)
            .queue_priorities(&priorities)];
        let features = vk::PhysicalDeviceFeatures::default()
            .shader_storage_buffer_array_dynamic_indexing(true);
        let mut s16 = vk::PhysicalDevice16BitStorageFeatures::default()
            .storage_buffer16_bit_access(info.fast);
        let create = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queues)
            .enabled_features(&features)
            .push_next(&mut s16);
        // SAFETY: the physical device belongs to `instance`; the create info outlives the call.
        let device = unsafe { instance.raw.create_device(info.handle, &create, None) }
            .map_err(|e| vk_err("vkCreateDevice", e))?;
        // SAFETY: queue 0 of the family was requested above.
        let queue = unsafe { device.get_device_queue(info.queue_family, 0) };
        // SAFETY: the physical device is live.
        let memory = unsafe {
            instance
                .raw
                .get_physical_device_memory_properties(info.handle)
        };
        let pipelines = match Pipelines::new(&device, info.fast) {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: nothing was created from the device yet.
                unsafe { device.destroy_device(None) };
                return Err(e);
            }
        };
        let ctx = Arc::new(Ctx {
            instance,
            info,
            device,
            queue,
            memory,
            submit: Mutex::new(None),
            pipelines,
            used: AtomicUsize::new(0),
        });
        let submitter = ctx.new_submitter()?;
        *ctx.submit.lock() = Some(submitter);
        Ok(ctx)
    }

    fn new_submitter(&self) -> Result<Submitter> {
        let d = &self.device;
        // SAFETY: plain object creation on a live device; created objects are destroyed in `drop`.
        unsafe {
            let pool = d
                .create_command_pool(
                    &vk::CommandPoolCreateInfo::default()
                        .queue_family_index(self.info.queue_family)
                        .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER),
                    None,
                )
                .map_err(|e| vk_err("vkCreateCommandPool", e))?;
            let cb = d
                .allocate_command_buffers(
                    &vk::CommandBufferAllocateInfo::default()
                        .command_pool(pool)
                        .level(vk::CommandBufferLevel::PRIMARY)
                        .command_buffer_count(1),
                )
                .map_err(|e| vk_err("vkAllocateCommandBuffers", e))?[0];
            let fence = d
                .create_fence(&vk::FenceCreateInfo::default(), None)
                .map_err(|e| vk_err("vkCreateFence", e))?;
            let staging = self.alloc_raw(
                STAGING_BYTES,
                vk::BufferUsageFlags::TRANSFER_SRC | vk::BufferUsageFlags::TRANSFER_DST,
                true,
            )?;
            Ok(Submitter {
                pool,
                cb,
                fence,
                staging,
                params: None,
                descriptors: None,
            })
        }
    }

    /// Bytes allocated in buffers of this device.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    /// Largest single buffer: the storage-buffer range the shaders can address and the allocation
    /// limit.
    pub fn max_buffer(&self) -> usize {
        self.info
            .max_storage_range
            .min(self.info.max_allocation)
            .try_into()
            .unwrap_or(usize::MAX)
    }

    fn memory_type(&self, bits: u32, host: bool) -> Option<u32> {
        let want = if host {
            vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT
        } else {
            vk::MemoryPropertyFlags::DEVICE_LOCAL
        };
        let types = &self.memory.memory_types[..self.memory.memory_type_count as usize];
        let fits = |i: usize, flags: vk::MemoryPropertyFlags| {
            bits & (1 << i) != 0 && types[i].property_flags.contains(flags)
        };
        (0..types.len())
            .find(|&i| fits(i, want))
            .or_else(|| {
                (!host)
                    .then(|| (0..types.len()).find(|&i| fits(i, vk::MemoryPropertyFlags::empty())))
                    .flatten()
            })
            .map(|i| i as u32)
    }

    /// A buffer of `size` bytes (rounded up to 16) in device-local or host-visible (mapped) memory.
    pub fn alloc_raw(
        &self,
        size: usize,
        usage: vk::BufferUsageFlags,
        host: bool,
    ) -> Result<RawBuffer> {
        let oom = |requested: usize| Error::OutOfMemory {
            device: self.info.name.clone(),
            requested,
            available: self.max_buffer().saturating_sub(self.used()),
        };
        let bytes = size.max(16).div_ceil(16) * 16;
        if bytes > self.max_buffer() {
            return Err(oom(size));
        }
        let d = &self.device;
        // SAFETY: objects are created on a live device and destroyed on every error path.
        unsafe {
            let buffer = d
                .create_buffer(
                    &vk::BufferCreateInfo::default()
                        .size(bytes as u64)
                        .usage(usage)
                        .sharing_mode(vk::SharingMode::EXCLUSIVE),
                    None,
                )
                .map_err(|e| vk_err("vkCreateBuffer", e))?;
            let req = d.get_buffer_memory_requirements(buffer);
            let Some(type_index) = self.memory_type(req.memory_type_bits, host) else {
                d.destroy_buffer(buffer, None);
                return Err(vk_err(
                    "no suitable memory type",
                    vk::Result::ERROR_FEATURE_NOT_PRESENT,
                ));
            };
            let memory = match d.allocate_memory(
                &vk::MemoryAllocateInfo::default()
                    .allocation_size(req.size)
                    .memory_type_index(type_index),
                None,
            ) {
                Ok(m) => m,
                Err(e) => {
                    d.destroy_buffer(buffer, None);
                    return Err(match e {
                        vk::Result::ERROR_OUT_OF_DEVICE_MEMORY
                        | vk::Result::ERROR_OUT_OF_HOST_MEMORY => oom(size),
                        e => vk_err("vkAllocateMemory", e),
                    });
                }
            };
            let free = |e: vk::Result, what: &str| {
                d.destroy_buffer(buffer, None);
                d.free_memory(memory, None);
                vk_err(what, e)
            };
            d.bind_buffer_memory(buffer, memory, 0)
                .map_err(|e| free(e, "vkBindBufferMemory"))?;
            let mapped = if host {
                Some(
                    d.map_memory(memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty())
                        .map_err(|e| free(e, "vkMapMemory"))? as *mut u8,
                )
            } else {
                None
            };
            self.used.fetch_add(bytes, Ordering::AcqRel);
            Ok(RawBuffer {
                buffer,
                memory,
                size: bytes,
                mapped,
            })
        }
    }

    /// Frees a buffer from [`Ctx::alloc_raw`]; no submitted work may use it any more.
    pub fn free_raw(&self, raw: &RawBuffer) {
        // SAFETY: the buffer was created on this device and no work using it is pending (every
        // submission is waited for before its lock is released).
        unsafe {
            self.device.destroy_buffer(raw.buffer, None);
            self.device.free_memory(raw.memory, None);
        }
        self.used.fetch_sub(raw.size, Ordering::AcqRel);
    }

    /// Parameter buffers of at least `bytes` (see [`ParamBuffers`]).
    pub fn alloc_params(&self, bytes: usize) -> Result<ParamBuffers> {
        let upload = self.alloc_raw(
            bytes,
            vk::BufferUsageFlags::STORAGE_BUFFER | vk::BufferUsageFlags::TRANSFER_SRC,
            true,
        )?;
        match self.alloc_raw(
            bytes,
            vk::BufferUsageFlags::STORAGE_BUFFER | vk::BufferUsageFlags::TRANSFER_DST,
            false,
        ) {
            Ok(device) => Ok(ParamBuffers { upload, device }),
            Err(e) => {
                self.free_raw(&upload);
                Err(e)
            }
        }
    }

    /// Frees buffers from [`Ctx::alloc_params`]; no submitted work may use them any more.
    pub fn free_params(&self, p: &ParamBuffers) {
        self.free_raw(&p.upload);
        self.free_raw(&p.device);
    }

    /// Locks the device's submission state.
    pub fn lock(&self) -> Result<MutexGuard<'_, Option<Submitter>>> {
        let guard = self.submit.lock();
        if guard.is_none() {
            return Err(vk_err(
                "device lost its submission state",
                vk::Result::ERROR_DEVICE_LOST,
            ));
        }
        Ok(guard)
    }

    /// Records commands with `record` into the submitter's command buffer (between full memory
    /// barriers), submits them and waits for completion.
    pub fn run(
        &self,
        s: &mut Submitter,
        record: impl FnOnce(&ash::Device, vk::CommandBuffer) -> Result<()>,
    ) -> Result<()> {
        let d = &self.device;
        // SAFETY: the command buffer, fence and queue are used under the submission lock only (the
        // caller holds it through `s`); the submission is complete when this returns.
        unsafe {
            d.reset_command_buffer(s.cb, vk::CommandBufferResetFlags::empty())
                .map_err(|e| vk_err("vkResetCommandBuffer", e))?;
            d.begin_command_buffer(
                s.cb,
                &vk::CommandBufferBeginInfo::default()
                    .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT),
            )
            .map_err(|e| vk_err("vkBeginCommandBuffer", e))?;
            barrier(d, s.cb, vk::PipelineStageFlags::ALL_COMMANDS);
            let recorded = record(d, s.cb);
            barrier(d, s.cb, vk::PipelineStageFlags::HOST);
            d.end_command_buffer(s.cb)
                .map_err(|e| vk_err("vkEndCommandBuffer", e))?;
            recorded?;
            d.reset_fences(&[s.fence])
                .map_err(|e| vk_err("vkResetFences", e))?;
            let cbs = [s.cb];
            let submit = [vk::SubmitInfo::default().command_buffers(&cbs)];
            d.queue_submit(self.queue, &submit, s.fence)
                .map_err(|e| vk_err("vkQueueSubmit", e))?;
            d.wait_for_fences(&[s.fence], true, u64::MAX)
                .map_err(|e| vk_err("vkWaitForFences", e))
        }
    }
}

/// A full memory barrier from all earlier commands to `dst` (later commands, or the host).
fn barrier(d: &ash::Device, cb: vk::CommandBuffer, dst: vk::PipelineStageFlags) {
    let mut access = vk::AccessFlags::MEMORY_READ | vk::AccessFlags::MEMORY_WRITE;
    if dst == vk::PipelineStageFlags::HOST {
        access |= vk::AccessFlags::HOST_READ;
    }
    let mb = [vk::MemoryBarrier::default()
        .src_access_mask(vk::AccessFlags::MEMORY_WRITE)
        .dst_access_mask(access)];
    // SAFETY: `cb` is in the recording state (callers record under the submission lock).
    unsafe {
        d.cmd_pipeline_barrier(
            cb,
            vk::PipelineStageFlags::ALL_COMMANDS,
            dst | vk::PipelineStageFlags::ALL_COMMANDS,
            vk::DependencyFlags::empty(),
            &mb,
            &[],
            &[],
        )
    };
}

/// Makes the writes of earlier commands of `src` stage visible to the compute shaders recorded
/// next (between dependent dispatches, `src` = compute; after a parameter upload, transfer).
pub fn compute_barrier(d: &ash::Device, cb: vk::CommandBuffer, src: vk::PipelineStageFlags) {
    let src_access = if src == vk::PipelineStageFlags::TRANSFER {
        vk::AccessFlags::TRANSFER_WRITE
    } else {
        vk::AccessFlags::SHADER_WRITE
    };
    let mb = [vk::MemoryBarrier::default()
        .src_access_mask(src_access)
        .dst_access_mask(vk::AccessFlags::SHADER_READ | vk::AccessFlags::SHADER_WRITE)];
    // SAFETY: `cb` is in the recording state (callers record under the submission lock).
    unsafe {
        d.cmd_pipeline_barrier(
            cb,
            src,
            vk::PipelineStageFlags::COMPUTE_SHADER,
            vk::DependencyFlags::empty(),
            &mb,
            &[],
            &[],
        )
    };
}

impl Drop for Ctx {
    fn drop(&mut self) {
        let d = &self.device;
        // SAFETY: every buffer holds an `Arc<Ctx>`, so none is left; no work is pending.
        unsafe {
            let _ = d.device_wait_idle();
            if let Some(s) = self.submit.lock().take() {
                self.free_raw(&s.staging);
                if let Some(p) = &s.params {
                    self.free_params(p);
                }
                if let Some((pool, _)) = s.descriptors {
                    d.destroy_descriptor_pool(pool, None);
                }
                d.destroy_fence(s.fence, None);
                d.destroy_command_pool(s.pool, None);
            }
            self.pipelines.destroy(d);
            d.destroy_device(None);
        }
    }
}
