//! [`NcclCommunicator`]: AllReduce (sum) over one stream per device with NCCL. The NCCL
//! communicators are created for the device set with `ncclCommInitAll` and destroyed with the
//! communicator. One call drives every device from the calling thread inside a group; the
//! participants' streams are synchronized first, and the reduction runs on the communicator's own
//! streams, which are synchronized before the call returns.

use crate::device::CudaDevice;
use crate::memory::CudaBuffer;
use crate::{cu, err};
use cudarc::driver::CudaStream;
use cudarc::nccl::{result as nccl, sys as nccl_sys};
use ggml_core::backend::check_range;
use ggml_core::{Backend, Communicator, DType, DataRef, Error, Result};
use parking_lot::Mutex;
use std::sync::Arc;

struct Comms(Vec<nccl_sys::ncclComm_t>);

// SAFETY: the raw communicators are only used under the communicator's mutex.
unsafe impl Send for Comms {}

impl Drop for Comms {
    fn drop(&mut self) {
        for &c in &self.0 {
            // SAFETY: created by ncclCommInitAll, destroyed once.
            let _ = unsafe { nccl::comm_destroy(c) };
        }
    }
}

/// An NCCL communicator over distinct CUDA devices.
pub struct NcclCommunicator {
    devices: Vec<Arc<CudaDevice>>,
    backends: Vec<Arc<dyn Backend>>,
    streams: Vec<Arc<CudaStream>>,
    comms: Mutex<Comms>,
}

impl NcclCommunicator {
    /// A communicator over `devices` (distinct), whose participants' streams are `backends`.
    pub fn new(devices: Vec<Arc<CudaDevice>>, backends: Vec<Arc<dyn Backend>>) -> Result<Self> {
        let n = devices.len();
        let list: Vec<i32> = devices.iter().map(|d| d.ordinal() as i32).collect();
        let streams = devices
            .iter()
            .map(|d| cu("create stream", d.context().new_stream()))
            .collect::<Result<Vec<_>>>()?;
        let mut raw: Vec<nccl_sys::ncclComm_t> = vec![std::ptr::null_mut(); n];
        // SAFETY: `raw` has room for `n` communicators; `list` holds `n` distinct device ordinals.
        unsafe { nccl::comm_init_all(raw.as_mut_ptr(), n as i32, list.as_ptr()) }
            .map_err(|e| err(format!("ncclCommInitAll over {list:?}: {e:?}")))?;
        Ok(NcclCommunicator {
            devices,
            backends,
            streams,
            comms: Mutex::new(Comms(raw)),
        })
    }
}

fn nccl_type(dtype: DType) -> Result<nccl_sys::ncclDataType_t> {
    match dtype {
        DType::F32 => Ok(nccl_sys::ncclDataType_t::ncclFloat32),
        DType::F16 => Ok(nccl_sys::ncclDataType_t::ncclFloat16),
        DType::BF16 => Ok(nccl_sys::ncclDataType_t::ncclBfloat16),
        _ => Err(Error::UnsupportedType {
            dtype,
            what: "nccl all_reduce".into(),
        }),
    }
}

impl Communicator for NcclCommunicator {
    fn size(&self) -> usize {
        self.devices.len()
    }
    fn all_reduce(&self, data: &[DataRef], dtype: DType, count: usize) -> Result<()> {
        if data.len() != self.size() {
            return Err(err(format!(
                "all_reduce over {} buffers, communicator of {}",
                data.len(),
                self.size()
            )));
        }
        let ty = nccl_type(dtype)?;
        if count == 0 {
            return Ok(());
        }
        let len = count * dtype.type_size();
        let mut ptrs = Vec::with_capacity(data.len());
        for (d, dev) in data.iter().zip(&self.devices) {
            check_range(d.offset, len, d.buffer.size())?;
            let b = d
                .buffer
                .as_any()
                .downcast_ref::<CudaBuffer>()
                .filter(|b| b.ordinal() == dev.ordinal())
                .ok_or_else(|| {
                    err(format!(
                        "all_reduce: {} is not memory of {}",
                        d.buffer.name(),
                        ggml_core::Device::name(dev.as_ref())
                    ))
                })?;
            ptrs.push(b.device_ptr() + d.offset as u64);
        }
        for b in &self.backends {
            b.synchronize()?;
        }
        let comms = self.comms.lock();
        cu("ncclGroupStart", nccl::group_start())?;
        let mut failed = None;
        for (i, &p) in ptrs.iter().enumerate() {
            let bound = self.devices[i].context().bind_to_thread();
            // SAFETY: `p` addresses `count` elements on device i (checked above); in place.
            let r = bound.map_err(|e| format!("{e:?}")).and_then(|_| {
                unsafe {
                    nccl::all_reduce(
                        p as *const _,
                        p as *mut _,
                        count,
                        ty,
                        nccl_sys::ncclRedOp_t::ncclSum,
                        comms.0[i],
                        self.streams[i].cu_stream() as _,
                    )
                }
                .map(|_| ())
                .map_err(|e| format!("{e:?}"))
            });
            if let Err(e) = r {
                failed = Some(e);
                break;
            }
        }
        let ended = nccl::group_end();
        if let Some(e) = failed {
            return Err(err(format!("ncclAllReduce: {e}")));
        }
        cu("ncclGroupEnd", ended)?;
        for s in &self.streams {
            cu("nccl stream synchronize", s.synchronize())?;
        }
        Ok(())
    }
}
