//! mul_mat: products with at most [`gemv::MAX_COLUMNS`] columns per batch (decode) go to the GEMV
//! kernels, which read weights in their stored format; wider ones (prompt processing) to the
//! vendor's BLAS with F32 accumulation, one [`GemmCall`] per batch. With mixed-precision BLAS
//! ([`GemmTypes::Mixed`], cuBLAS GemmEx) F16 and BF16 weights are read in place with activations
//! rounded to the same type, quantized weights are dequantized to F16 in scratch
//! (`k_dequant_f16_*`) first, F32 weights keep F32 activations; contiguous F32 activations of F16
//! or BF16 operands are converted by `k_f16_from_f32` / `k_bf16_from_f32` (vector loads), other
//! layouts by `k_cpy`; with [`GemmTypes::F32`] (hipBLAS
//! SGEMM) every operand that is not readable as F32 in place is converted to F32 in scratch.

use super::gemv::{self, rows_readable};
use super::{args, contiguous_copy, fail, type_name, Launch, Runner, TDesc, MAX_BLOCKS};
use ggml_core::{DType, Layout, Result};

/// Scratch slots of converted weights and activations (shared with the GEMV path's).
const SLOT_WEIGHTS: usize = 0;
const SLOT_ACTIVATIONS: usize = 1;

/// Threads of a dequantizer block (`DQ_THREADS`: one unit of 32 weights each).
const DEQUANT_THREADS: usize = 128;

pub fn dequant_kernel(type_name: &str) -> String {
    format!("k_dequant_f16_{type_name}")
}

/// The operand types a backend's BLAS takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmTypes {
    /// F32, F16 and BF16 operands (of one type per call) with F32 accumulation and result.
    Mixed,
    /// F32 operands only.
    F32,
}

/// One column-major BLAS product `d[m, n] = a[k, m]^T b[k, n]` with F32 accumulation and an F32
/// result of leading dimension `ldd`; `a` and `b` are `a_type`/`b_type` with leading dimensions
/// `lda`/`ldb` (elements between columns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmCall {
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub a: u64,
    pub a_type: DType,
    pub lda: i32,
    pub b: u64,
    pub b_type: DType,
    pub ldb: i32,
    pub d: u64,
    pub ldd: i32,
}

