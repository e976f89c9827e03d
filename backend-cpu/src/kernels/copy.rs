//! Data movement kernels: `cpy`/`cont` (with type conversion, quantization and non-contiguous
//! sources, in ggml element order), `get_rows`, `set_rows` and `concat`.

use super::rows::{
    copy_strided, load_row, load_row_into, par_rows, read_index, store_row, unravel, with_out_row,
    Scratch,
};
use crate::view::TView;
use ggml_core::{DType, Error, Result};

fn shape(op: &'static str, msg: String) -> Error {
    Error::Shape { op, msg }
}

/// Byte address of flat element `e` (ggml order) of a scalar-typed view.
#[inline]
fn flat_ptr(v: &TView, e: usize) -> *mut u8 {
    let ne = &v.layout.ne;
    let i0 = e % ne[0];
    let [i1, i2, i3] = unravel(e / ne[0], ne);
    v.at([i0, i1, i2, i3])
}

/// Reads flat elements of any view in order, decoding one source row at a time.
struct FlatReader<'a> {
    v: &'a TView,
    row: usize,
    buf: Vec<f32>,
}

impl<'a> FlatReader<'a> {
    fn new(v: &'a TView) -> Self {
        FlatReader {
            v,
            row: usize::MAX,
            buf: vec![0.0; v.layout.ne[0]],
        }
    }

    /// # Safety
    /// The view must point to live memory of its layout; `e` must be in range.
    unsafe fn get(&mut self, e: usize) -> Result<f32> {
        let n0 = self.v.layout.ne[0];
        let r = e / n0;
        if r != self.row {
            load_row_into(self.v, unravel(r, &self.v.layout.ne), &mut self.buf)?;
            self.row = r;
        }
        Ok(self.buf[e % n0])
    }
}

/// `dst = src` element by element in ggml order, converting types (`cpy` and `cont`). The shapes may
/// differ as long as the element counts match.
pub fn copy(src: &TView, dst: &TView) -> Result<()> {
    let (s, d) = (src.layout, dst.layout);
    if s.nelements() != d.nelements() {
        return Err(shape("cpy", format!("{:?} into {:?}", s.ne, d.ne)));
    }
    let same = s.dtype == d.dtype;
    let n0 = d.ne[0];
    if s.ne[0] == n0 {
        let quant_raw = same && s.dtype.is_quantized();
        if quant_raw
            && (s.nb[0] != s.dtype.type_size() || d.nb[0] != d.dtype.type_size())
            && n0 > s.dtype.block_size()
        {
            return Err(Error::UnsupportedType {
                dtype: s.dtype,
                what: "cpy of rows with strided blocks".into(),
            });
        }
        return par_rows(d.nrows(), n0, |range| {
            let mut sc = Scratch::default();
            for r in range {
                let (rs, rd) = (unravel(r, &s.ne), unravel(r, &d.ne));
                // SAFETY: rows are in range; each destination row is written by one task only.
                unsafe {
                    if quant_raw {
                        let len = s.row_bytes();
                        std::ptr::copy_nonoverlapping(
                            src.row_ptr(rs[0], rs[1], rs[2]),
                            dst.row_ptr(rd[0], rd[1], rd[2]),
                            len,
                        );
                    } else if same {
                        copy_strided(
                            src.row_ptr(rs[0], rs[1], rs[2]),
                            s.nb[0],
                            dst.row_ptr(rd[0], rd[1], rd[2]),
                            d.nb[0],
                            n0,
                            s.dtype.type_size(),
                        );
                    } else {
                        let vals = load_row(src, rs, &mut sc.f)?;
                        store_row(dst, rd, vals, &mut sc.q)?;
                    }
                }
            }
            Ok(())
        });
    }
    if same && !s.dtype.is_quantized() {
        let size = s.dtype.type_size();
        return par_rows(d.nrows(), n0, |range| {
            for r in range {
                let rd = unravel(r, &d.ne);
                let drow = dst.row_ptr(rd[0], rd[1], rd[2]);
                for i0 in 0..n0 {
                    // SAFETY: both elements are in range of their views.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            flat_ptr(src, r * n0 + i0),
                            drow.add(i0 * d.nb[0]),
                            size,
                        )
                    };
                }
            }
            Ok(())
        });
    }
    par_rows(d.nrows(), n0, |range| {
        let mut reader = FlatReader::new(src);
        let mut sc = Scratch::default();
        for r in range {
            // SAFETY: elements are read in range; each destination row is written by one task only.
            unsafe {
                with_out_row(dst, unravel(r, &d.ne), &mut sc, |out| {
                    for (i0, o) in out.iter_mut().enumerate() {
                        *o = reader.get(r * n0 + i0)?;
                    }
                    Ok(())
                })?;
            }
        }
        Ok(())
    })
}

