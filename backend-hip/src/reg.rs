//! Registration of the HIP family with `ggml_core::registry`: [`HipReg`] loads ROCm and opens every
//! device once (zero devices and a one-line reason when HIP is missing), offers an RCCL
//! communicator when `librccl.so` loads; a static `inventory` entry and the `ggml_tp_plugin_hip`
//! entry point for the cdylib.

use crate::comm::RcclCommunicator;
use crate::device::HipDevice;
use crate::probe::runtime;
use ggml_core::registry::{BackendReg, StaticBackend};
use ggml_core::{Backend, Communicator, Device, Result};
use std::sync::{Arc, OnceLock};

/// Every HIP device, or why there is none.
pub fn hip_devices() -> std::result::Result<Vec<Arc<HipDevice>>, String> {
    let rt = runtime()?;
    let mut n = 0;
    // SAFETY: writes one int.
    rt.hip.check("hipGetDeviceCount", unsafe {
        (rt.hip.hipGetDeviceCount)(&mut n)
    })?;
    if n <= 0 {
        return Err("the HIP runtime reports no device".into());
    }
    (0..n as usize)
        .map(|i| HipDevice::new(rt, i).map_err(|e| e.to_string()))
        .collect()
}

/// The HIP backend family.
#[derive(Default)]
pub struct HipReg {
    devices: OnceLock<std::result::Result<Vec<Arc<HipDevice>>, String>>,
}

impl HipReg {
    pub fn new() -> Self {
        HipReg::default()
    }

    fn get(&self) -> &std::result::Result<Vec<Arc<HipDevice>>, String> {
        self.devices.get_or_init(hip_devices)
    }

    /// The opened device called `name`.
    pub fn device(&self, name: &str) -> Option<Arc<HipDevice>> {
        let devs = self.get().as_ref().ok()?;
        devs.iter().find(|d| d.name() == name).cloned()
    }
}

impl BackendReg for HipReg {
    fn name(&self) -> &str {
        "hip"
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
    /// An RCCL communicator over one stream per distinct device; `None` (generic fallback) when RCCL
    /// is missing or a device appears twice.
    fn new_communicator(
        &self,
        backends: &[Arc<dyn Backend>],
    ) -> Option<Result<Arc<dyn Communicator>>> {
        let rccl = runtime().ok()?.rccl.as_ref()?;
        if backends.is_empty() {
            return None;
        }
        let mut devices: Vec<Arc<HipDevice>> = Vec::with_capacity(backends.len());
        for b in backends {
            let d = self.device(&b.device().name())?;
            if devices.iter().any(|x| x.ordinal() == d.ordinal()) {
                return None;
            }
            devices.push(d);
        }
        Some(
            RcclCommunicator::new(rccl, devices, backends.to_vec())
                .map(|c| Arc::new(c) as Arc<dyn Communicator>),
        )
    }
}

fn make_reg() -> Box<dyn BackendReg> {
    Box::new(HipReg::new())
}

inventory::submit! {
    StaticBackend { name: "hip", create: make_reg }
}

ggml_core::export_plugin!(ggml_tp_plugin_hip, make_reg);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_reports_devices_or_a_reason() {
        let reg = HipReg::new();
        let devs = reg.devices();
        if devs.is_empty() {
            let reason = reg.unavailable_reason().expect("a reason when no device");
            assert!(!reason.is_empty() && !reason.contains('\n'), "{reason:?}");
            assert!(reg.new_communicator(&[]).is_none());
            println!("skipped: no HIP device ({reason})");
        } else {
            assert!(reg.unavailable_reason().is_none());
            for d in &devs {
                assert_eq!(d.family(), "hip");
                assert!(d.name().starts_with("hip:"));
                assert!(d.memory().total > 0, "{}", d.name());
            }
        }
        let registered = ggml_core::registry::backend("hip").expect("hip family registered");
        assert_eq!(registered.devices().len(), devs.len());
    }
}
