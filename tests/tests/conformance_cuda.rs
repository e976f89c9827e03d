//! The conformance suite on every CUDA device, and on meta devices over the CUDA devices with even
//! and 3:1 ratios (AllReduce through NCCL when it loads) and over 2 and 3 logical devices of GPU 0
//! (`backend_cuda::cuda_devices_with`: the same-GPU AllReduce, so that every tensor-parallel path
//! runs on one GPU), and repeated runs there kept as one CUDA graph over both streams; then a
//! direct check of the NCCL communicator and a few timings. Prints `skipped: no CUDA device`
//! (with the reason) when there is none, as on CI.

use backend_meta::MetaDevice;
use ggml_core::{Backend, DType, DataRef, Device, Graph};
use ggml_tp_tests::{
    check_all_reduce_sum, check_repeated_runs, family_devices, run_family, run_suite,
};
use std::sync::Arc;
use std::time::Instant;

/// The CUDA devices, or `None` after printing why there are none.
fn cuda_devices() -> Option<Vec<Arc<dyn Device>>> {
    family_devices("cuda", "CUDA")
}

#[test]
fn cuda_devices_conform() {
    let Some(devs) = cuda_devices() else { return };
    for d in &devs {
        println!("{}: {}, {:?}", d.name(), d.description(), d.memory());
    }
    for r in run_family("cuda", devs) {
        r.assert_ok();
    }
}

/// The `n` logical devices of GPU 0, or `None` after printing why there are none.
fn logical_devices(n: usize) -> Option<Vec<Arc<dyn Device>>> {
    match backend_cuda::cuda_devices_with(n) {
        Err(reason) => {
            println!("skipped: no CUDA device ({reason})");
            None
        }
        Ok(d) => Some(
            d.into_iter()
                .filter(|d| d.ordinal() == 0)
                .map(|d| d as Arc<dyn Device>)
                .collect(),
        ),
    }
}

/// The suite on a meta device over the CUDA devices; with split inputs, an in-place write into a
/// destination split along the written axis has no rule (the only failure allowed, as for CPU).
fn check_meta(ratios: Option<Vec<f32>>, input_axis: Option<usize>) {
    let Some(devs) = cuda_devices() else { return };
    check_meta_over(devs, ratios, input_axis);
}

/// [`check_meta`] over `devs`.
fn check_meta_over(
    devs: Vec<Arc<dyn Device>>,
    ratios: Option<Vec<f32>>,
    input_axis: Option<usize>,
) {
    let ratios = ratios.filter(|r| r.len() == devs.len());
    let m = MetaDevice::new(devs.clone(), ratios.clone()).unwrap();
    m.set_input_split(input_axis);
    let backend = m.new_meta_backend().unwrap();
    let communicator = backend.has_communicator();
    let mut report = run_suite(backend);
    println!(
        "meta over {} CUDA devices ({}), ratios {ratios:?}, inputs split on {input_axis:?}, \
         communicator: {communicator}:\n{}",
        devs.len(),
        devs.iter()
            .map(|d| d.description())
            .collect::<Vec<_>>()
            .join(", "),
        report.summary()
    );
    for s in report.skipped.iter().take(20) {
        println!("{s}");
    }
    let (no_rule, failures): (Vec<String>, Vec<String>) = report
        .failures
        .drain(..)
        .partition(|f| f.contains("meta: no split rule for"));
    report.failures = failures;
    if input_axis.is_none() {
        assert!(no_rule.is_empty(), "whole inputs always have a rule");
    }
    println!("  cases without a split rule: {}", no_rule.len());
    report.assert_ok();
}

#[test]
fn meta_cuda_even_inputs_whole() {
    check_meta(None, None);
}

#[test]
fn meta_cuda_three_to_one_inputs_whole() {
    check_meta(Some(vec![3.0, 1.0]), None);
}

#[test]
fn meta_cuda_three_to_one_inputs_split_on_axis_1() {
    check_meta(Some(vec![3.0, 1.0]), Some(1));
}

/// The suite on a meta device over `n` logical devices of GPU 0, which reduce through the same-GPU
/// communicator.
fn check_meta_logical(n: usize, ratios: Option<Vec<f32>>, input_axis: Option<usize>) {
    let Some(devs) = logical_devices(n) else {
        return;
    };
    assert_eq!(devs.len(), n);
    let m = MetaDevice::new(devs.clone(), None).unwrap();
    assert!(
        m.new_meta_backend().unwrap().has_communicator(),
        "logical devices of one GPU have a communicator"
    );
    check_meta_over(devs, ratios, input_axis);
}

#[test]
fn meta_cuda_two_logical_even() {
    check_meta_logical(2, None, None);
}

#[test]
fn meta_cuda_two_logical_three_to_one() {
    check_meta_logical(2, Some(vec![3.0, 1.0]), None);
}

