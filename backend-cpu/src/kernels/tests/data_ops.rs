//! Tests of cpy/cont, get_rows, set_rows and concat.

use super::*;
use crate::kernels::copy::{concat, copy, get_rows, set_rows};
use crate::kernels::run_op;
use ggml_core::Op;

const TYPES: [DType; 5] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q8_0,
    DType::Q4_0,
];

fn quant_tol(dtype: DType) -> f32 {
    if dtype.is_quantized() {
        1e-6
    } else {
        tol_of(dtype).max(1e-6)
    }
}

#[test]
fn copy_converts_between_all_types() {
    for st in TYPES {
        for dt in TYPES {
            for transposed in [false, true] {
                if transposed && st.is_quantized() {
                    continue;
                }
                let ne = [64, 3, 2, 1];
                let mut src = source(st, ne, &rand_vals(384, -2.0, 2.0), transposed);
                let mut dst = Host::poisoned(dt, ne);
                copy(&src.view(), &dst.view()).unwrap();
                let want = rounded(dt, ne[0], &src.values());
                assert_close(&dst.values(), &want, quant_tol(dt));
            }
        }
    }
}

#[test]
fn copy_reshapes_in_ggml_order() {
    // Transposed F32 source into an F16 destination of another shape.
    let ne = [7, 6, 1, 1];
    let mut src = Host::transposed(DType::F32, ne, &rand_vals(42, -1.0, 1.0));
    let mut dst = Host::poisoned(DType::F16, [21, 2, 1, 1]);
    copy(&src.view(), &dst.view()).unwrap();
    assert_close(&dst.values(), &rounded(DType::F16, 21, &src.values()), 0.0);
    // F32 [32, 4] into Q8_0 [64, 2] and Q4_0 [64, 2] back into F32 [32, 4].
    let mut a = Host::new(DType::F32, [32, 4, 1, 1], &rand_vals(128, -1.0, 1.0));
    let mut q = Host::poisoned(DType::Q8_0, [64, 2, 1, 1]);
    copy(&a.view(), &q.view()).unwrap();
    assert_close(&q.values(), &rounded(DType::Q8_0, 64, &a.values()), 1e-6);
    let mut q4 = Host::new(DType::Q4_0, [64, 2, 1, 1], &rand_vals(128, -1.0, 1.0));
    let mut back = Host::poisoned(DType::F32, [32, 4, 1, 1]);
    copy(&q4.view(), &back.view()).unwrap();
    assert_eq!(back.values(), q4.values());
    // I32 stays exact.
    let big: Vec<f32> = (0..12).map(|i| (i * 1_000_003) as f32).collect();
    let mut ints = Host::new(DType::I32, [3, 4, 1, 1], &big);
    let mut out = Host::poisoned(DType::I32, [12, 1, 1, 1]);
    copy(&ints.view(), &out.view()).unwrap();
    assert_eq!(out.bytes, ints.bytes);
}

#[test]
fn cont_through_dispatch_of_permuted_source() {
    let ne = [5, 3, 4, 2];
    let vals = rand_vals(120, -3.0, 3.0);
    let mut src = Host::transposed(DType::BF16, ne, &vals);
    let mut dst = Host::poisoned(DType::F32, ne);
    run_op(&Op::Cont, &[src.view()], &dst.view()).unwrap();
    assert_eq!(dst.values(), src.values());
}

#[test]
fn get_rows_dequantizes_any_table() {
    for tt in [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q8_0,
        DType::Q4_0,
        DType::I32,
    ] {
        let ne = [64, 9, 2, 1];
        let vals: Vec<f32> = if tt == DType::I32 {
            (0..1152).map(|i| i as f32 * 7.0).collect()
        } else {
            rand_vals(1152, -1.0, 1.0)
        };
        let mut table = Host::new(tt, ne, &vals);
        let tv = table.values();
        let ids_v: Vec<f32> = (0..10).map(|i| ((i * 5 + 3) % 9) as f32).collect();
        let mut ids = Host::new(DType::I32, [5, 2, 1, 1], &ids_v);
        let out_t = if tt == DType::I32 {
            DType::I32
        } else {
            DType::F32
        };
        let mut dst = Host::poisoned(out_t, [64, 5, 2, 1]);
        get_rows(&table.view(), &ids.view(), &dst.view()).unwrap();
        let mut want = Vec::new();
        for i2 in 0..2 {
            for i in 0..5 {
                let row = ids_v[i2 * 5 + i] as usize;
                want.extend_from_slice(&tv[(i2 * 9 + row) * 64..(i2 * 9 + row + 1) * 64]);
            }
        }
        assert_eq!(dst.values(), want, "{tt}");
    }
    let mut table = Host::new(DType::F32, [4, 3, 1, 1], &rand_vals(12, 0.0, 1.0));
    let mut ids = Host::new(DType::I32, [1, 1, 1, 1], &[3.0]);
    let mut dst = Host::poisoned(DType::F32, [4, 1, 1, 1]);
    assert!(get_rows(&table.view(), &ids.view(), &dst.view()).is_err());
}

#[test]
fn set_rows_quantizes_and_last_write_wins() {
    for dt in TYPES {
        let dne = [64, 6, 2, 1];
        let init = rand_vals(768, -1.0, 1.0);
        let mut dst = Host::new(dt, dne, &init);
        let before = dst.values();
        let mut src = Host::transposed(DType::F32, [64, 3, 2, 1], &rand_vals(384, -1.0, 1.0));
        let sv = src.values();
        let ids_v = [4.0, 1.0, 4.0];
        let mut ids = Host::new(DType::I32, [3, 1, 1, 1], &ids_v);
        set_rows(&dst.view(), &src.view(), &ids.view()).unwrap();
        let mut want = before.clone();
        for i2 in 0..2 {
            for (i, &t) in ids_v.iter().enumerate() {
                let (d0, s0) = ((i2 * 6 + t as usize) * 64, (i2 * 3 + i) * 64);
                want[d0..d0 + 64].copy_from_slice(&rounded(dt, 64, &sv[s0..s0 + 64]));
            }
        }
        assert_close(&dst.values(), &want, quant_tol(dt));
    }
}

#[test]
fn concat_every_dim() {
    for dim in 0..4 {
        let mut na = [3, 4, 2, 2];
        let mut nb = na;
        nb[dim] = 1 + dim;
        na[dim] = 2;
        let (va, vb) = (
            rand_vals(na.iter().product(), -1.0, 1.0),
            rand_vals(nb.iter().product(), -1.0, 1.0),
        );
        let mut a = Host::transposed(DType::F32, na, &va);
        let mut b = Host::new(DType::F32, nb, &vb);
        let mut nd = na;
        nd[dim] += nb[dim];
        let mut dst = Host::poisoned(DType::F32, nd);
        concat(&a.view(), &b.view(), &dst.view(), dim).unwrap();
        let got = dst.values();
        for (e, &g) in got.iter().enumerate() {
            let mut i = idx4(e, &nd);
            let want = if i[dim] < na[dim] {
                va[i[0] + na[0] * (i[1] + na[1] * (i[2] + na[2] * i[3]))]
            } else {
                i[dim] -= na[dim];
                vb[i[0] + nb[0] * (i[1] + nb[1] * (i[2] + nb[2] * i[3]))]
            };
            assert_eq!(g, want, "dim {dim} element {e}");
        }
    }
}
