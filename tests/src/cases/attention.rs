//! Cases of the attention ops: rope (normal, NeoX, YaRN, frequency factors, partial rotation),
//! soft_max (mask F32/F16 with broadcast, ALiBi, sinks) and flash_attn_ext (GQA, mask, softcap,
//! ALiBi, sinks; K/V in F32, F16, BF16, Q8_0).

use super::CaseSet;
use crate::case::{Check, Gen, InputSpec, ViewKind};
use crate::check::{attn_bound, float_bound, Class};
use crate::reference::attention::{self as at, AttnParams};
use ggml_core::{DType, RopeMode, RopeParams};

pub fn add_cases(set: &mut CaseSet) {
    rope(set);
    soft_max(set);
    flash_attn(set);
}

/// A flash_attn_ext case over `inputs` (q, k, v, then an optional mask and optional sinks) with K/V
/// of type `kv`, checked against the float64 reference.
pub fn push_flash_attn(
    set: &mut CaseSet,
    params: String,
    inputs: Vec<InputSpec>,
    kv: DType,
    p: AttnParams,
) {
    set.push(
        "flash_attn_ext",
        params,
        inputs,
        Check::Nmse(attn_bound(kv)),
        move |g, x| {
            g.flash_attn_ext(
                x[0],
                x[1],
                x[2],
                x.get(3).copied(),
                x.get(4).copied(),
                p.scale,
                p.max_bias,
                p.softcap,
            )
        },
        move |x| {
            Ok(at::flash_attn_ext(
                &x[0],
                &x[1],
                &x[2],
                x.get(3),
                x.get(4),
                p,
            ))
        },
    );
}

fn rope(set: &mut CaseSet) {
    for mode in [RopeMode::Normal, RopeMode::Neox] {
        for t in [DType::F32, DType::F16] {
            for variant in ["plain", "partial", "yarn", "freq_factors"] {
                let head_dim = set.pick(&[32, 64, 80]);
                let n_dims = if variant == "partial" {
                    head_dim / 2
                } else {
                    head_dim
                };
                let mut p = RopeParams::simple(mode, n_dims, set.pick(&[10000.0, 500000.0]));
                if variant == "yarn" {
                    p = RopeParams {
                        n_ctx_orig: 4096,
                        freq_scale: 0.25,
                        ext_factor: 1.0,
                        attn_factor: 0.9,
                        beta_fast: 32.0,
                        beta_slow: 1.0,
                        ..p
                    };
                }
                let ne = [head_dim, set.pick(&[1, 3, 4]), set.pick(&[1, 2, 7]), 1];
                let view = if variant == "plain" {
                    ViewKind::Contig
                } else {
                    set.layout(t, ne, true)
                };
                let mut inputs = vec![
                    InputSpec::new(t, ne).view(view),
                    InputSpec::ids([ne[2], 1, 1, 1], 96, false),
                ];
                let with_ff = variant == "freq_factors";
                if with_ff {
                    inputs.push(
                        InputSpec::new(DType::F32, [n_dims / 2, 1, 1, 1])
                            .gen(Gen::Uniform(1.0, 8.0)),
                    );
                }
                set.push(
                    "rope",
                    format!("{mode:?} {variant} n_dims {n_dims} base {}", p.freq_base),
                    inputs,
                    Check::Nmse(float_bound(Class::Approx, t)),
                    move |g, x| g.rope(x[0], x[1], x.get(2).copied(), p),
                    move |x| Ok(at::rope(&x[0], &x[1], x.get(2), &p)),
                );
            }
        }
    }
}

fn soft_max(set: &mut CaseSet) {
    let variants = [
        "plain",
        "mask f32",
        "mask f16",
        "alibi",
        "sinks",
        "mask per head",
    ];
    for variant in variants {
        for _ in 0..2 {
            let ne = [
                set.pick(&[1, 7, 32, 67]),
                set.pick(&[1, 3, 5]),
                set.pick(&[1, 4, 6]),
                set.pick(&[1, 2]),
            ];
            let scale = set.pick(&[1.0f32, 0.125]);
            let max_bias = if variant == "alibi" { 8.0 } else { 0.0 };
            let mask_t = if variant == "mask f32" {
                DType::F32
            } else {
                DType::F16
            };
            let mask_ne = [
                ne[0],
                ne[1] + set.pick(&[0, 2]),
                if variant == "mask per head" { ne[2] } else { 1 },
                1,
            ];
            let a = InputSpec::new(DType::F32, ne)
                .gen(Gen::Normal(3.0))
                .view(set.layout(DType::F32, ne, variant == "sinks"));
            let mut inputs = vec![a];
            if variant != "plain" {
                inputs.push(InputSpec::new(mask_t, mask_ne).gen(Gen::Mask));
            }
            if variant == "sinks" {
                inputs.push(InputSpec::new(DType::F32, [ne[2], 1, 1, 1]).gen(Gen::Normal(2.0)));
            }
            set.push(
                "soft_max",
                format!("{variant} scale {scale}"),
                inputs,
                Check::Nmse(float_bound(Class::Math, DType::F32)),
                move |g, x| g.soft_max(x[0], x.get(1).copied(), x.get(2).copied(), scale, max_bias),
                move |x| Ok(at::soft_max(&x[0], x.get(1), x.get(2), scale, max_bias)),
            );
        }
    }
}

fn flash_attn(set: &mut CaseSet) {
    let variants = ["plain", "mask", "gqa", "softcap", "alibi", "sinks"];
    for kv in [DType::F32, DType::F16, DType::BF16, DType::Q8_0] {
        for variant in variants {
            let d = set.pick(&[32, 64]);
            let dv = if kv == DType::F16 && variant == "mask" {
                32
            } else {
                d
            };
            let (n_q, n_kv, n_seq) = (
                set.pick(&[1, 4, 7]),
                set.pick(&[7, 32, 33]),
                if variant == "plain" { 2 } else { 1 },
            );
            let n_head = 4;
            let n_head_kv = if variant == "gqa" {
                set.pick(&[1, 2])
            } else {
                n_head
            };
            let p = AttnParams {
                scale: 1.0 / (d as f32).sqrt(),
                max_bias: if variant == "alibi" { 8.0 } else { 0.0 },
                softcap: if variant == "softcap" { 2.0 } else { 0.0 },
            };
            let q_ne = [d, n_q, n_head, n_seq];
            let mut inputs = vec![
                InputSpec::new(DType::F32, q_ne).view(set.row_layout(
                    DType::F32,
                    q_ne,
                    variant == "gqa",
                )),
                InputSpec::new(kv, [d, n_kv, n_head_kv, n_seq]),
                InputSpec::new(kv, [dv, n_kv, n_head_kv, n_seq]),
            ];
            if variant != "plain" {
                let mask_t = if variant == "alibi" {
                    DType::F32
                } else {
                    DType::F16
                };
                inputs.push(
                    InputSpec::new(mask_t, [n_kv, n_q + set.pick(&[0, 3]), 1, 1]).gen(Gen::Mask),
                );
            }
            if variant == "sinks" {
                inputs.push(InputSpec::new(DType::F32, [n_head, 1, 1, 1]).gen(Gen::Normal(2.0)));
            }
            let params = format!(
                "{variant} kv {kv} scale {} softcap {} max_bias {}",
                p.scale, p.softcap, p.max_bias
            );
            push_flash_attn(set, params, inputs, kv, p);
        }
    }
}