#[test]
fn meta_cuda_two_logical_three_to_one_inputs_split_on_axis_1() {
    check_meta_logical(2, Some(vec![3.0, 1.0]), Some(1));
}

#[test]
fn meta_cuda_three_logical_even() {
    check_meta_logical(3, None, None);
}

#[test]
fn meta_cuda_three_logical_three_to_one_to_one() {
    check_meta_logical(3, Some(vec![3.0, 1.0, 1.0]), None);
}

/// The matrix products of the suite, each run repeatedly over fresh inputs on a meta device over
/// two logical devices whose calling thread issues the work: the first runs are issued call by
/// call, the next recorded as one CUDA graph over both streams, the last replays it; every run
/// matches the reference, so a replay that ran nothing (or stale work) fails.
#[test]
fn meta_cuda_two_logical_recorded_programs_conform() {
    let Some(devs) = logical_devices(2) else {
        return;
    };
    let backend = MetaDevice::new(devs, None)
        .unwrap()
        .new_meta_backend()
        .unwrap();
    assert!(
        backend.set_one_driver(true),
        "logical devices queue their work and reduce on their streams"
    );
    backend.set_recording(true);
    let runs = u64::from(backend_meta::record::RUNS_BEFORE_RECORDING) + 2;
    let ran = check_repeated_runs(backend.clone(), "mul_mat", 12, runs);
    let stats = backend.stats();
    println!("{ran} mul_mat cases {runs} times each: {stats:?}");
    assert!(ran > 0, "the suite's mul_mat cases run on CUDA");
    assert_eq!(stats.refused_recordings, 0, "{stats:?}");
    assert!(
        stats.recordings >= ran as u64,
        "a recording per case: {stats:?}"
    );
    assert_eq!(
        stats.replays,
        2 * stats.recordings,
        "each recording replayed for its run and the next: {stats:?}"
    );
}

/// Allocates `count` f32 on each device and returns (backend, buffer) pairs.
fn per_device_f32(devs: &[Arc<dyn Device>], count: usize) -> Vec<(Arc<dyn Backend>, DataRef)> {
    devs.iter()
        .map(|d| {
            let buf = d.buffer_type().alloc(count * 4).unwrap();
            (d.new_backend().unwrap(), DataRef::new(buf, 0))
        })
        .collect()
}

#[test]
fn nccl_all_reduce_sums_and_timing() {
    let Some(devs) = cuda_devices() else { return };
    let reg = ggml_core::registry::backend("cuda").unwrap();
    let count = 4096 + 3;
    let parts = per_device_f32(&devs, count);
    let backends: Vec<Arc<dyn Backend>> = parts.iter().map(|p| p.0.clone()).collect();
    let Some(comm) = reg.new_communicator(&backends) else {
        println!("skipped: no NCCL communicator (libnccl.so missing)");
        return;
    };
    let comm = comm.unwrap();
    let data: Vec<DataRef> = parts.iter().map(|p| p.1.clone()).collect();
    check_all_reduce_sum(comm.as_ref(), &data, count);
    // Latency at 16 KB (4096 f32), averaged after a warm-up. The communicator is stream-ordered
    // (calls only queue work), so each call is followed by a wait for every participant.
    let iters = 200;
    let round_trip = || {
        comm.all_reduce(&data, DType::F32, 4096).unwrap();
        backends.iter().for_each(|b| b.synchronize().unwrap());
    };
    round_trip();
    let t = Instant::now();
    for _ in 0..iters {
        round_trip();
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
    println!(
        "all_reduce over {} devices, 16 KB: {us:.1} us per call (host-synchronized)",
        devs.len()
    );
}

#[test]
fn cuda_mul_mat_timing() {
    let Some(devs) = cuda_devices() else { return };
    let backend = devs[0].new_backend().unwrap();
    for (wt, k, m) in [(DType::BF16, 4096, 4096), (DType::Q4_0, 4096, 4096)] {
        let mut g = Graph::new();
        let a = g.new_input(wt, &[k, m]).unwrap();
        let b = g.new_input(DType::F32, &[k, 1]).unwrap();
        let out = g.mul_mat(a, b).unwrap();
        g.output(out);
        let mut sched = ggml_core::sched::Scheduler::new(vec![backend.clone()]);
        sched.alloc(&mut g).unwrap();
        sched.compute(&g).unwrap();
        let iters = 20;
        let t = Instant::now();
        for _ in 0..iters {
            sched.compute(&g).unwrap();
        }
        let s = t.elapsed().as_secs_f64() / iters as f64;
        let bytes = g.layout(a).nbytes() as f64;
        println!(
            "mul_mat {wt} [{k} x {m}] x vector on {}: {:.1} us, {:.2} TB/s of weights",
            devs[0].name(),
            s * 1e6,
            bytes / s / 1e12
        );
    }
}
