//! Attention reference ops: rotary embedding (normal / NeoX, YaRN, frequency factors), softmax with
//! mask, ALiBi and sinks, and flash attention with GQA, softcap, mask, ALiBi and sinks.

use crate::dense::Dense;
use ggml_core::{RopeMode, RopeParams};
use std::f64::consts::PI;

/// ggml's `ggml_rope_yarn_corr_dims`: the first and last dimension pair of the YaRN ramp.
pub fn rope_yarn_corr_dims(
    n_dims: usize,
    n_ctx_orig: usize,
    freq_base: f64,
    beta_fast: f64,
    beta_slow: f64,
) -> [f64; 2] {
    let corr_dim = |n_rot: f64| {
        n_dims as f64 * (n_ctx_orig as f64 / (n_rot * 2.0 * PI)).ln() / (2.0 * freq_base.ln())
    };
    let start = corr_dim(beta_fast).floor();
    let end = corr_dim(beta_slow).ceil();
    [start.max(0.0), end.min(n_dims as f64 - 1.0)]
}

/// ggml's `rope_yarn`: cos and sin of the angle for dimension pair `i0` (even), scaled by mscale.
fn rope_yarn(theta_extrap: f64, p: &RopeParams, corr: [f64; 2], i0: usize) -> (f64, f64) {
    let freq_scale = p.freq_scale as f64;
    let theta_interp = freq_scale * theta_extrap;
    let mut theta = theta_interp;
    let mut mscale = p.attn_factor as f64;
    if p.ext_factor != 0.0 {
        let y = ((i0 / 2) as f64 - corr[0]) / (corr[1] - corr[0]).max(0.001);
        let ramp_mix = (1.0 - y.clamp(0.0, 1.0)) * p.ext_factor as f64;
        theta = theta_interp * (1.0 - ramp_mix) + theta_extrap * ramp_mix;
        mscale *= 1.0 + 0.1 * (1.0 / freq_scale).ln();
    }
    (theta.cos() * mscale, theta.sin() * mscale)
}

/// Rotary embedding of `a` [head_dim, n_head, n_tokens, 1] at positions `pos` [n_tokens].
pub fn rope(a: &Dense, pos: &Dense, freq_factors: Option<&Dense>, p: &RopeParams) -> Dense {
    let n_dims = p.n_dims;
    let theta_scale = (p.freq_base as f64).powf(-2.0 / n_dims as f64);
    let corr = rope_yarn_corr_dims(
        n_dims,
        p.n_ctx_orig,
        p.freq_base as f64,
        p.beta_fast as f64,
        p.beta_slow as f64,
    );
    let mut out = a.clone();
    for i3 in 0..a.ne[3] {
        for i2 in 0..a.ne[2] {
            let position = pos.at([i2, 0, 0, 0]);
            let cache: Vec<(f64, f64)> = (0..n_dims / 2)
                .map(|k| {
                    let ff = freq_factors.map_or(1.0, |f| f.at([k, 0, 0, 0]));
                    let theta = position * theta_scale.powi(k as i32);
                    rope_yarn(theta / ff, p, corr, 2 * k)
                })
                .collect();
            for i1 in 0..a.ne[1] {
                let x = a.row(i1, i2, i3);
                let y = out.row_mut(i1, i2, i3);
                for (k, &(c, s)) in cache.iter().enumerate() {
                    let (j0, j1) = match p.mode {
                        RopeMode::Normal => (2 * k, 2 * k + 1),
                        RopeMode::Neox => (k, k + n_dims / 2),
                    };
                    y[j0] = x[j0] * c - x[j1] * s;
                    y[j1] = x[j0] * s + x[j1] * c;
                }
            }
        }
    }
    out
}

/// ALiBi slope of head `h` of `n_head` (1 when `max_bias` is 0), as ggml computes it.
pub fn alibi_slope(max_bias: f32, h: usize, n_head: usize) -> f64 {
    if max_bias <= 0.0 {
        return 1.0;
    }
    let n_head_log2 = 1usize << (n_head as f64).log2().floor() as u32;
    let m0 = 2f64.powf(-(max_bias as f64) / n_head_log2 as f64);
    let m1 = 2f64.powf(-(max_bias as f64 / 2.0) / n_head_log2 as f64);
    if h < n_head_log2 {
        m0.powi(h as i32 + 1)
    } else {
        m1.powi(2 * (h - n_head_log2) as i32 + 1)
    }
}

