//! Tests of the element-wise, normalization, softmax, rope, attention and sort kernels.

use super::*;
use crate::kernels::attention::{flash_attn_ext, FaParams};
use crate::kernels::elementwise::{add_id, binary, erf, glu, unary, BinOp};
use crate::kernels::norm::{alibi_slope, norm, rms_norm, soft_max, sum_rows};
use crate::kernels::rope::{rope, yarn_corr_dims};
use crate::kernels::run_op;
use crate::kernels::sort::{argsort, top_k};
use ggml_core::{GluOp, Op, RopeMode, RopeParams, SortOrder, UnaryOp};

const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

#[test]
fn binary_broadcasts_over_permuted_sources() {
    let ne = [7, 5, 3, 2];
    for at in FLOATS {
        for bne in [[7, 1, 3, 1], [1, 5, 1, 2], ne] {
            for op in [BinOp::Add, BinOp::Sub, BinOp::Mul, BinOp::Div] {
                let mut a = source(at, ne, &rand_vals(210, -2.0, 2.0), true);
                let mut b = Host::new(DType::F16, bne, &rand_vals(bne.iter().product(), 0.5, 2.0));
                let mut dst = Host::poisoned(at, ne);
                binary(op, &a.view(), &b.view(), &dst.view()).unwrap();
                let (av, bv) = (a.values(), b.values());
                let want: Vec<f32> = (0..210)
                    .map(|e| {
                        let i = idx4(e, &ne);
                        let y = bv[i[0] % bne[0]
                            + bne[0]
                                * (i[1] % bne[1]
                                    + bne[1] * (i[2] % bne[2] + bne[2] * (i[3] % bne[3])))];
                        match op {
                            BinOp::Add => av[e] + y,
                            BinOp::Sub => av[e] - y,
                            BinOp::Mul => av[e] * y,
                            BinOp::Div => av[e] / y,
                        }
                    })
                    .collect();
                assert_close(&dst.values(), &rounded(at, 7, &want), tol_of(at));
            }
        }
    }
}

#[test]
fn add_id_picks_bias_rows() {
    let mut a = Host::new(DType::F32, [33, 4, 3, 1], &rand_vals(396, -1.0, 1.0));
    let mut b = Host::new(DType::F32, [33, 5, 1, 1], &rand_vals(165, -1.0, 1.0));
    let ids_v: Vec<f32> = (0..12).map(|i| ((i * 3) % 5) as f32).collect();
    let mut ids = Host::new(DType::I32, [4, 3, 1, 1], &ids_v);
    let mut dst = Host::poisoned(DType::F32, [33, 4, 3, 1]);
    add_id(&a.view(), &b.view(), &ids.view(), &dst.view()).unwrap();
    let (av, bv) = (a.values(), b.values());
    let want: Vec<f32> = (0..396)
        .map(|e| av[e] + bv[e % 33 + 33 * ids_v[e / 33] as usize])
        .collect();
    assert_close(&dst.values(), &want, 1e-6);
}

#[test]
fn erf_matches_known_values() {
    for (x, want) in [
        (0.0, 0.0),
        (0.5, 0.520_499_9),
        (1.0, 0.842_700_8),
        (2.0, 0.995_322_3),
        (-1.5, -0.966_105_1),
        (4.0, 0.999_999_98),
    ] {
        assert!((erf(x) - want).abs() < 2e-7, "erf({x}) = {}", erf(x));
    }
}

fn unary_ref(op: UnaryOp, x: f64) -> f64 {
    match op {
        UnaryOp::Silu => x / (1.0 + (-x).exp()),
        UnaryOp::Gelu => {
            0.5 * x
                * (1.0
                    + ((2.0 / std::f64::consts::PI).sqrt() * x * (1.0 + 0.044715 * x * x)).tanh())
        }
        UnaryOp::GeluErf => 0.5 * x * (1.0 + erf((x / std::f64::consts::SQRT_2) as f32) as f64),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Neg => -x,
        UnaryOp::Relu => x.max(0.0),
        UnaryOp::Sqr => x * x,
        UnaryOp::Sqrt => x.abs().sqrt(),
        UnaryOp::Softplus => x.max(0.0) + (-x.abs()).exp().ln_1p(),
    }
}

