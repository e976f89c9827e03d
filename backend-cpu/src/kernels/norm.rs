//! Row reductions over axis 0: `rms_norm`, `norm`, `sum_rows` and `soft_max` (scale, broadcast mask,
//! ALiBi slopes, attention sinks). Sums are accumulated in f64 as ggml does.

use super::rows::{load_row, par_rows, unravel, with_out_row, Scratch};
use crate::view::TView;
use ggml_core::{Error, Result};

fn shape(op: &'static str, msg: String) -> Error {
    Error::Shape { op, msg }
}

/// `y = x / sqrt(mean(x²) + eps)` per row.
pub fn rms_norm(src: &TView, dst: &TView, eps: f32) -> Result<()> {
    super::elementwise::map_rows(src, dst, "rms_norm", |x, y| {
        let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
        let mean = (ss / x.len().max(1) as f64) as f32;
        let s = 1.0 / (mean + eps).sqrt();
        y.iter_mut().zip(x).for_each(|(o, &v)| *o = v * s);
    })
}

/// `y = (x - mean) / sqrt(var + eps)` per row.
pub fn norm(src: &TView, dst: &TView, eps: f32) -> Result<()> {
    super::elementwise::map_rows(src, dst, "norm", |x, y| {
        let n = x.len().max(1) as f64;
        let mean = (x.iter().map(|&v| v as f64).sum::<f64>() / n) as f32;
        let var: f64 = x.iter().map(|&v| ((v - mean) as f64).powi(2)).sum::<f64>() / n;
        let s = 1.0 / (var as f32 + eps).sqrt();
        y.iter_mut().zip(x).for_each(|(o, &v)| *o = (v - mean) * s);
    })
}

/// Sum of each row into a [1, ne1, ne2, ne3] result.
pub fn sum_rows(src: &TView, dst: &TView) -> Result<()> {
    let (s, d) = (src.layout, dst.layout);
    if d.ne != [1, s.ne[1], s.ne[2], s.ne[3]] {
        return Err(shape("sum_rows", format!("{:?} into {:?}", s.ne, d.ne)));
    }
    par_rows(d.nrows(), s.ne[0], |range| {
        let (mut sa, mut so) = (Scratch::default(), Scratch::default());
        for r in range {
            let idx = unravel(r, &d.ne);
            // SAFETY: rows are in range; each destination row is written by one task only.
            unsafe {
                let x = load_row(src, idx, &mut sa.f)?;
                let total = x.iter().map(|&v| v as f64).sum::<f64>() as f32;
                with_out_row(dst, idx, &mut so, |out| {
                    out[0] = total;
                    Ok(())
                })?;
            }
        }
        Ok(())
    })
}

/// ALiBi slope of head `h` of `n_head` heads (1 when `max_bias` is 0), as ggml computes it.
pub fn alibi_slope(max_bias: f32, h: usize, n_head: usize) -> f32 {
    if max_bias <= 0.0 {
        return 1.0;
    }
    let n_head_log2 = 1usize << (n_head.max(1) as f32).log2().floor() as u32;
    let m0 = 2f32.powf(-max_bias / n_head_log2 as f32);
    let m1 = 2f32.powf(-(max_bias / 2.0) / n_head_log2 as f32);
    if h < n_head_log2 {
        m0.powi(h as i32 + 1)
    } else {
        m1.powi(2 * (h - n_head_log2) as i32 + 1)
    }
}

/// Softmax over axis 0 of `a * scale + slope * mask`, with an optional sink logit per head (`ne2`).
pub fn soft_max(
    a: &TView,
    mask: Option<&TView>,
    sinks: Option<&TView>,
    dst: &TView,
    scale: f32,
    max_bias: f32,
) -> Result<()> {
    let (la, d) = (a.layout, dst.layout);
    if la.ne != d.ne {
        return Err(shape("soft_max", format!("{:?} into {:?}", la.ne, d.ne)));
    }
    if let Some(m) = mask {
        let lm = m.layout;
        if lm.ne[0] != la.ne[0]
            || lm.ne[1] < la.ne[1]
            || lm.ne[2] == 0
            || lm.ne[3] == 0
            || la.ne[2] % lm.ne[2] != 0
            || la.ne[3] % lm.ne[3] != 0
        {
            return Err(shape(
                "soft_max",
                format!("mask {:?} for {:?}", lm.ne, la.ne),
            ));
        }
    }
    if let Some(s) = sinks {
        if s.ne()[0] != la.ne[2] {
            return Err(shape(
                "soft_max",
                format!("sinks {:?} for {} heads", s.ne(), la.ne[2]),
            ));
        }
    }
    par_rows(d.nrows(), d.ne[0] * 4, |range| {
        let (mut sa, mut sm, mut so) = (Scratch::default(), Scratch::default(), Scratch::default());
        for r in range {
            let idx = unravel(r, &d.ne);
            let h = idx[1];
            let slope = alibi_slope(max_bias, h, la.ne[2]);
            // SAFETY: rows are in range; each destination row is written by one task only.
            unsafe {
                let x = load_row(a, idx, &mut sa.f)?;
                let m = match mask {
                    Some(m) => Some(load_row(
                        m,
                        [idx[0], idx[1] % m.ne()[2], idx[2] % m.ne()[3]],
                        &mut sm.f,
                    )?),
                    None => None,
                };
                let sink = sinks.map(|s| s.get_f32([h, 0, 0, 0]));
                with_out_row(dst, idx, &mut so, |out| {
                    match m {
                        Some(m) => out
                            .iter_mut()
                            .zip(x.iter().zip(m))
                            .for_each(|(o, (&v, &mv))| *o = v * scale + slope * mv),
                        None => out.iter_mut().zip(x).for_each(|(o, &v)| *o = v * scale),
                    }
                    let mut max = out.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    if let Some(s) = sink {
                        max = max.max(s);
                    }
                    let mut sum = 0f64;
                    for o in out.iter_mut() {
                        *o = (*o - max).exp();
                        sum += *o as f64;
                    }
                    if let Some(s) = sink {
                        sum += (s - max).exp() as f64;
                    }
                    let inv = if sum > 0.0 { (1.0 / sum) as f32 } else { 0.0 };
                    out.iter_mut().for_each(|o| *o *= inv);
                    Ok(())
                })?;
            }
        }
        Ok(())
    })
}
