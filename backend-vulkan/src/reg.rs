//! Registration of the Vulkan family with `ggml_core::registry`: a static `inventory` entry for builds
//! that link this crate and the `ggml_tp_plugin_vulkan` entry point for the cdylib plugin. Devices are
//! opened once, on first use; without a loader or a usable device the family reports no devices and
//! the reason. There is no native communicator: the meta backend's generic AllReduce is used.

use crate::device::VulkanDevice;
use crate::instance::open_devices;
use ggml_core::registry::{BackendReg, StaticBackend};
use ggml_core::Device;
use std::sync::{Arc, OnceLock};

/// The Vulkan backend family.
#[derive(Default)]
pub struct VulkanReg {
    devices: OnceLock<Result<Vec<Arc<VulkanDevice>>, String>>,
}

impl VulkanReg {
    pub fn new() -> Self {
        VulkanReg::default()
    }

    fn get(&self) -> &Result<Vec<Arc<VulkanDevice>>, String> {
        self.devices
            .get_or_init(|| open_devices(crate::settings::settings().copies))
    }
}

impl BackendReg for VulkanReg {
    fn name(&self) -> &str {
        "vulkan"
    }
    fn devices(&self) -> Vec<Arc<dyn Device>> {
        match self.get() {
            Ok(d) => d.iter().map(|d| d.clone() as Arc<dyn Device>).collect(),
            Err(_) => Vec::new(),
        }
    }
    fn unavailable_reason(&self) -> Option<String> {
        self.get().as_ref().err().cloned()
    }
}

fn make_reg() -> Box<dyn BackendReg> {
    Box::new(VulkanReg::new())
}

inventory::submit! {
    StaticBackend { name: "vulkan", create: make_reg }
}

ggml_core::export_plugin!(ggml_tp_plugin_vulkan, make_reg);
