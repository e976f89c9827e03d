//! End-to-end checks of the meta device over CPU devices: a two-layer transformer block (GQA attention
//! through flash attention and through mul_mat + softmax, SwiGLU FFN, and a MoE variant) computes the
//! same output on meta(cpu x N) as on one CPU device, for several device counts and ratios; the MoE
//! reduction is delayed past the expert sum; a repeated graph hits the program cache; the generic
//! AllReduce works for any device count; a large mirrored weight (a tied output head) is multiplied
//! by rows shared out over the devices; runs over shared devices from several threads finish.

mod common;

use backend_cpu::device::cpu_devices;
use backend_meta::{MetaDevice, ReduceOptions};
use common::{nmse, on_meta, on_meta_with, single, Dims};
use ggml_core::Device;
use std::sync::Arc;

const D: usize = Dims::TEST.d;

#[test]
fn dense_block_matches_one_device() {
    let seed = rand::random::<u64>();
    for t in [1usize, 5] {
        let want = single(seed, false, t);
        assert!(want.iter().all(|v| v.is_finite()));
        for (n, ratios) in [
            (1, None),
            (2, None),
            (3, None),
            (4, None),
            (2, Some(vec![3.0, 1.0])),
            (3, Some(vec![1.0, 1.0, 0.0])),
        ] {
            let (got, stats) = on_meta(n, ratios.clone(), seed, false, t, 1);
            let e = nmse(&got, &want);
            assert!(
                e <= 1e-6,
                "seed {seed} t {t} n {n} ratios {ratios:?}: nmse {e}"
            );
            if n > 1 {
                assert!(stats.reductions > 0, "partial sums were reduced");
            }
        }
    }
}

#[test]
fn moe_block_matches_and_reduces_after_the_expert_sum() {
    let seed = rand::random::<u64>();
    let t = 3;
    let want = single(seed, true, t);
    for (n, ratios) in [
        (2, None),
        (2, Some(vec![3.0, 1.0])),
        (3, Some(vec![1.0, 1.0, 0.0])),
        (4, None),
    ] {
        let (got, stats) = on_meta(n, ratios.clone(), seed, true, t, 1);
        let e = nmse(&got, &want);
        assert!(e <= 1e-6, "seed {seed} n {n} ratios {ratios:?}: nmse {e}");
        // Per layer: one reduction of the attention output and one of the MoE output, each one token's
        // hidden state per token ([D, t] f32), not one per used expert ([D, USED, t]).
        let hidden = (D * t * 4) as u64;
        assert_eq!(stats.reductions, 4, "{stats:?}");
        assert_eq!(stats.reduced_bytes, 4 * hidden, "{stats:?}");
        assert_eq!(stats.gathers, 0, "{stats:?}");
    }
}

#[test]
fn repeated_graph_hits_the_program_cache() {
    let seed = rand::random::<u64>();
    let (_, stats) = on_meta(2, None, seed, false, 2, 3);
    assert_eq!(stats.builds, 1, "{stats:?}");
    assert_eq!(stats.hits, 2, "{stats:?}");
}

#[test]
fn graphs_of_alternating_shapes_keep_their_programs() {
    let seed = rand::random::<u64>();
    let meta = common::meta_device(2, None, None);
    let backend = meta.new_meta_backend().unwrap();
    let mut h = common::Harness::new(
        backend.clone(),
        common::Place::Meta(meta.clone()),
        Dims::TEST,
        seed,
        false,
        1,
    );
    // The longest first, so that every later graph fits the arena planned for it and keeps its
    // inputs' addresses: then each shape is planned once however the shapes alternate.
    let shapes = [7usize, 3, 7, 3, 1, 1, 7, 1, 3];
    for (i, &t) in shapes.iter().enumerate() {
        h.set_tokens(t);
        let got = h.step();
        let want = single(seed, false, t);
        let e = nmse(&got, &want);
        assert!(e <= 1e-6, "seed {seed} step {i} t {t}: nmse {e}");
    }
    let stats = backend.stats();
    assert_eq!(stats.builds, 3, "{stats:?}");
    assert_eq!(stats.hits, shapes.len() as u64 - 3, "{stats:?}");
    assert_eq!(stats.evictions, 0, "{stats:?}");
    assert_eq!(backend.cached_programs(), 3);
    assert_eq!(meta.stats(), stats, "the device sums its live streams");
}

