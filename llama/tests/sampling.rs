//! The sampler against a naive reference of llama.cpp's chain (full sort, then penalties → top-k →
//! top-p → min-p → temperature → softmax): the distributions agree, and the empirical frequencies of
//! many seeded draws match them within a statistical tolerance. Also greedy decoding, reproducibility,
//! the penalties, NaN/inf logits, invalid parameters and a 262k vocabulary.

use std::collections::HashMap;
use std::time::Instant;

use llama::sampling::{Sampler, SamplingError, SamplingParams};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Parameters with every filter off: temperature 1, the plain softmax.
fn plain() -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repeat_penalty: 1.0,
        repeat_last_n: 64,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        seed: 1234,
    }
}

fn random_logits(n: usize, scale: f32, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.gen_range(-scale..scale)).collect()
}

/// The reference: the probability of every token id, written the straightforward way.
fn reference(logits: &[f32], history: &[u32], p: &SamplingParams) -> Vec<f64> {
    let mut l: Vec<f64> = logits
        .iter()
        .map(|&x| {
            if x.is_nan() {
                f64::NEG_INFINITY
            } else {
                f64::from(x)
            }
        })
        .collect();
    let window = &history[history.len().saturating_sub(p.repeat_last_n)..];
    let mut counts: HashMap<u32, u32> = HashMap::new();
    for &t in window {
        *counts.entry(t).or_default() += 1;
    }
    for (&t, &c) in &counts {
        let x = &mut l[t as usize];
        let rp = f64::from(p.repeat_penalty);
        *x = if *x <= 0.0 { *x * rp } else { *x / rp };
        *x -= f64::from(c) * f64::from(p.frequency_penalty) + f64::from(p.presence_penalty);
    }
    let mut order: Vec<usize> = (0..l.len()).filter(|&i| l[i] > f64::NEG_INFINITY).collect();
    order.sort_by(|&a, &b| l[b].partial_cmp(&l[a]).unwrap().then(a.cmp(&b)));
    if p.top_k > 0 {
        order.truncate(p.top_k);
    }
    let max = l[order[0]];
    if p.top_p < 1.0 {
        let total: f64 = order.iter().map(|&i| (l[i] - max).exp()).sum();
        let mut cum = 0.0;
        for k in 0..order.len() {
            cum += (l[order[k]] - max).exp() / total;
            if cum >= f64::from(p.top_p) {
                order.truncate(k + 1);
                break;
            }
        }
    }
    if p.min_p > 0.0 {
        let threshold = max + f64::from(p.min_p).ln();
        order.retain(|&i| l[i] >= threshold);
    }
    let t = f64::from(p.temperature);
    let total: f64 = order.iter().map(|&i| ((l[i] - max) / t).exp()).sum();
    let mut probs = vec![0.0; l.len()];
    for &i in &order {
        probs[i] = ((l[i] - max) / t).exp() / total;
    }
    probs
}

/// The sampler's distribution as a dense vector of probabilities.
fn dense(sampler: &mut Sampler, logits: &[f32], history: &[u32]) -> Vec<f64> {
    let mut probs = vec![0.0; logits.len()];
    for c in sampler.distribution(logits, history).unwrap() {
        probs[c.id as usize] += f64::from(c.p);
    }
    probs
}

fn assert_close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol, "{what}: token {i}: {g} vs {w}");
        assert_eq!(
            *g == 0.0,
            *w == 0.0,
            "{what}: token {i} kept by one side only"
        );
    }
}

fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

#[test]
fn greedy_is_argmax_first_on_ties() {
    let mut s = Sampler::new(SamplingParams::greedy()).unwrap();
    for seed in 0..20 {
        let logits = random_logits(1000, 5.0, seed);
        assert_eq!(s.sample(&logits, &[]).unwrap(), argmax(&logits));
    }
    assert_eq!(s.sample(&[1.0, 5.0, 5.0, 2.0], &[]).unwrap(), 1);
    assert_eq!(s.sample(&[0.0, 0.0, 0.0], &[]).unwrap(), 0);
    let negative = SamplingParams {
        temperature: -1.0,
        ..plain()
    };
    let mut s = Sampler::new(negative).unwrap();
    assert_eq!(s.sample(&[1.0, 5.0, 5.0, 2.0], &[]).unwrap(), 1);
}

#[test]
fn top_k_one_is_argmax() {
    let params = SamplingParams {
        top_k: 1,
        temperature: 1.5,
        ..plain()
    };
    let mut s = Sampler::new(params).unwrap();
    for seed in 0..20 {
        let logits = random_logits(5000, 2.0, seed);
        assert_eq!(s.sample(&logits, &[]).unwrap(), argmax(&logits));
    }
}