#[test]
fn unary_scale_clamp_on_every_float_type() {
    use UnaryOp::*;
    for t in FLOATS {
        for ne0 in [1, 7, 33] {
            let ne = [ne0, 3, 2, 1];
            let n = ne0 * 6;
            for op in [
                Silu, Gelu, GeluErf, Tanh, Exp, Sigmoid, Neg, Relu, Sqr, Sqrt, Softplus,
            ] {
                let vals: Vec<f32> = rand_vals(n, -3.0, 3.0)
                    .into_iter()
                    .map(|v| if op == Sqrt { v.abs() } else { v })
                    .collect();
                let mut a = source(t, ne, &vals, ne0 > 1);
                let mut dst = Host::poisoned(t, ne);
                unary(op, &a.view(), &dst.view()).unwrap();
                let want: Vec<f32> = a
                    .values()
                    .iter()
                    .map(|&x| unary_ref(op, x as f64) as f32)
                    .collect();
                assert_close(&dst.values(), &rounded(t, ne0, &want), tol_of(t) * 2.0);
            }
            let mut a = source(t, ne, &rand_vals(n, -3.0, 3.0), true);
            let mut dst = Host::poisoned(t, ne);
            run_op(
                &Op::Scale {
                    scale: 0.5,
                    bias: -1.0,
                },
                &[a.view()],
                &dst.view(),
            )
            .unwrap();
            let want: Vec<f32> = a.values().iter().map(|x| x * 0.5 - 1.0).collect();
            assert_close(&dst.values(), &rounded(t, ne0, &want), tol_of(t));
            run_op(
                &Op::Clamp {
                    min: -1.0,
                    max: 0.5,
                },
                &[a.view()],
                &dst.view(),
            )
            .unwrap();
            let want: Vec<f32> = a.values().iter().map(|x| x.clamp(-1.0, 0.5)).collect();
            assert_close(&dst.values(), &want, 0.0);
        }
    }
}

fn glu_ref(op: GluOp, g: f64, u: f64) -> f64 {
    match op {
        GluOp::Swiglu => unary_ref(UnaryOp::Silu, g) * u,
        GluOp::Geglu => unary_ref(UnaryOp::Gelu, g) * u,
        GluOp::GegluErf => unary_ref(UnaryOp::GeluErf, g) * u,
        GluOp::SwigluOai { alpha, limit } => {
            let g = g.min(limit as f64);
            let u = u.clamp(-limit as f64, limit as f64);
            g / (1.0 + (-alpha as f64 * g).exp()) * (u + 1.0)
        }
    }
}

#[test]
fn glu_fused_swapped_and_split() {
    for op in [
        GluOp::Swiglu,
        GluOp::Geglu,
        GluOp::GegluErf,
        GluOp::SwigluOai {
            alpha: 1.702,
            limit: 1.5,
        },
    ] {
        for n in [1, 7, 33] {
            let mut fused = Host::new(DType::F32, [2 * n, 3, 1, 1], &rand_vals(6 * n, -3.0, 3.0));
            let fv = fused.values();
            for swapped in [false, true] {
                let mut dst = Host::poisoned(DType::F32, [n, 3, 1, 1]);
                glu(op, swapped, &fused.view(), None, &dst.view()).unwrap();
                let want: Vec<f32> = (0..3 * n)
                    .map(|e| {
                        let (r, i) = (e / n, e % n);
                        let (g, u) = (fv[r * 2 * n + i], fv[r * 2 * n + n + i]);
                        let (g, u) = if swapped { (u, g) } else { (g, u) };
                        glu_ref(op, g as f64, u as f64) as f32
                    })
                    .collect();
                assert_close(&dst.values(), &want, 1e-5);
            }
            let ne = [n, 4, 2, 1];
            let mut g = Host::transposed(DType::F16, ne, &rand_vals(8 * n, -3.0, 3.0));
            let mut u = Host::new(DType::F16, ne, &rand_vals(8 * n, -3.0, 3.0));
            let mut dst = Host::poisoned(DType::F16, ne);
            glu(op, false, &g.view(), Some(&u.view()), &dst.view()).unwrap();
            let want: Vec<f32> = g
                .values()
                .iter()
                .zip(u.values())
                .map(|(&a, b)| glu_ref(op, a as f64, b as f64) as f32)
                .collect();
            assert_close(&dst.values(), &rounded(DType::F16, n, &want), 4e-3);
        }
    }
}

