//! The logit bias of the sampler (bans, boosts, invalid values) and the raw-logit log-probabilities
//! of [`log_probs`] against a naive f64 reference on fresh random logits of odd sizes.

use llama::sampling::{log_probs, Sampler, SamplingError, SamplingParams};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn random_logits(n: usize, scale: f32, rng: &mut StdRng) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-scale..scale)).collect()
}

/// `log(exp(l_t) / Σ exp(l))` summed naively in f64 from the largest term down.
fn reference_logprob(logits: &[f32], t: usize) -> f64 {
    let mut terms: Vec<f64> = logits.iter().map(|&l| f64::from(l).exp()).collect();
    terms.sort_by(|a, b| b.partial_cmp(a).unwrap());
    (f64::from(logits[t]).exp() / terms.iter().sum::<f64>()).ln()
}

#[test]
fn log_probs_match_a_naive_log_softmax() {
    let mut rng = StdRng::seed_from_u64(rand::random());
    for n in [1usize, 7, 333, 4099] {
        let logits = random_logits(n, 12.0, &mut rng);
        let token = rng.gen_range(0..n);
        let lp = log_probs(&logits, token as u32, 5);
        let want = reference_logprob(&logits, token);
        assert!(
            (lp.logprob - want).abs() < 1e-9,
            "n {n}: {} vs {want}",
            lp.logprob
        );
        assert_eq!(lp.top.len(), 5.min(n));
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| logits[b].partial_cmp(&logits[a]).unwrap().then(a.cmp(&b)));
        for (k, &(id, p)) in lp.top.iter().enumerate() {
            assert_eq!(id as usize, order[k], "n {n}, rank {k}");
            assert!((p - reference_logprob(&logits, order[k])).abs() < 1e-9);
        }
        let total: f64 = (0..n).map(|t| reference_logprob(&logits, t).exp()).sum();
        assert!((total - 1.0).abs() < 1e-9);
    }
}

#[test]
fn log_probs_ignore_nan_logits() {
    let lp = log_probs(&[0.0, f32::NAN, 0.0], 0, 3);
    assert!((lp.logprob - 0.5f64.ln()).abs() < 1e-12);
    assert_eq!(lp.top[0].0, 0);
    assert_eq!(lp.top[2], (1, f64::NEG_INFINITY));
}

#[test]
fn bias_bans_and_boosts() {
    let mut rng = StdRng::seed_from_u64(rand::random());
    let logits = random_logits(501, 4.0, &mut rng);
    let best = (0..logits.len())
        .max_by(|&a, &b| logits[a].partial_cmp(&logits[b]).unwrap())
        .unwrap() as u32;
    let mut greedy = Sampler::new(SamplingParams::greedy())
        .unwrap()
        .with_logit_bias(vec![(best, -100.0)])
        .unwrap();
    assert_ne!(greedy.sample(&logits, &[]).unwrap(), best);
    let mut boosted = Sampler::new(SamplingParams::greedy())
        .unwrap()
        .with_logit_bias(vec![(17, 100.0)])
        .unwrap();
    assert_eq!(boosted.sample(&logits, &[]).unwrap(), 17);
    // Seeded draws never produce a banned token.
    let banned: Vec<(u32, f32)> = (0..500).map(|t| (t, -100.0)).collect();
    let mut s = Sampler::new(SamplingParams {
        top_k: 0,
        min_p: 0.0,
        top_p: 1.0,
        ..SamplingParams::default()
    })
    .unwrap()
    .with_logit_bias(banned)
    .unwrap();
    for _ in 0..20 {
        assert_eq!(s.sample(&logits, &[]).unwrap(), 500);
    }
}

#[test]
fn invalid_biases_are_errors() {
    let s = || Sampler::new(SamplingParams::default()).unwrap();
    for bad in [100.5, -101.0, f32::NAN, f32::INFINITY] {
        assert!(matches!(
            s().with_logit_bias(vec![(3, bad)]),
            Err(SamplingError::InvalidBias { token: 3, .. })
        ));
    }
    let mut out = s().with_logit_bias(vec![(10, 1.0)]).unwrap();
    assert_eq!(
        out.sample(&[0.0; 4], &[]),
        Err(SamplingError::BiasOutOfRange {
            token: 10,
            n_vocab: 4
        })
    );
}
