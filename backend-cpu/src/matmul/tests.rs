//! Tests of `mul_mat` / `mul_mat_id`: every weight type at every available SIMD level against an f64
//! reference computed from dequantized weights and (for quantized weights) the same
//! quantized-then-dequantized activations; odd shapes, broadcast batches, strided activations,
//! expert routing; plus SIMD-versus-scalar agreement. Fresh random inputs on every run; the
//! destination is filled with NaN first.

use super::*;
use ggml_core::quant::{dequantize_row, quantize_row, vec_dot_type};
use ggml_core::Layout;
use rand::Rng;

const TYPES: [DType; 12] = DType::WEIGHTS;

/// Normalized-MSE bound per weight type. Q4_1/Q5_1 use the f16-rounded block sums of Q8_1 for the
/// min term (as ggml), which the dequantized reference does not see.
fn bound(wt: DType) -> f64 {
    match wt {
        DType::Q4_1 | DType::Q5_1 => 1e-4,
        _ => 1e-9,
    }
}

fn rand_vec(n: usize) -> Vec<f32> {
    let mut rng = rand::thread_rng();
    (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
}

/// Quantized weight bytes of `rows` rows of `k` and their dequantized values.
fn weights(wt: DType, k: usize, rows: usize) -> (Vec<u8>, Vec<f64>) {
    let x = rand_vec(k * rows);
    let rb = wt.row_size(k).unwrap();
    let mut bytes = vec![0u8; rb * rows];
    let mut deq = vec![0f32; k * rows];
    for r in 0..rows {
        quantize_row(wt, &x[r * k..(r + 1) * k], &mut bytes[r * rb..(r + 1) * rb]).unwrap();
        dequantize_row(
            wt,
            &bytes[r * rb..(r + 1) * rb],
            &mut deq[r * k..(r + 1) * k],
        )
        .unwrap();
    }
    (bytes, deq.into_iter().map(f64::from).collect())
}

/// The activation row as the kernels see it: quantized to `vec_dot_type` and back for quantized
/// weights, else unchanged.
fn act_ref(wt: DType, row: &[f32]) -> Vec<f64> {
    if !wt.is_quantized() {
        return row.iter().map(|&v| f64::from(v)).collect();
    }
    let at = vec_dot_type(wt);
    let mut q = vec![0u8; at.row_size(row.len()).unwrap()];
    quantize_row(at, row, &mut q).unwrap();
    let mut out = vec![0f32; row.len()];
    dequantize_row(at, &q, &mut out).unwrap();
    out.into_iter().map(f64::from).collect()
}

fn to_f32(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Dot product and the sum of the squared terms (the scale of the result, robust to cancellation).
fn dot_mag(w: &[f64], a: &[f64]) -> (f64, f64) {
    w.iter().zip(a).fold((0.0, 0.0), |(s, m), (x, y)| {
        (s + x * y, m + (x * y).powi(2))
    })
}

/// Squared error over the squared reference plus the squared terms of every dot product.
fn nmse(got: &[f32], want: &[f64], mag: f64) -> f64 {
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(&g, &w)| (f64::from(g) - w).powi(2))
        .sum();
    let den: f64 = (want.iter().map(|w| w * w).sum::<f64>() + mag).max(1e-30);
    if got.iter().any(|g| !g.is_finite()) {
        return f64::INFINITY;
    }
    num / den
}

fn k_for(wt: DType, odd: bool) -> usize {
    match wt.block_size() {
        1 if odd => 67,
        1 => 300,
        bs => bs * 2,
    }
}

/// The bytes and layout of activations `[K, N, B2, B3]` whose logical row `r` is `vals[r * K..]`:
/// contiguous, or `transposed` (per batch stored as [N, K] and viewed as [K, N]).
fn activations(vals: &[f32], ne: [usize; 4], transposed: bool) -> (Vec<u8>, Layout) {
    let [k, n, b2, _] = ne;
    if !transposed {
        let layout = Layout::contiguous(DType::F32, ne);
        return (bytemuck::cast_slice(vals).to_vec(), layout);
    }
    // Per batch a [N, K] block: element (i0, i1) at i0 * N + i1.
    let mut t = vec![0f32; vals.len()];
    for r in 0..vals.len() / k {
        let (i1, batch) = (r % n, r / n);
        for i0 in 0..k {
            t[batch * n * k + i0 * n + i1] = vals[r * k + i0];
        }
    }
    let nb = [4 * n, 4, 4 * n * k, 4 * n * k * b2];
    let layout = Layout {
        dtype: DType::F32,
        ne,
        nb,
    };
    (bytemuck::cast_slice(&t).to_vec(), layout)
}

/// One `mul_mat` case; returns the output. `transposed`: b stored as [N, K] and viewed as [K, N].
#[allow(clippy::too_many_arguments)] // a test case spelled out: level, type, K, M, N, batch dims, layout
fn run_mul_mat(
    level: SimdLevel,
    wt: DType,
    k: usize,
    m: usize,
    n: usize,
    a23: [usize; 2],
    b23: [usize; 2],
    transposed: bool,
) -> Vec<f32> {
    let (abytes, adeq) = weights(wt, k, m * a23[0] * a23[1]);
    let mut abuf = abytes.clone();
    let a = TView::of_slice(&mut abuf, wt, [k, m, a23[0], a23[1]]);
    let nb_rows = n * b23[0] * b23[1];
    let bvals = rand_vec(k * nb_rows); // logical b[(row) * k + i0]
    let (mut bbuf, blayout) = activations(&bvals, [k, n, b23[0], b23[1]], transposed);
    let b = TView::new(bbuf.as_mut_ptr(), blayout);
    let mut dbuf: Vec<u8> = bytemuck::cast_slice(&vec![f32::NAN; m * nb_rows]).to_vec();
    let dst = TView::of_slice(&mut dbuf, DType::F32, [m, n, b23[0], b23[1]]);
    mul_mat_with(level, &a, &b, &dst).unwrap();
    let got: Vec<f32> = to_f32(&dbuf);
    let (r2, r3) = (b23[0] / a23[0], b23[1] / a23[1]);
    let mut want = vec![0f64; m * nb_rows];
    let mut mag = 0.0;
    for i3 in 0..b23[1] {
        for i2 in 0..b23[0] {
            for j in 0..n {
                let r = j + n * (i2 + b23[0] * i3);
                let act = act_ref(wt, &bvals[r * k..(r + 1) * k]);
                let arow0 = m * (i2 / r2 + a23[0] * (i3 / r3));
                for i in 0..m {
                    let w = &adeq[(arow0 + i) * k..(arow0 + i + 1) * k];
                    let (d, g) = dot_mag(w, &act);
                    want[r * m + i] = d;
                    mag += g;
                }
            }
        }
    }
    let e = nmse(&got, &want, mag);
    assert!(
        e <= bound(wt),
        "{wt} at {} k={k} m={m} n={n} a23={a23:?} b23={b23:?} t={transposed}: nmse {e:e}",
        level.name()
    );
    got
}

#[test]
fn mul_mat_all_types_levels_shapes() {
    for level in SimdLevel::available() {
        for wt in TYPES {
            for (m, n) in [(1, 1), (3, 17), (17, 3), (33, 33), (17, 9), (70, 40)] {
                for odd in [false, true] {
                    run_mul_mat(level, wt, k_for(wt, odd), m, n, [1, 1], [1, 1], false);
                }
            }
            run_mul_mat(level, wt, k_for(wt, false), 33, 17, [2, 1], [4, 3], false);
            run_mul_mat(level, wt, k_for(wt, false), 17, 33, [1, 3], [2, 3], true);
            run_mul_mat(level, wt, k_for(wt, true), 3, 1, [2, 1], [2, 1], true);
        }
    }
}

#[test]
fn simd_levels_agree_with_scalar() {
    for wt in TYPES {
        for level in SimdLevel::available().into_iter().skip(1) {
            // Same inputs at both levels: seed the thread RNG via fixed data instead of re-drawing.
            let k = k_for(wt, false);
            let (mut abuf, _) = weights(wt, k, 40);
            let mut bbuf: Vec<u8> = bytemuck::cast_slice(&rand_vec(k * 13)).to_vec();
            let a = TView::of_slice(&mut abuf, wt, [k, 40, 1, 1]);
            let b = TView::of_slice(&mut bbuf, DType::F32, [k, 13, 1, 1]);
            let mut outs = Vec::new();
            for l in [SimdLevel::Scalar, level] {
                let mut dbuf: Vec<u8> = bytemuck::cast_slice(&vec![f32::NAN; 40 * 13]).to_vec();
                let dst = TView::of_slice(&mut dbuf, DType::F32, [40, 13, 1, 1]);
                mul_mat_with(l, &a, &b, &dst).unwrap();
                outs.push(to_f32(&dbuf));
            }
            let want: Vec<f64> = outs[0].iter().map(|&v| f64::from(v)).collect();
            let e = nmse(&outs[1], &want, 0.0);
            assert!(e < 1e-10, "{wt}: {} vs scalar nmse {e:e}", level.name());
        }
    }
}

/// For quantized weights a column's result does not depend on the other columns of the call (a
/// token's logits must not depend on its batch; float weights switch to the blocked GEMM from
/// [`GEMM_MIN_COLS`] columns): every column of an N = 11 product (tiles of 2 x 4, 1 x 4, 4 x 1, 1 x 1)
/// equals, bit for bit, the same column multiplied alone (4 x 1 and 1 x 1 tiles), at every level,
/// for M = 13 rows (tiles of 4 rows) and K of 3 blocks (an odd count) or 14848 elements (464 legacy
/// blocks: the x86 prompt kernels, `quant_prompt_x86` and `quant_rows8_x86`, unpack a tile's rows in two
/// chunks).
#[test]
fn column_results_do_not_depend_on_the_batch() {
    let (m, n) = (13, 11);
    for level in SimdLevel::available() {
        for (wt, k) in TYPES
            .into_iter()
            .filter(|t| t.is_quantized())
            .flat_map(|t| [(t, t.block_size() * 3), (t, 14848)])
        {
            let (mut abuf, _) = weights(wt, k, m);
            let a = TView::of_slice(&mut abuf, wt, [k, m, 1, 1]);
            let bvals = rand_vec(k * n);
            let mut bbuf: Vec<u8> = bytemuck::cast_slice(&bvals).to_vec();
            let b = TView::of_slice(&mut bbuf, DType::F32, [k, n, 1, 1]);
            let mut dbuf: Vec<u8> = bytemuck::cast_slice(&vec![f32::NAN; m * n]).to_vec();
            let dst = TView::of_slice(&mut dbuf, DType::F32, [m, n, 1, 1]);
            mul_mat_with(level, &a, &b, &dst).unwrap();
            let all = to_f32(&dbuf);
            for j in 0..n {
                let mut cbuf: Vec<u8> = bytemuck::cast_slice(&bvals[j * k..(j + 1) * k]).to_vec();
                let col = TView::of_slice(&mut cbuf, DType::F32, [k, 1, 1, 1]);
                let mut obuf: Vec<u8> = bytemuck::cast_slice(&vec![f32::NAN; m]).to_vec();
                let out = TView::of_slice(&mut obuf, DType::F32, [m, 1, 1, 1]);
                mul_mat_with(level, &a, &col, &out).unwrap();
                let alone = to_f32(&obuf);
                let batched = &all[j * m..(j + 1) * m];
                assert!(
                    alone
                        .iter()
                        .zip(batched)
                        .all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{wt} at {} column {j}: alone {alone:?} batched {batched:?}",
                    level.name()
                );
            }
        }
    }
}

/// A group of products of one activation ([`mul_mat_group`]: one preparation, every product's
/// tiles in one loop) gives each product's [`mul_mat`] result bit for bit, for every quantized
/// type at every level, with products of different row counts and one column or several.
#[test]
fn grouped_products_equal_single_products() {
    for level in SimdLevel::available() {
        for wt in TYPES.into_iter().filter(|t| t.is_quantized()) {
            let k = wt.block_size() * 7;
            for n in [1, 5] {
                let mut bbuf: Vec<u8> = bytemuck::cast_slice(&rand_vec(k * n)).to_vec();
                let b = TView::of_slice(&mut bbuf, DType::F32, [k, n, 1, 1]);
                let mut ws: Vec<Vec<u8>> =
                    [37, 8, 13].iter().map(|&m| weights(wt, k, m).0).collect();
                let mut alone: Vec<Vec<u8>> = [37, 8, 13]
                    .iter()
                    .map(|&m| bytemuck::cast_slice(&vec![f32::NAN; m * n]).to_vec())
                    .collect();
                let mut grouped = alone.clone();
                let views = |ws: &mut Vec<Vec<u8>>, ds: &mut Vec<Vec<u8>>| -> Vec<(TView, TView)> {
                    ws.iter_mut()
                        .zip(ds.iter_mut())
                        .zip([37, 8, 13])
                        .map(|((w, d), m)| {
                            (
                                TView::of_slice(w, wt, [k, m, 1, 1]),
                                TView::of_slice(d, DType::F32, [m, n, 1, 1]),
                            )
                        })
                        .collect()
                };
                for (a, dst) in views(&mut ws, &mut alone) {
                    mul_mat_with(level, &a, &b, &dst).unwrap();
                }
                mul_mat_group_with(level, &views(&mut ws, &mut grouped), &b).unwrap();
                assert_eq!(alone, grouped, "{wt} at {} n={n}", level.name());
            }
        }
    }
}

/// `n` values that quantize to extreme quants in blocks of `bs`: blocks of `+1` and of `-1` in
/// turn, each with one element of the other sign.
fn extreme_values(bs: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let sign = if (i / bs).is_multiple_of(2) {
                1.0
            } else {
                -1.0
            };
            if i % bs == 0 {
                -sign
            } else {
                sign
            }
        })
        .collect()
}

