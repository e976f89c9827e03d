//! Shared row machinery of the kernels: row index arithmetic, parallel iteration over row ranges, and
//! reading/writing one row of any tensor as f32 (strided scalar rows gathered element by element,
//! block-quantized rows through `ggml_core::quant`).

use crate::view::TView;
use ggml_core::quant::{dequantize_row, quantize_row};
use ggml_core::{DType, Error, Result};
use std::ops::Range;

/// Row index (i1, i2, i3) of flat row `r` for a shape `ne`.
#[inline]
pub fn unravel(r: usize, ne: &[usize; 4]) -> [usize; 3] {
    let i1 = r % ne[1];
    let r = r / ne[1];
    [i1, r % ne[2], r / ne[2]]
}

/// Runs `f` over disjoint ranges of `0..nrows` in parallel ([`crate::team::par_tasks`]). `row_cost` is a rough number
/// of element operations per row, used to keep tasks from being too small.
pub fn par_rows<F>(nrows: usize, row_cost: usize, f: F) -> Result<()>
where
    F: Fn(Range<usize>) -> Result<()> + Sync + Send,
{
    if nrows == 0 {
        return Ok(());
    }
    let threads = crate::team::threads().max(1);
    let min_rows = (16384 / row_cost.max(1)).max(1);
    let chunk = nrows.div_ceil(threads * 4).max(min_rows);
    let nchunks = nrows.div_ceil(chunk);
    if nchunks == 1 {
        return f(0..nrows);
    }
    crate::team::par_tasks(nchunks, |c| f(c * chunk..((c + 1) * chunk).min(nrows)))
}

/// Per-thread scratch space for row conversions.
#[derive(Default)]
pub struct Scratch {
    pub f: Vec<f32>,
    pub q: Vec<u8>,
}

fn bad_type(dtype: DType, what: &str) -> Error {
    Error::UnsupportedType {
        dtype,
        what: what.to_string(),
    }
}

/// Row `(i1, i2, i3)` of `v` as f32: borrowed directly for F32 rows with unit stride, converted into
/// `buf` otherwise (I32 values are converted numerically).
///
/// # Safety
/// `v` must point to live memory of its layout and the row must not be written meanwhile.
pub unsafe fn load_row<'a>(v: &TView, r: [usize; 3], buf: &'a mut Vec<f32>) -> Result<&'a [f32]> {
    let n = v.layout.ne[0];
    let p = v.row_ptr(r[0], r[1], r[2]);
    let dt = v.dtype();
    if dt == DType::F32 && (v.layout.nb[0] == 4 || n <= 1) {
        return Ok(std::slice::from_raw_parts(p as *const f32, n));
    }
    buf.clear();
    buf.resize(n, 0.0);
    load_row_into(v, r, buf)?;
    Ok(&buf[..])
}

/// Converts row `(i1, i2, i3)` of `v` into `out` (`out.len() == ne[0]`).
///
/// # Safety
/// As for [`load_row`].
pub unsafe fn load_row_into(v: &TView, r: [usize; 3], out: &mut [f32]) -> Result<()> {
    let n = v.layout.ne[0];
    let p = v.row_ptr(r[0], r[1], r[2]);
    let dt = v.dtype();
    let nb0 = v.layout.nb[0];
    if dt == DType::F16 && nb0 == 2 {
        super::vector::row_ops().widen_f16(p, out);
        return Ok(());
    }
    if dt.is_quantized() || (nb0 == dt.type_size() && dt != DType::I32) {
        if dt.is_quantized() && nb0 != dt.type_size() && n > dt.block_size() {
            return Err(bad_type(dt, "a row with strided blocks"));
        }
        let bytes = std::slice::from_raw_parts(
            p as *const u8,
            dt.row_size(n)
                .ok_or_else(|| bad_type(dt, "a partial block row"))?,
        );
        return dequantize_row(dt, bytes, out);
    }
    match dt {
        DType::F32 => out
            .iter_mut()
            .enumerate()
            .for_each(|(i, o)| *o = (p.add(i * nb0) as *const f32).read_unaligned()),
        DType::F16 => out.iter_mut().enumerate().for_each(|(i, o)| {
            *o = half::f16::from_bits((p.add(i * nb0) as *const u16).read_unaligned()).to_f32()
        }),
        DType::BF16 => out.iter_mut().enumerate().for_each(|(i, o)| {
            *o = half::bf16::from_bits((p.add(i * nb0) as *const u16).read_unaligned()).to_f32()
        }),
        DType::I32 => out
            .iter_mut()
            .enumerate()
            .for_each(|(i, o)| *o = (p.add(i * nb0) as *const i32).read_unaligned() as f32),
        t => return Err(bad_type(t, "row load")),
    }
    Ok(())
}

