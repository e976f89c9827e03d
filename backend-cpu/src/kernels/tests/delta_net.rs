//! The gated delta rule's two forms against an f64 recurrence and against each other: the chunked
//! form over batches whose length is not a multiple of the chunk, the token-by-token form one call
//! per token, and the whole op with key heads shared both ways.

use super::super::tests::Host;
use super::*;
use ggml_core::DType;
use rand::Rng;

/// Random inputs of one head as the model makes them: L2-normalised keys, β in (0, 1), log decays
/// in (-2, 0).
fn random_head(dk: usize, dv: usize, t: usize) -> HeadInputs {
    let mut rng = rand::thread_rng();
    let mut unit = |n: usize| -> Vec<f32> {
        let mut x: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        for row in x.chunks_mut(dk) {
            let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-6);
            row.iter_mut().for_each(|v| *v /= norm);
        }
        x
    };
    let (q, k) = (unit(t * dk), unit(t * dk));
    HeadInputs {
        dk,
        dv,
        q,
        k,
        v: (0..t * dv).map(|_| rng.gen_range(-1.0..1.0)).collect(),
        g: (0..t).map(|_| rng.gen_range(-2.0..0.0)).collect(),
        beta: (0..t).map(|_| rng.gen_range(0.0..1.0)).collect(),
    }
}

/// The recurrence in f64: outputs `[T][Dv]` and the final state.
fn reference(x: &HeadInputs, s0: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let (dk, dv, t) = (x.dk, x.dv, x.g.len());
    let mut s: Vec<f64> = s0.iter().map(|&v| v as f64).collect();
    let mut o = vec![0f64; t * dv];
    for i in 0..t {
        let decay = (x.g[i] as f64).exp();
        for j in 0..dv {
            let col = &mut s[j * dk..(j + 1) * dk];
            col.iter_mut().for_each(|c| *c *= decay);
            let r: f64 = col.iter().zip(x.k(i)).map(|(c, &k)| c * k as f64).sum();
            let u = x.beta[i] as f64 * (x.v(i)[j] as f64 - r);
            col.iter_mut()
                .zip(x.k(i))
                .for_each(|(c, &k)| *c += u * k as f64);
            o[i * dv + j] = col.iter().zip(x.q(i)).map(|(c, &q)| c * q as f64).sum();
        }
    }
    (o, s)
}

fn nmse(got: &[f32], want: &[f64]) -> f64 {
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(&g, w)| (g as f64 - w).powi(2))
        .sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    num / den.max(1e-30)
}

fn random_state(n: usize) -> Vec<f32> {
    let mut rng = rand::thread_rng();
    (0..n).map(|_| rng.gen_range(-0.5..0.5)).collect()
}

#[test]
fn chunked_form_matches_the_f64_recurrence() {
    for (dk, dv, t) in [(17, 23, 16), (32, 32, 64), (31, 19, 150), (8, 40, 129)] {
        let x = random_head(dk, dv, t);
        let s0 = random_state(dk * dv);
        let (want_o, want_s) = reference(&x, &s0);
        let (mut s, mut o) = (s0.clone(), vec![0f32; t * dv]);
        run_head(&x, &mut s, &mut o, t);
        let (eo, es) = (nmse(&o, &want_o), nmse(&s, &want_s));
        assert!(
            eo < 1e-10 && es < 1e-10,
            "{dk}x{dv}, {t} tokens: {eo:e} {es:e}"
        );
    }
}

#[test]
fn a_prompt_in_chunks_and_token_by_token_reach_one_state() {
    let (dk, dv, t) = (29, 33, 203);
    let x = random_head(dk, dv, t);
    let s0 = random_state(dk * dv);
    let (mut chunked, mut o_chunked) = (s0.clone(), vec![0f32; t * dv]);
    run_head(&x, &mut chunked, &mut o_chunked, t);
    let (mut stepped, mut o_stepped) = (s0, vec![0f32; t * dv]);
    for i in 0..t {
        recurrent(&x, &mut stepped, &mut o_stepped, i..i + 1);
    }
    let wide = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
    let (es, eo) = (
        nmse(&chunked, &wide(&stepped)),
        nmse(&o_chunked, &wide(&o_stepped)),
    );
    assert!(es < 1e-10 && eo < 1e-10, "state {es:e}, outputs {eo:e}");
    assert!(
        chunked.iter().any(|&v| v.abs() > 1e-3),
        "a state that moved"
    );
}

