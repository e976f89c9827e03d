//! Index kernels over axis 0 of F32 rows: `argsort` (stable, ascending or descending) and `top_k`
//! (the k largest, largest first, ties broken by the lower index). NaN sorts above every number.

use super::rows::{load_row, par_rows, unravel, Scratch};
use crate::view::TView;
use ggml_core::{DType, Error, Result, SortOrder};
use std::cmp::Ordering;

/// A total order on f32 that keeps -0 == 0 and puts NaN above everything.
#[inline]
fn cmp_f32(a: f32, b: f32) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (false, false) => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
    }
}

fn index_rows<F>(src: &TView, dst: &TView, name: &'static str, k: usize, f: F) -> Result<()>
where
    F: Fn(&[f32], &mut Vec<u32>) + Sync,
{
    let (s, d) = (src.layout, dst.layout);
    if d.dtype != DType::I32 || d.ne != [k, s.ne[1], s.ne[2], s.ne[3]] || k > s.ne[0] {
        return Err(Error::Shape {
            op: name,
            msg: format!("{:?} into {:?} ({})", s.ne, d.ne, d.dtype),
        });
    }
    par_rows(d.nrows(), s.ne[0] * 8, |range| {
        let mut sa = Scratch::default();
        let mut order: Vec<u32> = Vec::with_capacity(s.ne[0]);
        for r in range {
            let idx = unravel(r, &d.ne);
            // SAFETY: rows are in range; each destination row is written by one task only.
            unsafe {
                let x = load_row(src, idx, &mut sa.f)?;
                order.clear();
                order.extend(0..s.ne[0] as u32);
                f(x, &mut order);
                let out = dst.row_ptr(idx[0], idx[1], idx[2]);
                for (i, &o) in order[..k].iter().enumerate() {
                    (out.add(i * d.nb[0]) as *mut i32).write_unaligned(o as i32);
                }
            }
        }
        Ok(())
    })
}

pub fn argsort(src: &TView, dst: &TView, order: SortOrder) -> Result<()> {
    index_rows(src, dst, "argsort", src.ne()[0], |x, idx| match order {
        SortOrder::Asc => idx.sort_by(|&a, &b| cmp_f32(x[a as usize], x[b as usize])),
        SortOrder::Desc => idx.sort_by(|&a, &b| cmp_f32(x[b as usize], x[a as usize])),
    })
}

pub fn top_k(src: &TView, dst: &TView, k: usize) -> Result<()> {
    if k == 0 {
        return Err(Error::Shape {
            op: "top_k",
            msg: "k = 0".into(),
        });
    }
    index_rows(src, dst, "top_k", k, |x, idx| {
        let by = |a: &u32, b: &u32| cmp_f32(x[*b as usize], x[*a as usize]).then(a.cmp(b));
        if k < idx.len() {
            idx.select_nth_unstable_by(k - 1, by);
        }
        idx[..k].sort_unstable_by(by);
    })
}
