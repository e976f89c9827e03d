//! Rotary position embedding (`rope_ext` of ggml): Normal (adjacent pairs) and NeoX (halves) modes,
//! partial rotation (`n_dims < head_dim` passes the tail through), per-pair frequency factors and
//! YaRN context extension with ggml's `rope_yarn` formulas (correction dims, ramp mix, mscale).

use super::rows::{load_row, par_rows, unravel, with_out_row, Scratch};
use crate::view::TView;
use ggml_core::{DType, Error, Result, RopeMode, RopeParams};

fn yarn_corr_dim(n_dims: usize, n_ctx_orig: usize, n_rot: f32, base: f32) -> f32 {
    n_dims as f32 * (n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln()
        / (2.0 * base.ln())
}

/// ggml's `ggml_rope_yarn_corr_dims`: the first and last dimensions where the YaRN ramp applies.
pub fn yarn_corr_dims(
    n_dims: usize,
    n_ctx_orig: usize,
    freq_base: f32,
    beta_fast: f32,
    beta_slow: f32,
) -> [f32; 2] {
    let start = yarn_corr_dim(n_dims, n_ctx_orig, beta_fast, freq_base).floor();
    let end = yarn_corr_dim(n_dims, n_ctx_orig, beta_slow, freq_base).ceil();
    [start.max(0.0), end.min(n_dims as f32 - 1.0)]
}

fn yarn_ramp(low: f32, high: f32, i0: usize) -> f32 {
    let y = ((i0 / 2) as f32 - low) / (high - low).max(0.001);
    1.0 - y.clamp(0.0, 1.0)
}

/// ggml's `rope_yarn`: (cos, sin) of the rotation of pair `i0`, scaled by the magnitude factor.
fn rope_yarn(
    theta_extrap: f32,
    freq_scale: f32,
    corr: [f32; 2],
    i0: usize,
    ext_factor: f32,
    mut mscale: f32,
) -> (f32, f32) {
    let theta_interp = freq_scale * theta_extrap;
    let mut theta = theta_interp;
    if ext_factor != 0.0 {
        let ramp_mix = yarn_ramp(corr[0], corr[1], i0) * ext_factor;
        theta = theta_interp * (1.0 - ramp_mix) + theta_extrap * ramp_mix;
        mscale *= 1.0 + 0.1 * (1.0 / freq_scale).ln();
    }
    (theta.cos() * mscale, theta.sin() * mscale)
}

/// Fills `cache` with (cos, sin) for every rotated pair at position `pos` (ggml's rope cache).
fn rope_cache(
    p: &RopeParams,
    pos: f32,
    ff: Option<&[f32]>,
    corr: [f32; 2],
    cache: &mut [(f32, f32)],
) {
    let theta_scale = p.freq_base.powf(-2.0 / p.n_dims as f32);
    let mut theta = pos;
    for (k, c) in cache.iter_mut().enumerate() {
        let f = ff.map_or(1.0, |f| f[k]);
        *c = rope_yarn(
            theta / f,
            p.freq_scale,
            corr,
            2 * k,
            p.ext_factor,
            p.attn_factor,
        );
        theta *= theta_scale;
    }
}

/// Rotates each head `a[:, head, token]` by the angle of `positions[token]`.
pub fn rope(a: &TView, pos: &TView, ff: Option<&TView>, dst: &TView, p: &RopeParams) -> Result<()> {
    let (la, d) = (a.layout, dst.layout);
    let nd = p.n_dims;
    if la.ne != d.ne
        || nd > la.ne[0]
        || !nd.is_multiple_of(2)
        || pos.dtype() != DType::I32
        || pos.ne()[0] != la.ne[2]
    {
        return Err(Error::Shape {
            op: "rope",
            msg: format!("a {:?}, positions {:?}, n_dims {nd}", la.ne, pos.ne()),
        });
    }
    let factors: Option<Vec<f32>> = match ff {
        Some(f) => {
            if f.ne()[0] < nd / 2 {
                return Err(Error::Shape {
                    op: "rope",
                    msg: format!("{} freq factors for {} pairs", f.ne()[0], nd / 2),
                });
            }
            // SAFETY: the first row of the factors is in range.
            Some(unsafe { load_row(f, [0, 0, 0], &mut Vec::new())?.to_vec() })
        }
        None => None,
    };
    let corr = yarn_corr_dims(nd, p.n_ctx_orig, p.freq_base, p.beta_fast, p.beta_slow);
    // Rows are (head, token, seq); one cache per token, recomputed when the token changes.
    par_rows(d.nrows(), d.ne[0] * 4, |range| {
        let (mut sa, mut so) = (Scratch::default(), Scratch::default());
        let mut cache = vec![(0f32, 0f32); nd / 2];
        let mut cached_tok = usize::MAX;
        for r in range {
            let idx = unravel(r, &d.ne);
            let tok = idx[1] + la.ne[2] * idx[2];
            // SAFETY: rows are in range; each destination row is written by one task only.
            unsafe {
                if tok != cached_tok {
                    let ps = pos.get_i32([idx[1], 0, 0, 0]);
                    rope_cache(p, ps as f32, factors.as_deref(), corr, &mut cache);
                    cached_tok = tok;
                }
                let x = load_row(a, idx, &mut sa.f)?;
                with_out_row(dst, idx, &mut so, |out| {
                    match p.mode {
                        RopeMode::Normal => {
                            for (k, &(c, s)) in cache.iter().enumerate() {
                                let (x0, x1) = (x[2 * k], x[2 * k + 1]);
                                out[2 * k] = x0 * c - x1 * s;
                                out[2 * k + 1] = x0 * s + x1 * c;
                            }
                        }
                        RopeMode::Neox => {
                            let h = nd / 2;
                            for (k, &(c, s)) in cache.iter().enumerate() {
                                let (x0, x1) = (x[k], x[k + h]);
                                out[k] = x0 * c - x1 * s;
                                out[k + h] = x0 * s + x1 * c;
                            }
                        }
                    }
                    out[nd..].copy_from_slice(&x[nd..]);
                    Ok(())
                })?;
            }
        }
        Ok(())
    })
}
