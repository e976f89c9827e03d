//! mul_mat through cuBLAS: operands that are not contiguous F32 are converted (dequantized) into
//! scratch with `k_cpy`, then one SGEMM per result batch (a single SGEMM over every batch when the
//! weight has one). Correct first; a bandwidth-tuned quantized GEMV is later work.

use super::ops::launch;
use super::{grid_for, TDesc};
use crate::stream::CudaBackend;
use crate::{cu, err};
use cudarc::cublas::{result as blas, sys as blas_sys};
use ggml_core::{DType, Layout, Result};

/// `src` as contiguous F32: itself when it already is, else a converted copy in scratch `slot`.
fn as_f32(be: &CudaBackend, src: TDesc, l: &Layout, slot: usize) -> Result<u64> {
    if l.dtype == DType::F32 && l.is_contiguous() {
        return Ok(src.ptr);
    }
    let ptr = be.scratch(slot, l.nelements() * 4)?;
    let s = src;
    let d = TDesc::contiguous(ptr, DType::F32, l.ne)?;
    launch!(be, "k_cpy", grid_for(l.nelements()); s, d)?;
    Ok(ptr)
}

/// `dst[m, n] = dot(a row m, b row n)` per batch, a [K, M, A2, A3], b [K, N, B2, B3].
pub fn mul_mat(
    be: &CudaBackend,
    a: TDesc,
    la: &Layout,
    b: TDesc,
    lb: &Layout,
    d: TDesc,
) -> Result<()> {
    let [k, m, a2, a3] = la.ne;
    let [_, n, b2, b3] = lb.ne;
    if a2 == 0 || a3 == 0 || b2 % a2 != 0 || b3 % a3 != 0 {
        return Err(err(format!("mul_mat batches {:?} x {:?}", la.ne, lb.ne)));
    }
    let ap = as_f32(be, a, la, 0)?;
    let bp = as_f32(be, b, lb, 1)?;
    let (r2, r3) = (b2 / a2, b3 / a3);
    let handle = be.blas();
    let (alpha, beta) = (1.0f32, 0.0f32);
    // K = 0 (a device holding no slice of a split axis) is legal: BLAS then writes beta * C = 0, but
    // the leading dimensions must still be at least 1.
    let gemm = |a_off: usize, b_off: usize, d_off: usize, cols: usize| -> Result<()> {
        // SAFETY: the operands are contiguous F32 of the sizes given (checked by the caller's
        // descriptors or allocated above); the handle is bound to this backend's stream.
        cu("cublasSgemm", unsafe {
            blas::sgemm(
                handle.0,
                blas_sys::cublasOperation_t::CUBLAS_OP_T,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                m as i32,
                cols as i32,
                k as i32,
                &alpha,
                (ap + 4 * a_off as u64) as *const f32,
                k.max(1) as i32,
                (bp + 4 * b_off as u64) as *const f32,
                k.max(1) as i32,
                &beta,
                (d.ptr + 4 * d_off as u64) as *mut f32,
                m as i32,
            )
        })
    };
    if a2 * a3 == 1 {
        return gemm(0, 0, 0, n * b2 * b3);
    }
    for i3 in 0..b3 {
        for i2 in 0..b2 {
            let a_off = k * m * ((i2 / r2) + a2 * (i3 / r3));
            let b_off = k * n * (i2 + b2 * i3);
            let d_off = m * n * (i2 + b2 * i3);
            gemm(a_off, b_off, d_off, n)?;
        }
    }
    Ok(())
}
