//! The BLAS calls of the shared dispatch on the host: `d = a^T b` ([`GemmCall`], F32, F16 or BF16
//! operands) and the strided batched product ([`BatchedGemmCall`], F16 or F32 operands), both
//! column-major with F32 results and accumulation, as cuBLAS computes them.

use backend_cuda::dispatch::{BatchedGemmCall, GemmCall};
use ggml_core::DType;
use half::{bf16, f16};

/// Element `i` of a column-major operand of type `dtype` at host address `base`.
///
/// # Safety
/// `base` must point at a live host array of `dtype` holding element `i`.
unsafe fn element(base: u64, dtype: DType, i: usize) -> f32 {
    match dtype {
        DType::F16 => (*(base as *const f16).add(i)).to_f32(),
        DType::BF16 => (*(base as *const bf16).add(i)).to_f32(),
        _ => *(base as *const f32).add(i),
    }
}

/// Computes one [`GemmCall`].
///
/// # Safety
/// The operands must lie in live host memory with the call's shapes and leading dimensions.
pub unsafe fn gemm(c: &GemmCall) {
    let (m, n, k) = (c.m as usize, c.n as usize, c.k as usize);
    let (lda, ldb, ldd) = (c.lda as usize, c.ldb as usize, c.ldd as usize);
    let d = c.d as *mut f32;
    for col in 0..n {
        for row in 0..m {
            let mut acc = 0.0f32;
            for l in 0..k {
                acc +=
                    element(c.a, c.a_type, row * lda + l) * element(c.b, c.b_type, col * ldb + l);
            }
            *d.add(col * ldd + row) = acc;
        }
    }
}

/// Computes one [`BatchedGemmCall`]: `d[b] = op(a[b]) op(b[b])` for every batch `b`.
///
/// # Safety
/// As for [`gemm`], for every batch at its stride.
pub unsafe fn gemm_batched(c: &BatchedGemmCall) {
    let (m, n, k) = (c.m as usize, c.n as usize, c.k as usize);
    let (lda, ldb, ldd) = (c.lda as usize, c.ldb as usize, c.ldd as usize);
    let size = c.dtype.type_size() as u64;
    for batch in 0..c.batch as u64 {
        let a = c.a + batch * c.stride_a as u64 * size;
        let b = c.b + batch * c.stride_b as u64 * size;
        let d = (c.d as *mut f32).add(batch as usize * c.stride_d as usize);
        for j in 0..n {
            for i in 0..m {
                let mut acc = 0.0f32;
                for l in 0..k {
                    let ai = if c.trans_a { l + i * lda } else { i + l * lda };
                    let bi = if c.trans_b { j + l * ldb } else { l + j * ldb };
                    acc += element(a, c.dtype, ai) * element(b, c.dtype, bi);
                }
                *d.add(i + j * ldd) = acc;
            }
        }
    }
}
