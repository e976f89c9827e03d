//! Registration of the CPU family with `ggml_core::registry`: a static `inventory` entry for builds
//! that link this crate, the `ggml_tp_plugin_cpu` entry point for the cdylib plugin, and the
//! family's communicator ([`CpuCommunicator`]).

use crate::comm::CpuCommunicator;
use crate::device::{default_devices, CpuDevice};
use ggml_core::registry::{BackendReg, StaticBackend};
use ggml_core::{Backend, Communicator, Device, DeviceKind, Error, Result};
use std::sync::{Arc, OnceLock};

/// The CPU backend family. Devices come from the settings (see [`default_devices`]) and are
/// created once per registration.
#[derive(Default)]
pub struct CpuReg {
    devices: OnceLock<std::result::Result<Vec<Arc<CpuDevice>>, String>>,
}

impl CpuReg {
    pub fn new() -> Self {
        CpuReg::default()
    }

    fn get(&self) -> &std::result::Result<Vec<Arc<CpuDevice>>, String> {
        self.devices
            .get_or_init(|| default_devices().map_err(|e| e.to_string()))
    }
}

impl BackendReg for CpuReg {
    fn name(&self) -> &str {
        "cpu"
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
    fn new_communicator(
        &self,
        backends: &[Arc<dyn Backend>],
    ) -> Option<Result<Arc<dyn Communicator>>> {
        if backends
            .iter()
            .any(|b| b.device().kind() != DeviceKind::Cpu)
        {
            return Some(Err(Error::Backend {
                backend: "cpu".into(),
                msg: "communicator over non-CPU streams".into(),
            }));
        }
        Some(Ok(Arc::new(CpuCommunicator::new(backends.len()))))
    }
}

fn make_reg() -> Box<dyn BackendReg> {
    Box::new(CpuReg::new())
}

inventory::submit! {
    StaticBackend { name: "cpu", create: make_reg }
}

ggml_core::export_plugin!(ggml_tp_plugin_cpu, make_reg);
