//! Registration of the CUDA family with `ggml_core::registry`: [`CudaReg`] probes the libraries and
//! opens every device once (zero devices and a reason when CUDA is missing; each GPU as
//! `GGML_TP_CUDA_LOGICAL` logical devices, see [`cuda_devices_with`]), offers a stream-ordered
//! communicator over the streams it opened: NCCL over distinct GPUs when it loads, the same-GPU
//! reduce over logical devices of one GPU; a static `inventory` entry and the `ggml_tp_plugin_cuda`
//! entry point for the cdylib.

use crate::comm::{NcclCommunicator, SameGpuCommunicator};
use crate::device::{CudaDevice, CudaGpu, Share};
use crate::probe::{guarded, nccl_present, probe};
use crate::settings::settings;
use crate::stream::CudaBackend;
use ggml_core::registry::{BackendReg, StaticBackend};
use ggml_core::{Backend, Communicator, Device, Result};
use parking_lot::Mutex;
use std::sync::{Arc, OnceLock};

type Devices = std::result::Result<Vec<Arc<CudaDevice>>, String>;

/// Every CUDA device as `GGML_TP_CUDA_LOGICAL` gives them (default: one per GPU), or why there is
/// none: opened once per process, so that the registry, the meta backend and direct users share
/// the same devices (and the streams each device knows).
pub fn cuda_devices() -> Devices {
    cuda_devices_with(settings().logical)
}

/// Every GPU presented as `logical` devices (at least 1), named `cuda:0`, `cuda:1`, ... in order of
/// GPU then share (GPU 0's first). Each device has its own streams and is held to `1 / logical` of
/// its card's memory; the devices of one GPU share its context and kernels. Opened once per process
/// and count: the set of [`cuda_devices`] is the one of the setting; other counts (tests) are
/// distinct devices of the same names over the same GPUs.
pub fn cuda_devices_with(logical: usize) -> Devices {
    let logical = logical.max(1);
    let mut sets = SETS.lock();
    if let Some((_, d)) = sets.iter().find(|(n, _)| *n == logical) {
        return d.clone();
    }
    let d = gpus().and_then(|g| split(&g, logical).map_err(|e| e.to_string()));
    sets.push((logical, d.clone()));
    d
}

/// The device sets opened so far, by logical devices per GPU.
static SETS: Mutex<Vec<(usize, Devices)>> = parking_lot::const_mutex(Vec::new());

/// Every device of every set opened so far.
fn opened_devices() -> Vec<Arc<CudaDevice>> {
    SETS.lock()
        .iter()
        .filter_map(|(_, d)| d.as_ref().ok())
        .flatten()
        .cloned()
        .collect()
}

/// Every GPU, opened once per process.
fn gpus() -> std::result::Result<Vec<Arc<CudaGpu>>, String> {
    static GPUS: OnceLock<std::result::Result<Vec<Arc<CudaGpu>>, String>> = OnceLock::new();
    GPUS.get_or_init(|| {
        probe()?;
        guarded("CUDA device enumeration", || {
            let n = cudarc::driver::CudaContext::device_count()
                .map_err(|e| format!("cuInit / device count failed: {e:?}"))?;
            if n <= 0 {
                return Err("the CUDA driver reports no device".into());
            }
            (0..n as usize)
                .map(|i| CudaGpu::open(i).map_err(|e| e.to_string()))
                .collect()
        })
    })
    .clone()
}

/// `logical` devices on each of `gpus`, numbered in order.
fn split(gpus: &[Arc<CudaGpu>], logical: usize) -> Result<Vec<Arc<CudaDevice>>> {
    let mut devices = Vec::with_capacity(gpus.len() * logical);
    for gpu in gpus {
        for index in 0..logical {
            let share = Share {
                index,
                count: logical,
            };
            devices.push(CudaDevice::new(gpu.clone(), devices.len(), share)?);
        }
    }
    Ok(devices)
}

/// The CUDA backend family (over the devices of [`cuda_devices`]).
#[derive(Default)]
pub struct CudaReg;

impl CudaReg {
    pub fn new() -> Self {
        CudaReg
    }

    fn get(&self) -> Devices {
        cuda_devices()
    }

    /// The opened device called `name`.
    pub fn device(&self, name: &str) -> Option<Arc<CudaDevice>> {
        self.get().ok()?.into_iter().find(|d| d.name() == name)
    }
}

/// The stream behind `backend`, if a device of any opened set opened it.
fn stream_of(backend: &Arc<dyn Backend>) -> Option<Arc<CudaBackend>> {
    opened_devices().iter().find_map(|d| d.backend_of(backend))
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
    /// A communicator over one stream per distinct device, queued on those streams: the same-GPU
    /// reduce when they are logical devices of one GPU, else NCCL over distinct GPUs. `None`
    /// (generic fallback) when a device appears twice, a stream is not this family's, GPUs are
    /// mixed with logical devices of one GPU, or the needed library or kernels are missing.
    fn new_communicator(
        &self,
        backends: &[Arc<dyn Backend>],
    ) -> Option<Result<Arc<dyn Communicator>>> {
        let streams: Vec<Arc<CudaBackend>> =
            backends.iter().map(stream_of).collect::<Option<_>>()?;
        let distinct = |key: fn(&CudaBackend) -> usize| {
            streams
                .iter()
                .enumerate()
                .all(|(i, a)| streams[..i].iter().all(|b| key(b) != key(a)))
        };
        if streams.is_empty() || !distinct(|s| Arc::as_ptr(s.cuda_device()) as usize) {
            return None;
        }
        let ordinal = streams[0].cuda_device().ordinal();
        if streams.len() > 1 && streams.iter().all(|s| s.cuda_device().ordinal() == ordinal) {
            return SameGpuCommunicator::usable(&streams).then(|| {
                SameGpuCommunicator::new(streams).map(|c| Arc::new(c) as Arc<dyn Communicator>)
            });
        }
        if !nccl_present() || !distinct(|s| s.cuda_device().ordinal()) {
            return None;
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

    #[test]
    fn logical_sets_share_the_gpus_or_the_reason() {
        assert_eq!(crate::settings::Settings::default().logical, 1);
        match (cuda_devices_with(1), cuda_devices_with(2)) {
            (Err(one), Err(two)) => {
                assert_eq!(one, two);
                println!("skipped: no CUDA device ({one})");
            }
            (Ok(one), Ok(two)) => {
                assert_eq!(two.len(), 2 * one.len());
                assert!(Arc::ptr_eq(two[1].gpu(), one[0].gpu()));
                assert!(Arc::ptr_eq(&cuda_devices_with(0).unwrap()[0], &one[0]));
            }
            (one, two) => panic!("1 per GPU: {:?}, 2 per GPU: {:?}", one.err(), two.err()),
        }
    }
}
