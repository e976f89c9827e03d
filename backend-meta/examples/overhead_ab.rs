//! Interleaved A/B timing of the meta layer's cost: the test block at benchmark size on one CPU
//! device directly (A) and through a meta device over that one device (B), alternating rounds so that
//! load from other processes hits both alike. Prints per-round times and the median ratio B/A.
//! `cargo run --release -p backend-meta --example overhead_ab -- [tokens] [rounds]`

#[path = "../tests/common/mod.rs"]
mod common;

use common::{Dims, Harness, Place};
use ggml_core::Device;
use std::sync::Arc;
use std::time::Instant;

const BENCH: Dims = Dims {
    d: 512,
    head: 64,
    hq: 8,
    hkv: 4,
    ffn: 1408,
    ctx: 64,
    experts: 4,
    used: 2,
};

fn main() {
    let mut args = std::env::args().skip(1);
    let t: usize = args.next().and_then(|v| v.parse().ok()).unwrap_or(1);
    let rounds: usize = args.next().and_then(|v| v.parse().ok()).unwrap_or(15);
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2);
    let dev = common::cpu_device(threads);
    let mut a = Harness::new(
        dev.new_backend().unwrap(),
        Place::Single(dev),
        BENCH,
        1,
        false,
        t,
    );
    let devs: Vec<Arc<dyn Device>> = backend_cpu::device::cpu_devices(1, threads)
        .unwrap()
        .into_iter()
        .map(|d| d as Arc<dyn Device>)
        .collect();
    let meta = backend_meta::MetaDevice::new(devs, None).unwrap();
    let mut b = Harness::new(
        meta.new_backend().unwrap(),
        Place::Meta(meta),
        BENCH,
        1,
        false,
        t,
    );
    assert_eq!(a.step(), b.step(), "same result through the meta device");
    let steps = 100;
    let mut ratios = Vec::new();
    for round in 0..rounds {
        let s = Instant::now();
        (0..steps).for_each(|_| drop(a.step()));
        let ta = s.elapsed() / steps as u32;
        let s = Instant::now();
        (0..steps).for_each(|_| drop(b.step()));
        let tb = s.elapsed() / steps as u32;
        ratios.push(tb.as_secs_f64() / ta.as_secs_f64());
        println!(
            "round {round:2}: cpu {ta:>10.3?}  meta(cpu x1) {tb:>10.3?}  ratio {:.3}",
            ratios[round]
        );
    }
    ratios.sort_by(f64::total_cmp);
    println!(
        "tokens {t}: median ratio meta/cpu {:.3} over {rounds} rounds",
        ratios[rounds / 2]
    );
}