#[test]
fn norms_and_sum_rows() {
    for ne0 in [1, 7, 33] {
        let ne = [ne0, 5, 2, 1];
        let mut a = source(DType::F32, ne, &rand_vals(ne0 * 10, -2.0, 2.0), ne0 > 1);
        let av = a.values();
        let mut dst = Host::poisoned(DType::F32, ne);
        rms_norm(&a.view(), &dst.view(), 1e-5).unwrap();
        let mut want_rms = Vec::new();
        let mut want_norm = Vec::new();
        let mut want_sum = Vec::new();
        for row in av.chunks(ne0) {
            let ms = row.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / ne0 as f64;
            want_rms.extend(row.iter().map(|&x| (x as f64 / (ms + 1e-5).sqrt()) as f32));
            let mean = row.iter().map(|&x| x as f64).sum::<f64>() / ne0 as f64;
            let var = row.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / ne0 as f64;
            want_norm.extend(
                row.iter()
                    .map(|&x| ((x as f64 - mean) / (var + 1e-5).sqrt()) as f32),
            );
            want_sum.push(row.iter().map(|&x| x as f64).sum::<f64>() as f32);
        }
        assert_close(&dst.values(), &want_rms, 1e-5);
        norm(&a.view(), &dst.view(), 1e-5).unwrap();
        assert_close(&dst.values(), &want_norm, 1e-3);
        let mut sums = Host::poisoned(DType::F32, [1, 5, 2, 1]);
        sum_rows(&a.view(), &sums.view()).unwrap();
        assert_close(&sums.values(), &want_sum, 1e-5);
    }
}

#[test]
fn soft_max_with_mask_alibi_and_sinks() {
    let ne = [33, 4, 3, 2];
    let n = 33 * 24;
    for (mt, max_bias, with_sinks) in [
        (DType::F16, 8.0, true),
        (DType::F32, 0.0, false),
        (DType::F32, 0.0, true),
    ] {
        let mut a = Host::transposed(DType::F32, ne, &rand_vals(n, -3.0, 3.0));
        let mne = [33, 6, 3, 1];
        let mvals: Vec<f32> = rand_vals(33 * 18, -1.0, 1.0)
            .into_iter()
            .enumerate()
            .map(|(i, v)| if i % 5 == 2 { f32::NEG_INFINITY } else { v })
            .collect();
        let mut mask = Host::new(mt, mne, &mvals);
        let mut sinks = Host::new(DType::F32, [3, 1, 1, 1], &rand_vals(3, -1.0, 2.0));
        let mut dst = Host::poisoned(DType::F32, ne);
        let sv = sinks.values();
        let (sview, mview) = (sinks.view(), mask.view());
        soft_max(
            &a.view(),
            Some(&mview),
            if with_sinks { Some(&sview) } else { None },
            &dst.view(),
            0.7,
            max_bias,
        )
        .unwrap();
        let (av, mv) = (a.values(), mask.values());
        let mut want = Vec::new();
        for r in 0..24 {
            // The mask [33, 6, 3, 1] broadcasts over i3.
            let (i1, i2) = (r % 4, (r / 4) % 3);
            let slope = alibi_slope(max_bias, i2, 3) as f64;
            let mrow = &mv[(i1 + 6 * i2) * 33..][..33];
            let x: Vec<f64> = (0..33)
                .map(|i| av[r * 33 + i] as f64 * 0.7 + slope * mrow[i] as f64)
                .collect();
            let sink = if with_sinks {
                Some(sv[i2] as f64)
            } else {
                None
            };
            let max = x
                .iter()
                .copied()
                .chain(sink)
                .fold(f64::NEG_INFINITY, f64::max);
            let total: f64 = x.iter().chain(sink.as_ref()).map(|v| (v - max).exp()).sum();
            want.extend(x.iter().map(|v| ((v - max).exp() / total) as f32));
        }
        assert_close(&dst.values(), &want, 1e-5);
    }
    assert_eq!(alibi_slope(8.0, 0, 3), 2f32.powf(-4.0));
}

