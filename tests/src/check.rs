//! Error bounds per type and op class, and the comparison of a backend's result with the reference.

use crate::case::Check;
use crate::dense::Dense;
use ggml_core::{DType, SortOrder};

/// How far an op's float computation may stray from exact arithmetic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// One rounding per element (copies, add, mul, scale, relu, ...).
    Exact,
    /// A few ulp per element: exp/tanh/sigmoid/sqrt, reductions (norms, sums, softmax).
    Math,
    /// Approximations ggml itself makes: fp16 GELU tables, rope angles at f32, attention in f16.
    Approx,
}

/// NMSE bound of a float result of type `out` from an op of class `class` (F32 data in and out unless
/// `out` is narrower: F16 rounds to 11 bits, NMSE about 8e-8; BF16 to 8 bits, about 5e-6).
pub fn float_bound(class: Class, out: DType) -> f64 {
    let f32_bound: f64 = match class {
        Class::Exact => 1e-12,
        Class::Math => 1e-9,
        Class::Approx => 1e-6,
    };
    let floor = match out {
        DType::F16 => 1e-6,
        DType::BF16 => 1e-4,
        _ => 0.0,
    };
    f32_bound.max(floor)
}

/// NMSE bound of mul_mat / mul_mat_id / flash attention against weights (or K/V) of type `w`,
/// measured against weights dequantized exactly. Backends may convert the activations to the
/// weight's dot type as ggml does: F16 (11 bits), BF16 (8 bits), Q8_0 / Q8_1 / Q8_K for quantized
/// weights, whose rounding gives NMSE about 4e-5 for normal data (see `tests::activation_bounds`).
pub fn weight_bound(w: DType) -> f64 {
    match w {
        DType::F32 => 1e-9,
        DType::F16 => 1e-6,
        DType::BF16 => 1e-4,
        _ => 5e-4,
    }
}

/// The check of a matrix product with weights of type `w` over rows of `k` elements: its results
/// sum `k` terms of about unit size (the suite draws N(0, 1) inputs), so they are about sqrt(k)
/// large, and one that cancels to near zero is only as precise as that (counted as that large).
pub fn product_check(w: DType, k: usize) -> Check {
    Check::NmseOfTerms {
        bound: weight_bound(w),
        terms: (k as f64).sqrt(),
    }
}

/// NMSE bound of storing F32 values into `target` (cpy, cast, set_rows), against the round trip
/// through ggml-core's reference quantizer: float targets must round to nearest exactly; quantized
/// ones may differ in the odd tie or in reciprocal precision, a small part of the format's own error.
pub fn store_bound(target: DType) -> f64 {
    match target {
        DType::F32 | DType::F16 | DType::BF16 | DType::I32 => 1e-12,
        DType::Q8_0 | DType::Q8_1 | DType::Q8K => 1e-6,
        _ => 1e-4,
    }
}

/// Normalized mean squared error sum((x - r)^2) / sum(r^2); plain MSE when the reference is ~0.
pub fn nmse(x: &[f64], r: &[f64]) -> f64 {
    nmse_floor(x, r, 0.0)
}

/// NMSE whose denominator is at least `n * floor^2`: values far below `floor` count as that large.
pub fn nmse_floor(x: &[f64], r: &[f64], floor: f64) -> f64 {
    let err: f64 = x.iter().zip(r).map(|(a, b)| (a - b) * (a - b)).sum();
    let n = r.len().max(1) as f64;
    let norm = r.iter().map(|b| b * b).sum::<f64>().max(n * floor * floor);
    if norm < 1e-20 * n {
        err / n
    } else {
        err / norm
    }
}

/// Magnitude below which a result of type `out` loses relative precision (16 times its smallest
/// normal: F16 results of 1e-5 are subnormal and only good to a few percent).
pub fn magnitude_floor(out: DType) -> f64 {
    match out {
        DType::F16 => 16.0 * 6.103_515_625e-5,
        _ => 16.0 * f32::MIN_POSITIVE as f64,
    }
}

