//! The gated delta rule ([`ggml_core::Op::GatedDeltaNet`]) on the CPU, one task per value head.
//!
//! Per head, on the state `S[key, value]` (stored one value column of `Dk` keys after the other),
//! token `t` does `S ← e^{g_t} S`, `u_t = β_t (v_t - Sᵀk_t)`, `S ← S + k_t u_tᵀ`, `o_t = Sᵀq_t`.
//!
//! Batches of at least [`CHUNKED_FROM`] tokens go through the chunked (WY / UT transform) form, in
//! chunks of [`CHUNK`] tokens: with `G_j` the cumulative log decay from the chunk's start and `S₀` the
//! state there, the chunk's updates solve the unit lower-triangular system
//! `(I + A) U = diag(β) V - diag(β e^G) K S₀`, `A[j, m] = β_j e^{G_j - G_m} k_j·k_m` (`m < j`), by
//! forward substitution on `[diag(β) V | diag(β e^G) K]` (so `U = Ũ - W S₀`); then
//! `o_j = e^{G_j} S₀ᵀq_j + Σ_{m≤j} e^{G_j - G_m} (q_j·k_m) u_m` and
//! `S = e^{G_last} S₀ + Σ_j e^{G_last - G_j} k_j u_jᵀ`. Every exponent is ≤ 0. Fewer tokens run
//! the recurrence token by token.

use super::rows::{load_row_into, par_rows};
use super::vector::row_ops;
use crate::view::TView;
use ggml_core::{Error, HeadShare, Result};

/// Tokens per chunk of the chunked form.
pub const CHUNK: usize = 64;
/// The fewest tokens that take the chunked form.
pub const CHUNKED_FROM: usize = 16;

/// One value head's inputs over the batch, token-major and contiguous.
struct HeadInputs {
    dk: usize,
    dv: usize,
    /// `[T][Dk]` each.
    q: Vec<f32>,
    k: Vec<f32>,
    /// `[T][Dv]`.
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
}

impl HeadInputs {
    fn q(&self, t: usize) -> &[f32] {
        &self.q[t * self.dk..(t + 1) * self.dk]
    }
    fn k(&self, t: usize) -> &[f32] {
        &self.k[t * self.dk..(t + 1) * self.dk]
    }
    fn v(&self, t: usize) -> &[f32] {
        &self.v[t * self.dv..(t + 1) * self.dv]
    }
}

/// The recurrence over tokens `range` of `x`, from and into `s`; outputs into `o` (`[T][Dv]`).
fn recurrent(x: &HeadInputs, s: &mut [f32], o: &mut [f32], range: std::ops::Range<usize>) {
    let (dk, dv, ops) = (x.dk, x.dv, row_ops());
    for t in range {
        let (q, k, v) = (x.q(t), x.k(t), x.v(t));
        let decay = x.g[t].exp();
        let out = &mut o[t * dv..(t + 1) * dv];
        for (j, col) in s.chunks_exact_mut(dk).enumerate() {
            ops.scale(decay, col);
            let u = x.beta[t] * (v[j] - ops.dot(col, k));
            ops.axpy(u, k, col);
            out[j] = ops.dot(col, q);
        }
    }
}

/// Scratch of one chunk: the cumulative decays, their differences `e^{G_j - G_m}` (`m ≤ j`), and
/// the solved rows `[Ũ | W]` and updates `U`.
#[derive(Default)]
struct ChunkScratch {
    cum: Vec<f32>,
    gam: Vec<f32>,
    x: Vec<f32>,
    u: Vec<f32>,
}

/// One chunk `t0..t0 + n` of `x` in the chunked form, from and into `s`; outputs into `o`.
fn chunk(x: &HeadInputs, s: &mut [f32], o: &mut [f32], t0: usize, n: usize, w: &mut ChunkScratch) {
    let (dk, dv, ops) = (x.dk, x.dv, row_ops());
    let width = dv + dk;
    w.cum.clear();
    let mut acc = 0f32;
    for t in t0..t0 + n {
        acc += x.g[t];
        w.cum.push(acc);
    }
    w.gam.clear();
    w.gam.resize(n * n, 0.0);
    for j in 0..n {
        for m in 0..=j {
            w.gam[j * n + m] = (w.cum[j] - w.cum[m]).exp();
        }
    }
    // The right-hand sides [β v | β e^G k], solved in place row by row against
    // A[j, m] = β_j e^{G_j - G_m} k_j·k_m.
    w.x.clear();
    w.x.resize(n * width, 0.0);
    for j in 0..n {
        let (kj, bj) = (x.k(t0 + j), x.beta[t0 + j]);
        let (done, row) = w.x.split_at_mut(j * width);
        let row = &mut row[..width];
        let eg = bj * w.cum[j].exp();
        row[..dv]
            .iter_mut()
            .zip(x.v(t0 + j))
            .for_each(|(r, v)| *r = bj * v);
        row[dv..].iter_mut().zip(kj).for_each(|(r, k)| *r = eg * k);
        for m in 0..j {
            let a = bj * w.gam[j * n + m] * ops.dot(kj, x.k(t0 + m));
            ops.axpy(-a, &done[m * width..(m + 1) * width], row);
        }
    }
    // U = Ũ - W S₀, then the outputs.
    w.u.clear();
    w.u.resize(n * dv, 0.0);
    for j in 0..n {
        let row = &w.x[j * width..(j + 1) * width];
        let (ut, wj) = row.split_at(dv);
        let u = &mut w.u[j * dv..(j + 1) * dv];
        for (c, col) in s.chunks_exact(dk).enumerate() {
            u[c] = ut[c] - ops.dot(wj, col);
        }
    }
    for j in 0..n {
        let q = x.q(t0 + j);
        let out = &mut o[(t0 + j) * dv..(t0 + j + 1) * dv];
        let eg = w.cum[j].exp();
        for (c, col) in s.chunks_exact(dk).enumerate() {
            out[c] = eg * ops.dot(q, col);
        }
        for m in 0..=j {
            let coef = w.gam[j * n + m] * ops.dot(q, x.k(t0 + m));
            ops.axpy(coef, &w.u[m * dv..(m + 1) * dv], out);
        }
    }
    // The state at the chunk's end.
    let el = w.cum[n - 1].exp();
    let tail = &w.gam[(n - 1) * n..];
    for (c, col) in s.chunks_exact_mut(dk).enumerate() {
        ops.scale(el, col);
        for (m, &decay) in tail.iter().enumerate() {
            ops.axpy(decay * w.u[m * dv + c], x.k(t0 + m), col);
        }
    }
}