fn rope_ref(x: &[f32], pos: f32, p: &RopeParams, ff: Option<&[f32]>) -> Vec<f32> {
    let nd = p.n_dims;
    let corr = yarn_corr_dims(nd, p.n_ctx_orig, p.freq_base, p.beta_fast, p.beta_slow);
    let mut out = x.to_vec();
    for k in 0..nd / 2 {
        let theta_extrap = pos as f64 * (p.freq_base as f64).powf(-2.0 * k as f64 / nd as f64)
            / ff.map_or(1.0, |f| f[k] as f64);
        let interp = p.freq_scale as f64 * theta_extrap;
        let mut mscale = p.attn_factor as f64;
        let mut theta = interp;
        if p.ext_factor != 0.0 {
            let y = (k as f64 - corr[0] as f64) / ((corr[1] - corr[0]) as f64).max(0.001);
            let mix = (1.0 - y.clamp(0.0, 1.0)) * p.ext_factor as f64;
            theta = interp * (1.0 - mix) + theta_extrap * mix;
            mscale *= 1.0 + 0.1 * (1.0 / p.freq_scale as f64).ln();
        }
        let (c, s) = (theta.cos() * mscale, theta.sin() * mscale);
        let (i, j) = if p.mode == RopeMode::Normal {
            (2 * k, 2 * k + 1)
        } else {
            (k, k + nd / 2)
        };
        out[i] = (x[i] as f64 * c - x[j] as f64 * s) as f32;
        out[j] = (x[i] as f64 * s + x[j] as f64 * c) as f32;
    }
    out
}

#[test]
fn rope_modes_partial_factors_and_yarn() {
    let (hd, nh, nt) = (10, 3, 4);
    let ne = [hd, nh, nt, 1];
    for mode in [RopeMode::Normal, RopeMode::Neox] {
        for (yarn, with_ff, t) in [
            (false, false, DType::F32),
            (true, true, DType::F32),
            (true, false, DType::F16),
        ] {
            let mut p = RopeParams::simple(mode, 8, 10000.0);
            if yarn {
                p.n_ctx_orig = 64;
                p.freq_scale = 0.25;
                p.ext_factor = 1.0;
                p.attn_factor = 0.9;
            }
            let mut a = Host::transposed(t, ne, &rand_vals(hd * nh * nt, -1.0, 1.0));
            let positions = [0.0, 5.0, 17.0, 40.0];
            let mut pos = Host::new(DType::I32, [nt, 1, 1, 1], &positions);
            let ffv = rand_vals(4, 0.5, 4.0);
            let mut ff = Host::new(DType::F32, [4, 1, 1, 1], &ffv);
            let mut dst = Host::poisoned(t, ne);
            let ffview = ff.view();
            rope(
                &a.view(),
                &pos.view(),
                if with_ff { Some(&ffview) } else { None },
                &dst.view(),
                &p,
            )
            .unwrap();
            let av = a.values();
            let want: Vec<f32> = av
                .chunks(hd)
                .enumerate()
                .flat_map(|(r, x)| {
                    rope_ref(
                        x,
                        positions[r / nh],
                        &p,
                        if with_ff { Some(&ffv[..]) } else { None },
                    )
                })
                .collect();
            assert_close(
                &dst.values(),
                &rounded(t, hd, &want),
                tol_of(t).max(1e-4) * 2.0,
            );
        }
    }
}

