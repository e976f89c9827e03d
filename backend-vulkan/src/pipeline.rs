//! Compute pipelines: the SPIR-V table built by `build.rs`, the one descriptor-set layout every
//! shader uses (binding 0: parameter words; binding 1: [`SLOTS`] data buffers), and a per-device
//! cache of pipelines created on first use from the variant (`fast` or `base`) the device supports.

use crate::context::vk_err;
use ash::vk;
use ggml_core::{Error, Result};
use parking_lot::Mutex;
use std::collections::HashMap;

include!(concat!(env!("OUT_DIR"), "/shaders.rs"));

/// Data buffer slots of a dispatch: slot 0 is the destination, slots 1.. the sources.
pub const SLOTS: usize = 6;

/// The name of shader `name` as stored in [`SHADERS`], if there is one.
pub fn shader_named(name: &str) -> Option<&'static str> {
    SHADERS
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(n, _, _)| *n)
}

/// The pipelines of one logical device.
pub struct Pipelines {
    fast: bool,
    pub set_layout: vk::DescriptorSetLayout,
    pub layout: vk::PipelineLayout,
    cache: vk::PipelineCache,
    made: Mutex<HashMap<&'static str, vk::Pipeline>>,
}

impl Pipelines {
    /// The shared layouts on `device`; `fast` picks the 16-bit/subgroup shader variants.
    pub fn new(device: &ash::Device, fast: bool) -> Result<Pipelines> {
        let bindings = [
            vk::DescriptorSetLayoutBinding::default()
                .binding(0)
                .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                .descriptor_count(1)
                .stage_flags(vk::ShaderStageFlags::COMPUTE),
            vk::DescriptorSetLayoutBinding::default()
                .binding(1)
                .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                .descriptor_count(SLOTS as u32)
                .stage_flags(vk::ShaderStageFlags::COMPUTE),
        ];
        // SAFETY: object creation on a live device; everything is destroyed on error paths and in
        // `destroy`.
        unsafe {
            let set_layout = device
                .create_descriptor_set_layout(
                    &vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings),
                    None,
                )
                .map_err(|e| vk_err("vkCreateDescriptorSetLayout", e))?;
            let set_layouts = [set_layout];
            let layout = match device.create_pipeline_layout(
                &vk::PipelineLayoutCreateInfo::default().set_layouts(&set_layouts),
                None,
            ) {
                Ok(l) => l,
                Err(e) => {
                    device.destroy_descriptor_set_layout(set_layout, None);
                    return Err(vk_err("vkCreatePipelineLayout", e));
                }
            };
            let cache =
                match device.create_pipeline_cache(&vk::PipelineCacheCreateInfo::default(), None) {
                    Ok(c) => c,
                    Err(e) => {
                        device.destroy_pipeline_layout(layout, None);
                        device.destroy_descriptor_set_layout(set_layout, None);
                        return Err(vk_err("vkCreatePipelineCache", e));
                    }
                };
            Ok(Pipelines {
                fast,
                set_layout,
                layout,
                cache,
                made: Mutex::new(HashMap::new()),
            })
        }
    }

    /// True when the `fast` variants are in use.
    pub fn fast(&self) -> bool {
        self.fast
    }

    /// The pipeline of shader `name`, created on first use.
    pub fn get(&self, device: &ash::Device, name: &'static str) -> Result<vk::Pipeline> {
        let mut made = self.made.lock();
        if let Some(&p) = made.get(name) {
            return Ok(p);
        }
        let (_, fast, base) =
            SHADERS
                .iter()
                .find(|(n, _, _)| *n == name)
                .ok_or_else(|| Error::Backend {
                    backend: "vulkan".into(),
                    msg: format!("no shader named {name}"),
                })?;
        let bytes = if self.fast { fast } else { base };
        let code =
            ash::util::read_spv(&mut std::io::Cursor::new(bytes)).map_err(|e| Error::Backend {
                backend: "vulkan".into(),
                msg: format!("shader {name}: bad SPIR-V: {e}"),
            })?;
        // SAFETY: the module is created from valid SPIR-V words and destroyed once the pipeline
        // exists (or failed).
        unsafe {
            let module = device
                .create_shader_module(&vk::ShaderModuleCreateInfo::default().code(&code), None)
                .map_err(|e| vk_err(&format!("shader {name}: vkCreateShaderModule"), e))?;
            let stage = vk::PipelineShaderStageCreateInfo::default()
                .stage(vk::ShaderStageFlags::COMPUTE)
                .module(module)
                .name(c"main");
            let info = [vk::ComputePipelineCreateInfo::default()
                .stage(stage)
                .layout(self.layout)];
            let made_pipeline = device.create_compute_pipelines(self.cache, &info, None);
            device.destroy_shader_module(module, None);
            let pipeline = made_pipeline
                .map_err(|(_, e)| vk_err(&format!("shader {name}: vkCreateComputePipelines"), e))?
                [0];
            made.insert(name, pipeline);
            Ok(pipeline)
        }
    }

    /// Destroys every pipeline and layout (the device is idle).
    pub fn destroy(&self, device: &ash::Device) {
        // SAFETY: called from the device's drop, with no work pending.
        unsafe {
            for (_, p) in self.made.lock().drain() {
                device.destroy_pipeline(p, None);
            }
            device.destroy_pipeline_cache(self.cache, None);
            device.destroy_pipeline_layout(self.layout, None);
            device.destroy_descriptor_set_layout(self.set_layout, None);
        }
    }
}
