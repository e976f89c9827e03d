//! Registration of the CUDA family with `ggml_core::registry`: [`CudaReg`] probes the libraries and
//! opens every device once (zero devices and a reason when CUDA is missing), offers a stream-ordered
//! communicator over the streams it opened when NCCL loads; a static `inventory` entry and the
//! `ggml_tp_plugin_cuda` entry point for the cdylib.

use crate::comm::NcclCommunicator;
use crate::device::CudaDevice;
use crate::probe::{guarded, nccl_present, probe};
use ggml_core::registry::{BackendReg, StaticBackend};
use ggml_core::{Backend, Communicator, Device, Result};
use std::sync::{Arc, OnceLock};

/// Every CUDA device, or why there is none: opened once per process, so that the registry, the
/// meta backend and direct users share the same devices (and the streams each device knows).
pub fn cuda_devices() -> std::result::Result<Vec<Arc<CudaDevice>>, String> {
    static DEVICES: OnceLock<std::result::Result<Vec<Arc<CudaDevice>>, String>> = OnceLock::new();
    DEVICES.get_or_init(open_devices).clone()
}

fn open_devices() -> std::result::Result<Vec<Arc<CudaDevice>>, String> {
    probe()?;
    guarded("CUDA device enumeration", || {
        let n = cudarc::driver::CudaContext::device_count()
            .map_err(|e| format!("cuInit / device count failed: {e:?}"))?;
        if n <= 0 {
            return Err("the CUDA driver reports no device".into());
        }
        (0..n as usize)
            .map(|i| CudaDevice::new(i).map_err(|e| e.to_string()))
            .collect()
    })
}

/// The CUDA backend family (over the devices of [`cuda_devices`]).
#[derive(Default)]
pub struct CudaReg;

impl CudaReg {
    pub fn new() -> Self {
        CudaReg
    }

    fn get(&self) -> std::result::Result<Vec<Arc<CudaDevice>>, String> {
        cuda_devices()
    }

    /// The opened device called `name`.
    pub fn device(&self, name: &str) -> Option<Arc<CudaDevice>> {
        self.get().ok()?.into_iter().find(|d| d.name() == name)
    }
}

impl BackendReg for CudaReg {
    fn name(&self) -> &str {
        "cuda"
    }
    fn devices(&self) -> Vec<Arc<dyn Device>> {
        match self.get() {
            Ok(d) => d.iter().map(|d| d.clone() as Arc<dyn Device>).collect(),
            Err(_) => Vec::new(),
        }
    }
    fn unavailable_reason(&self) -> Option<String> {
        self.get().err()
    }
    /// A communicator over one stream per distinct device, queued on those streams; `None` (generic
    /// fallback) when NCCL is missing, a device appears twice, or a stream is not this family's.
    fn new_communicator(
        &self,
        backends: &[Arc<dyn Backend>],
    ) -> Option<Result<Arc<dyn Communicator>>> {
        if !nccl_present() || backends.is_empty() {
            return None;
        }
        let mut streams: Vec<Arc<crate::CudaBackend>> = Vec::with_capacity(backends.len());
        for b in backends {
            let s = self.device(&b.device().name())?.backend_of(b)?;
            let ordinal = s.cuda_device().ordinal();
            if streams.iter().any(|x| x.cuda_device().ordinal() == ordinal) {
                return None;
            }
            streams.push(s);
        }
        Some(NcclCommunicator::new(streams).map(|c| Arc::new(c) as Arc<dyn Communicator>))
    }
}

fn make_reg() -> Box<dyn BackendReg> {
    Box::new(CudaReg::new())
}

inventory::submit! {
    StaticBackend { name: "cuda", create: make_reg }
}

ggml_core::export_plugin!(ggml_tp_plugin_cuda, make_reg);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_reports_devices_or_a_reason() {
        let reg = CudaReg::new();
        let devs = reg.devices();
        if devs.is_empty() {
            let reason = reg.unavailable_reason().expect("a reason when no device");
            println!("skipped: no CUDA device ({reason})");
        } else {
            assert!(reg.unavailable_reason().is_none());
            for d in &devs {
                assert_eq!(d.family(), "cuda");
                assert!(d.memory().total > 0, "{}", d.name());
            }
        }
        assert!(ggml_core::registry::backend("cuda").is_some());
    }
}
