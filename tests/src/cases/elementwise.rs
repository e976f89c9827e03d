//! Cases of the element-wise and row-wise ops: unary, binary with broadcast, scale, clamp, GLU,
//! norms, sum_rows, concat, add_id.

use super::{CaseSet, FLOATS};
use crate::case::{Check, Gen, InputSpec};
use crate::check::{float_bound, Class};
use crate::reference::elementwise::{self as ew, BinOp};
use ggml_core::{DType, GluOp, UnaryOp};

const UNARY: [UnaryOp; 11] = [
    UnaryOp::Silu,
    UnaryOp::Gelu,
    UnaryOp::GeluErf,
    UnaryOp::Tanh,
    UnaryOp::Exp,
    UnaryOp::Sigmoid,
    UnaryOp::Neg,
    UnaryOp::Relu,
    UnaryOp::Sqr,
    UnaryOp::Sqrt,
    UnaryOp::Softplus,
];

pub fn add_cases(set: &mut CaseSet) {
    unary(set);
    binary(set);
    scale_clamp(set);
    glu(set);
    norms(set);
    concat(set);
    add_id(set);
}

fn unary(set: &mut CaseSet) {
    for u in UNARY {
        let (gen, class) = match u {
            UnaryOp::Sqrt => (Gen::Uniform(0.01, 4.0), Class::Math),
            UnaryOp::Exp => (Gen::Uniform(-4.0, 4.0), Class::Math),
            // Both tails: ~x far right, ~e^x far left.
            UnaryOp::Softplus => (Gen::Uniform(-24.0, 24.0), Class::Math),
            UnaryOp::Neg | UnaryOp::Relu | UnaryOp::Sqr => (Gen::Normal(1.5), Class::Exact),
            UnaryOp::Gelu | UnaryOp::GeluErf => (Gen::Normal(2.0), Class::Approx),
            _ => (Gen::Normal(2.0), Class::Math),
        };
        for t in FLOATS {
            for nc in [false, true] {
                let ne = set.shape();
                let view = set.layout(t, ne, nc);
                let input = InputSpec::new(t, ne).gen(gen).view(view);
                set.push(
                    ggml_core::Op::Unary(u).name(),
                    String::new(),
                    vec![input],
                    Check::Nmse(float_bound(class, t)),
                    move |g, x| g.unary(x[0], u),
                    move |x| Ok(ew::unary(u, &x[0])),
                );
            }
        }
    }
}

fn binary(set: &mut CaseSet) {
    let ops = [
        (BinOp::Add, "add"),
        (BinOp::Sub, "sub"),
        (BinOp::Mul, "mul"),
        (BinOp::Div, "div"),
    ];
    let types = [
        (DType::F32, DType::F32),
        (DType::F16, DType::F16),
        (DType::BF16, DType::BF16),
        (DType::F32, DType::F16),
    ];
    for (op, name) in ops {
        for (ta, tb) in types {
            for variant in 0..3 {
                let ne = set.shape();
                let bne = match variant {
                    0 => ne,
                    1 => [ne[0], 1, ne[2], 1],
                    _ => [1, ne[1], 1, ne[3]],
                };
                let nc = variant != 1;
                let a = InputSpec::new(ta, ne).view(set.layout(ta, ne, nc));
                let bgen = if op == BinOp::Div {
                    Gen::Uniform(0.5, 2.0)
                } else {
                    Gen::Normal(1.0)
                };
                let b = InputSpec::new(tb, bne)
                    .gen(bgen)
                    .view(set.layout(tb, bne, variant == 0));
                let params = format!("b broadcast {variant}");
                set.push(
                    name,
                    params,
                    vec![a, b],
                    Check::Nmse(float_bound(Class::Exact, ta)),
                    move |g, x| match op {
                        BinOp::Add => g.add(x[0], x[1]),
                        BinOp::Sub => g.sub(x[0], x[1]),
                        BinOp::Mul => g.mul(x[0], x[1]),
                        BinOp::Div => g.div(x[0], x[1]),
                    },
                    move |x| Ok(ew::binary(op, &x[0], &x[1])),
                );
            }
        }
    }
}

fn scale_clamp(set: &mut CaseSet) {
    for t in FLOATS {
        for nc in [false, true] {
            let ne = set.shape();
            let input = InputSpec::new(t, ne).view(set.layout(t, ne, nc));
            let (s, b) = if nc { (0.75f32, 0.0f32) } else { (-1.25, 0.5) };
            set.push(
                "scale",
                format!("scale {s} bias {b}"),
                vec![input],
                // x * s + b near zero is only as precise as its terms (about |b| large).
                Check::NmseOfTerms {
                    bound: float_bound(Class::Exact, t),
                    terms: b.abs() as f64,
                },
                move |g, x| g.scale_bias(x[0], s, b),
                move |x| Ok(ew::scale(&x[0], s, b)),
            );
            let ne = set.shape();
            let input = InputSpec::new(t, ne)
                .gen(Gen::Normal(2.0))
                .view(set.layout(t, ne, nc));
            set.push(
                "clamp",
                "[-1, 1.5]".into(),
                vec![input],
                Check::Nmse(float_bound(Class::Exact, t)),
                |g, x| g.clamp(x[0], -1.0, 1.5),
                |x| Ok(ew::clamp(&x[0], -1.0, 1.5)),
            );
        }
    }
}