/// One GEMM operand in device memory: element type, leading dimension (elements between rows)
/// and byte strides of the batch axes 2 and 3.
#[derive(Clone, Copy, Debug)]
struct Operand {
    ptr: u64,
    dtype: DType,
    ld: usize,
    batch_nb: [usize; 2],
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

/// `dst[m, n] = dot(a row m, b row n)` per batch, a [K, M, A2, A3], b [K, N, B2, B3].
pub(super) fn mul_mat(
    r: &dyn Runner,
    (a, la): (TDesc, &Layout),
    (b, lb): (TDesc, &Layout),
    d: TDesc,
) -> Result<()> {
    let [_, _, a2, a3] = la.ne;
    let [_, n, b2, b3] = lb.ne;
    if a2 == 0 || a3 == 0 || b2 % a2 != 0 || b3 % a3 != 0 {
        return Err(fail(
            r,
            format!("mul_mat batches {:?} x {:?}", la.ne, lb.ne),
        ));
    }
    if n <= gemv::MAX_COLUMNS {
        return gemv::mul_mat_vec(r, (a, la), (b, lb), d);
    }
    let wa = weights(r, a, la)?;
    let xb = activations(r, b, lb, wa.dtype)?;
    gemm(r, &wa, la.ne, &xb, lb.ne, d.ptr)
}

/// A contiguous copy of `src` as `dtype` in scratch `slot`.
fn converted(r: &dyn Runner, src: TDesc, l: &Layout, dtype: DType, slot: usize) -> Result<Operand> {
    let copy = contiguous_copy(r, src, l, dtype, slot)?;
    Ok(Operand::contiguous(copy.ptr, dtype, l.ne))
}

/// The weights as a GEMM operand: float rows in place (F32 rows only without mixed-precision
/// BLAS), quantized ones dequantized to F16 (with mixed precision), other layouts copied to F32.
fn weights(r: &dyn Runner, a: TDesc, la: &Layout) -> Result<Operand> {
    let t = la.dtype;
    let mixed = r.gemm_types() == GemmTypes::Mixed;
    if t.is_float() && (mixed || t == DType::F32) {
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
        return converted(r, a, la, DType::F32, SLOT_WEIGHTS);
    }
    match type_name(t) {
        Some(tn) if mixed && t.is_quantized() && rows_readable(&a, la) => {
            let n = la.nelements();
            let ptr = r.scratch(SLOT_WEIGHTS, n * 2)?;
            let blocks = (n / 32).div_ceil(DEQUANT_THREADS).clamp(1, MAX_BLOCKS);
            r.launch(&Launch {
                kernel: dequant_kernel(tn).into(),
                grid: [blocks as u32, 1, 1],
                threads: DEQUANT_THREADS as u32,
                shared_bytes: 0,
                args: args![a, ptr],
            })?;
            Ok(Operand::contiguous(ptr, DType::F16, la.ne))
        }
        _ => converted(r, a, la, DType::F32, SLOT_WEIGHTS),
    }
}

/// The activations as a GEMM operand of type `dtype` (the weights' operand type).
fn activations(r: &dyn Runner, b: TDesc, lb: &Layout, dtype: DType) -> Result<Operand> {
    if lb.dtype == dtype && lb.is_contiguous() {
        return Ok(Operand::contiguous(b.ptr, dtype, lb.ne));
    }
    let half_kernel = match dtype {
        DType::F16 => Some("k_f16_from_f32"),
        DType::BF16 => Some("k_bf16_from_f32"),
        _ => None,
    };
    if let Some(kernel) = half_kernel.filter(|_| lb.dtype == DType::F32 && lb.is_contiguous()) {
        let n = lb.nelements();
        let ptr = r.scratch(SLOT_ACTIVATIONS, n * 2)?;
        r.launch(&Launch::elementwise(
            kernel,
            n.div_ceil(4),
            args![b.ptr, ptr, n as u64],
        ))?;
        return Ok(Operand::contiguous(ptr, dtype, lb.ne));
    }
    converted(r, b, lb, dtype, SLOT_ACTIVATIONS)
}

fn dim(r: &dyn Runner, v: usize) -> Result<i32> {
    i32::try_from(v.max(1)).map_err(|_| fail(r, format!("GEMM dimension {v} exceeds i32")))
}

/// `d[m, n] = dot(a row m, b column n)` per batch with F32 accumulation; `a` of shape
/// `[K, M, A2, A3]` broadcast over `b`'s `[K, N, B2, B3]`, `d` contiguous F32.
fn gemm(
    r: &dyn Runner,
    a: &Operand,
    a_ne: [usize; 4],
    b: &Operand,
    b_ne: [usize; 4],
    d: u64,
) -> Result<()> {
    let [k, m, a2, a3] = a_ne;
    let [_, n, b2, b3] = b_ne;
    let (r2, r3) = (b2 / a2, b3 / a3);
    // K = 0 (a device holding no slice of a split axis) is legal: BLAS then writes beta * C = 0.
    let call = |a_ptr: u64, b_ptr: u64, d_ptr: u64, cols: usize| -> Result<()> {
        r.gemm(&GemmCall {
            m: dim(r, m)?,
            n: dim(r, cols)?,
            k: k as i32,
            a: a_ptr,
            a_type: a.dtype,
            lda: dim(r, a.ld)?,
            b: b_ptr,
            b_type: b.dtype,
            ldb: dim(r, b.ld)?,
            d: d_ptr,
            ldd: dim(r, m)?,
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
