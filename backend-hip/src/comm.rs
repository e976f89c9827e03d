//! [`RcclCommunicator`]: AllReduce (sum) over one stream per device with RCCL, NCCL's API on HIP.
//! The RCCL communicators are created for the device set with `ncclCommInitAll` and destroyed with
//! the communicator. One call drives every device from the calling thread inside a group; the
//! participants' streams are synchronized first, and the reduction runs on the communicator's own
//! streams, which are synchronized before the call returns (not stream-ordered).

use crate::device::HipDevice;
use crate::ffi::rccl::{self, Comm, RcclApi};
use crate::memory::HipBuffer;
use crate::stream::HipStream;
use crate::{check, err};
use ggml_core::backend::check_range;
use ggml_core::{Backend, Communicator, DType, DataRef, Error, Result};
use parking_lot::Mutex;
use std::sync::Arc;

struct Comms {
    rccl: &'static RcclApi,
    raw: Vec<Comm>,
}

// SAFETY: the raw communicators are only used under the communicator's mutex.
unsafe impl Send for Comms {}

impl Drop for Comms {
    fn drop(&mut self) {
        for &c in &self.raw {
            // SAFETY: created by ncclCommInitAll, destroyed once.
            let _ = unsafe { (self.rccl.ncclCommDestroy)(c) };
        }
    }
}

/// An RCCL communicator over distinct HIP devices (the RCCL communicators drop before the streams
/// they were used on).
pub struct RcclCommunicator {
    comms: Mutex<Comms>,
    streams: Vec<HipStream>,
    devices: Vec<Arc<HipDevice>>,
    backends: Vec<Arc<dyn Backend>>,
}

impl RcclCommunicator {
    /// A communicator over `devices` (distinct, at least one), whose participants' streams are
    /// `backends`, with RCCL from `rccl`.
    pub fn new(
        rccl: &'static RcclApi,
        devices: Vec<Arc<HipDevice>>,
        backends: Vec<Arc<dyn Backend>>,
    ) -> Result<Self> {
        let list: Vec<i32> = devices.iter().map(|d| d.ctx().id()).collect();
        let streams = devices
            .iter()
            .map(|d| HipStream::new(*d.ctx()))
            .collect::<Result<Vec<_>>>()?;
        let mut raw: Vec<Comm> = vec![std::ptr::null_mut(); list.len()];
        // SAFETY: `raw` has room for one communicator per entry of `list` (distinct ordinals).
        let code =
            unsafe { (rccl.ncclCommInitAll)(raw.as_mut_ptr(), list.len() as i32, list.as_ptr()) };
        check(rccl.check(&format!("ncclCommInitAll over {list:?}"), code))?;
        Ok(RcclCommunicator {
            comms: Mutex::new(Comms { rccl, raw }),
            streams,
            devices,
            backends,
        })
    }
}

/// RCCL's type for `dtype`.
fn rccl_type(dtype: DType) -> Result<rccl::DataType> {
    match dtype {
        DType::F32 => Ok(rccl::FLOAT32),
        DType::F16 => Ok(rccl::FLOAT16),
        DType::BF16 => Ok(rccl::BFLOAT16),
        _ => Err(Error::UnsupportedType {
            dtype,
            what: "rccl all_reduce".into(),
        }),
    }
}

impl Communicator for RcclCommunicator {
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
        let ty = rccl_type(dtype)?;
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
                .downcast_ref::<HipBuffer>()
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
        let rccl = comms.rccl;
        // SAFETY: group calls take no arguments.
        check(rccl.check("ncclGroupStart", unsafe { (rccl.ncclGroupStart)() }))?;
        let mut failed = None;
        for (i, &p) in ptrs.iter().enumerate() {
            let r = self.devices[i].ctx().bind().and_then(|_| {
                // SAFETY: `p` addresses `count` elements on device i (checked above); in place.
                let code = unsafe {
                    (rccl.ncclAllReduce)(
                        p as *const _,
                        p as *mut _,
                        count,
                        ty,
                        rccl::SUM,
                        comms.raw[i],
                        self.streams[i].raw(),
                    )
                };
                check(rccl.check("ncclAllReduce", code))
            });
            if let Err(e) = r {
                failed = Some(e);
                break;
            }
        }
        // SAFETY: closes the group opened above.
        let ended = rccl.check("ncclGroupEnd", unsafe { (rccl.ncclGroupEnd)() });
        if let Some(e) = failed {
            return Err(e);
        }
        check(ended)?;
        for (s, d) in self.streams.iter().zip(&self.devices) {
            d.ctx().bind()?;
            s.synchronize()?;
        }
        Ok(())
    }
}
