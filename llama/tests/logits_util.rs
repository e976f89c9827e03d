//! Shared helpers of the logits tests (included by them with `#[path]`): fixture and model folders,
//! device placements for each split mode (on fewer GPUs than a mode needs, logical CUDA devices
//! sharing them), raw little-endian readers, and the comparison metrics (NMSE, KL divergence,
//! argmax) of the fixtures' README.

#![allow(dead_code)]

use backend_cpu::device::cpu_devices;
use backend_meta::MetaDevice;
use ggml_core::backend::Device;
use ggml_tp_tests::emulated::{self, Flavor};
use llama::Placement;
use std::path::PathBuf;
use std::sync::Arc;

/// The fixtures folder: `GGML_TP_FIXTURES`, else `<CARGO_MANIFEST_DIR>/../../shared/fixtures`.
pub fn fixtures() -> Option<PathBuf> {
    let dir = match std::env::var_os("GGML_TP_FIXTURES") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures"),
    };
    dir.is_dir().then_some(dir)
}

/// The tiny architecture fixtures' folder (`<fixtures>/arch`), or `None` after printing why the
/// test is skipped.
pub fn arch_dir() -> Option<PathBuf> {
    let dir = fixtures().map(|f| f.join("arch"));
    if dir.is_none() {
        println!("skipped: fixtures not found");
    }
    dir
}

/// The folders a real model file is looked for in, in order: `GGML_TP_MODELS` alone when it is
/// set, else the repository's `models/` (an override) and then the user's model cache that
/// `cargo xtask models` fills (`$XDG_CACHE_HOME/ggml-tp/models`, else `~/.cache/ggml-tp/models`).
pub fn model_dirs() -> Vec<PathBuf> {
    if let Some(dir) = std::env::var_os("GGML_TP_MODELS").filter(|d| !d.is_empty()) {
        return vec![PathBuf::from(dir)];
    }
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models");
    std::iter::once(repo)
        .chain(ggml_core::env::models_cache_dir())
        .collect()
}

/// The real model `file` from the first of [`model_dirs`] that has it, or `None` after printing
/// why the test is skipped.
pub fn model_file(file: &str) -> Option<PathBuf> {
    let dirs = model_dirs();
    let found = dirs.iter().map(|d| d.join(file)).find(|p| p.is_file());
    if found.is_none() {
        let looked: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
        println!(
            "skipped: models not found ({file} in {})",
            looked.join(", ")
        );
    }
    found
}

/// A split mode to test.
#[derive(Clone, Debug)]
pub enum Mode {
    None,
    Layers(Vec<f32>),
    Tensor(Vec<f32>),
}

/// The device family the logit tests run on: `GGML_TP_TEST_FAMILY` (e.g. `cuda` on the GPU
/// machine, `emulated-cuda` or `emulated-hip` for the GPU kernels on the host), else `cpu`.
pub fn family() -> String {
    std::env::var("GGML_TP_TEST_FAMILY").unwrap_or_else(|_| "cpu".into())
}

/// The emulated flavor `fam` names, if it names one.
fn emulated_flavor(fam: &str) -> Option<Flavor> {
    [Flavor::Cuda, Flavor::Hip]
        .into_iter()
        .find(|f| f.name() == fam)
}

/// `n` devices of the test family (virtual CPU devices, emulated GPUs, the first `n` registered
/// ones, or for `cuda` with fewer GPUs than `n` logical devices, see [`logical_cuda`]).
pub fn devices(n: usize) -> Vec<Arc<dyn Device>> {
    let fam = family();
    if fam == "cpu" {
        return cpu_devices(n, 2)
            .unwrap()
            .into_iter()
            .map(|d| d as Arc<dyn Device>)
            .collect();
    }
    if let Some(flavor) = emulated_flavor(&fam) {
        return emulated::devices(flavor, n).unwrap();
    }
    let devs: Vec<Arc<dyn Device>> = ggml_core::registry::devices()
        .into_iter()
        .filter(|d| d.family() == fam)
        .collect();
    if fam == "cuda" && devs.len() < n && !devs.is_empty() {
        return logical_cuda(n);
    }
    assert!(
        devs.len() >= n,
        "{n} {fam} devices needed, {} found",
        devs.len()
    );
    devs.into_iter().take(n).collect()
}

