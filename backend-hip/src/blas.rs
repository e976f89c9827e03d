//! [`BlasHandle`]: a hipBLAS handle bound to one stream, running the dispatch's GEMM calls as
//! SGEMM (the dispatch converts other operand types to F32 in scratch first, see
//! `ggml_gpu::dispatch::GemmTypes::F32`).

use crate::device::DeviceCtx;
use crate::ffi::hipblas::{self, Handle};
use crate::stream::HipStream;
use crate::{check, err};
use ggml_core::{DType, Result};
use ggml_gpu::dispatch::GemmCall;

/// A hipBLAS handle bound to one stream.
pub struct BlasHandle {
    ctx: DeviceCtx,
    raw: Handle,
}

// SAFETY: the handle is only used under its backend's mutex.
unsafe impl Send for BlasHandle {}

impl BlasHandle {
    /// A handle on the device of `ctx` whose work goes to `stream`.
    pub fn new(ctx: DeviceCtx, stream: &HipStream) -> Result<Self> {
        let blas = &ctx.runtime().blas;
        ctx.bind()?;
        let mut raw: Handle = std::ptr::null_mut();
        // SAFETY: creates a handle on the current device, destroyed once in `drop`.
        check(blas.check("hipblasCreate", unsafe { (blas.hipblasCreate)(&mut raw) }))?;
        let handle = BlasHandle { ctx, raw };
        // SAFETY: both handles are live; the stream outlives the handle (same owner, dropped after).
        check(blas.check("hipblasSetStream", unsafe {
            (blas.hipblasSetStream)(raw, stream.raw())
        }))?;
        Ok(handle)
    }
}

impl Drop for BlasHandle {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: created in `new`, destroyed once.
            let _ = unsafe { (self.ctx.runtime().blas.hipblasDestroy)(self.raw) };
        }
    }
}

impl BlasHandle {
    /// Queues `call`, whose operands must be F32 (the dispatch converts them for
    /// [`GemmTypes::F32`]), as one SGEMM.
    pub fn sgemm(&self, call: &GemmCall) -> Result<()> {
        if call.a_type != DType::F32 || call.b_type != DType::F32 {
            return Err(err(format!(
                "hipBLAS SGEMM of {} x {} operands",
                call.a_type, call.b_type
            )));
        }
        let blas = &self.ctx.runtime().blas;
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the operands are F32 of the leading dimensions and sizes given (from checked
        // descriptors or scratch allocated by the dispatch); the handle is bound to its backend's
        // stream.
        let code = unsafe {
            (blas.hipblasSgemm)(
                self.raw,
                hipblas::OP_T,
                hipblas::OP_N,
                call.m,
                call.n,
                call.k,
                &alpha,
                call.a as *const f32,
                call.lda,
                call.b as *const f32,
                call.ldb,
                &beta,
                call.d as *mut f32,
                call.ldd,
            )
        };
        check(blas.check("hipblasSgemm", code))
    }
}
