//! Cases of the matrix, indexing, copy and sort ops: mul_mat, mul_mat_id, get_rows, set_rows, cpy,
//! cast, cont, argsort, top_k.

use super::{CaseSet, STORE_TARGETS};
use crate::case::{Check, Gen, InputSpec, ViewKind};
use crate::check::{float_bound, product_check, store_bound, Class};
use crate::codec::round_trip;
use crate::dense::Dense;
use crate::reference::matrix as mx;
use ggml_core::{DType, SortOrder};

pub fn add_cases(set: &mut CaseSet) {
    mul_mat(set);
    mul_mat_id(set);
    get_rows(set);
    set_rows(set);
    copies(set);
    sorting(set);
}

fn mul_mat(set: &mut CaseSet) {
    for w in DType::WEIGHTS {
        for variant in 0..4 {
            let k = if w.is_quantized() {
                w.block_size() * set.pick(&[1, 2, 3])
            } else {
                set.pick(&[7, 33, 64, 100])
            };
            // NMSE over few outputs is noisy: quantized weights (whose activations may be rounded to
            // 8 bits) get at least 64 outputs so the statistic is stable against the bound.
            let m = if w.is_quantized() {
                set.pick(&[64, 65, 96])
            } else {
                set.pick(&[1, 5, 16, 33])
            };
            let n = if variant == 0 {
                1
            } else {
                set.pick(&[2, 3, 8, 17])
            };
            // variant 2 broadcasts a over b's outer axes; variant 3 uses non-contiguous a and b.
            let (a_ne, b_ne) = if variant == 2 {
                ([k, m, 2, 1], [k, n, 4, 3])
            } else {
                ([k, m, 1, 1], [k, n, 1, 1])
            };
            let (a_ne, b_ne) = if variant == 3 {
                ([k, m, 3, 1], [k, n, 3, 1])
            } else {
                (a_ne, b_ne)
            };
            let bt = if variant == 1 && !w.is_quantized() {
                DType::F16
            } else {
                DType::F32
            };
            let a_view = if variant == 3 {
                ViewKind::Permute([0, 2, 1, 3])
            } else {
                ViewKind::Contig
            };
            let b_view = set.row_layout(bt, b_ne, variant == 3);
            let a = InputSpec::new(w, a_ne).view(a_view);
            let b = InputSpec::new(bt, b_ne).view(b_view);
            set.push(
                "mul_mat",
                format!("variant {variant}"),
                vec![a, b],
                product_check(w, k),
                |g, x| g.mul_mat(x[0], x[1]),
                |x| Ok(mx::mul_mat(&x[0], &x[1])),
            );
        }
    }
}

fn mul_mat_id(set: &mut CaseSet) {
    for w in DType::WEIGHTS {
        for shared_b in [true, false] {
            let k = if w.is_quantized() {
                w.block_size() * set.pick(&[1, 2])
            } else {
                set.pick(&[7, 64])
            };
            let m = if w.is_quantized() {
                set.pick(&[64, 67])
            } else {
                set.pick(&[3, 16])
            };
            let (n_exp, n_used, n_tok) = (4, set.pick(&[1, 2, 3]), set.pick(&[1, 5]));
            let b1 = if shared_b { 1 } else { n_used };
            let experts = InputSpec::new(w, [k, m, n_exp, 1]);
            let b = InputSpec::new(DType::F32, [k, b1, n_tok, 1]);
            let ids = InputSpec::ids([n_used, n_tok, 1, 1], n_exp, true);
            let params = format!("{n_used} of {n_exp} experts, b rows {b1}");
            push_mul_mat_id(set, params, [experts, b, ids], w, k);
        }
        mul_mat_id_prompt(set, w);
    }
}

fn push_mul_mat_id(set: &mut CaseSet, params: String, inputs: [InputSpec; 3], w: DType, k: usize) {
    set.push(
        "mul_mat_id",
        params,
        inputs.to_vec(),
        product_check(w, k),
        |g, x| g.mul_mat_id(x[0], x[1], x[2]),
        |x| Ok(mx::mul_mat_id(&x[0], &x[1], &x[2])),
    );
}

/// A prompt's routing (more tokens than a decode step, the pairs of an expert over more than one
/// tile of the GPU's grouped product, weight rows over more than one row tile) where the last two
/// experts get no token.
fn mul_mat_id_prompt(set: &mut CaseSet, w: DType) {
    let k = if w.is_quantized() {
        w.block_size() * set.pick(&[3, 9])
    } else {
        set.pick(&[40, 64])
    };
    let m = if w.is_quantized() { 67 } else { 19 };
    let (n_exp, n_used, n_tok) = (6, set.pick(&[2, 3]), set.pick(&[37, 45]));
    let b1 = set.pick(&[1, n_used]);
    let experts = InputSpec::new(w, [k, m, n_exp, 1]);
    let b = InputSpec::new(DType::F32, [k, b1, n_tok, 1]);
    let ids = InputSpec::ids([n_used, n_tok, 1, 1], n_exp - 2, true);
    let params = format!("prompt of {n_tok}, {n_used} of {n_exp} experts (2 unused), b rows {b1}");
    push_mul_mat_id(set, params, [experts, b, ids], w, k);
}

