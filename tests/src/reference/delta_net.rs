//! The gated delta rule in float64, token after token, per value head (the definition of
//! `gated_delta_net`).

use crate::dense::Dense;
use ggml_core::HeadShare;

/// `[q, k, v, gates, state]` to `[Dv, H, T + Dk]`: the outputs, then the final state.
pub fn gated_delta_net(x: &[Dense], heads: HeadShare) -> Dense {
    let (q, k, v, gates, s0) = (&x[0], &x[1], &x[2], &x[3], &x[4]);
    let [dk, hk, t, _] = k.ne;
    let [dv, h, _, _] = v.ne;
    let mut out = Dense::zeros([dv, h, t + dk, 1]);
    let state_at = t * dv * h;
    for head in 0..h {
        let kh = match heads {
            HeadShare::Grouped => head / (h / hk),
            HeadShare::Tiled => head % hk,
        };
        let mut s: Vec<f64> = (0..dk * dv)
            .map(|e| s0.at([e % dk, e / dk, head, 0]))
            .collect();
        for i in 0..t {
            let decay = gates.at([head, i, 0, 0]).exp();
            let b = gates.at([head, i, 1, 0]);
            for j in 0..dv {
                let col = &mut s[j * dk..(j + 1) * dk];
                col.iter_mut().for_each(|c| *c *= decay);
                let r: f64 = (0..dk).map(|e| col[e] * k.at([e, kh, i, 0])).sum();
                let u = b * (v.at([j, head, i, 0]) - r);
                (0..dk).for_each(|e| col[e] += u * k.at([e, kh, i, 0]));
                let o = (0..dk).map(|e| col[e] * q.at([e, kh, i, 0])).sum();
                out.set([j, head, i, 0], o);
            }
        }
        let base = state_at + head * dk * dv;
        out.data[base..base + dk * dv].copy_from_slice(&s);
    }
    out
}