/// `dst[:, i1, i2, i3] = table[:, ids[i1, i2, i3], i2, i3]`, dequantized to F32 (I32 tables stay I32).
pub fn get_rows(table: &TView, ids: &TView, dst: &TView) -> Result<()> {
    let (t, d) = (table.layout, dst.layout);
    if ids.dtype() != DType::I32
        || t.ne[0] != d.ne[0]
        || ids.ne()[0] != d.ne[1]
        || t.ne[2] != d.ne[2]
        || t.ne[3] != d.ne[3]
    {
        return Err(shape(
            "get_rows",
            format!("table {:?}, ids {:?}, dst {:?}", t.ne, ids.ne(), d.ne),
        ));
    }
    let raw = t.dtype == d.dtype && !t.dtype.is_quantized();
    par_rows(d.nrows(), d.ne[0], |range| {
        let mut sc = Scratch::default();
        for r in range {
            let [i1, i2, i3] = unravel(r, &d.ne);
            // SAFETY: indices are bounds-checked; each destination row is written by one task only.
            unsafe {
                let row = read_index(ids, [i1, i2, i3, 0], t.ne[1], "get_rows")?;
                if raw {
                    copy_strided(
                        table.row_ptr(row, i2, i3),
                        t.nb[0],
                        dst.row_ptr(i1, i2, i3),
                        d.nb[0],
                        d.ne[0],
                        t.dtype.type_size(),
                    );
                } else {
                    with_out_row(dst, [i1, i2, i3], &mut sc, |out| {
                        load_row_into(table, [row, i2, i3], out)
                    })?;
                }
            }
        }
        Ok(())
    })
}

/// `dst[:, ids[i, i2 % ids.ne1, i3 % ids.ne2], i2, i3] = src[:, i, i2, i3]`, quantized to dst's type.
/// When several source rows target the same row, the last one wins.
pub fn set_rows(dst: &TView, src: &TView, ids: &TView) -> Result<()> {
    let (d, s, ix) = (dst.layout, src.layout, ids.layout);
    if ix.dtype != DType::I32
        || s.ne[0] != d.ne[0]
        || ix.ne[0] != s.ne[1]
        || s.ne[2] != d.ne[2]
        || s.ne[3] != d.ne[3]
        || ix.ne[1] == 0
        || ix.ne[2] == 0
    {
        return Err(shape(
            "set_rows",
            format!("dst {:?}, src {:?}, ids {:?}", d.ne, s.ne, ix.ne),
        ));
    }
    // (destination flat row, source flat row), last write per destination kept.
    let mut plan = Vec::with_capacity(s.nrows());
    for r in 0..s.nrows() {
        let [i, i2, i3] = unravel(r, &s.ne);
        // SAFETY: the index position is in range of ids.
        let target = unsafe {
            read_index(
                ids,
                [i, i2 % ix.ne[1], i3 % ix.ne[2], 0],
                d.ne[1],
                "set_rows",
            )?
        };
        plan.push((target + d.ne[1] * (i2 + d.ne[2] * i3), r));
    }
    plan.sort_by_key(|&(t, _)| t);
    plan.dedup_by(|later, earlier| {
        let dup = later.0 == earlier.0;
        if dup {
            earlier.1 = later.1;
        }
        dup
    });
    par_rows(plan.len(), d.ne[0], |range| {
        let mut sc = Scratch::default();
        for &(t, r) in &plan[range] {
            // SAFETY: destination rows in the plan are distinct.
            unsafe {
                let vals = load_row(src, unravel(r, &s.ne), &mut sc.f)?;
                store_row(dst, unravel(t, &d.ne), vals, &mut sc.q)?;
            }
        }
        Ok(())
    })
}

/// Concatenation of `a` and `b` along `dim` (scalar types, raw bytes; any strides).
pub fn concat(a: &TView, b: &TView, dst: &TView, dim: usize) -> Result<()> {
    let (la, lb, d) = (a.layout, b.layout, dst.layout);
    let size = d.dtype.type_size();
    if dim > 3
        || la.dtype != d.dtype
        || lb.dtype != d.dtype
        || d.dtype.is_quantized()
        || la.ne[dim] + lb.ne[dim] != d.ne[dim]
        || (0..4).any(|k| k != dim && (la.ne[k] != d.ne[k] || lb.ne[k] != d.ne[k]))
    {
        return Err(shape(
            "concat",
            format!("{:?} and {:?} into {:?} on {dim}", la.ne, lb.ne, d.ne),
        ));
    }
    par_rows(d.nrows(), d.ne[0], |range| {
        for r in range {
            let idx = unravel(r, &d.ne);
            let out = dst.row_ptr(idx[0], idx[1], idx[2]);
            // SAFETY: all rows are in range; each destination row is written by one task only.
            unsafe {
                if dim == 0 {
                    copy_strided(
                        a.row_ptr(idx[0], idx[1], idx[2]),
                        la.nb[0],
                        out,
                        d.nb[0],
                        la.ne[0],
                        size,
                    );
                    copy_strided(
                        b.row_ptr(idx[0], idx[1], idx[2]),
                        lb.nb[0],
                        out.add(la.ne[0] * d.nb[0]),
                        d.nb[0],
                        lb.ne[0],
                        size,
                    );
                } else {
                    let k = dim - 1;
                    let (v, n0, nb0, mut j) = if idx[k] < la.ne[dim] {
                        (a, la.ne[0], la.nb[0], idx)
                    } else {
                        (b, lb.ne[0], lb.nb[0], idx)
                    };
                    if idx[k] >= la.ne[dim] {
                        j[k] -= la.ne[dim];
                    }
                    copy_strided(v.row_ptr(j[0], j[1], j[2]), nb0, out, d.nb[0], n0, size);
                }
            }
        }
        Ok(())
    })
}
