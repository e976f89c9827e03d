//! Matrix products with many columns (prompt processing) through cuBLAS GemmEx with F32
//! accumulation: F16 and BF16 weights are read in place with activations rounded to the same type
//! (tensor cores); quantized weights are dequantized to F16 in scratch (`k_dequant_f16_*`) first;
//! F32 weights keep F32 activations (plain SGEMM arithmetic, no TF32).

use super::gemv::rows_readable;
use super::ops::launch;
use super::{grid_for, type_name, TDesc};
use crate::stream::CudaBackend;
use crate::{cu, err};
use cudarc::cublas::{result as blas, sys as blas_sys};
use ggml_core::{DType, Layout, Result};

/// Scratch slots of converted weights and activations (shared with the GEMV path's).
const SLOT_WEIGHTS: usize = 0;
const SLOT_ACTIVATIONS: usize = 1;

pub fn dequant_kernel(type_name: &str) -> String {
    format!("k_dequant_f16_{type_name}")
}

/// One GEMM operand in device memory: element type, leading dimension (elements between rows)
/// and byte strides of the batch axes 2 and 3.
#[derive(Clone, Copy, Debug)]
pub struct Operand {
    pub ptr: u64,
    pub dtype: DType,
    pub ld: usize,
    pub batch_nb: [usize; 2],
}

impl Operand {
    fn contiguous(ptr: u64, dtype: DType, ne: [usize; 4]) -> Operand {
        let l = Layout::contiguous(dtype, ne);
        Operand {
            ptr,
            dtype,
            ld: ne[0],
            batch_nb: [l.nb[2], l.nb[3]],
        }
    }
}

fn cuda_type(t: DType) -> blas_sys::cudaDataType {
    match t {
        DType::F16 => blas_sys::cudaDataType::CUDA_R_16F,
        DType::BF16 => blas_sys::cudaDataType::CUDA_R_16BF,
        _ => blas_sys::cudaDataType::CUDA_R_32F,
    }
}

/// A contiguous copy of `src` as `dtype` in scratch `slot`.
fn converted(
    be: &CudaBackend,
    src: TDesc,
    l: &Layout,
    dtype: DType,
    slot: usize,
) -> Result<Operand> {
    let ptr = be.scratch(slot, l.nelements() * dtype.type_size())?;
    let d = TDesc::contiguous(ptr, dtype, l.ne)?;
    launch!(be, "k_cpy", grid_for(l.nelements()); src, d)?;
    Ok(Operand::contiguous(ptr, dtype, l.ne))
}

/// The weights as a GEMM operand: float rows in place, quantized ones dequantized to F16, other
/// layouts copied to F32.
pub fn weights(be: &CudaBackend, a: TDesc, la: &Layout) -> Result<Operand> {
    let t = la.dtype;
    if t.is_float() {
        let es = t.type_size();
        let rows_fit = (la.ne[0] <= 1 || la.nb[0] == es)
            && la.nb[1..].iter().all(|&nb| nb % es == 0)
            && la.nb[1] / es >= la.ne[0];
        if rows_fit {
            return Ok(Operand {
                ptr: a.ptr,
                dtype: t,
                ld: la.nb[1] / es,
                batch_nb: [la.nb[2], la.nb[3]],
            });
        }
        return converted(be, a, la, DType::F32, SLOT_WEIGHTS);
    }
    match type_name(t) {
        Some(tn) if rows_readable(&a, la) => {
            let n = la.nelements();
            let ptr = be.scratch(SLOT_WEIGHTS, n * 2)?;
            let name = dequant_kernel(tn);
            launch!(be, &name, grid_for(n / 32); a, ptr)?;
            Ok(Operand::contiguous(ptr, DType::F16, la.ne))
        }
        _ => converted(be, a, la, DType::F32, SLOT_WEIGHTS),
    }
}

/// The activations as a GEMM operand of type `dtype` (the weights' operand type).
pub fn activations(be: &CudaBackend, b: TDesc, lb: &Layout, dtype: DType) -> Result<Operand> {
    if lb.dtype == dtype && lb.is_contiguous() {
        return Ok(Operand::contiguous(b.ptr, dtype, lb.ne));
    }
    converted(be, b, lb, dtype, SLOT_ACTIVATIONS)
}

fn dim(v: usize) -> Result<i32> {
    i32::try_from(v.max(1)).map_err(|_| err(format!("GEMM dimension {v} exceeds i32")))
}

/// `d[m, n] = dot(a row m, b column n)` per batch with F32 accumulation; `a` of shape
/// `[K, M, A2, A3]` broadcast over `b`'s `[K, N, B2, B3]`, `d` contiguous F32.
pub fn gemm(
    be: &CudaBackend,
    a: &Operand,
    a_ne: [usize; 4],
    b: &Operand,
    b_ne: [usize; 4],
    d: u64,
) -> Result<()> {
    let [k, m, a2, a3] = a_ne;
    let [_, n, b2, b3] = b_ne;
    let (r2, r3) = (b2 / a2, b3 / a3);
    let handle = be.blas();
    let (alpha, beta) = (1.0f32, 0.0f32);
    let (lda, ldb, ldc) = (dim(a.ld)?, dim(b.ld)?, dim(m)?);
    // K = 0 (a device holding no slice of a split axis) is legal: BLAS then writes beta * C = 0.
    let call = |a_ptr: u64, b_ptr: u64, d_ptr: u64, cols: usize| -> Result<()> {
        // SAFETY: the operands lie in live device memory with the leading dimensions and sizes
        // given (from checked descriptors or scratch allocated above); the handle is bound to this
        // backend's stream.
        cu("cublasGemmEx", unsafe {
            blas::gemm_ex(
                handle.0,
                blas_sys::cublasOperation_t::CUBLAS_OP_T,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                dim(m)?,
                dim(cols)?,
                k as i32,
                (&alpha as *const f32).cast(),
                a_ptr as *const _,
                cuda_type(a.dtype),
                lda,
                b_ptr as *const _,
                cuda_type(b.dtype),
                ldb,
                (&beta as *const f32).cast(),
                d_ptr as *mut _,
                blas_sys::cudaDataType::CUDA_R_32F,
                ldc,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        })
    };
    if a2 * a3 == 1 {
        return call(a.ptr, b.ptr, d, n * b2 * b3);
    }
    for i3 in 0..b3 {
        for i2 in 0..b2 {
            let a_ptr = a.ptr + ((i2 / r2) * a.batch_nb[0] + (i3 / r3) * a.batch_nb[1]) as u64;
            let b_ptr = b.ptr + (i2 * b.batch_nb[0] + i3 * b.batch_nb[1]) as u64;
            let d_ptr = d + (4 * m * n * (i2 + b2 * i3)) as u64;
            call(a_ptr, b_ptr, d_ptr, n)?;
        }
    }
    Ok(())
}