/// `n` CUDA devices over fewer GPUs: every GPU as `ceil(n / GPUs)` logical devices (own streams,
/// an equal share of the memory, copies and AllReduce within the card), the first `n` of them, so
/// that every split mode runs on one GPU.
fn logical_cuda(n: usize) -> Vec<Arc<dyn Device>> {
    let gpus = backend_cuda::cuda_devices_with(1).expect("CUDA GPUs").len();
    let devs = backend_cuda::cuda_devices_with(n.div_ceil(gpus)).expect("logical CUDA devices");
    println!(
        "{n} logical CUDA devices on {gpus} GPU(s): {}",
        devs.iter()
            .take(n)
            .map(|d| format!("{} {}", d.name(), d.description()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    devs.into_iter()
        .take(n)
        .map(|d| d as Arc<dyn Device>)
        .collect()
}

/// How many devices of the test family exist (CPU and emulated devices are virtual, and so are
/// logical CUDA devices once there is a GPU: any number).
pub fn available() -> usize {
    if family() == "cpu" || emulated_flavor(&family()).is_some() {
        return usize::MAX;
    }
    let n = ggml_core::registry::devices()
        .into_iter()
        .filter(|d| d.family() == family())
        .count();
    if family() == "cuda" && n > 0 {
        usize::MAX
    } else {
        n
    }
}

impl Mode {
    pub fn placement(&self) -> Placement {
        match self {
            Mode::None => Placement::Single(devices(1).remove(0)),
            Mode::Layers(r) => Placement::Layers {
                devices: devices(r.len()),
                ratios: r.clone(),
            },
            Mode::Tensor(r) => {
                Placement::Tensor(MetaDevice::new(devices(r.len()), Some(r.clone())).unwrap())
            }
        }
    }

    /// Devices the mode needs.
    pub fn needs(&self) -> usize {
        match self {
            Mode::None => 1,
            Mode::Layers(r) | Mode::Tensor(r) => r.len(),
        }
    }
}

/// A tiny model of `fixtures/arch` as its manifest describes it.
pub struct ArchFixture {
    pub name: String,
    /// The 64 token ids llama.cpp was fed.
    pub ids: Vec<u32>,
    pub n_vocab: usize,
}

impl ArchFixture {
    /// llama.cpp's logits `[64, n_vocab]` (`<name>.logits.f32` in `dir`).
    pub fn reference(&self, dir: &std::path::Path) -> Vec<f32> {
        read_f32(&dir.join(format!("{}.logits.f32", self.name)))
    }
}

/// Every model of `dir/manifest.json` (the `fixtures/arch` folder), in manifest order.
pub fn arch_fixtures(dir: &std::path::Path) -> Vec<ArchFixture> {
    let text = std::fs::read_to_string(dir.join("manifest.json")).unwrap();
    let manifest: serde_json::Value = serde_json::from_str(&text).unwrap();
    manifest["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| ArchFixture {
            name: m["name"].as_str().unwrap().to_string(),
            ids: m["token_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect(),
            n_vocab: m["hparams"]["n_vocab"].as_u64().unwrap() as usize,
        })
        .collect()
}

/// The model `name` of `dir/manifest.json`.
pub fn arch_fixture(dir: &std::path::Path, name: &str) -> ArchFixture {
    arch_fixtures(dir)
        .into_iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("{name} is not in the fixtures manifest"))
}

pub fn read_f32(path: &std::path::Path) -> Vec<f32> {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

pub fn read_i32(path: &std::path::Path) -> Vec<i32> {
    read_f32(path)
        .into_iter()
        .map(|f| f.to_bits() as i32)
        .collect()
}

/// `sum((c - r)^2) / sum(r^2)`.
pub fn nmse(c: &[f32], r: &[f32]) -> f64 {
    let num: f64 = c.iter().zip(r).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = r.iter().map(|y| (*y as f64).powi(2)).sum();
    num / den.max(1e-30)
}

fn log_softmax(x: &[f32]) -> Vec<f64> {
    let m = x.iter().fold(f64::NEG_INFINITY, |a, &v| a.max(v as f64));
    let lse = m + x.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
    x.iter().map(|&v| v as f64 - lse).collect()
}

/// `KL(softmax(r) || softmax(c))`.
pub fn kl(r: &[f32], c: &[f32]) -> f64 {
    let (lr, lc) = (log_softmax(r), log_softmax(c));
    lr.iter().zip(&lc).map(|(a, b)| a.exp() * (a - b)).sum()
}

pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

/// Best minus second-best value.
pub fn margin(x: &[f32]) -> f32 {
    let b = argmax(x);
    let second = x
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != b)
        .fold(f32::NEG_INFINITY, |a, (_, &v)| a.max(v));
    x[b] - second
}