/// Runs the rule over all of `x`'s tokens from and into `s`, writing the outputs into `o`: chunked
/// from [`CHUNKED_FROM`] tokens on, token by token below.
fn run_head(x: &HeadInputs, s: &mut [f32], o: &mut [f32], n_tokens: usize) {
    if n_tokens < CHUNKED_FROM {
        return recurrent(x, s, o, 0..n_tokens);
    }
    let mut w = ChunkScratch::default();
    for t0 in (0..n_tokens).step_by(CHUNK) {
        chunk(x, s, o, t0, CHUNK.min(n_tokens - t0), &mut w);
    }
}

/// The sources of the op, in its order.
pub struct DeltaNetSources<'a> {
    pub q: &'a TView,
    pub k: &'a TView,
    pub v: &'a TView,
    /// `[H, T, 2]`: the log decays, then the βs.
    pub gates: &'a TView,
    pub state: &'a TView,
}

/// Gathers value head `h`'s inputs (reading key head `kh`).
///
/// # Safety
/// The views must point to live memory of their layouts, not written meanwhile.
unsafe fn gather(src: &DeltaNetSources, h: usize, kh: usize) -> Result<HeadInputs> {
    let [dk, _, t, _] = src.k.layout.ne;
    let dv = src.v.layout.ne[0];
    let mut x = HeadInputs {
        dk,
        dv,
        q: vec![0.0; t * dk],
        k: vec![0.0; t * dk],
        v: vec![0.0; t * dv],
        g: Vec::with_capacity(t),
        beta: Vec::with_capacity(t),
    };
    let one = |v: &TView, i: [usize; 4]| (v.at(i) as *const f32).read_unaligned();
    for i in 0..t {
        load_row_into(src.q, [kh, i, 0], &mut x.q[i * dk..(i + 1) * dk])?;
        load_row_into(src.k, [kh, i, 0], &mut x.k[i * dk..(i + 1) * dk])?;
        load_row_into(src.v, [h, i, 0], &mut x.v[i * dv..(i + 1) * dv])?;
        x.g.push(one(src.gates, [h, i, 0, 0]));
        x.beta.push(one(src.gates, [h, i, 1, 0]));
    }
    Ok(x)
}

/// The op: outputs and final state into `dst` `[Dv, H, T + Dk]` (contiguous).
pub fn gated_delta_net(src: &DeltaNetSources, dst: &TView, heads: HeadShare) -> Result<()> {
    let [dk, hk, t, _] = src.k.layout.ne;
    let [dv, h, _, _] = src.v.layout.ne;
    if dst.layout.ne != [dv, h, t + dk, 1] || !dst.layout.is_contiguous() {
        return Err(Error::Shape {
            op: "gated_delta_net",
            msg: format!(
                "result {:?} for {dv}x{h} values over {t} tokens",
                dst.layout
            ),
        });
    }
    let ratio = h / hk.max(1);
    par_rows(h, t * dk * dv * 4, |range| {
        let mut o = vec![0f32; t * dv];
        let mut s = vec![0f32; dk * dv];
        for head in range {
            let kh = match heads {
                HeadShare::Grouped => head / ratio,
                HeadShare::Tiled => head % hk,
            };
            // SAFETY: the sources are live and read only; head `head` alone writes its output rows
            // and its state block of `dst`.
            unsafe {
                let x = gather(src, head, kh)?;
                for (c, col) in s.chunks_exact_mut(dk).enumerate() {
                    load_row_into(src.state, [c, head, 0], col)?;
                }
                run_head(&x, &mut s, &mut o, t);
                let base = dst.ptr as *mut f32;
                for (i, row) in o.chunks_exact(dv).enumerate() {
                    let at = base.add((i * h + head) * dv);
                    std::ptr::copy_nonoverlapping(row.as_ptr(), at, dv);
                }
                let at = base.add(t * dv * h + head * dk * dv);
                std::ptr::copy_nonoverlapping(s.as_ptr(), at, dk * dv);
            }
        }
        Ok(())
    })
}

#[cfg(test)]
#[path = "tests/delta_net.rs"]
mod tests;
