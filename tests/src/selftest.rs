//! Tests of the suite itself, without a backend: every generated case builds a valid graph whose
//! result shape the reference reproduces; reference ops agree with independent compositions; the
//! comparisons reject wrong results; the quantized-matmul bounds cover ggml's activation rounding.

use crate::case::{draw_leaf, Check, Gen};
use crate::cases::{all_cases, mix};
use crate::check::{compare, nmse, weight_bound};
use crate::codec::{decode, encode, round_trip};
use crate::dense::Dense;
use crate::reference::attention::{flash_attn_ext, rope, soft_max, AttnParams};
use crate::reference::matrix::{argsort, get_rows, mul_mat, set_rows};
use crate::runner::build;
use ggml_core::quant::vec_dot_type;
use ggml_core::{DType, RopeMode, RopeParams, SortOrder};
use rand::rngs::StdRng;
use rand::SeedableRng;

fn normal(seed: u64, ne: [usize; 4]) -> Dense {
    draw_leaf(&mut StdRng::seed_from_u64(seed), Gen::Normal(1.0), ne)
}

#[test]
fn every_case_builds_and_its_reference_matches_the_graph_shape() {
    let seed = crate::seed();
    let cases = all_cases(seed);
    assert!(cases.len() >= 300, "only {} cases", cases.len());
    for (i, case) in cases.iter().enumerate() {
        let built = build(case).unwrap_or_else(|e| {
            panic!(
                "case #{i} {} does not build: {e} (seed {seed})",
                case.describe()
            )
        });
        let want =
            (case.reference)(&built.values).unwrap_or_else(|e| panic!("case #{i} reference: {e}"));
        assert_eq!(
            want.ne,
            built.graph.layout(built.out).ne,
            "case #{i} {} (seed {seed})",
            case.describe()
        );
        if matches!(case.check, Check::Nmse(_) | Check::NmseOfTerms { .. }) {
            assert!(
                want.data.iter().all(|v| v.is_finite()),
                "case #{i} {}: reference not finite (seed {seed})",
                case.describe()
            );
        }
    }
}

#[test]
fn flash_attention_equals_softmax_of_scaled_scores_times_v() {
    let (d, n_q, n_kv, h) = (8, 3, 5, 2);
    let q = normal(1, [d, n_q, h, 1]);
    let k = normal(2, [d, n_kv, 1, 1]);
    let v = normal(3, [d, n_kv, 1, 1]);
    let mut mask = Dense::zeros([n_kv, n_q, 1, 1]);
    mask.set([4, 1, 0, 0], f64::NEG_INFINITY);
    let sinks = Dense::from_vec([h, 1, 1, 1], vec![0.3, -1.0]);
    let p = AttnParams {
        scale: 0.4,
        max_bias: 0.0,
        softcap: 0.0,
    };
    let got = flash_attn_ext(&q, &k, &v, Some(&mask), Some(&sinks), p);
    for head in 0..h {
        let qh = q.slice(2, head, 1);
        let scores = mul_mat(&k, &qh); // [n_kv, n_q]
        let probs = soft_max(
            &scores,
            Some(&mask),
            Some(&sinks.slice(0, head, 1)),
            p.scale,
            0.0,
        );
        let out = mul_mat(&v.transpose(), &probs); // [d, n_q]
        for iq in 0..n_q {
            for i in 0..d {
                assert!((got.at([i, head, iq, 0]) - out.at([i, iq, 0, 0])).abs() < 1e-12);
            }
        }
    }
}

#[test]
fn softmax_rows_sum_to_one_and_rope_is_a_rotation() {
    let a = normal(4, [9, 4, 3, 1]);
    let s = soft_max(&a, None, None, 0.7, 0.0);
    for r in 0..4 {
        assert!((s.row(r, 1, 0).iter().sum::<f64>() - 1.0).abs() < 1e-12);
    }
    let x = normal(5, [16, 2, 3, 1]);
    let pos = Dense::from_vec([3, 1, 1, 1], vec![0.0, 5.0, 17.0]);
    for mode in [RopeMode::Normal, RopeMode::Neox] {
        let y = rope(&x, &pos, None, &RopeParams::simple(mode, 12, 10000.0));
        assert_eq!(
            y.slice(2, 0, 1),
            x.slice(2, 0, 1),
            "position 0 is the identity"
        );
        assert_eq!(
            y.slice(0, 12, 4),
            x.slice(0, 12, 4),
            "dimensions past n_dims pass through"
        );
        for t in 1..3 {
            let n = |d: &Dense| d.row(1, t, 0).iter().map(|v| v * v).sum::<f64>();
            assert!((n(&y) - n(&x)).abs() < 1e-9, "rotation keeps the norm");
        }
    }
}

#[test]
fn set_rows_then_get_rows_returns_the_rows() {
    let dst = normal(6, [5, 6, 2, 1]);
    let src = normal(7, [5, 3, 2, 1]);
    let ids = Dense::from_vec([3, 1, 1, 1], vec![4.0, 0.0, 2.0]);
    let out = set_rows(&dst, &src, &ids);
    let back = get_rows(
        &out,
        &Dense::from_vec([3, 2, 1, 1], vec![4.0, 0.0, 2.0, 4.0, 0.0, 2.0]),
    );
    assert_eq!(back, src);
    assert_eq!(out.row(1, 0, 0), dst.row(1, 0, 0));
}

fn compare_f32(check: Check, got: &Dense, want: &Dense, input0: &Dense) -> Result<String, String> {
    compare(check, DType::F32, got, want, input0)
}

