//! Element-wise and row-wise reference ops: unary functions, broadcast binary ops, scale, clamp,
//! gated linear units, norms, row sums, concat and add_id.

use crate::dense::Dense;
use ggml_core::{GluOp, UnaryOp};
use std::f64::consts::PI;

/// erf in float64: Maclaurin series for |x| < 3, continued fraction of erfc beyond.
pub fn erf(x: f64) -> f64 {
    let z = x.abs();
    let r = if z < 3.0 {
        let (mut term, mut sum, mut n) = (z, z, 0.0f64);
        while term.abs() > 1e-17 * sum.abs() {
            n += 1.0;
            term *= -z * z / n;
            sum += term / (2.0 * n + 1.0);
        }
        2.0 / PI.sqrt() * sum
    } else {
        let mut t = z;
        for k in (1..=80).rev() {
            t = z + (k as f64 / 2.0) / t;
        }
        1.0 - (-z * z).exp() / PI.sqrt() / t
    };
    r.copysign(x)
}

pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

pub fn silu(x: f64) -> f64 {
    x * sigmoid(x)
}

/// GELU, tanh approximation (ggml's `gelu`).
pub fn gelu(x: f64) -> f64 {
    let c = (2.0 / PI).sqrt();
    0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
}

pub fn gelu_erf(x: f64) -> f64 {
    0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2))
}

pub fn unary_fn(u: UnaryOp, x: f64) -> f64 {
    match u {
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

pub fn unary(u: UnaryOp, a: &Dense) -> Dense {
    a.map(|x| unary_fn(u, x))
}

/// The binary element-wise ops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
}

/// `a op b` with `b` repeated over `a` (each `b.ne[d]` divides `a.ne[d]`).
pub fn binary(op: BinOp, a: &Dense, b: &Dense) -> Dense {
    Dense::from_fn(a.ne, |i| {
        let x = a.at(i);
        let y = b.at([
            i[0] % b.ne[0],
            i[1] % b.ne[1],
            i[2] % b.ne[2],
            i[3] % b.ne[3],
        ]);
        match op {
            BinOp::Add => x + y,
            BinOp::Sub => x - y,
            BinOp::Mul => x * y,
            BinOp::Div => x / y,
        }
    })
}

pub fn scale(a: &Dense, s: f32, bias: f32) -> Dense {
    a.map(|x| x * s as f64 + bias as f64)
}

pub fn clamp(a: &Dense, min: f32, max: f32) -> Dense {
    a.map(|x| x.clamp(min as f64, max as f64))
}

/// One gated unit: `f(gate) * up`.
pub fn glu_fn(op: GluOp, g: f64, u: f64) -> f64 {
    match op {
        GluOp::Swiglu => silu(g) * u,
        GluOp::Geglu => gelu(g) * u,
        GluOp::GegluErf => gelu_erf(g) * u,
        GluOp::SwigluOai { alpha, limit } => {
            let (alpha, limit) = (alpha as f64, limit as f64);
            let g = g.min(limit);
            let u = u.clamp(-limit, limit);
            g * sigmoid(alpha * g) * (u + 1.0)
        }
    }
}

/// GLU with separate gate and up tensors.
pub fn glu(op: GluOp, gate: &Dense, up: &Dense) -> Dense {
    Dense::from_fn(gate.ne, |i| glu_fn(op, gate.at(i), up.at(i)))
}

/// GLU over the two halves of axis 0 (gate first, or up first when `swapped`).
pub fn glu_fused(op: GluOp, a: &Dense, swapped: bool) -> Dense {
    let n = a.ne[0] / 2;
    let (g, u) = (a.slice(0, 0, n), a.slice(0, n, n));
    if swapped {
        glu(op, &u, &g)
    } else {
        glu(op, &g, &u)
    }
}

fn map_rows(a: &Dense, f: impl Fn(&[f64], &mut [f64])) -> Dense {
    let mut out = Dense::zeros(a.ne);
    for i3 in 0..a.ne[3] {
        for i2 in 0..a.ne[2] {
            for i1 in 0..a.ne[1] {
                f(a.row(i1, i2, i3), out.row_mut(i1, i2, i3));
            }
        }
    }
    out
}

pub fn rms_norm(a: &Dense, eps: f32) -> Dense {
    map_rows(a, |x, y| {
        let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
        let s = 1.0 / (ms + eps as f64).sqrt();
        y.iter_mut().zip(x).for_each(|(o, v)| *o = v * s);
    })
}

pub fn norm(a: &Dense, eps: f32) -> Dense {
    map_rows(a, |x, y| {
        let n = x.len() as f64;
        let mean = x.iter().sum::<f64>() / n;
        let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
        let s = 1.0 / (var + eps as f64).sqrt();
        y.iter_mut().zip(x).for_each(|(o, v)| *o = (v - mean) * s);
    })
}

pub fn sum_rows(a: &Dense) -> Dense {
    Dense::from_fn([1, a.ne[1], a.ne[2], a.ne[3]], |i| {
        a.row(i[1], i[2], i[3]).iter().sum()
    })
}

pub fn concat(a: &Dense, b: &Dense, dim: usize) -> Dense {
    let mut ne = a.ne;
    ne[dim] += b.ne[dim];
    Dense::from_fn(ne, |mut i| {
        if i[dim] < a.ne[dim] {
            a.at(i)
        } else {
            i[dim] -= a.ne[dim];
            b.at(i)
        }
    })
}

/// `a[:, i1, i2] + b[:, ids[i1, i2]]`.
pub fn add_id(a: &Dense, b: &Dense, ids: &Dense) -> Dense {
    Dense::from_fn(a.ne, |i| {
        a.at(i) + b.at([i[0], ids.id([i[1], i[2], 0, 0]), 0, 0])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_known_values() {
        // Values from Abramowitz & Stegun, table 7.1.
        for (x, e) in [
            (0.5, 0.520_499_877_813_047),
            (1.0, 0.842_700_792_949_715),
            (2.0, 0.995_322_265_018_953),
            (3.5, 0.999_999_256_901_628),
        ] {
            assert!((erf(x) - e).abs() < 1e-13, "erf({x}) = {}", erf(x));
            assert!((erf(-x) + e).abs() < 1e-13);
        }
    }
}