#[test]
fn a_driver_takes_over_the_shares_of_a_device_whose_thread_is_busy() {
    let seed = rand::random::<u64>();
    let t = 3;
    let want = single(seed, false, t);
    let cpus = cpu_devices(2, 2).unwrap();
    let devs: Vec<Arc<dyn Device>> = cpus.iter().map(|d| d.clone() as Arc<dyn Device>).collect();
    let meta = MetaDevice::new(devs, None).unwrap();
    let backend = meta.new_meta_backend().unwrap();
    let mut h = common::Harness::new(
        backend.clone(),
        common::Place::Meta(meta),
        Dims::TEST,
        seed,
        false,
        t,
    );
    // cpu:1's only thread stays busy until another driver has computed one of its shares (or,
    // should that never happen, for a minute: then the assertion below fails).
    let watched = backend.clone();
    cpus[1].pool().spawn(move || {
        let give_up = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while watched.stats().taken_over == 0 && std::time::Instant::now() < give_up {
            std::thread::yield_now();
        }
    });
    let got = h.step();
    let e = nmse(&got, &want);
    assert!(e <= 1e-6, "seed {seed}: nmse {e}");
    assert!(backend.stats().taken_over >= 1, "{:?}", backend.stats());
}

#[test]
fn mixed_families_duplicates_and_bad_ratios_are_refused() {
    assert!(MetaDevice::new(vec![], None).is_err());
    let devs: Vec<Arc<dyn Device>> = cpu_devices(2, 2)
        .unwrap()
        .into_iter()
        .map(|d| d as Arc<dyn Device>)
        .collect();
    assert!(MetaDevice::new(devs.clone(), Some(vec![1.0])).is_err());
    let twice = vec![devs[0].clone(), devs[0].clone()];
    assert!(matches!(
        MetaDevice::new(twice, None),
        Err(backend_meta::MetaError::Duplicate(name)) if name == "cpu:0"
    ));
    assert!(MetaDevice::new(devs, Some(vec![0.0, 0.0])).is_err());
}

#[test]
fn generic_recursive_doubling_reduce_matches_for_any_device_count() {
    let seed = rand::random::<u64>();
    let t = 4;
    let want = single(seed, false, t);
    for n in [2usize, 3, 4] {
        let f32_only = ReduceOptions {
            generic: true,
            bf16_min_bytes: usize::MAX,
        };
        let (got, stats) = on_meta_with(n, None, seed, false, t, 1, Some(f32_only));
        let e = nmse(&got, &want);
        assert!(e <= 1e-6, "seed {seed} n {n}: nmse {e}");
        assert_eq!(
            stats.reduced_bytes,
            stats.reductions * (D * t * 4) as u64,
            "{stats:?}"
        );
        // Everything travels in BF16: half the bytes, BF16-sized error.
        let bf16 = ReduceOptions {
            generic: true,
            bf16_min_bytes: 0,
        };
        let (got, stats) = on_meta_with(n, None, seed, false, t, 1, Some(bf16));
        let e = nmse(&got, &want);
        assert!(e <= 1e-4, "seed {seed} n {n} bf16: nmse {e}");
        assert_eq!(stats.reduced_bytes, stats.reductions * (D * t * 2) as u64);
    }
}

#[test]
fn each_device_plans_compute_memory_for_its_share_only() {
    use common::{cpu_device, meta_device, Harness, Place};
    // A wide FFN and a batch of tokens make the split intermediates dominate.
    let dims = Dims {
        d: 64,
        head: 16,
        hq: 4,
        hkv: 2,
        ffn: 1024,
        ctx: 32,
        experts: 4,
        used: 2,
    };
    let t = 32;
    let dev = cpu_device(1);
    let mut one = Harness::new(
        dev.new_backend().unwrap(),
        Place::Single(dev),
        dims,
        3,
        false,
        t,
    );
    let want = one.step();
    let full = one.planned_memory();
    let meta = meta_device(2, None, None);
    let backend = meta.new_meta_backend().unwrap();
    let mut two = Harness::new(backend.clone(), Place::Meta(meta), dims, 3, false, t);
    assert!(nmse(&two.step(), &want) <= 1e-6);
    let per_device = backend.device_compute_memory();
    println!("one device: {full} bytes; meta x2 per device: {per_device:?}");
    assert_eq!(per_device.len(), 2);
    for m in per_device {
        assert!(
            m * 10 <= full * 7,
            "a device plans {m} bytes of compute memory, one device alone {full}"
        );
    }
}

#[test]
fn sixty_four_devices_hold_their_slices() {
    use backend_meta::WeightSplit;
    use ggml_core::{DType, Layout};
    let devs: Vec<Arc<dyn Device>> = cpu_devices(64, 64)
        .unwrap()
        .into_iter()
        .map(|d| d as Arc<dyn Device>)
        .collect();
    let meta = MetaDevice::new(devs, None).unwrap();
    // 100 rows over 64 devices: 36 devices hold 2 rows, 28 hold 1; bytes round-trip.
    let layout = Layout::contiguous(DType::F32, [8, 100, 1, 1]);
    let buf = meta
        .alloc_tensor(layout, &WeightSplit::axis(1, 100, 1), 0, "w")
        .unwrap();
    let vals: Vec<f32> = (0..800).map(|i| i as f32).collect();
    ggml_core::Buffer::set(buf.as_ref(), 0, bytemuck::cast_slice(&vals)).unwrap();
    let mut back = vec![0f32; 800];
    ggml_core::Buffer::get(buf.as_ref(), 0, bytemuck::cast_slice_mut(&mut back)).unwrap();
    assert_eq!(back, vals);
    let rows: Vec<usize> = (0..64).map(|d| buf.local_layout(d).ne[1]).collect();
    assert_eq!(rows.iter().sum::<usize>(), 100);
    assert!(rows.iter().all(|&r| r == 1 || r == 2), "{rows:?}");
}