#[test]
fn seeded_draws_are_reproducible() {
    let params = SamplingParams {
        seed: 42,
        ..SamplingParams::default()
    };
    let run = |seed: u64| {
        let mut s = Sampler::new(SamplingParams {
            seed,
            ..params.clone()
        })
        .unwrap();
        let mut history = Vec::new();
        for step in 0..200 {
            let logits = random_logits(1000, 1.0, step);
            let t = s.sample(&logits, &history).unwrap();
            history.push(t);
        }
        history
    };
    let a = run(42);
    assert_eq!(a, run(42));
    assert_ne!(a, run(43));

    let mut s = Sampler::new(params).unwrap();
    let logits = random_logits(1000, 1.0, 7);
    let first: Vec<u32> = (0..50).map(|_| s.sample(&logits, &[]).unwrap()).collect();
    s.reseed(42);
    let again: Vec<u32> = (0..50).map(|_| s.sample(&logits, &[]).unwrap()).collect();
    assert_eq!(first, again);
}

#[test]
fn draws_follow_the_filtered_softmax() {
    let logits = random_logits(40, 3.0, 99);
    let history = [3u32, 7, 3, 11, 20];
    let configs = [
        ("plain", plain()),
        (
            "top_k=5 T=0.7",
            SamplingParams {
                top_k: 5,
                temperature: 0.7,
                ..plain()
            },
        ),
        (
            "top_p=0.8 T=1.3",
            SamplingParams {
                top_p: 0.8,
                temperature: 1.3,
                ..plain()
            },
        ),
        (
            "min_p=0.1",
            SamplingParams {
                min_p: 0.1,
                ..plain()
            },
        ),
        (
            "all + penalties",
            SamplingParams {
                top_k: 12,
                top_p: 0.9,
                min_p: 0.05,
                temperature: 0.8,
                repeat_penalty: 1.3,
                repeat_last_n: 4,
                presence_penalty: 0.2,
                frequency_penalty: 0.1,
                seed: 5,
            },
        ),
    ];
    const DRAWS: usize = 200_000;
    for (name, params) in configs {
        let want = reference(&logits, &history, &params);
        let mut s = Sampler::new(params).unwrap();
        assert_close(&dense(&mut s, &logits, &history), &want, 1e-5, name);

        let mut freq = vec![0usize; logits.len()];
        for _ in 0..DRAWS {
            freq[s.sample(&logits, &history).unwrap() as usize] += 1;
        }
        let n = DRAWS as f64;
        let (mut chi2, mut dof) = (0.0, 0usize);
        for (i, (&f, &p)) in freq.iter().zip(&want).enumerate() {
            if p == 0.0 {
                assert_eq!(f, 0, "{name}: filtered token {i} drawn");
                continue;
            }
            let got = f as f64 / n;
            let sigma = (p * (1.0 - p) / n).sqrt();
            assert!(
                (got - p).abs() <= 5.0 * sigma + 1e-9,
                "{name}: token {i}: frequency {got} vs p {p}"
            );
            chi2 += (f as f64 - n * p).powi(2) / (n * p);
            dof += 1;
        }
        let dof = dof.saturating_sub(1).max(1) as f64;
        assert!(
            chi2 <= dof + 6.0 * (2.0 * dof).sqrt(),
            "{name}: chi-square {chi2} with {dof} degrees of freedom"
        );
    }
}

#[test]
fn penalties_change_the_right_logits() {
    let logits = [2.0f32, -2.0, 1.0, 0.5, 3.0, -1.0, 0.0];
    // Token 1 is outside the window of the last 4; token 0 occurs twice in it.
    let history = [1u32, 0, 5, 3, 0];
    let params = SamplingParams {
        repeat_penalty: 1.5,
        repeat_last_n: 4,
        ..plain()
    };
    let mut s = Sampler::new(params.clone()).unwrap();
    let dist = s.distribution(&logits, &history).unwrap().to_vec();
    let got: Vec<f32> = dist.iter().map(|c| c.logit).collect();
    assert_eq!(got, [2.0 / 1.5, -2.0, 1.0, 0.5 / 1.5, 3.0, -1.5, 0.0]);

    let params = SamplingParams {
        frequency_penalty: 0.25,
        presence_penalty: 0.5,
        ..params
    };
    let mut s = Sampler::new(params).unwrap();
    let dist = s.distribution(&logits, &history).unwrap().to_vec();
    let got: Vec<f32> = dist.iter().map(|c| c.logit).collect();
    let want = [
        2.0 / 1.5 - 2.0 * 0.25 - 0.5,
        -2.0,
        1.0,
        0.5 / 1.5 - 0.25 - 0.5,
        3.0,
        -1.5 - 0.25 - 0.5,
        0.0,
    ];
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < 1e-6, "{got:?} vs {want:?}");
    }

    // Greedy sees the penalized logits; without penalties history is ignored.
    let greedy = SamplingParams {
        repeat_penalty: 1.1,
        ..SamplingParams::greedy()
    };
    let mut s = Sampler::new(greedy).unwrap();
    assert_eq!(s.sample(&[3.0, 2.9], &[0]).unwrap(), 1);
    let mut s = Sampler::new(SamplingParams::greedy()).unwrap();
    assert_eq!(s.sample(&[3.0, 2.9], &[0, 9999]).unwrap(), 0);
}