#[test]
fn comparisons_reject_wrong_results() {
    let want = normal(8, [7, 3, 1, 1]);
    let mut got = want.clone();
    assert!(compare_f32(Check::Nmse(1e-12), &got, &want, &want).is_ok());
    got.data[5] = f64::NAN;
    assert!(
        compare_f32(Check::Nmse(1.0), &got, &want, &want).is_err(),
        "NaN must fail whatever the bound"
    );
    let off = want.map(|x| x * 1.001);
    assert!(compare_f32(Check::Nmse(1e-7), &off, &want, &want).is_err());
    assert!((nmse(&off.data, &want.data) - 1e-6).abs() < 1e-9);

    // An F16 result in the subnormal range is judged against the F16 magnitude floor.
    let tiny = Dense::from_vec([1, 1, 1, 1], vec![-5.0e-6]);
    let tiny_got = Dense::from_vec([1, 1, 1, 1], vec![-4.94e-6]);
    assert!(compare(Check::Nmse(1e-6), DType::F16, &tiny_got, &tiny, &tiny).is_ok());
    assert!(compare(Check::Nmse(1e-9), DType::F32, &tiny_got, &tiny, &tiny).is_err());
    // A result that cancels to near zero is judged against the size of its terms.
    let near_zero = Dense::from_vec([1, 1, 1, 1], vec![0.005832567811012268]);
    let rounded = Dense::from_vec([1, 1, 1, 1], vec![0.005832552909851074]);
    assert!(compare(
        Check::Nmse(1e-12),
        DType::F32,
        &rounded,
        &near_zero,
        &near_zero
    )
    .is_err());
    let terms = Check::NmseOfTerms {
        bound: 1e-12,
        terms: 0.5,
    };
    assert!(compare(terms, DType::F32, &rounded, &near_zero, &near_zero).is_ok());
    let wrong = Dense::from_vec([1, 1, 1, 1], vec![0.0059]);
    assert!(compare(terms, DType::F32, &wrong, &near_zero, &near_zero).is_err());

    let vals = Dense::from_vec([4, 1, 1, 1], vec![2.0, 5.0, 5.0, 1.0]);
    let tie_swapped = Dense::from_vec([4, 1, 1, 1], vec![2.0, 1.0, 0.0, 3.0]);
    assert_eq!(
        argsort(&vals, SortOrder::Desc).data,
        vec![1.0, 2.0, 0.0, 3.0]
    );
    assert!(compare_f32(
        Check::Sorted(SortOrder::Desc),
        &tie_swapped,
        &argsort(&vals, SortOrder::Desc),
        &vals
    )
    .is_ok());
    assert!(compare_f32(
        Check::Sorted(SortOrder::Asc),
        &tie_swapped,
        &tie_swapped,
        &vals
    )
    .is_err());
    let repeated = Dense::from_vec([2, 1, 1, 1], vec![1.0, 1.0]);
    assert!(compare_f32(Check::TopK, &repeated, &repeated, &vals).is_err());
    let top2 = Dense::from_vec([2, 1, 1, 1], vec![2.0, 1.0]);
    assert!(compare_f32(Check::TopK, &top2, &top2, &vals).is_ok());
    let wrong = Dense::from_vec([2, 1, 1, 1], vec![2.0, 0.0]);
    assert!(compare_f32(Check::TopK, &wrong, &top2, &vals).is_err());
}

#[test]
fn codecs_round_trip_through_every_type() {
    let x = normal(9, [256, 2, 1, 1]);
    assert!(
        encode(DType::Q4K, [64, 1, 1, 1], &x.data[..64]).is_err(),
        "a partial block is refused"
    );
    for t in DType::WEIGHTS {
        let r = round_trip(t, &x).unwrap();
        assert_eq!(round_trip(t, &r).unwrap().ne, x.ne);
        assert!(nmse(&r.data, &x.data) < 1e-1, "{t}");
    }
    let ids = Dense::from_vec([3, 1, 1, 1], vec![0.0, 7.0, -2.0]);
    assert_eq!(
        decode(
            DType::I32,
            ids.ne,
            &encode(DType::I32, ids.ne, &ids.data).unwrap()
        )
        .unwrap(),
        ids
    );
}

/// Bounds are honest: quantizing activations to the weight's dot type as ggml does (and rounding to
/// F16/BF16 for those weights) stays well inside `weight_bound`, over several random draws.
#[test]
fn activation_bounds() {
    for w in DType::WEIGHTS {
        let k = 256;
        let mut worst = 0.0f64;
        for trial in 0..4 {
            let s = mix(trial + 100 * w.gguf_id() as u64);
            let a = round_trip(w, &normal(s, [k, 16, 1, 1])).unwrap();
            let b = normal(s + 1, [k, 8, 1, 1]);
            let exact = mul_mat(&a, &b);
            let act = match vec_dot_type(w) {
                DType::F32 => b.clone(),
                t => round_trip(t, &b).unwrap(),
            };
            worst = worst.max(nmse(&mul_mat(&a, &act).data, &exact.data));
        }
        assert!(
            worst * 4.0 < weight_bound(w) || w == DType::F32,
            "{w}: activation rounding gives nmse {worst:.2e}, bound {:.1e}",
            weight_bound(w)
        );
        println!(
            "{w}: activation rounding nmse {worst:.2e}, bound {:.1e}",
            weight_bound(w)
        );
    }
}
