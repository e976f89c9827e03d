//! Registration of the CPU family with `ggml_core::registry`: a static `inventory` entry for builds
//! that link this crate, the `ggml_tp_plugin_cpu` entry point for the cdylib plugin, and
//! [`CpuCommunicator`], the AllReduce over host memory used between virtual CPU devices.

use crate::device::{default_devices, CpuDevice};
use ggml_core::registry::{BackendReg, StaticBackend};
use ggml_core::{Backend, Communicator, DType, DataRef, Device, Error, Result};
use rayon::prelude::*;
use std::sync::{Arc, OnceLock};

/// The CPU backend family. Devices come from the environment (see [`default_devices`]) and are
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
        if backends.iter().any(|b| b.device().family() != "cpu") {
            return Some(Err(Error::Backend {
                backend: "cpu".into(),
                msg: "communicator over non-CPU streams".into(),
            }));
        }
        Some(Ok(Arc::new(CpuCommunicator {
            size: backends.len(),
        })))
    }
}

fn make_reg() -> Box<dyn BackendReg> {
    Box::new(CpuReg::new())
}

inventory::submit! {
    StaticBackend { name: "cpu", create: make_reg }
}

ggml_core::export_plugin!(ggml_tp_plugin_cpu, make_reg);

/// AllReduce (sum) over host buffers of the participating CPU streams, in place, with no staging
/// copies. Sums are taken in f32 in participant order, so every participant ends with identical
/// bytes. Stream-ordered: a CPU stream's work is complete when `compute` returns, so once every
/// participant's `compute` has returned the sum can start, and it is complete when it returns.
pub struct CpuCommunicator {
    size: usize,
}

impl CpuCommunicator {
    pub fn new(size: usize) -> Self {
        CpuCommunicator { size }
    }
}

impl Communicator for CpuCommunicator {
    fn size(&self) -> usize {
        self.size
    }
    fn is_stream_ordered(&self) -> bool {
        true
    }
    fn all_reduce(&self, data: &[DataRef], dtype: DType, count: usize) -> Result<()> {
        let err = |msg: String| Error::Backend {
            backend: "cpu".into(),
            msg,
        };
        if data.len() != self.size {
            return Err(err(format!(
                "all_reduce over {} buffers, communicator of {}",
                data.len(),
                self.size
            )));
        }
        if !dtype.is_float() {
            return Err(Error::UnsupportedType {
                dtype,
                what: "cpu all_reduce".into(),
            });
        }
        let len = count * dtype.type_size();
        let mut ptrs = Vec::with_capacity(data.len());
        for d in data {
            ggml_core::backend::check_range(d.offset, len, d.buffer.size())?;
            ptrs.push(
                d.host_ptr()
                    .ok_or_else(|| err(format!("{} is not host memory", d.buffer.name())))?
                    as usize,
            );
        }
        const CHUNK: usize = 4096;
        let load = |p: usize, i: usize| -> f32 {
            // SAFETY: `i < count`, inside the range checked above.
            unsafe {
                match dtype {
                    DType::F32 => (p as *const f32).add(i).read_unaligned(),
                    DType::F16 => {
                        half::f16::from_bits((p as *const u16).add(i).read_unaligned()).to_f32()
                    }
                    _ => half::bf16::from_bits((p as *const u16).add(i).read_unaligned()).to_f32(),
                }
            }
        };
        let store = |p: usize, i: usize, v: f32| {
            // SAFETY: as for `load`; each chunk of elements is written by one task only.
            unsafe {
                match dtype {
                    DType::F32 => (p as *mut f32).add(i).write_unaligned(v),
                    DType::F16 => (p as *mut u16)
                        .add(i)
                        .write_unaligned(half::f16::from_f32(v).to_bits()),
                    _ => (p as *mut u16)
                        .add(i)
                        .write_unaligned(half::bf16::from_f32(v).to_bits()),
                }
            }
        };
        (0..count.div_ceil(CHUNK)).into_par_iter().for_each(|c| {
            for i in c * CHUNK..((c + 1) * CHUNK).min(count) {
                let s = ptrs.iter().fold(0f32, |acc, &p| acc + load(p, i));
                ptrs.iter().for_each(|&p| store(p, i, s));
            }
        });
        Ok(())
    }
}