/// F16 K/V of a call with one query row are read in place (`IN_PLACE_MAX_QUERIES`); every head's
/// result equals, bit for bit, the same query row's in a call of four rows (K/V converted once per
/// task): several chunks of keys, masked keys, a value row length outside whole vectors.
#[test]
fn flash_attn_f16_in_place_equals_converted() {
    let (d, dv, nkv, h, hkv) = (64, 40, 37, 6, 2);
    let q1 = rand_vals(d * h, -1.0, 1.0);
    let mut q4 = rand_vals(d * 4 * h, -1.0, 1.0);
    for hh in 0..h {
        q4[4 * hh * d..][..d].copy_from_slice(&q1[hh * d..][..d]);
    }
    let mut k = Host::new(
        DType::F16,
        [d, nkv, hkv, 1],
        &rand_vals(d * nkv * hkv, -1.0, 1.0),
    );
    let mut v = Host::new(
        DType::F16,
        [dv, nkv, hkv, 1],
        &rand_vals(dv * nkv * hkv, -1.0, 1.0),
    );
    let mvals: Vec<f32> = (0..nkv * 4)
        .map(|i| if i % 5 == 3 { f32::NEG_INFINITY } else { 0.0 })
        .collect();
    let mut mask = Host::new(DType::F16, [nkv, 4, 1, 1], &mvals);
    let p = FaParams {
        scale: 0.125,
        max_bias: 0.0,
        softcap: 0.0,
    };
    let mut run = |nq: usize, qvals: &[f32]| {
        let mut q = Host::new(DType::F32, [d, nq, h, 1], qvals);
        let mut dst = Host::poisoned(DType::F32, [dv, h, nq, 1]);
        let (kv, vv, mv) = (k.view(), v.view(), mask.view());
        flash_attn_ext(&q.view(), &kv, &vv, Some(&mv), None, &dst.view(), p).unwrap();
        dst.values()[..dv * h].to_vec()
    };
    let (one, four) = (run(1, &q1), run(4, &q4));
    assert!(
        one.iter()
            .zip(&four)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "in place {one:?}\nconverted {four:?}"
    );
}