/// Compares `got` (of type `out`) with `want` under `check`; `input0` is the op's first input (for
/// sort checks). Returns a message on failure.
pub fn compare(
    check: Check,
    out: DType,
    got: &Dense,
    want: &Dense,
    input0: &Dense,
) -> Result<String, String> {
    if got.ne != want.ne {
        return Err(format!("result shape {:?}, expected {:?}", got.ne, want.ne));
    }
    match check {
        Check::Nmse(bound) => nmse_check(bound, 0.0, out, got, want),
        Check::NmseOfTerms { bound, terms } => nmse_check(bound, terms, out, got, want),
        Check::Exact => {
            match (0..got.len()).find(|&k| got.data[k].to_bits() != want.data[k].to_bits()) {
                None => Ok("exact".into()),
                Some(k) => Err(format!(
                    "element {k} is {}, expected {}",
                    got.data[k], want.data[k]
                )),
            }
        }
        Check::Sorted(order) => check_rows(got, input0, |idx, vals| {
            let sorted = idx.windows(2).all(|w| match order {
                SortOrder::Asc => vals[w[0]] <= vals[w[1]],
                SortOrder::Desc => vals[w[0]] >= vals[w[1]],
            });
            if idx.len() == vals.len() && sorted {
                Ok(())
            } else {
                Err(format!("{idx:?} does not sort {vals:?} ({order:?})"))
            }
        }),
        Check::TopK => check_rows(got, input0, |idx, vals| {
            let mut desc: Vec<f64> = vals.to_vec();
            desc.sort_by(|a, b| b.total_cmp(a));
            let picked: Vec<f64> = idx.iter().map(|&i| vals[i]).collect();
            if picked == desc[..idx.len()] {
                Ok(())
            } else {
                Err(format!(
                    "{idx:?} picks {picked:?}, the top {} of {vals:?} are {:?}",
                    idx.len(),
                    &desc[..idx.len()]
                ))
            }
        }),
    }
}

/// Per row: indices must be distinct and in range, then `f(indices, input row)` decides.
fn check_rows(
    got: &Dense,
    input: &Dense,
    f: impl Fn(&[usize], &[f64]) -> Result<(), String>,
) -> Result<String, String> {
    for i3 in 0..got.ne[3] {
        for i2 in 0..got.ne[2] {
            for i1 in 0..got.ne[1] {
                let vals = input.row(i1, i2, i3);
                let raw = got.row(i1, i2, i3);
                let mut seen = vec![false; vals.len()];
                let mut idx = Vec::with_capacity(raw.len());
                for &v in raw {
                    if v < 0.0 || v as usize >= vals.len() || v.fract() != 0.0 || seen[v as usize] {
                        return Err(format!("row ({i1}, {i2}, {i3}): index {v} is out of range or repeated in {raw:?}"));
                    }
                    seen[v as usize] = true;
                    idx.push(v as usize);
                }
                f(&idx, vals).map_err(|e| format!("row ({i1}, {i2}, {i3}): {e}"))?;
            }
        }
    }
    Ok("order ok".into())
}

/// The largest differences, for failure messages.
fn first_diffs(got: &Dense, want: &Dense) -> String {
    let mut d: Vec<(f64, usize)> = (0..got.len())
        .map(|k| ((got.data[k] - want.data[k]).abs(), k))
        .collect();
    d.sort_by(|a, b| b.0.total_cmp(&a.0));
    let shown: Vec<String> = d
        .iter()
        .take(3)
        .map(|&(_, k)| {
            let ne = got.ne;
            let i = [
                k % ne[0],
                k / ne[0] % ne[1],
                k / ne[0] / ne[1] % ne[2],
                k / ne[0] / ne[1] / ne[2],
            ];
            format!("at {i:?} got {} want {}", got.data[k], want.data[k])
        })
        .collect();
    format!("worst: {}", shown.join("; "))
}

/// NMSE bound of flash attention with K/V of type `kv`: as mul_mat against `kv` weights (ggml's CPU
/// path converts Q to K's dot type and, for F16 V, accumulates in F16), never tighter than `Math`.
pub fn attn_bound(kv: DType) -> f64 {
    let accumulate = if kv == DType::F16 { 5e-6 } else { 0.0 };
    weight_bound(kv)
        .max(accumulate)
        .max(float_bound(Class::Math, DType::F32))
}

/// The NMSE check of `got` against `want` under `bound`, reference values counted as at least
/// `terms` large (see [`Check::NmseOfTerms`]).
fn nmse_check(
    bound: f64,
    terms: f64,
    out: DType,
    got: &Dense,
    want: &Dense,
) -> Result<String, String> {
    if let Some(k) = (0..got.len()).find(|&k| !got.data[k].is_finite() && want.data[k].is_finite())
    {
        return Err(format!(
            "element {k} is {} (reference {}): unwritten or overflowed output",
            got.data[k], want.data[k]
        ));
    }
    // A bound loose enough for F16 precision admits F16 intermediates (ggml's fp16 GELU
    // table), which also have F16's subnormal floor.
    let floor = if bound >= float_bound(Class::Exact, DType::F16) {
        magnitude_floor(DType::F16)
    } else {
        magnitude_floor(out)
    }
    .max(terms);
    let e = nmse_floor(&got.data, &want.data, floor);
    if e <= bound {
        Ok(format!("nmse {e:.3e}"))
    } else {
        Err(format!(
            "nmse {e:.3e} > bound {bound:.1e}; {}",
            first_diffs(got, want)
        ))
    }
}