/// Writes `vals` (f32) into row `(i1, i2, i3)` of `v`, converting or quantizing to its type.
///
/// # Safety
/// `v` must point to live memory of its layout and no other thread may access the row meanwhile.
pub unsafe fn store_row(v: &TView, r: [usize; 3], vals: &[f32], q: &mut Vec<u8>) -> Result<()> {
    let n = v.layout.ne[0];
    debug_assert_eq!(vals.len(), n);
    let p = v.row_ptr(r[0], r[1], r[2]);
    let dt = v.dtype();
    let nb0 = v.layout.nb[0];
    if dt.is_quantized() || (nb0 == dt.type_size() && dt != DType::I32) {
        if dt.is_quantized() && nb0 != dt.type_size() && n > dt.block_size() {
            return Err(bad_type(dt, "a row with strided blocks"));
        }
        let len = dt
            .row_size(n)
            .ok_or_else(|| bad_type(dt, "a partial block row"))?;
        if dt == DType::F32 {
            std::ptr::copy_nonoverlapping(vals.as_ptr(), p as *mut f32, n);
            return Ok(());
        }
        q.clear();
        q.resize(len, 0);
        quantize_row(dt, vals, q)?;
        std::ptr::copy_nonoverlapping(q.as_ptr(), p, len);
        return Ok(());
    }
    match dt {
        DType::F32 => vals
            .iter()
            .enumerate()
            .for_each(|(i, &x)| (p.add(i * nb0) as *mut f32).write_unaligned(x)),
        DType::F16 => vals.iter().enumerate().for_each(|(i, &x)| {
            (p.add(i * nb0) as *mut u16).write_unaligned(half::f16::from_f32(x).to_bits())
        }),
        DType::BF16 => vals.iter().enumerate().for_each(|(i, &x)| {
            (p.add(i * nb0) as *mut u16).write_unaligned(half::bf16::from_f32(x).to_bits())
        }),
        DType::I32 => vals
            .iter()
            .enumerate()
            .for_each(|(i, &x)| (p.add(i * nb0) as *mut i32).write_unaligned(x as i32)),
        t => return Err(bad_type(t, "row store")),
    }
    Ok(())
}

/// Gives `f` a mutable f32 row to fill for row `(i1, i2, i3)` of `dst`: the row itself for F32 rows
/// with unit stride, a scratch row that is then converted and stored otherwise.
///
/// # Safety
/// As for [`store_row`].
pub unsafe fn with_out_row<F>(dst: &TView, r: [usize; 3], s: &mut Scratch, f: F) -> Result<()>
where
    F: FnOnce(&mut [f32]) -> Result<()>,
{
    let n = dst.layout.ne[0];
    if dst.dtype() == DType::F32 && (dst.layout.nb[0] == 4 || n <= 1) {
        let row = std::slice::from_raw_parts_mut(dst.row_ptr(r[0], r[1], r[2]) as *mut f32, n);
        return f(row);
    }
    let mut buf = std::mem::take(&mut s.f);
    buf.clear();
    buf.resize(n, 0.0);
    let res = f(&mut buf).and_then(|_| store_row(dst, r, &buf, &mut s.q));
    s.f = buf;
    res
}

/// Copies one element of `size` bytes (raw, no conversion).
///
/// # Safety
/// Both pointers must be valid for `size` bytes and not overlap.
#[inline]
pub unsafe fn copy_elem(src: *const u8, dst: *mut u8, size: usize) {
    match size {
        4 => (dst as *mut u32).write_unaligned((src as *const u32).read_unaligned()),
        2 => (dst as *mut u16).write_unaligned((src as *const u16).read_unaligned()),
        _ => std::ptr::copy_nonoverlapping(src, dst, size),
    }
}

/// Copies `n` scalar elements of `size` bytes between two strided rows (raw bytes).
///
/// # Safety
/// Both rows must be valid for their strides and not overlap.
pub unsafe fn copy_strided(
    src: *const u8,
    s_stride: usize,
    dst: *mut u8,
    d_stride: usize,
    n: usize,
    size: usize,
) {
    if (s_stride == size && d_stride == size) || n == 1 {
        std::ptr::copy_nonoverlapping(src, dst, n * size);
    } else {
        for i in 0..n {
            copy_elem(src.add(i * s_stride), dst.add(i * d_stride), size);
        }
    }
}

/// Reads I32 element `i` with a bounds check against `limit`, as an index.
///
/// # Safety
/// `v` must be an I32 view and `i` in range.
#[inline]
pub unsafe fn read_index(
    v: &TView,
    i: [usize; 4],
    limit: usize,
    what: &'static str,
) -> Result<usize> {
    let x = v.get_i32(i);
    if x < 0 || x as usize >= limit {
        return Err(Error::Shape {
            op: what,
            msg: format!("index {x} out of range 0..{limit}"),
        });
    }
    Ok(x as usize)
}