/// The whole op over several value heads sharing key heads, as `heads` maps them.
fn op_matches(heads: HeadShare, t: usize) {
    let (dk, dv, hk, h) = (13, 11, 2, 6);
    let xs: Vec<HeadInputs> = (0..hk).map(|_| random_head(dk, dv, t)).collect();
    let kh = |head: usize| match heads {
        HeadShare::Grouped => head / (h / hk),
        HeadShare::Tiled => head % hk,
    };
    let mut rng = rand::thread_rng();
    let (g, beta): (Vec<f32>, Vec<f32>) = (0..h * t)
        .map(|_| (rng.gen_range(-1.0..0.0), rng.gen_range(0.0..1.0)))
        .unzip();
    let s0 = random_state(dk * dv * h);
    let interleave = |f: &dyn Fn(usize, usize) -> Vec<f32>, heads: usize| -> Vec<f32> {
        (0..t)
            .flat_map(|i| (0..heads).flat_map(move |hh| f(hh, i)))
            .collect()
    };
    let q = interleave(&|hh, i| xs[hh].q(i).to_vec(), hk);
    let k = interleave(&|hh, i| xs[hh].k(i).to_vec(), hk);
    let v: Vec<f32> = (0..t * h * dv).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let mut hosts = [
        Host::new(DType::F32, [dk, hk, t, 1], &q),
        Host::new(DType::F32, [dk, hk, t, 1], &k),
        Host::new(DType::F32, [dv, h, t, 1], &v),
        Host::new(
            DType::F32,
            [h, t, 2, 1],
            &[g.clone(), beta.clone()].concat(),
        ),
        Host::new(DType::F32, [dk, dv, h, 1], &s0),
    ];
    let mut out = Host::new(
        DType::F32,
        [dv, h, t + dk, 1],
        &vec![f32::NAN; dv * h * (t + dk)],
    );
    let views: Vec<TView> = hosts.iter_mut().map(|x| x.view()).collect();
    let src = DeltaNetSources {
        q: &views[0],
        k: &views[1],
        v: &views[2],
        gates: &views[3],
        state: &views[4],
    };
    gated_delta_net(&src, &out.view(), heads).unwrap();
    let got: &[f32] = bytemuck::cast_slice(&out.bytes);
    for head in 0..h {
        let x = HeadInputs {
            dk,
            dv,
            q: xs[kh(head)].q.clone(),
            k: xs[kh(head)].k.clone(),
            v: (0..t)
                .flat_map(|i| v[(i * h + head) * dv..][..dv].to_vec())
                .collect(),
            g: (0..t).map(|i| g[i * h + head]).collect(),
            beta: (0..t).map(|i| beta[i * h + head]).collect(),
        };
        let (want_o, want_s) = reference(&x, &s0[head * dk * dv..][..dk * dv]);
        let o: Vec<f32> = (0..t)
            .flat_map(|i| got[(i * h + head) * dv..][..dv].to_vec())
            .collect();
        let s = &got[t * dv * h + head * dk * dv..][..dk * dv];
        let (eo, es) = (nmse(&o, &want_o), nmse(s, &want_s));
        assert!(
            eo < 1e-10 && es < 1e-10,
            "{heads:?} head {head}, {t} tokens: {eo:e} {es:e}"
        );
    }
}

#[test]
fn the_op_shares_key_heads_both_ways() {
    for t in [1, 5, 70] {
        op_matches(HeadShare::Grouped, t);
        op_matches(HeadShare::Tiled, t);
    }
}