/// Weights of `rows` rows of `k` whose quants are all the largest or the smallest.
fn extreme_weights(wt: DType, k: usize, rows: usize) -> Vec<u8> {
    let x = extreme_values(wt.block_size(), k * rows);
    let rb = wt.row_size(k).unwrap();
    let mut bytes = vec![0u8; rb * rows];
    for r in 0..rows {
        quantize_row(wt, &x[r * k..(r + 1) * k], &mut bytes[r * rb..(r + 1) * rb]).unwrap();
    }
    bytes
}

/// Q4_0 / Q5_0 and the K-quants at both x86 levels (`quant_rows8_x86`, `quant_rows8_k_x86`: groups
/// of eight rows, the portable kernel's float steps) equal the scalar level bit for bit: row counts
/// that end inside a group, the column counts of the decode kernels (< 4; the K-quants' one-row
/// kernel at AVX2) and of the prompt kernel
/// (groups of four and the rest), one block or many (several chunks of rows: 464 legacy blocks, 20
/// super-blocks), contiguous and strided activations, and weights whose quants are all at the
/// extremes (the AVX2 kernels' i16 sums of byte products at their largest).
#[test]
fn eight_row_kernels_equal_scalar() {
    let levels: Vec<SimdLevel> = SimdLevel::available()
        .into_iter()
        .filter(|l| matches!(l, SimdLevel::Avx2 | SimdLevel::Avx512))
        .collect();
    for (wt, level) in [DType::Q4_0, DType::Q5_0, DType::Q4K, DType::Q5K, DType::Q6K]
        .into_iter()
        .flat_map(|wt| levels.iter().map(move |&l| (wt, l)))
    {
        let long = if wt.block_size() == 32 { 464 } else { 20 };
        for (m, n, blocks) in [
            (1, 1, 1),
            (13, 3, 3),
            (8, 4, 28),
            (29, 11, 7),
            (70, 67, long),
        ] {
            let k = wt.block_size() * blocks;
            for (transposed, extreme) in [(false, false), (true, false), (false, true)] {
                let mut abuf = if extreme {
                    extreme_weights(wt, k, m)
                } else {
                    weights(wt, k, m).0
                };
                let a = TView::of_slice(&mut abuf, wt, [k, m, 1, 1]);
                let vals = if extreme {
                    extreme_values(wt.block_size(), k * n)
                } else {
                    rand_vec(k * n)
                };
                let (mut bbuf, blayout) = activations(&vals, [k, n, 1, 1], transposed);
                let b = TView::new(bbuf.as_mut_ptr(), blayout);
                let outs: Vec<Vec<f32>> = [SimdLevel::Scalar, level]
                    .into_iter()
                    .map(|level| {
                        let mut d: Vec<u8> = bytemuck::cast_slice(&vec![f32::NAN; m * n]).to_vec();
                        let dst = TView::of_slice(&mut d, DType::F32, [m, n, 1, 1]);
                        mul_mat_with(level, &a, &b, &dst).unwrap();
                        to_f32(&d)
                    })
                    .collect();
                assert!(
                    outs[0]
                        .iter()
                        .zip(&outs[1])
                        .all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{wt} m={m} n={n} k={k} t={transposed} extreme={extreme}: scalar {:?} {} {:?}",
                    outs[0],
                    level.name(),
                    outs[1]
                );
            }
        }
    }
}