#[test]
fn a_large_mirrored_weight_is_multiplied_by_rows_shared_out() {
    // A tied output head (8 MiB of F32 weights) is; a MoE router's size (2 MiB) is not, so that
    // its softmax needs no gather.
    for (rows, split) in [(32768usize, true), (8192, false)] {
        mirrored_weight_times_mirrored_activation(rows, split);
    }
}

/// A mirrored F32 weight of 64 x `rows` times a mirrored hidden state on two devices, alone (a
/// graph output) and under a softmax; `split`: whether its rows are expected to be shared out.
fn mirrored_weight_times_mirrored_activation(rows: usize, split: bool) {
    use ggml_core::backend::Backend;
    use ggml_core::sched::Scheduler;
    use ggml_core::{DType, DataRef, Graph, Layout};
    use rand::{Rng, SeedableRng};
    let (d, t) = (64usize, 3usize);
    let seed = rand::random::<u64>();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let head: Vec<f32> = (0..d * rows).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let x: Vec<f32> = (0..d * t).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let layout = Layout::contiguous(DType::F32, [d, rows, 1, 1]);
    // Logits alone (a graph output), and their softmax (which needs every row on every device).
    let run = |backend: Arc<dyn Backend>, head_buffer: Arc<dyn ggml_core::Buffer>, soft: bool| {
        head_buffer.set(0, bytemuck::cast_slice(&head)).unwrap();
        let mut g = Graph::new();
        let w = g.new_bound(layout, DataRef::new(head_buffer, 0), "head", true);
        let xi = g.new_input(DType::F32, &[d, t]).unwrap();
        let h = g.rms_norm(xi, 1e-5).unwrap();
        let mut out = g.mul_mat(w, h).unwrap();
        if soft {
            out = g.soft_max(out, None, None, 1.0, 0.0).unwrap();
        }
        g.output(out);
        let mut sched = Scheduler::new(vec![backend]);
        sched.alloc(&mut g).unwrap();
        g.set_f32(xi, &x).unwrap();
        sched.compute(&g).unwrap();
        g.get_f32(out).unwrap()
    };
    for soft in [false, true] {
        let cpu = common::cpu_device(1);
        let want = run(
            cpu.new_backend().unwrap(),
            cpu.buffer_type().alloc(layout.nbytes()).unwrap(),
            soft,
        );
        let meta = common::meta_device(2, None, None);
        let backend = meta.new_meta_backend().unwrap();
        let weight = meta
            .alloc_tensor(layout, &backend_meta::WeightSplit::Mirrored, 0, "head")
            .unwrap();
        let got = run(backend.clone(), weight, soft);
        let e = nmse(&got, &want);
        assert!(
            e <= 1e-10,
            "seed {seed} rows {rows} softmax {soft}: nmse {e}"
        );
        // Each device plans memory for its half of the logits, not for all of them (the softmax
        // gathers them whole first).
        let full = rows * t * 4;
        for m in backend
            .device_compute_memory()
            .into_iter()
            .filter(|_| split && !soft)
        {
            assert!(
                m < full,
                "a device plans {m} bytes, the whole product is {full}"
            );
        }
        assert_eq!(
            backend.stats().gathers,
            u64::from(split && soft),
            "{:?}",
            backend.stats()
        );
    }
}

#[test]
fn concurrent_runs_over_shared_devices_finish() {
    use common::{Harness, Place};
    // Two meta devices over the same two CPU devices (one worker thread each), in both orders,
    // computing at once from two threads: each run's drivers need both devices' workers.
    let devs: Vec<Arc<dyn Device>> = cpu_devices(2, 2)
        .unwrap()
        .into_iter()
        .map(|d| d as Arc<dyn Device>)
        .collect();
    let seed = rand::random::<u64>();
    let t = 2;
    let want = single(seed, false, t);
    let orders = [
        vec![devs[0].clone(), devs[1].clone()],
        vec![devs[1].clone(), devs[0].clone()],
    ];
    std::thread::scope(|s| {
        for order in orders {
            let want = &want;
            s.spawn(move || {
                let meta = MetaDevice::new(order, None).unwrap();
                let mut h = Harness::new(
                    meta.new_backend().unwrap(),
                    Place::Meta(meta),
                    Dims::TEST,
                    seed,
                    false,
                    t,
                );
                for _ in 0..50 {
                    let e = nmse(&h.step(), want);
                    assert!(e <= 1e-6, "seed {seed}: nmse {e}");
                }
            });
        }
    });
}
