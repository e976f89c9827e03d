//! Shared by the GPU tests of backend-cuda: the CUDA devices (or the printed reason there are none),
//! random data, and the normalized error against a higher-precision reference.

#![allow(dead_code)] // each test binary uses its own share of these helpers

use backend_cuda::{cuda_devices, CudaDevice};
use rand::{Rng, SeedableRng};
use std::sync::Arc;

/// At least `n` CUDA devices, or `None` after printing why the test is skipped.
pub fn devices(n: usize) -> Option<Vec<Arc<CudaDevice>>> {
    match cuda_devices() {
        Err(reason) => {
            println!("skipped: no CUDA device ({reason})");
            None
        }
        Ok(d) if d.len() < n => {
            println!("skipped: {} CUDA device(s), the test needs {n}", d.len());
            None
        }
        Ok(d) => Some(d),
    }
}

/// True when NCCL loads, else prints why the test is skipped.
pub fn nccl_or_skip() -> bool {
    match backend_cuda::nccl::library() {
        Ok(_) => true,
        Err(e) => {
            println!("skipped: no NCCL ({e})");
            false
        }
    }
}

/// `n` values uniform in [-1, 1), fresh each run.
pub fn random(n: usize) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::from_entropy();
    (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
}

/// Normalized mean squared error of `got` against `want`.
pub fn nmse(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let err: f64 = got
        .iter()
        .zip(want)
        .map(|(&g, &w)| (g as f64 - w).powi(2))
        .sum();
    let norm: f64 = want.iter().map(|w| w * w).sum();
    if norm == 0.0 {
        err
    } else {
        err / norm
    }
}