#[test]
fn flash_attn_matches_naive_attention() {
    let (d, dv, nq, nkv, h, hkv) = (64, 32, 3, 7, 4, 2);
    for (kt, softcap, max_bias, with_sinks) in [
        (DType::F32, 0.0, 0.0, false),
        (DType::F16, 0.0, 0.0, true),
        (DType::Q8_0, 30.0, 0.0, false),
        (DType::Q4_0, 0.0, 4.0, true),
        (DType::BF16, 0.0, 0.0, true),
    ] {
        let mut q = Host::transposed(DType::F32, [d, nq, h, 1], &rand_vals(d * nq * h, -1.0, 1.0));
        let mut k = Host::new(kt, [d, nkv, hkv, 1], &rand_vals(d * nkv * hkv, -1.0, 1.0));
        let mut v = Host::new(kt, [dv, nkv, hkv, 1], &rand_vals(dv * nkv * hkv, -1.0, 1.0));
        let mvals: Vec<f32> = (0..nkv * 4)
            .map(|i| {
                if i % nkv > (i / nkv) + 4 {
                    f32::NEG_INFINITY
                } else {
                    (i % 3) as f32 * -0.5
                }
            })
            .collect();
        let mut mask = Host::new(DType::F16, [nkv, 4, 1, 1], &mvals);
        let mut sinks = Host::new(DType::F32, [h, 1, 1, 1], &rand_vals(h, -1.0, 1.0));
        let mut dst = Host::poisoned(DType::F32, [dv, h, nq, 1]);
        let p = FaParams {
            scale: 0.125,
            max_bias,
            softcap,
        };
        let sview = sinks.view();
        flash_attn_ext(
            &q.view(),
            &k.view(),
            &v.view(),
            Some(&mask.view()),
            if with_sinks { Some(&sview) } else { None },
            &dst.view(),
            p,
        )
        .unwrap();
        let (qv, kv, vv, mv, sv) = (
            q.values(),
            k.values(),
            v.values(),
            mask.values(),
            sinks.values(),
        );
        let mut want = vec![0f32; dv * h * nq];
        for iq in 0..nq {
            for hh in 0..h {
                let hk = hh / (h / hkv);
                let slope = alibi_slope(max_bias, hh, h) as f64;
                let qr = &qv[(iq + nq * hh) * d..][..d];
                let scores: Vec<f64> = (0..nkv)
                    .map(|j| {
                        let kr = &kv[(j + nkv * hk) * d..][..d];
                        let mut s = qr
                            .iter()
                            .zip(kr)
                            .map(|(&a, &b)| a as f64 * b as f64)
                            .sum::<f64>()
                            * 0.125;
                        if softcap != 0.0 {
                            s = softcap as f64 * (s / softcap as f64).tanh();
                        }
                        s + slope * mv[iq * nkv + j] as f64
                    })
                    .collect();
                let sink = with_sinks.then(|| sv[hh] as f64);
                let max = scores
                    .iter()
                    .copied()
                    .chain(sink)
                    .fold(f64::NEG_INFINITY, f64::max);
                let total: f64 = scores
                    .iter()
                    .chain(sink.as_ref())
                    .map(|s| (s - max).exp())
                    .sum();
                for c in 0..dv {
                    let acc: f64 = (0..nkv)
                        .map(|j| (scores[j] - max).exp() * vv[(j + nkv * hk) * dv + c] as f64)
                        .sum();
                    want[(hh + h * iq) * dv + c] = (acc / total) as f32;
                }
            }
        }
        assert_close(&dst.values(), &want, 1e-4);
    }
}

#[test]
fn argsort_is_stable_and_top_k_prefers_lower_index() {
    for ne0 in [1, 7, 33] {
        let ne = [ne0, 4, 3, 1];
        let vals: Vec<f32> = rand_vals(ne0 * 12, 0.0, 5.0)
            .into_iter()
            .map(|v| v.floor())
            .collect();
        let mut a = source(DType::F32, ne, &vals, ne0 > 1);
        let av = a.values();
        for order in [SortOrder::Asc, SortOrder::Desc] {
            let mut dst = Host::poisoned(DType::I32, ne);
            argsort(&a.view(), &dst.view(), order).unwrap();
            let got = dst.values();
            for (r, row) in av.chunks(ne0).enumerate() {
                let mut idx: Vec<usize> = (0..ne0).collect();
                match order {
                    SortOrder::Asc => idx.sort_by(|&x, &y| row[x].partial_cmp(&row[y]).unwrap()),
                    SortOrder::Desc => idx.sort_by(|&x, &y| row[y].partial_cmp(&row[x]).unwrap()),
                }
                let want: Vec<f32> = idx.iter().map(|&i| i as f32).collect();
                assert_eq!(&got[r * ne0..(r + 1) * ne0], &want[..]);
            }
        }
        for k in [1, ne0.div_ceil(2), ne0] {
            let mut dst = Host::poisoned(DType::I32, [k, 4, 3, 1]);
            top_k(&a.view(), &dst.view(), k).unwrap();
            let got = dst.values();
            for (r, row) in av.chunks(ne0).enumerate() {
                let mut idx: Vec<usize> = (0..ne0).collect();
                idx.sort_by(|&x, &y| row[y].partial_cmp(&row[x]).unwrap());
                let want: Vec<f32> = idx[..k].iter().map(|&i| i as f32).collect();
                assert_eq!(&got[r * k..(r + 1) * k], &want[..]);
            }
        }
    }
}
