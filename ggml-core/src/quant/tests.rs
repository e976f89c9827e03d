//! Unit tests of the quant dispatch: round-trip error bounds on fresh random data, odd inputs,
//! argument checking and the reference dot products against an f64 dot of dequantized values.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::dtype::QK_K;

/// Every type `quantize_row` / `dequantize_row` support.
const TYPES: [DType; 14] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::Q8_1,
    DType::Q4K,
    DType::Q5K,
    DType::Q6K,
    DType::Q8K,
    DType::MXFP4,
];

/// Weight types with a reference dot product.
const WEIGHTS: [DType; 12] = DType::WEIGHTS;

/// A fresh random generator; its seed is printed so a failure can be replayed.
fn rng() -> (StdRng, u64) {
    let seed: u64 = rand::thread_rng().gen();
    (StdRng::seed_from_u64(seed), seed)
}

/// Standard normal samples (Box-Muller).
fn gaussian(rng: &mut StdRng, n: usize, sigma: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let u1: f64 = rng.gen_range(f64::EPSILON..1.0);
            let u2: f64 = rng.gen();
            ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32 * sigma
        })
        .collect()
}

fn round_trip(dtype: DType, x: &[f32]) -> Vec<f32> {
    let q = quantize_to_vec(dtype, x).unwrap();
    assert_eq!(q.len(), dtype.row_size(x.len()).unwrap());
    let y = dequantize_to_vec(dtype, &q).unwrap();
    assert_eq!(y.len(), x.len());
    y
}

/// sum (x - y)^2 / sum x^2.
fn nmse(x: &[f32], y: &[f32]) -> f64 {
    let err: f64 = x
        .iter()
        .zip(y)
        .map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2))
        .sum();
    let norm: f64 = x.iter().map(|&a| f64::from(a).powi(2)).sum();
    err / norm
}

/// Upper bound of the normalized MSE of one quantize/dequantize round trip of Gaussian data. The
/// bounds sit about 1.5x above what the reference quantizers reach (like ggml's test-quantize-fns
/// thresholds, they catch broken rounding, packing or scale handling, not small regressions).
fn nmse_bound(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 0.0,
        DType::F16 => 7e-8,
        DType::BF16 => 4.5e-6,
        DType::Q8_0 | DType::Q8_1 => 5e-5,
        DType::Q8K => 7.5e-5,
        DType::Q6K => 7e-4,
        DType::Q5_0 => 3e-3,
        DType::Q5_1 | DType::Q5K => 2.2e-3,
        DType::Q4_0 => 1.1e-2,
        DType::Q4_1 => 9.5e-3,
        DType::Q4K => 8e-3,
        DType::MXFP4 => 2.1e-2,
        DType::I32 => 0.0,
        DType::Q4_0G | DType::Q8_0G => nmse_bound(dtype.base()),
    }
}

#[test]
fn round_trip_error_is_bounded_on_random_data() {
    let (mut rng, seed) = rng();
    for dtype in TYPES {
        for sigma in [1e-3f32, 1.0, 40.0] {
            let x = gaussian(&mut rng, 16 * QK_K, sigma);
            let e = nmse(&x, &round_trip(dtype, &x));
            if std::env::var_os("QUANT_PRINT_NMSE").is_some() {
                eprintln!("{dtype} sigma {sigma}: nmse {e:.3e}");
            }
            assert!(
                e <= nmse_bound(dtype),
                "{dtype} sigma {sigma}: nmse {e:.3e} > {:.1e} (seed {seed})",
                nmse_bound(dtype)
            );
        }
    }
}

#[test]
fn round_trip_error_is_bounded_on_ggml_test_data() {
    // The synthetic rows of ggml's test-quantize-fns: 0.1 + 2 cos(i + offset).
    for dtype in TYPES {
        let x: Vec<f32> = (0..8 * QK_K)
            .map(|i| 0.1 + 2.0 * (i as f32 + 0.3).cos())
            .collect();
        let e = nmse(&x, &round_trip(dtype, &x));
        assert!(e <= nmse_bound(dtype), "{dtype}: nmse {e:.3e}");
    }
}

