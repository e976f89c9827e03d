//! Matrix and indexing reference ops: mul_mat with broadcast, mul_mat_id, get_rows, set_rows,
//! argsort and top_k.

use crate::dense::Dense;
use ggml_core::SortOrder;

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// result[m, n, i2, i3] = dot(a[:, m, i2 / (B2 / A2), i3 / (B3 / A3)], b[:, n, i2, i3]).
pub fn mul_mat(a: &Dense, b: &Dense) -> Dense {
    let (r2, r3) = (b.ne[2] / a.ne[2], b.ne[3] / a.ne[3]);
    Dense::from_fn([a.ne[1], b.ne[1], b.ne[2], b.ne[3]], |i| {
        dot(a.row(i[0], i[2] / r2, i[3] / r3), b.row(i[1], i[2], i[3]))
    })
}

/// experts [K, M, E], b [K, B1, T], ids [n_used, T]: result[m, e, t] = dot(experts[:, m, ids[e, t]], b[:, e % B1, t]).
pub fn mul_mat_id(experts: &Dense, b: &Dense, ids: &Dense) -> Dense {
    Dense::from_fn([experts.ne[1], ids.ne[0], ids.ne[1], 1], |i| {
        let expert = ids.id([i[1], i[2], 0, 0]);
        dot(experts.row(i[0], expert, 0), b.row(i[1] % b.ne[1], i[2], 0))
    })
}

/// result[:, i, j2, j3] = table[:, ids[i, j2, j3], j2, j3].
pub fn get_rows(table: &Dense, ids: &Dense) -> Dense {
    Dense::from_fn([table.ne[0], ids.ne[0], ids.ne[1], ids.ne[2]], |i| {
        table.at([i[0], ids.id([i[1], i[2], i[3], 0]), i[2], i[3]])
    })
}

/// dst with dst[:, ids[i, i2 % I1, i3 % I2], i2, i3] = src[:, i, i2, i3].
pub fn set_rows(dst: &Dense, src: &Dense, ids: &Dense) -> Dense {
    let mut out = dst.clone();
    for i3 in 0..src.ne[3] {
        for i2 in 0..src.ne[2] {
            for i in 0..src.ne[1] {
                let r = ids.id([i, i2 % ids.ne[1], i3 % ids.ne[2], 0]);
                out.row_mut(r, i2, i3).copy_from_slice(src.row(i, i2, i3));
            }
        }
    }
    out
}

/// Indices that sort each row (stable; ties keep index order).
pub fn argsort(a: &Dense, order: SortOrder) -> Dense {
    let mut out = Dense::zeros(a.ne);
    for i3 in 0..a.ne[3] {
        for i2 in 0..a.ne[2] {
            for i1 in 0..a.ne[1] {
                let row = a.row(i1, i2, i3);
                let mut idx: Vec<usize> = (0..row.len()).collect();
                idx.sort_by(|&x, &y| match order {
                    SortOrder::Asc => row[x].total_cmp(&row[y]),
                    SortOrder::Desc => row[y].total_cmp(&row[x]),
                });
                out.row_mut(i1, i2, i3)
                    .iter_mut()
                    .zip(idx)
                    .for_each(|(o, j)| *o = j as f64);
            }
        }
    }
    out
}

/// Indices of the `k` largest values of each row, largest first (ties in index order).
pub fn top_k(a: &Dense, k: usize) -> Dense {
    argsort(a, SortOrder::Desc).slice(0, 0, k)
}