#[test]
fn mul_mat_id_routing() {
    let mut rng = rand::thread_rng();
    for level in SimdLevel::available() {
        for wt in TYPES {
            for b1_is_one in [true, false] {
                let (k, m, e_count, n_used, t_count) = (k_for(wt, false), 17, 5, 3, 9);
                let (mut abuf, adeq) = weights(wt, k, m * e_count);
                let a = TView::of_slice(&mut abuf, wt, [k, m, e_count, 1]);
                let b1 = if b1_is_one { 1 } else { n_used };
                let bvals = rand_vec(k * b1 * t_count);
                let mut bbuf: Vec<u8> = bytemuck::cast_slice(&bvals).to_vec();
                let b = TView::of_slice(&mut bbuf, DType::F32, [k, b1, t_count, 1]);
                // Repeated and out-of-order expert ids; expert 4 may stay unused.
                let ids: Vec<i32> = (0..n_used * t_count).map(|_| rng.gen_range(0..4)).collect();
                let mut ibuf: Vec<u8> = bytemuck::cast_slice(&ids).to_vec();
                let idv = TView::of_slice(&mut ibuf, DType::I32, [n_used, t_count, 1, 1]);
                let mut dbuf: Vec<u8> =
                    bytemuck::cast_slice(&vec![f32::NAN; m * n_used * t_count]).to_vec();
                let dst = TView::of_slice(&mut dbuf, DType::F32, [m, n_used, t_count, 1]);
                mul_mat_id_with(level, &a, &b, &idv, &dst).unwrap();
                let got: Vec<f32> = to_f32(&dbuf);
                let mut want = vec![0f64; got.len()];
                let mut mag = 0.0;
                for t in 0..t_count {
                    for u in 0..n_used {
                        let r = (u % b1) + b1 * t;
                        let act = act_ref(wt, &bvals[r * k..(r + 1) * k]);
                        let e = ids[u + n_used * t] as usize;
                        for i in 0..m {
                            let w = &adeq[(e * m + i) * k..(e * m + i + 1) * k];
                            let (d, g) = dot_mag(w, &act);
                            want[i + m * (u + n_used * t)] = d;
                            mag += g;
                        }
                    }
                }
                let err = nmse(&got, &want, mag);
                assert!(
                    err <= bound(wt),
                    "{wt} at {} b1={b1}: nmse {err:e}",
                    level.name()
                );
            }
        }
    }
}

