//! `ggml_gpu::dispatch`'s [`Runner`] on a HIP stream: launches through the hiprtc-compiled
//! [`crate::kernels::Kernels`], GEMMs as hipBLAS SGEMM (F32 operands, [`GemmTypes::F32`]),
//! descriptors of tensors in this device's buffers.

use crate::err;
use crate::memory::HipBuffer;
use crate::stream::HipBackend;
use ggml_core::backend::check_range;
use ggml_core::{Buffer as _, Device, Graph, Result, TensorId};
use ggml_gpu::dispatch::{GemmCall, GemmTypes, Launch, Runner, TDesc};

impl Runner for HipBackend {
    fn device_name(&self) -> String {
        self.hip_device().name()
    }

    fn family(&self) -> &'static str {
        "hip"
    }

    fn desc(&self, graph: &Graph, id: TensorId) -> Result<TDesc> {
        let t = graph.tensor(id);
        let data = graph.data(id)?;
        let device = self.hip_device();
        let buf = data
            .buffer
            .as_any()
            .downcast_ref::<HipBuffer>()
            .filter(|b| b.ordinal() == device.ordinal())
            .ok_or_else(|| {
                err(format!(
                    "tensor {} lives in {}, not in memory of {}",
                    t.name,
                    data.buffer.name(),
                    device.name()
                ))
            })?;
        check_range(data.offset, t.nbytes(), buf.size())?;
        TDesc::new(buf.device_ptr() + data.offset as u64, &t.layout)
    }

    fn scratch(&self, slot: usize, bytes: usize) -> Result<u64> {
        HipBackend::scratch(self, slot, bytes)
    }

    fn launch(&self, launch: &Launch) -> Result<()> {
        self.kernels().launch(self.stream(), launch)
    }

    fn gemm_types(&self) -> GemmTypes {
        GemmTypes::F32
    }

    fn gemm(&self, call: &GemmCall) -> Result<()> {
        self.blas().sgemm(call)
    }
}
