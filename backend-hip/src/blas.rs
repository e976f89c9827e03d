//! mul_mat through hipBLAS: operands that are not contiguous F32 are converted (dequantized) into
//! scratch with `k_cpy`, then one SGEMM per planned batch ([`plan::gemm_batches`]). [`BlasHandle`]
//! is a hipBLAS handle bound to one stream.

use crate::check;
use crate::device::DeviceCtx;
use crate::ffi::hipblas::{self, Handle};
use crate::kernels::plan;
use crate::kernels::table::TDesc;
use crate::stream::{HipBackend, HipStream};
use ggml_core::{DType, Layout, Result};

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

/// `src` as contiguous F32: itself when it already is, else a converted copy in scratch `slot`.
fn as_f32(be: &HipBackend, src: TDesc, l: &Layout, slot: usize) -> Result<u64> {
    if l.dtype == DType::F32 && l.is_contiguous() {
        return Ok(src.ptr);
    }
    let ptr = be.scratch(slot, l.nelements() * 4)?;
    be.launch(&plan::to_f32(src, l.ne, ptr)?)?;
    Ok(ptr)
}

/// `dst[m, n] = dot(a row m, b row n)` per batch, a [K, M, A2, A3], b [K, N, B2, B3].
pub fn mul_mat(
    be: &HipBackend,
    a: TDesc,
    la: &Layout,
    b: TDesc,
    lb: &Layout,
    d: TDesc,
) -> Result<()> {
    let batches = plan::gemm_batches(la, lb)?;
    let [k, m, ..] = la.ne;
    let ap = as_f32(be, a, la, 0)?;
    let bp = as_f32(be, b, lb, 1)?;
    let handle = be.blas();
    let blas = &handle.ctx.runtime().blas;
    let (alpha, beta) = (1.0f32, 0.0f32);
    for g in batches {
        // K = 0 (a device holding no slice of a split axis) is legal: BLAS then writes beta * C = 0,
        // but the leading dimensions must still be at least 1.
        // SAFETY: the operands are contiguous F32 of the sizes the batches address (checked by the
        // caller's descriptors or allocated above); the handle is bound to this backend's stream.
        let code = unsafe {
            (blas.hipblasSgemm)(
                handle.raw,
                hipblas::OP_T,
                hipblas::OP_N,
                m as i32,
                g.cols as i32,
                k as i32,
                &alpha,
                (ap + 4 * g.a_offset as u64) as *const f32,
                k.max(1) as i32,
                (bp + 4 * g.b_offset as u64) as *const f32,
                k.max(1) as i32,
                &beta,
                (d.ptr + 4 * g.d_offset as u64) as *mut f32,
                m as i32,
            )
        };
        check(blas.check("hipblasSgemm", code))?;
    }
    Ok(())
}