#[test]
fn errors_not_panics() {
    let mut abuf = vec![0u8; 64 * 4 * 4];
    let mut bbuf = vec![0u8; 64 * 4 * 4];
    let mut dbuf = vec![0u8; 4 * 4 * 4];
    let a = TView::of_slice(&mut abuf, DType::F32, [64, 4, 1, 1]);
    let b = TView::of_slice(&mut bbuf, DType::F32, [64, 4, 1, 1]);
    let bad_b = TView::of_slice(&mut bbuf, DType::F32, [32, 4, 1, 1]);
    let dst = TView::of_slice(&mut dbuf, DType::F32, [4, 4, 1, 1]);
    assert!(mul_mat(&a, &b, &dst).is_ok());
    assert!(mul_mat(&a, &bad_b, &dst).is_err());
    let ai = TView::of_slice(&mut abuf, DType::I32, [64, 4, 1, 1]);
    assert!(mul_mat(&ai, &b, &dst).is_err());
    let bq = TView::of_slice(&mut bbuf, DType::Q8_0, [64, 4, 1, 1]);
    assert!(mul_mat(&a, &bq, &dst).is_err());
    let mut ibuf: Vec<u8> = bytemuck::cast_slice(&[7i32; 4]).to_vec();
    let ids = TView::of_slice(&mut ibuf, DType::I32, [1, 4, 1, 1]);
    let e = TView::of_slice(&mut abuf, DType::F32, [64, 4, 1, 1]);
    let b1 = TView::of_slice(&mut bbuf, DType::F32, [64, 1, 4, 1]);
    let d1 = TView::of_slice(&mut dbuf, DType::F32, [4, 1, 4, 1]);
    assert!(mul_mat_id(&e, &b1, &ids, &d1).is_err());
    // K = 0: an empty sum.
    let mut empty = vec![0u8; 0];
    let a0 = TView::of_slice(&mut empty, DType::F32, [0, 4, 1, 1]);
    let b0 = TView::of_slice(&mut empty, DType::F32, [0, 9, 1, 1]);
    let mut dbuf: Vec<u8> = bytemuck::cast_slice(&[f32::NAN; 36]).to_vec();
    let d0 = TView::of_slice(&mut dbuf, DType::F32, [4, 9, 1, 1]);
    mul_mat(&a0, &b0, &d0).unwrap();
    assert!(to_f32(&dbuf).iter().all(|&v| v == 0.0));
}

