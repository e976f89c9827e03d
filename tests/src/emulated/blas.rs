//! The BLAS calls of the shared dispatch on the host: `d = a^T b` ([`GemmCall`], F32, F16 or BF16
//! operands) and the strided batched product ([`BatchedGemmCall`], F16 or F32 operands), both
//! column-major with F32 results and accumulation, as cuBLAS computes them. Operands are converted
//! to F32 vectors of the summed axis first, so that every result is one contiguous dot product;
//! columns of the result are spread over the host's cores.

use ggml_core::DType;
use ggml_gpu::dispatch::{BatchedGemmCall, GemmCall};
use half::{bf16, f16};

/// `count` vectors of `len` elements as F32, vector `v` element `l` at `element(v, l)` (an index
/// into the array of `dtype` at host address `base`).
///
/// # Safety
/// `base` must point at a live host array of `dtype` holding every element indexed.
unsafe fn vectors(
    base: u64,
    dtype: DType,
    count: usize,
    len: usize,
    element: impl Fn(usize, usize) -> usize,
) -> Vec<f32> {
    let mut out = Vec::with_capacity(count * len);
    for v in 0..count {
        for l in 0..len {
            let i = element(v, l);
            out.push(match dtype {
                DType::F16 => (*(base as *const f16).add(i)).to_f32(),
                DType::BF16 => (*(base as *const bf16).add(i)).to_f32(),
                _ => *(base as *const f32).add(i),
            });
        }
    }
    out
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `d[col * ldd + row] = rows[row] . cols[col]` for the `m` rows and `n` columns (vectors of `k`;
/// with `k` = 0 every result is 0, as a device's share of a product over a zero-size slice),
/// columns spread over the cores.
///
/// # Safety
/// `d` must be valid for writes at every index written.
unsafe fn products(
    rows: &[f32],
    cols: &[f32],
    (m, n, k): (usize, usize, usize),
    d: *mut f32,
    ldd: usize,
) {
    let threads = std::thread::available_parallelism()
        .map_or(1, |t| t.get())
        .min(n.max(1));
    let per = n.div_ceil(threads);
    let d = d as usize;
    std::thread::scope(|s| {
        for first in (0..n).step_by(per.max(1)) {
            s.spawn(move || {
                let d = d as *mut f32;
                for col in first..(first + per).min(n) {
                    let c = &cols[col * k..(col + 1) * k];
                    for row in 0..m {
                        let r = &rows[row * k..(row + 1) * k];
                        // SAFETY: each thread writes its own columns, all inside `d`.
                        unsafe { *d.add(col * ldd + row) = dot(r, c) };
                    }
                }
            });
        }
    });
}

/// Computes one [`GemmCall`].
///
/// # Safety
/// The operands must lie in live host memory with the call's shapes and leading dimensions.
pub unsafe fn gemm(c: &GemmCall) {
    let (m, n, k) = (c.m as usize, c.n as usize, c.k as usize);
    let (lda, ldb) = (c.lda as usize, c.ldb as usize);
    let rows = vectors(c.a, c.a_type, m, k, |row, l| row * lda + l);
    let cols = vectors(c.b, c.b_type, n, k, |col, l| col * ldb + l);
    products(&rows, &cols, (m, n, k), c.d as *mut f32, c.ldd as usize);
}

/// Computes one [`BatchedGemmCall`]: `d[b] = op(a[b]) op(b[b])` for every batch `b`.
///
/// # Safety
/// As for [`gemm`], for every batch at its stride.
pub unsafe fn gemm_batched(c: &BatchedGemmCall) {
    let (m, n, k) = (c.m as usize, c.n as usize, c.k as usize);
    let (lda, ldb) = (c.lda as usize, c.ldb as usize);
    let size = c.dtype.type_size() as u64;
    for batch in 0..c.batch as u64 {
        let a = c.a + batch * c.stride_a as u64 * size;
        let b = c.b + batch * c.stride_b as u64 * size;
        let d = (c.d as *mut f32).add(batch as usize * c.stride_d as usize);
        // Row i of op(a) and column j of op(b), each along the summed axis.
        let rows = vectors(a, c.dtype, m, k, |i, l| {
            if c.trans_a {
                l + i * lda
            } else {
                i + l * lda
            }
        });
        let cols = vectors(b, c.dtype, n, k, |j, l| {
            if c.trans_b {
                j + l * ldb
            } else {
                l + j * ldb
            }
        });
        products(&rows, &cols, (m, n, k), d, c.ldd as usize);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(a: &[f32], b: &[f32], d: &mut [f32], (m, n, k): (usize, usize, usize)) -> GemmCall {
        GemmCall {
            m: m as i32,
            n: n as i32,
            k: k as i32,
            a: a.as_ptr() as u64,
            a_type: DType::F32,
            lda: k.max(1) as i32,
            b: b.as_ptr() as u64,
            b_type: DType::F32,
            ldb: k.max(1) as i32,
            d: d.as_mut_ptr() as u64,
            ldd: m as i32,
        }
    }

    #[test]
    fn products_match_direct_sums_and_k_zero_writes_zeros() {
        let (m, n, k) = (5, 7, 9);
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
        let b: Vec<f32> = (0..n * k).map(|i| ((i * 5) % 13) as f32 - 6.0).collect();
        let mut d = vec![f32::NAN; m * n];
        // SAFETY: the arrays hold the call's shapes.
        unsafe { gemm(&call(&a, &b, &mut d, (m, n, k))) };
        for col in 0..n {
            for row in 0..m {
                let want: f32 = (0..k).map(|l| a[row * k + l] * b[col * k + l]).sum();
                assert_eq!(d[col * m + row], want, "({row}, {col})");
            }
        }
        let mut d = vec![f32::NAN; m * n];
        // SAFETY: as above; with k = 0 no operand element is read.
        unsafe { gemm(&call(&[], &[], &mut d, (m, n, 0))) };
        assert!(d.iter().all(|&v| v == 0.0), "{d:?}");
    }
}
