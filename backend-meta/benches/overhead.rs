//! What the meta layer costs: the two-layer transformer block of the tests, at a larger size, on one
//! CPU device directly and through a meta device over that one device (same threads). The meta issue
//! asks for at most 5% more time. Also meta over two CPU devices sharing the same cores, for scale.

#[path = "../tests/common/mod.rs"]
mod common;

use backend_cpu::device::cpu_devices;
use backend_meta::MetaDevice;
use common::{Dims, Harness, Place};
use criterion::{criterion_group, criterion_main, Criterion};
use ggml_core::Device;
use std::sync::Arc;

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

fn threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
}

fn meta_over(n: usize) -> Arc<MetaDevice> {
    let devs: Vec<Arc<dyn Device>> = cpu_devices(n, threads())
        .unwrap()
        .into_iter()
        .map(|d| d as Arc<dyn Device>)
        .collect();
    MetaDevice::new(devs, None).unwrap()
}

fn bench(c: &mut Criterion) {
    for t in [1usize, 32] {
        let mut g = c.benchmark_group(format!("block_t{t}"));
        g.sample_size(30);
        let dev: Arc<dyn Device> = cpu_devices(1, threads()).unwrap().remove(0);
        let mut single = Harness::new(
            dev.new_backend().unwrap(),
            Place::Single(dev),
            BENCH,
            1,
            false,
            t,
        );
        g.bench_function("cpu", |b| b.iter(|| single.step()));
        let m1 = meta_over(1);
        let mut meta1 = Harness::new(
            m1.new_backend().unwrap(),
            Place::Meta(m1),
            BENCH,
            1,
            false,
            t,
        );
        g.bench_function("meta(cpu x1)", |b| b.iter(|| meta1.step()));
        let m2 = meta_over(2);
        let mut meta2 = Harness::new(
            m2.new_backend().unwrap(),
            Place::Meta(m2),
            BENCH,
            1,
            false,
            t,
        );
        g.bench_function("meta(cpu x2)", |b| b.iter(|| meta2.step()));
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