#[test]
fn half_precision_activations() {
    for level in SimdLevel::available() {
        for wt in [DType::F32, DType::F16, DType::Q8_0, DType::Q4K] {
            for bt in [DType::F16, DType::BF16] {
                let (k, m, n) = (k_for(wt, false), 17, 9);
                let (mut abuf, adeq) = weights(wt, k, m);
                let a = TView::of_slice(&mut abuf, wt, [k, m, 1, 1]);
                // b rounded to half precision; the kernels see exactly these values.
                let mut bbuf = vec![0u8; bt.row_size(k).unwrap() * n];
                quantize_row(bt, &rand_vec(k * n), &mut bbuf).unwrap();
                let mut bvals = vec![0f32; k * n];
                dequantize_row(bt, &bbuf, &mut bvals).unwrap();
                let b = TView::of_slice(&mut bbuf, bt, [k, n, 1, 1]);
                let mut dbuf: Vec<u8> = bytemuck::cast_slice(&vec![f32::NAN; m * n]).to_vec();
                let dst = TView::of_slice(&mut dbuf, DType::F32, [m, n, 1, 1]);
                mul_mat_with(level, &a, &b, &dst).unwrap();
                let mut want = vec![0f64; m * n];
                let mut mag = 0.0;
                for j in 0..n {
                    let act = act_ref(wt, &bvals[j * k..(j + 1) * k]);
                    for i in 0..m {
                        let (d, g) = dot_mag(&adeq[i * k..(i + 1) * k], &act);
                        want[j * m + i] = d;
                        mag += g;
                    }
                }
                let e = nmse(&to_f32(&dbuf), &want, mag);
                assert!(
                    e <= bound(wt),
                    "{wt} x {bt} at {}: nmse {e:e}",
                    level.name()
                );
            }
        }
    }
}