#[test]
fn zeros_stay_zero() {
    for dtype in TYPES {
        let y = round_trip(dtype, &[0.0; 2 * QK_K]);
        assert!(y.iter().all(|&v| v == 0.0), "{dtype}: {:?}", &y[..8]);
    }
}

#[test]
fn constant_rows_are_close() {
    for dtype in TYPES {
        for c in [0.7f32, -3.0, 1e-3, 1234.5] {
            // MXFP4 keeps 2 significant bits below its largest value 6 (a constant of 1.9 * 2^k ends
            // up as 1.5 * 2^k). At 1e-3 the f16 super-block scale of Q6_K (c / 4096) is
            // subnormal in f16, which costs it a few percent, as in ggml.
            let tol = match (dtype, c) {
                (DType::MXFP4, _) => 0.25,
                (_, c) if c.abs() < 0.01 => 0.05,
                _ => 0.02,
            };
            let y = round_trip(dtype, &[c; QK_K]);
            for &v in &y {
                assert!(
                    (v - c).abs() <= tol * c.abs(),
                    "{dtype} constant {c}: got {v}"
                );
            }
        }
    }
}

#[test]
fn large_magnitudes_stay_finite_and_accurate() {
    let (mut rng, seed) = rng();
    for dtype in TYPES {
        // 3e4 keeps every f16 field (Q4_1's min included) in range.
        let mut x = gaussian(&mut rng, 4 * QK_K, 1e4);
        x.iter_mut().for_each(|v| *v = v.clamp(-3e4, 3e4));
        let y = round_trip(dtype, &x);
        assert!(y.iter().all(|v| v.is_finite()), "{dtype} (seed {seed})");
        let e = nmse(&x, &y);
        assert!(
            e <= nmse_bound(dtype),
            "{dtype}: nmse {e:.3e} (seed {seed})"
        );
    }
    // Q8_K has an f32 scale, so it covers the whole f32 range.
    let x: Vec<f32> = (0..QK_K).map(|i| (i as f32 - 128.0) * 1e35).collect();
    let y = round_trip(DType::Q8K, &x);
    assert!(y.iter().all(|v| v.is_finite()));
    assert!(nmse(&x, &y) <= nmse_bound(DType::Q8K));
}

#[test]
fn bad_lengths_and_types_are_errors() {
    for dtype in TYPES {
        let (bs, ts) = (dtype.block_size(), dtype.type_size());
        let mut out = vec![0f32; 2 * bs];
        let mut bytes = vec![0u8; 2 * ts];
        for wrong in [2 * ts - 1, 2 * ts + 1, ts] {
            let err = dequantize_row(dtype, &vec![0u8; wrong], &mut out);
            assert!(
                matches!(err, Err(Error::Shape { .. })),
                "{dtype} dequant {wrong} bytes: {err:?}"
            );
            let err = quantize_row(dtype, &out, &mut vec![0u8; wrong]);
            assert!(
                matches!(err, Err(Error::Shape { .. })),
                "{dtype} quant {wrong} bytes: {err:?}"
            );
        }
        if bs > 1 {
            let err = dequantize_row(dtype, &bytes, &mut vec![0f32; 2 * bs - 1]);
            assert!(matches!(err, Err(Error::Shape { .. })), "{dtype}");
            let err = quantize_row(dtype, &vec![0f32; bs + 1], &mut bytes);
            assert!(matches!(err, Err(Error::Shape { .. })), "{dtype}");
            assert!(dequantize_to_vec(dtype, &bytes[1..]).is_err());
            assert!(quantize_to_vec(dtype, &[0.0; 3]).is_err());
        }
        // Empty rows are fine.
        dequantize_row(dtype, &[], &mut []).unwrap();
        quantize_row(dtype, &[], &mut []).unwrap();
        quantize_row(dtype, &out, &mut bytes).unwrap();
        dequantize_row(dtype, &bytes, &mut out).unwrap();
    }
    assert!(matches!(
        dequantize_row(DType::I32, &[0; 4], &mut [0.0]),
        Err(Error::UnsupportedType { .. })
    ));
    assert!(matches!(
        quantize_row(DType::I32, &[0.0], &mut [0; 4]),
        Err(Error::UnsupportedType { .. })
    ));
}

