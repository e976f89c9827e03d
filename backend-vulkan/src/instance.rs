//! The Vulkan instance and device discovery: loads libvulkan at run time (`ash::Entry::load`),
//! creates one instance, and opens every physical device that can run the shaders as one or more
//! logical devices ([`open_devices`]; the registry opens each physical device `GGML_TP_VULKAN_DEVICES`
//! times, see [`crate::settings`]). Failures become a one-line reason, never a panic.

use crate::context::Ctx;
use crate::device::VulkanDevice;
use ash::vk;
use std::ffi::CStr;
use std::sync::Arc;

/// A loaded Vulkan library and an instance created from it. Destroyed when the last device goes.
pub struct Instance {
    pub entry: ash::Entry,
    pub raw: ash::Instance,
}

impl Drop for Instance {
    fn drop(&mut self) {
        // SAFETY: every object created from the instance (logical devices) holds an `Arc<Instance>`
        // and is gone by now.
        unsafe { self.raw.destroy_instance(None) };
    }
}

impl Instance {
    /// Loads the Vulkan loader and creates an instance for Vulkan 1.1.
    pub fn new() -> Result<Arc<Instance>, String> {
        // SAFETY: loading the system Vulkan loader runs its initialisers, as any Vulkan program does.
        let entry = unsafe { ash::Entry::load() }
            .map_err(|e| format!("no Vulkan loader (libvulkan): {e}"))?;
        let app = vk::ApplicationInfo::default()
            .application_name(c"ggml-tp")
            .engine_name(c"ggml-tp")
            .api_version(vk::API_VERSION_1_1);
        let info = vk::InstanceCreateInfo::default().application_info(&app);
        // SAFETY: the create info and what it points to live across the call.
        let raw = unsafe { entry.create_instance(&info, None) }
            .map_err(|e| format!("vkCreateInstance failed: {e}"))?;
        Ok(Arc::new(Instance { entry, raw }))
    }
}

/// What a physical device offers the shaders.
#[derive(Clone, Debug)]
pub struct PhysicalInfo {
    pub handle: vk::PhysicalDevice,
    pub name: String,
    pub api_version: u32,
    /// A CPU implementation (lavapipe): shared-memory tiles and barriers cost more than they save.
    pub cpu: bool,
    pub queue_family: u32,
    /// 16-bit storage buffer access and subgroup arithmetic in compute shaders: the `fast` shaders.
    pub fast: bool,
    pub subgroup_size: u32,
    pub max_storage_range: u64,
    pub min_storage_align: u64,
    pub max_allocation: u64,
    pub device_local_bytes: u64,
}

/// Which shader variant to use on devices that support both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// 16-bit storage and subgroup reductions where the device has them (the default).
    Auto,
    /// The base shaders everywhere (32-bit words, atomics for 16-bit stores, shared memory only).
    Base,
}

/// Why `pd` cannot run the shaders, or what it offers.
fn probe(
    instance: &Instance,
    pd: vk::PhysicalDevice,
    variant: Variant,
) -> Result<PhysicalInfo, String> {
    let i = &instance.raw;
    // SAFETY: `pd` was enumerated from this instance; the chained structs outlive the calls.
    unsafe {
        let props = i.get_physical_device_properties(pd);
        let name = CStr::from_ptr(props.device_name.as_ptr())
            .to_string_lossy()
            .into_owned();
        if props.api_version < vk::API_VERSION_1_1 {
            return Err(format!("{name}: Vulkan 1.1 required"));
        }
        let features = i.get_physical_device_features(pd);
        if features.shader_storage_buffer_array_dynamic_indexing == 0 {
            return Err(format!(
                "{name}: no dynamic indexing of storage buffer arrays"
            ));
        }
        let queue_family = i
            .get_physical_device_queue_family_properties(pd)
            .iter()
            .position(|q| q.queue_flags.contains(vk::QueueFlags::COMPUTE))
            .ok_or_else(|| format!("{name}: no compute queue"))? as u32;
        let mut s16 = vk::PhysicalDevice16BitStorageFeatures::default();
        let mut f2 = vk::PhysicalDeviceFeatures2::default().push_next(&mut s16);
        i.get_physical_device_features2(pd, &mut f2);
        let storage16 = s16.storage_buffer16_bit_access != 0;
        let mut sg = vk::PhysicalDeviceSubgroupProperties::default();
        let mut maint3 = vk::PhysicalDeviceMaintenance3Properties::default();
        let mut p2 = vk::PhysicalDeviceProperties2::default()
            .push_next(&mut sg)
            .push_next(&mut maint3);
        i.get_physical_device_properties2(pd, &mut p2);
        let subgroups = sg.supported_stages.contains(vk::ShaderStageFlags::COMPUTE)
            && sg
                .supported_operations
                .contains(vk::SubgroupFeatureFlags::BASIC | vk::SubgroupFeatureFlags::ARITHMETIC);
        let mem = i.get_physical_device_memory_properties(pd);
        let device_local_bytes = mem.memory_heaps[..mem.memory_heap_count as usize]
            .iter()
            .filter(|h| h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL))
            .map(|h| h.size)
            .max()
            .unwrap_or(0);
        Ok(PhysicalInfo {
            handle: pd,
            name,
            api_version: props.api_version,
            cpu: props.device_type == vk::PhysicalDeviceType::CPU,
            queue_family,
            fast: storage16 && subgroups && variant == Variant::Auto,
            subgroup_size: sg.subgroup_size,
            max_storage_range: u64::from(props.limits.max_storage_buffer_range),
            min_storage_align: props.limits.min_storage_buffer_offset_alignment,
            max_allocation: maint3.max_memory_allocation_size,
            device_local_bytes,
        })
    }
}

/// Opens every usable physical device `copies` times as logical devices `vulkan:0`, `vulkan:1`, ...
/// with the shader variant of the settings (`GGML_TP_VULKAN_BASE`, [`crate::settings`]). An error
/// (with the reasons) when none could be opened.
pub fn open_devices(copies: usize) -> Result<Vec<Arc<VulkanDevice>>, String> {
    open_devices_with(copies, crate::settings::settings().variant)
}

/// [`open_devices`] with an explicit shader variant.
pub fn open_devices_with(
    copies: usize,
    variant: Variant,
) -> Result<Vec<Arc<VulkanDevice>>, String> {
    let instance = Instance::new()?;
    // SAFETY: the instance is live.
    let pds = unsafe { instance.raw.enumerate_physical_devices() }
        .map_err(|e| format!("vkEnumeratePhysicalDevices failed: {e}"))?;
    if pds.is_empty() {
        return Err("no Vulkan physical device".into());
    }
    let mut devices = Vec::new();
    let mut reasons = Vec::new();
    for pd in pds {
        let info = match probe(&instance, pd, variant) {
            Ok(i) => i,
            Err(e) => {
                reasons.push(e);
                continue;
            }
        };
        for _ in 0..copies.max(1) {
            match Ctx::new(instance.clone(), info.clone()) {
                Ok(ctx) => devices.push(VulkanDevice::new(devices.len(), ctx)),
                Err(e) => reasons.push(format!("{}: {e}", info.name)),
            }
        }
    }
    if devices.is_empty() {
        return Err(reasons.join("; "));
    }
    Ok(devices)
}
