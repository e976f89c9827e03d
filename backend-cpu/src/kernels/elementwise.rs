//! Element-wise kernels: binary ops with broadcasting (`add`, `sub`, `mul`, `div`), `add_id`, `scale`,
//! `clamp`, the unary functions and the gated linear units. Float sources of any stride; values are
//! computed in f32 and stored in the result type.

use super::rows::{load_row, par_rows, read_index, unravel, with_out_row, Scratch};
use super::vector::row_ops;
use crate::view::TView;
use ggml_core::{Error, GluOp, Result, UnaryOp};

fn shape(op: &'static str, msg: String) -> Error {
    Error::Shape { op, msg }
}

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_COEF_A: f32 = 0.044715;

/// Error function through the Chebyshev fit of erfc (fractional error below 1.2e-7).
#[inline]
pub fn erf(x: f32) -> f32 {
    // Evaluated in f64 so the result is accurate to f32 rounding.
    let z = (x as f64).abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let erfc = t * poly.exp();
    let r = 1.0 - erfc;
    (if x >= 0.0 { r } else { -r }) as f32
}

#[inline]
pub fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)).tanh())
}

#[inline]
pub fn gelu_erf(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

#[inline]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// The scalar function of a unary op.
#[inline]
pub fn unary_fn(op: UnaryOp, x: f32) -> f32 {
    match op {
        UnaryOp::Silu => silu(x),
        UnaryOp::Gelu => gelu(x),
        UnaryOp::GeluErf => gelu_erf(x),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Sigmoid => sigmoid(x),
        UnaryOp::Neg => -x,
        UnaryOp::Relu => x.max(0.0),
        UnaryOp::Sqr => x * x,
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Softplus => x.max(0.0) + (-x.abs()).exp().ln_1p(),
    }
}

/// Applies `f` row by row: `f(src_row, dst_row)` on f32 rows of equal shape.
pub fn map_rows<F>(src: &TView, dst: &TView, name: &'static str, f: F) -> Result<()>
where
    F: Fn(&[f32], &mut [f32]) + Sync,
{
    let (s, d) = (src.layout, dst.layout);
    if s.ne != d.ne {
        return Err(shape(name, format!("{:?} into {:?}", s.ne, d.ne)));
    }
    par_rows(d.nrows(), d.ne[0], |range| {
        let mut sa = Scratch::default();
        let mut so = Scratch::default();
        for r in range {
            let idx = unravel(r, &d.ne);
            // SAFETY: rows are in range; each destination row is written by one task only.
            unsafe {
                let x = load_row(src, idx, &mut sa.f)?;
                with_out_row(dst, idx, &mut so, |out| {
                    f(x, out);
                    Ok(())
                })?;
            }
        }
        Ok(())
    })
}

pub fn unary(op: UnaryOp, src: &TView, dst: &TView) -> Result<()> {
    map_rows(src, dst, "unary", |x, y| {
        y.iter_mut().zip(x).for_each(|(o, &v)| *o = unary_fn(op, v))
    })
}

pub fn scale(src: &TView, dst: &TView, s: f32, b: f32) -> Result<()> {
    map_rows(src, dst, "scale", |x, y| {
        y.iter_mut().zip(x).for_each(|(o, &v)| *o = v * s + b)
    })
}

pub fn clamp(src: &TView, dst: &TView, lo: f32, hi: f32) -> Result<()> {
    map_rows(src, dst, "clamp", |x, y| {
        y.iter_mut()
            .zip(x)
            .for_each(|(o, &v)| *o = v.max(lo).min(hi))
    })
}

/// Binary operators of `add`, `sub`, `mul`, `div`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
}

#[inline]
fn apply<F: Fn(f32, f32) -> f32>(out: &mut [f32], x: &[f32], y: &[f32], f: F) {
    if y.len() == x.len() {
        out.iter_mut()
            .zip(x.iter().zip(y))
            .for_each(|(o, (&a, &b))| *o = f(a, b));
    } else if y.len() == 1 {
        let b = y[0];
        out.iter_mut().zip(x).for_each(|(o, &a)| *o = f(a, b));
    } else {
        for (xs, os) in x.chunks(y.len()).zip(out.chunks_mut(y.len())) {
            os.iter_mut()
                .zip(xs.iter().zip(y))
                .for_each(|(o, (&a, &b))| *o = f(a, b));
        }
    }
}

/// `dst = a op b` with `b` repeated over `a` (each `b.ne[d]` divides `a.ne[d]`).
pub fn binary(op: BinOp, a: &TView, b: &TView, dst: &TView) -> Result<()> {
    let (la, lb, d) = (a.layout, b.layout, dst.layout);
    if la.ne != d.ne || (0..4).any(|k| lb.ne[k] == 0 || la.ne[k] % lb.ne[k] != 0) {
        return Err(shape(
            "binary",
            format!("{:?} op {:?} into {:?}", la.ne, lb.ne, d.ne),
        ));
    }
    par_rows(d.nrows(), d.ne[0], |range| {
        let (mut sa, mut sb, mut so) = (Scratch::default(), Scratch::default(), Scratch::default());
        for r in range {
            let idx = unravel(r, &d.ne);
            let bidx = [idx[0] % lb.ne[1], idx[1] % lb.ne[2], idx[2] % lb.ne[3]];
            // SAFETY: rows are in range; each destination row is written by one task only.
            unsafe {
                let x = load_row(a, idx, &mut sa.f)?;
                let y = load_row(b, bidx, &mut sb.f)?;
                with_out_row(dst, idx, &mut so, |out| {
                    match op {
                        BinOp::Add => apply(out, x, y, |p, q| p + q),
                        BinOp::Sub => apply(out, x, y, |p, q| p - q),
                        BinOp::Mul => apply(out, x, y, |p, q| p * q),
                        BinOp::Div => apply(out, x, y, |p, q| p / q),
                    }
                    Ok(())
                })?;
            }
        }
        Ok(())
    })
}

/// `dst[:, i1, i2] = a[:, i1, i2] + b[:, ids[i1, i2]]`.
pub fn add_id(a: &TView, b: &TView, ids: &TView, dst: &TView) -> Result<()> {
    let (la, lb, d) = (a.layout, b.layout, dst.layout);
    if la.ne != d.ne || lb.ne[0] != la.ne[0] || ids.ne()[0] != la.ne[1] || ids.ne()[1] != la.ne[2] {
        return Err(shape(
            "add_id",
            format!("a {:?}, b {:?}, ids {:?}", la.ne, lb.ne, ids.ne()),
        ));
    }
    par_rows(d.nrows(), d.ne[0], |range| {
        let (mut sa, mut sb, mut so) = (Scratch::default(), Scratch::default(), Scratch::default());
        for r in range {
            let idx = unravel(r, &d.ne);
            // SAFETY: indices are bounds-checked; each destination row is written by one task only.
            unsafe {
                let e = read_index(ids, [idx[0], idx[1], 0, 0], lb.ne[1], "add_id")?;
                let x = load_row(a, idx, &mut sa.f)?;
                let y = load_row(b, [e, 0, 0], &mut sb.f)?;
                with_out_row(dst, idx, &mut so, |out| {
                    apply(out, x, y, |p, q| p + q);
                    Ok(())
                })?;
            }
        }
        Ok(())
    })
}

#[inline]
fn glu_fn(op: GluOp, g: f32, u: f32) -> f32 {
    match op {
        GluOp::Swiglu => silu(g) * u,
        GluOp::Geglu => gelu(g) * u,
        GluOp::GegluErf => gelu_erf(g) * u,
        GluOp::SwigluOai { alpha, limit } => {
            let g = g.min(limit);
            let u = u.clamp(-limit, limit);
            g * sigmoid(alpha * g) * (u + 1.0)
        }
    }
}

/// `out[i] = silu(g[i]) * u[i]` with the `exp` of the row primitives over the whole row at once
/// (`e`: scratch), vectorised at the SIMD levels instead of one libm `expf` per element.
fn swiglu_row(g: &[f32], u: &[f32], e: &mut Vec<f32>, out: &mut [f32]) {
    e.clear();
    e.extend(g.iter().map(|&x| -x));
    row_ops().exp(e);
    out.iter_mut()
        .zip(g.iter().zip(u).zip(e.iter()))
        .for_each(|(o, ((&gv, &uv), &ev))| *o = gv / (1.0 + ev) * uv);
}

/// Gated linear unit: `dst = f(gate) * up`, from one source holding both halves along axis 0 (gate
/// first unless `swapped`), or from separate `gate` and `up` sources.
pub fn glu(op: GluOp, swapped: bool, a: &TView, up: Option<&TView>, dst: &TView) -> Result<()> {
    let (la, d) = (a.layout, dst.layout);
    let n = d.ne[0];
    let ok = match up {
        Some(u) => la.ne == d.ne && u.ne() == d.ne,
        None => la.ne[0] == 2 * n && la.ne[1..] == d.ne[1..],
    };
    if !ok {
        return Err(shape("glu", format!("{:?} into {:?}", la.ne, d.ne)));
    }
    par_rows(d.nrows(), n, |range| {
        let (mut sa, mut sb, mut so) = (Scratch::default(), Scratch::default(), Scratch::default());
        let mut se = Vec::new();
        for r in range {
            let idx = unravel(r, &d.ne);
            // SAFETY: rows are in range; each destination row is written by one task only.
            unsafe {
                let x = load_row(a, idx, &mut sa.f)?;
                let (g, u) = match up {
                    Some(u) => (x, load_row(u, idx, &mut sb.f)?),
                    None if swapped => (&x[n..], &x[..n]),
                    None => (&x[..n], &x[n..]),
                };
                with_out_row(dst, idx, &mut so, |out| {
                    if op == GluOp::Swiglu {
                        swiglu_row(g, u, &mut se, out);
                    } else {
                        out.iter_mut()
                            .zip(g.iter().zip(u))
                            .for_each(|(o, (&gv, &uv))| *o = glu_fn(op, gv, uv));
                    }
                    Ok(())
                })?;
            }
        }
        Ok(())
    })
}