#[test]
fn vec_dot_types_follow_ggml() {
    use DType::*;
    let pairs = [
        (F32, F32),
        (F16, F16),
        (BF16, BF16),
        (Q4_0, Q8_0),
        (Q5_0, Q8_0),
        (Q8_0, Q8_0),
        (MXFP4, Q8_0),
        (Q4_1, Q8_1),
        (Q5_1, Q8_1),
        (Q4K, Q8K),
        (Q5K, Q8K),
        (Q6K, Q8K),
    ];
    for (w, a) in pairs {
        assert_eq!(vec_dot_type(w), a, "{w}");
    }
}

#[test]
fn vec_dot_ref_matches_f64_dot_of_dequantized_rows() {
    let (mut rng, seed) = rng();
    let n = 4 * QK_K;
    for weight in WEIGHTS {
        let act_type = vec_dot_type(weight);
        for sigma in [0.02f32, 3.0] {
            let mut wx = gaussian(&mut rng, n, sigma);
            if matches!(weight, DType::Q4_1 | DType::Q5_1 | DType::Q4K | DType::Q5K) {
                wx.iter_mut().for_each(|v| *v += sigma); // non-zero mins
            }
            let w = quantize_to_vec(weight, &wx).unwrap();
            let a = quantize_to_vec(act_type, &gaussian(&mut rng, n, 1.5)).unwrap();
            let (wd, ad) = (
                dequantize_to_vec(weight, &w).unwrap(),
                dequantize_to_vec(act_type, &a).unwrap(),
            );
            let exact: f64 = wd
                .iter()
                .zip(&ad)
                .map(|(&x, &y)| f64::from(x) * f64::from(y))
                .sum();
            let scale: f64 = wd
                .iter()
                .zip(&ad)
                .map(|(&x, &y)| (f64::from(x) * f64::from(y)).abs())
                .sum();
            // Q8_1's s is d * sum(q) rounded to f16, which the Q4_1/Q5_1 dots use for the min term.
            let rel = if act_type == DType::Q8_1 { 2e-3 } else { 2e-5 };
            let got = f64::from(vec_dot_ref(weight, &w, &a, n).unwrap());
            assert!(
                (got - exact).abs() <= rel * scale,
                "{weight} sigma {sigma}: {got} vs {exact} (scale {scale}, seed {seed})"
            );
        }
    }
}

#[test]
fn vec_dot_ref_rejects_bad_arguments() {
    let w = vec![0u8; DType::Q4_0.row_size(64).unwrap()];
    let a = vec![0u8; DType::Q8_0.row_size(64).unwrap()];
    assert_eq!(vec_dot_ref(DType::Q4_0, &w, &a, 64).unwrap(), 0.0);
    assert!(matches!(
        vec_dot_ref(DType::Q4_0, &w, &a[1..], 64),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(
        vec_dot_ref(DType::Q4_0, &w, &a, 32),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(
        vec_dot_ref(DType::Q4_0, &w, &a, 63),
        Err(Error::Shape { .. })
    ));
    // Q4_1 wants Q8_1 activations, which are 2 bytes longer per block than Q8_0.
    let w1 = vec![0u8; DType::Q4_1.row_size(64).unwrap()];
    assert!(vec_dot_ref(DType::Q4_1, &w1, &a, 64).is_err());
    for t in [DType::Q8_1, DType::Q8K, DType::I32] {
        let b = vec![0u8; t.row_size(256).unwrap()];
        assert!(
            matches!(
                vec_dot_ref(t, &b, &b, 256),
                Err(Error::UnsupportedType { .. })
            ),
            "{t}"
        );
    }
}