fn get_rows(set: &mut CaseSet) {
    let tables = DType::WEIGHTS.iter().copied().chain([DType::I32]);
    for t in tables {
        for batched in [false, true] {
            let ne0 = set.row_len(t);
            let (rows, b2) = (set.pick(&[1, 4, 9]), if batched { 3 } else { 1 });
            let n = set.pick(&[1, 2, 5]);
            let gen = if t == DType::I32 {
                Gen::Ids {
                    max: 1 << 20,
                    distinct: false,
                }
            } else {
                Gen::Normal(1.0)
            };
            let table = InputSpec::new(t, [ne0, rows, b2, 1]).gen(gen);
            let table = if batched && !t.is_quantized() {
                table.view(ViewKind::Permute([0, 2, 1, 3]))
            } else {
                table
            };
            let ids = InputSpec::ids([n, b2, 1, 1], rows, false);
            let check = if t == DType::I32 {
                Check::Exact
            } else {
                Check::Nmse(float_bound(Class::Exact, DType::F32))
            };
            set.push(
                "get_rows",
                format!("batched={batched}"),
                vec![table, ids],
                check,
                |g, x| g.get_rows(x[0], x[1]),
                |x| Ok(mx::get_rows(&x[0], &x[1])),
            );
        }
    }
}

fn set_rows(set: &mut CaseSet) {
    for t in STORE_TARGETS {
        for batched in [false, true] {
            let ne0 = set.row_len(t);
            let (rows, b2, b3) = (
                set.pick(&[3, 8]),
                if batched { 2 } else { 1 },
                if batched { 2 } else { 1 },
            );
            let n = set.pick(&[1, 2, 3]).min(rows);
            let ids_b = if batched { [1, 2] } else { [1, 1] };
            let dst = InputSpec::new(t, [ne0, rows, b2, b3]);
            let src_ne = [ne0, n, b2, b3];
            let src = InputSpec::new(DType::F32, src_ne).view(set.row_layout(
                DType::F32,
                src_ne,
                batched,
            ));
            let ids = InputSpec::ids([n, ids_b[0], ids_b[1], 1], rows, true);
            set.push(
                "set_rows",
                format!("batched={batched}"),
                vec![dst, src, ids],
                Check::Nmse(store_bound(t)),
                |g, x| g.set_rows(x[0], x[1], x[2]),
                move |x| Ok(mx::set_rows(&x[0], &round_trip(t, &x[1])?, &x[2])),
            );
        }
    }
}

/// cpy (into a poisoned destination, same or flattened shape), cast and cont, from contiguous and
/// non-contiguous sources.
fn copies(set: &mut CaseSet) {
    let pairs = STORE_TARGETS.iter().map(|&t| (DType::F32, t)).chain([
        (DType::F16, DType::F32),
        (DType::BF16, DType::F32),
        (DType::F16, DType::F16),
    ]);
    for (src_t, dst_t) in pairs {
        for nc in [false, true] {
            let ne = [
                set.row_len(dst_t),
                set.pick(&[1, 3, 4]),
                set.pick(&[1, 2]),
                1,
            ];
            let keep_rows = dst_t.is_quantized();
            let view = if keep_rows {
                set.row_layout(src_t, ne, nc)
            } else {
                set.layout(src_t, ne, nc)
            };
            let src = InputSpec::new(src_t, ne).view(view);
            let dst_ne = if nc { ne } else { [ne[0], ne[1] * ne[2], 1, 1] };
            let dst = InputSpec::new(dst_t, dst_ne).gen(Gen::Poison);
            let check = Check::Nmse(store_bound(dst_t));
            let params = format!("{src_t} -> {dst_t}");
            set.push(
                "cpy",
                params.clone(),
                vec![src, dst],
                check,
                |g, x| g.cpy(x[0], x[1]),
                move |x| {
                    let r = round_trip(dst_t, &x[0])?;
                    Ok(Dense::from_vec(dst_ne, r.data))
                },
            );
            let view = if keep_rows {
                set.row_layout(src_t, ne, !nc)
            } else {
                set.layout(src_t, ne, !nc)
            };
            let src = InputSpec::new(src_t, ne).view(view);
            let name = if src_t == dst_t { "cont" } else { "cast" };
            set.push(
                name,
                params,
                vec![src],
                check,
                move |g, x| g.cast(x[0], dst_t),
                move |x| round_trip(dst_t, &x[0]),
            );
        }
    }
}

fn sorting(set: &mut CaseSet) {
    for order in [SortOrder::Asc, SortOrder::Desc] {
        for gen in [Gen::Normal(1.0), Gen::Ties(5)] {
            let ne = [
                set.pick(&[1, 7, 33, 130]),
                set.pick(&[1, 3]),
                set.pick(&[1, 2]),
                1,
            ];
            let a = InputSpec::new(DType::F32, ne).gen(gen).view(set.layout(
                DType::F32,
                ne,
                gen != Gen::Ties(5),
            ));
            set.push(
                "argsort",
                format!("{order:?} {gen:?}"),
                vec![a],
                Check::Sorted(order),
                move |g, x| g.argsort(x[0], order),
                move |x| Ok(mx::argsort(&x[0], order)),
            );
        }
    }
    for gen in [Gen::Normal(1.0), Gen::Ties(4), Gen::Ties(40)] {
        for kind in 0..2 {
            let ne = [
                set.pick(&[1, 8, 33, 100]),
                set.pick(&[1, 3]),
                set.pick(&[1, 2]),
                1,
            ];
            let k = if kind == 0 {
                1.min(ne[0])
            } else {
                set.pick(&[1, 3, 8]).min(ne[0])
            };
            let a =
                InputSpec::new(DType::F32, ne)
                    .gen(gen)
                    .view(set.layout(DType::F32, ne, kind == 1));
            set.push(
                "top_k",
                format!("k {k} {gen:?}"),
                vec![a],
                Check::TopK,
                move |g, x| g.top_k(x[0], k),
                move |x| Ok(mx::top_k(&x[0], k)),
            );
        }
    }
}