/// Softmax of `logits` with an optional extra logit (a sink) that joins only the normaliser.
fn softmax_into(logits: &[f64], sink: Option<f64>, out: &mut [f64]) {
    let mut max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    if let Some(s) = sink {
        max = max.max(s);
    }
    let mut sum = sink.map_or(0.0, |s| (s - max).exp());
    for (o, &l) in out.iter_mut().zip(logits) {
        *o = (l - max).exp();
        sum += *o;
    }
    out.iter_mut().for_each(|o| *o /= sum);
}

/// Softmax over axis 0 of `a * scale + slope * mask`, mask rows `[i1, i2 % m2, i3 % m3]`.
pub fn soft_max(
    a: &Dense,
    mask: Option<&Dense>,
    sinks: Option<&Dense>,
    scale: f32,
    max_bias: f32,
) -> Dense {
    let mut out = Dense::zeros(a.ne);
    let mut logits = vec![0.0; a.ne[0]];
    for i3 in 0..a.ne[3] {
        for i2 in 0..a.ne[2] {
            let slope = alibi_slope(max_bias, i2, a.ne[2]);
            for i1 in 0..a.ne[1] {
                for (i0, l) in logits.iter_mut().enumerate() {
                    let m = mask.map_or(0.0, |m| m.at([i0, i1, i2 % m.ne[2], i3 % m.ne[3]]));
                    *l = a.at([i0, i1, i2, i3]) * scale as f64 + slope * m;
                }
                softmax_into(
                    &logits,
                    sinks.map(|s| s.at([i2, 0, 0, 0])),
                    out.row_mut(i1, i2, i3),
                );
            }
        }
    }
    out
}

/// Flash attention parameters.
#[derive(Clone, Copy, Debug)]
pub struct AttnParams {
    pub scale: f32,
    pub max_bias: f32,
    pub softcap: f32,
}

/// q [D, Nq, H, S], k [D, Nkv, Hkv, S], v [Dv, Nkv, Hkv, S], mask [Nkv, >= Nq, m2, m3];
/// result [Dv, H, Nq, S].
pub fn flash_attn_ext(
    q: &Dense,
    k: &Dense,
    v: &Dense,
    mask: Option<&Dense>,
    sinks: Option<&Dense>,
    p: AttnParams,
) -> Dense {
    let (n_q, n_head, n_seq) = (q.ne[1], q.ne[2], q.ne[3]);
    let (n_kv, dv) = (k.ne[1], v.ne[0]);
    let group = n_head / k.ne[2];
    let mut out = Dense::zeros([dv, n_head, n_q, n_seq]);
    let mut scores = vec![0.0; n_kv];
    let mut probs = vec![0.0; n_kv];
    for s in 0..n_seq {
        for h in 0..n_head {
            let hk = h / group;
            let slope = alibi_slope(p.max_bias, h, n_head);
            for iq in 0..n_q {
                let qr = q.row(iq, h, s);
                for (j, sc) in scores.iter_mut().enumerate() {
                    let dot: f64 = qr.iter().zip(k.row(j, hk, s)).map(|(a, b)| a * b).sum();
                    let mut x = dot * p.scale as f64;
                    if p.softcap > 0.0 {
                        x = p.softcap as f64 * (x / p.softcap as f64).tanh();
                    }
                    let m = mask.map_or(0.0, |m| m.at([j, iq, h % m.ne[2], s % m.ne[3]]));
                    *sc = x + slope * m;
                }
                softmax_into(&scores, sinks.map(|t| t.at([h, 0, 0, 0])), &mut probs);
                let o = out.row_mut(h, iq, s);
                for (j, &pj) in probs.iter().enumerate() {
                    if pj != 0.0 {
                        o.iter_mut()
                            .zip(v.row(j, hk, s))
                            .for_each(|(acc, &x)| *acc += pj * x);
                    }
                }
            }
        }
    }
    out
}