#[test]
fn nan_and_inf_logits() {
    let nan = f32::NAN;
    let logits = [nan, 1.0, nan, 0.5, nan];
    let mut s = Sampler::new(SamplingParams::greedy()).unwrap();
    assert_eq!(s.sample(&logits, &[]).unwrap(), 1);
    let mut s = Sampler::new(SamplingParams {
        top_p: 0.99,
        ..plain()
    })
    .unwrap();
    for _ in 0..1000 {
        let t = s.sample(&logits, &[]).unwrap();
        assert!(t == 1 || t == 3, "drew NaN token {t}");
    }
    let inf = [0.0, f32::INFINITY, 2.0, f32::NEG_INFINITY];
    assert_eq!(s.sample(&inf, &[]).unwrap(), 1);
    let mut boost = Sampler::new(SamplingParams {
        repeat_penalty: 0.5,
        ..plain()
    })
    .unwrap();
    assert_eq!(boost.sample(&[f32::MAX, 1.0], &[0, 1]).unwrap(), 0);
    let dist = boost.distribution(&[f32::MAX, f32::MAX], &[0]).unwrap();
    assert!(dist.iter().all(|c| c.p.is_finite()), "{dist:?}");
    assert_eq!(
        s.sample(&[nan, nan, f32::NEG_INFINITY], &[]),
        Err(SamplingError::NoFiniteLogits(3))
    );
    assert_eq!(s.sample(&[], &[]), Err(SamplingError::EmptyLogits));
}

#[test]
fn invalid_params_are_errors() {
    let bad = [
        (
            "top_p",
            SamplingParams {
                top_p: -0.1,
                ..plain()
            },
        ),
        (
            "top_p",
            SamplingParams {
                top_p: 1.5,
                ..plain()
            },
        ),
        (
            "min_p",
            SamplingParams {
                min_p: f32::NAN,
                ..plain()
            },
        ),
        (
            "temperature",
            SamplingParams {
                temperature: f32::NAN,
                ..plain()
            },
        ),
        (
            "repeat_penalty",
            SamplingParams {
                repeat_penalty: 0.0,
                ..plain()
            },
        ),
        (
            "presence_penalty",
            SamplingParams {
                presence_penalty: f32::INFINITY,
                ..plain()
            },
        ),
    ];
    for (name, params) in bad {
        match Sampler::new(params) {
            Err(SamplingError::InvalidParam { name: got, .. }) => assert_eq!(got, name),
            other => panic!("{name}: {other:?}"),
        }
    }
    let mut s = Sampler::new(SamplingParams {
        repeat_penalty: 1.2,
        ..plain()
    })
    .unwrap();
    assert_eq!(
        s.sample(&[1.0, 2.0], &[5]),
        Err(SamplingError::TokenOutOfRange {
            token: 5,
            n_vocab: 2
        })
    );
}

#[test]
fn large_vocabulary() {
    const N: usize = 262_144;
    let mut logits = random_logits(N, 4.0, 3);
    // A peaked head, as real logits have.
    for (i, l) in logits.iter_mut().enumerate().step_by(997) {
        *l += 8.0 + (i % 7) as f32;
    }
    let history: Vec<u32> = (0..64).map(|i| i * 4099 % N as u32).collect();
    let configs = [
        SamplingParams {
            repeat_penalty: 1.1,
            ..SamplingParams::default()
        },
        SamplingParams {
            top_p: 0.9,
            ..plain()
        },
        SamplingParams {
            min_p: 0.05,
            ..plain()
        },
    ];
    for params in configs {
        let want = reference(&logits, &history, &params);
        let mut s = Sampler::new(params.clone()).unwrap();
        assert_close(&dense(&mut s, &logits, &history), &want, 1e-6, "262k");
        let t0 = Instant::now();
        for _ in 0..20 {
            let t = s.sample(&logits, &history).unwrap();
            assert!(want[t as usize] > 0.0);
        }
        println!(
            "262k vocab, top_k={} top_p={} min_p={}: {:.2} ms per token",
            params.top_k,
            params.top_p,
            params.min_p,
            t0.elapsed().as_secs_f64() * 1e3 / 20.0
        );
    }
}