fn glu(set: &mut CaseSet) {
    let ops = [
        GluOp::Swiglu,
        GluOp::Geglu,
        GluOp::GegluErf,
        GluOp::SwigluOai {
            alpha: 1.702,
            limit: 7.0,
        },
    ];
    for op in ops {
        let class = if matches!(op, GluOp::Geglu | GluOp::GegluErf) {
            Class::Approx
        } else {
            Class::Math
        };
        let gen = Gen::Normal(if matches!(op, GluOp::SwigluOai { .. }) {
            5.0
        } else {
            1.5
        });
        for t in FLOATS {
            let check = Check::Nmse(float_bound(class, t));
            // Separate gate and up (the gate possibly non-contiguous).
            let ne = set.shape();
            let gate = InputSpec::new(t, ne).gen(gen).view(set.layout(t, ne, true));
            let up = InputSpec::new(t, ne).gen(gen);
            set.push(
                ggml_core::Op::Glu { op, swapped: false }.name(),
                format!("{op:?} split"),
                vec![gate, up],
                check,
                move |g, x| g.glu(op, x[0], x[1]),
                move |x| Ok(ew::glu(op, &x[0], &x[1])),
            );
            for swapped in [false, true] {
                let mut ne = set.shape();
                ne[0] *= 2;
                let a = InputSpec::new(t, ne)
                    .gen(gen)
                    .view(set.layout(t, ne, swapped));
                set.push(
                    ggml_core::Op::Glu { op, swapped }.name(),
                    format!("{op:?} fused swapped={swapped}"),
                    vec![a],
                    check,
                    move |g, x| g.glu_fused(op, x[0], swapped),
                    move |x| Ok(ew::glu_fused(op, &x[0], swapped)),
                );
            }
        }
    }
}

fn norms(set: &mut CaseSet) {
    let check = Check::Nmse(float_bound(Class::Math, DType::F32));
    for nc in [false, true] {
        for eps in [1e-6f32, 1e-5] {
            let ne = set.shape();
            let a = InputSpec::new(DType::F32, ne)
                .gen(Gen::Normal(3.0))
                .view(set.layout(DType::F32, ne, nc));
            set.push(
                "rms_norm",
                format!("eps {eps}"),
                vec![a],
                check,
                move |g, x| g.rms_norm(x[0], eps),
                move |x| Ok(ew::rms_norm(&x[0], eps)),
            );
            let ne = set.shape();
            let a = InputSpec::new(DType::F32, ne)
                .gen(Gen::Uniform(-1.0, 5.0))
                .view(set.layout(DType::F32, ne, nc));
            set.push(
                "norm",
                format!("eps {eps}"),
                vec![a],
                check,
                move |g, x| g.norm(x[0], eps),
                move |x| Ok(ew::norm(&x[0], eps)),
            );
            let ne = set.shape();
            let a = InputSpec::new(DType::F32, ne).view(set.layout(DType::F32, ne, nc));
            set.push(
                "sum_rows",
                String::new(),
                vec![a],
                check,
                |g, x| g.sum_rows(x[0]),
                |x| Ok(ew::sum_rows(&x[0])),
            );
        }
    }
}

fn concat(set: &mut CaseSet) {
    for dim in 0..4 {
        for t in [DType::F32, DType::F16, DType::I32] {
            let a_ne = set.shape();
            let mut b_ne = a_ne;
            b_ne[dim] = set.pick(&[1, 2, 3]);
            let gen = if t == DType::I32 {
                Gen::Ids {
                    max: 1 << 20,
                    distinct: false,
                }
            } else {
                Gen::Normal(1.0)
            };
            let a = InputSpec::new(t, a_ne)
                .gen(gen)
                .view(set.layout(t, a_ne, dim % 2 == 1));
            let b = InputSpec::new(t, b_ne)
                .gen(gen)
                .view(set.layout(t, b_ne, dim >= 2));
            set.push(
                "concat",
                format!("dim {dim}"),
                vec![a, b],
                Check::Exact,
                move |g, x| g.concat(x[0], x[1], dim),
                move |x| Ok(ew::concat(&x[0], &x[1], dim)),
            );
        }
    }
}

fn add_id(set: &mut CaseSet) {
    for _ in 0..3 {
        let (ne0, n_used, n_tok, n_exp) = (
            set.pick(&[3, 32, 65]),
            set.pick(&[1, 2, 4]),
            set.pick(&[1, 5]),
            6,
        );
        let a = InputSpec::new(DType::F32, [ne0, n_used, n_tok, 1]);
        let b = InputSpec::new(DType::F32, [ne0, n_exp, 1, 1]);
        let ids = InputSpec::ids([n_used, n_tok, 1, 1], n_exp, true);
        set.push(
            "add_id",
            String::new(),
            vec![a, b, ids],
            Check::Nmse(float_bound(Class::Exact, DType::F32)),
            |g, x| g.add_id(x[0], x[1], x[2]),
            |x| Ok(ew::add_id(&x[0], &x[1], &x[2])),
        );
    }
}
