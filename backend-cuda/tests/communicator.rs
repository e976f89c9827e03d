//! The CUDA communicator on real GPUs: every path (NCCL, NCCL over BF16, one-shot peer-to-peer, one-shot
//! over BF16) in F32 and BF16 with odd counts against an F64 reference, guard bytes around every
//! message, identical results on every rank, hundreds of calls queued back to back with no host
//! synchronization in between, the registry's communicator, and clear errors for bad input. Prints
//! `skipped: ...` without two GPUs or NCCL.

mod common;

use backend_cuda::{CudaBackend, NcclCommunicator, ReducePath, ReducePolicy};
use common::{devices, nccl_or_skip, random};
use ggml_core::{Backend, Buffer, Communicator, DType, DataRef, Device, Error};
use half::bf16;
use std::sync::Arc;

/// Bytes of poison around each message.
const GUARD: usize = 256;
const POISON: u8 = 0xff;

const POLICY: ReducePolicy = ReducePolicy {
    one_shot_max_bytes: 512 << 10,
    bf16_min_bytes: Some(4 << 20),
};

struct Rig {
    backends: Vec<Arc<CudaBackend>>,
    comm: NcclCommunicator,
}

fn rig() -> Option<Rig> {
    let devs = devices(2)?;
    if !nccl_or_skip() {
        return None;
    }
    let backends: Vec<Arc<CudaBackend>> = devs.iter().map(|d| d.open_backend().unwrap()).collect();
    let comm = NcclCommunicator::with_policy(backends.clone(), POLICY).unwrap();
    println!(
        "{} ranks, one-shot available: {}",
        backends.len(),
        comm.has_one_shot()
    );
    Some(Rig { backends, comm })
}

fn alloc(be: &CudaBackend, bytes: usize) -> Arc<dyn Buffer> {
    be.cuda_device().buffer_type().alloc(bytes).unwrap()
}

/// Values as stored in `dtype` (BF16 rounds) and their bytes.
fn encode(values: &[f32], dtype: DType) -> (Vec<f32>, Vec<u8>) {
    match dtype {
        DType::F32 => (values.to_vec(), bytemuck::cast_slice(values).to_vec()),
        DType::BF16 => {
            let h: Vec<bf16> = values.iter().map(|&v| bf16::from_f32(v)).collect();
            (
                h.iter().map(|v| v.to_f32()).collect(),
                bytemuck::cast_slice(&h).to_vec(),
            )
        }
        _ => unreachable!("F32 and BF16 only"),
    }
}

fn decode(bytes: &[u8], dtype: DType) -> Vec<f32> {
    match dtype {
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect(),
        _ => bytes
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes(c.try_into().expect("2 bytes")).to_f32())
            .collect(),
    }
}

/// Largest NMSE a path may leave: F32 throughout is exact up to the rounding of the sum.
fn tolerance(dtype: DType, path: ReducePath) -> f64 {
    match (dtype, path) {
        (DType::F32, ReducePath::Nccl | ReducePath::OneShot) => 1e-12,
        _ => 1e-4,
    }
}

/// The results on every rank: all identical, close to the F64 sum of `inputs`. The squared error is
/// normalized by the inputs' energy, as rounding in transport scales with the terms, not with their
/// (possibly cancelling) sum.
fn check_sum(results: &[Vec<f32>], inputs: &[Vec<f32>], tol: f64, what: &str) {
    let want: Vec<f64> = (0..inputs[0].len())
        .map(|i| inputs.iter().map(|v| v[i] as f64).sum())
        .collect();
    let energy: f64 = inputs.iter().flatten().map(|&v| (v as f64).powi(2)).sum();
    for (r, got) in results.iter().enumerate() {
        assert!(
            got.iter()
                .zip(&results[0])
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{what}: rank {r} differs from rank 0"
        );
        let squared: f64 = got
            .iter()
            .zip(&want)
            .map(|(&g, &w)| (g as f64 - w).powi(2))
            .sum();
        let e = squared / energy;
        assert!(e <= tol, "{what}: rank {r} error {e:e} > {tol:e}");
    }
}

#[test]
fn every_path_sums_with_odd_counts() {
    let Some(rig) = rig() else { return };
    let cases = [
        (DType::F32, ReducePath::Nccl),
        (DType::F32, ReducePath::NcclBf16),
        (DType::F32, ReducePath::OneShot),
        (DType::F32, ReducePath::OneShotBf16),
        (DType::BF16, ReducePath::Nccl),
        (DType::BF16, ReducePath::OneShot),
    ];
    for (dtype, path) in cases {
        if matches!(path, ReducePath::OneShot | ReducePath::OneShotBf16) && !rig.comm.has_one_shot()
        {
            println!("{dtype} {path:?}: skipped: no peer access between the GPUs");
            continue;
        }
        for count in [1, 3, 1000, 4097, 65_537] {
            let len = count * dtype.type_size();
            let mut inputs = Vec::new();
            let mut data = Vec::new();
            for be in &rig.backends {
                let (values, bytes) = encode(&random(count), dtype);
                let buf = alloc(be, len + 2 * GUARD);
                buf.fill(0, buf.size(), POISON).unwrap();
                buf.set(GUARD, &bytes).unwrap();
                inputs.push(values);
                data.push(DataRef::new(buf, GUARD));
            }
            rig.comm
                .all_reduce_using(&data, dtype, count, path)
                .unwrap();
            let mut results = Vec::new();
            for d in &data {
                let mut all = vec![0u8; d.buffer.size()];
                d.buffer.get(0, &mut all).unwrap();
                let (head, rest) = all.split_at(GUARD);
                let (body, tail) = rest.split_at(len);
                assert!(
                    head.iter().chain(tail).all(|&b| b == POISON),
                    "{dtype} {path:?} count {count}: wrote outside the message"
                );
                results.push(decode(body, dtype));
            }
            let what = format!("{dtype} {path:?} count {count}");
            check_sum(&results, &inputs, tolerance(dtype, path), &what);
        }
        println!("{dtype} {path:?}: ok");
    }
}

/// How one call of the back-to-back test goes: by size through the trait, or forced.
fn schedule(i: usize, one_shot: bool) -> Option<ReducePath> {
    match i % 4 {
        1 if one_shot => Some(ReducePath::OneShot),
        2 => Some(ReducePath::Nccl),
        3 if one_shot => Some(ReducePath::OneShotBf16),
        _ => None,
    }
}

#[test]
fn back_to_back_calls_without_host_sync() {
    let Some(rig) = rig() else { return };
    let counts = [4099usize, 17, 70_001, 1, 2048, 65_536];
    let max = *counts.iter().max().unwrap();
    let iters = 300;
    let slot = max * 4;
    // Per rank: every call's input, the work area the reduction runs in, every call's result.
    let mut inputs: Vec<Vec<Vec<f32>>> = vec![Vec::new(); iters];
    let mut staged = Vec::new();
    for be in &rig.backends {
        let src = alloc(be, iters * slot);
        for (i, per_call) in inputs.iter_mut().enumerate() {
            let v = random(counts[i % counts.len()]);
            src.set(i * slot, bytemuck::cast_slice(&v)).unwrap();
            per_call.push(v);
        }
        let work = alloc(be, slot);
        let out = alloc(be, iters * slot);
        out.fill(0, out.size(), POISON).unwrap();
        staged.push((src, work, out));
    }
    let mut paths = Vec::new();
    for i in 0..iters {
        let count = counts[i % counts.len()];
        for (be, (src, work, _)) in rig.backends.iter().zip(&staged) {
            let from = DataRef::new(src.clone(), i * slot);
            be.copy_async(&from, &DataRef::new(work.clone(), 0), count * 4)
                .unwrap();
        }
        let data: Vec<DataRef> = staged
            .iter()
            .map(|(_, w, _)| DataRef::new(w.clone(), 0))
            .collect();
        let path = match schedule(i, rig.comm.has_one_shot()) {
            Some(p) => {
                rig.comm
                    .all_reduce_using(&data, DType::F32, count, p)
                    .unwrap();
                p
            }
            None => {
                rig.comm.all_reduce(&data, DType::F32, count).unwrap();
                rig.comm.path_for(DType::F32, count)
            }
        };
        paths.push(path);
        for (be, (_, work, out)) in rig.backends.iter().zip(&staged) {
            let to = DataRef::new(out.clone(), i * slot);
            be.copy_async(&DataRef::new(work.clone(), 0), &to, count * 4)
                .unwrap();
        }
    }
    for (i, path) in paths.iter().enumerate() {
        let count = counts[i % counts.len()];
        let results: Vec<Vec<f32>> = staged
            .iter()
            .map(|(_, _, out)| {
                let mut v = vec![0f32; count];
                out.get(i * slot, bytemuck::cast_slice_mut(&mut v)).unwrap();
                v
            })
            .collect();
        let what = format!("call {i} ({path:?}, {count} elements)");
        check_sum(&results, &inputs[i], tolerance(DType::F32, *path), &what);
    }
    let one_shot = paths
        .iter()
        .filter(|p| matches!(p, ReducePath::OneShot | ReducePath::OneShotBf16))
        .count();
    println!("{iters} calls queued back to back, {one_shot} of them one-shot: ok");
}

#[test]
fn registry_communicator_is_stream_ordered() {
    let Some(devs) = devices(2) else { return };
    if !nccl_or_skip() {
        return;
    }
    let reg = ggml_core::registry::backend("cuda").unwrap();
    let backends: Vec<Arc<dyn Backend>> = devs.iter().map(|d| d.new_backend().unwrap()).collect();
    let comm = reg
        .new_communicator(&backends)
        .expect("a communicator over the CUDA streams")
        .unwrap();
    assert!(comm.is_stream_ordered());
    assert_eq!(comm.size(), devs.len());
    let count = 513;
    let inputs: Vec<Vec<f32>> = devs.iter().map(|_| random(count)).collect();
    let data: Vec<DataRef> = devs
        .iter()
        .zip(&inputs)
        .map(|(d, v)| {
            let buf = d.buffer_type().alloc(count * 4).unwrap();
            buf.set(0, bytemuck::cast_slice(v)).unwrap();
            DataRef::new(buf, 0)
        })
        .collect();
    comm.all_reduce(&data, DType::F32, count).unwrap();
    let results: Vec<Vec<f32>> = data
        .iter()
        .map(|d| {
            let mut v = vec![0f32; count];
            d.buffer.get(0, bytemuck::cast_slice_mut(&mut v)).unwrap();
            v
        })
        .collect();
    check_sum(&results, &inputs, 1e-12, "registry communicator");
    // The same device twice has no communicator (the generic path takes over).
    let twice = vec![backends[0].clone(), devs[0].new_backend().unwrap()];
    assert!(reg.new_communicator(&twice).is_none());
}

#[test]
fn bad_input_is_an_error() {
    let Some(rig) = rig() else { return };
    let count = 64;
    let data: Vec<DataRef> = rig
        .backends
        .iter()
        .map(|be| DataRef::new(alloc(be, count * 4), 0))
        .collect();
    let e = rig
        .comm
        .all_reduce(&data[..1], DType::F32, count)
        .unwrap_err();
    assert!(e.to_string().contains("local ranks"), "{e}");
    let swapped: Vec<DataRef> = data.iter().rev().cloned().collect();
    let e = rig
        .comm
        .all_reduce(&swapped, DType::F32, count)
        .unwrap_err();
    assert!(e.to_string().contains("is not memory of"), "{e}");
    let e = rig
        .comm
        .all_reduce(&data, DType::F32, count + 1)
        .unwrap_err();
    assert!(matches!(e, Error::OutOfBounds { .. }), "{e}");
    let e = rig.comm.all_reduce(&data, DType::I32, count).unwrap_err();
    assert!(matches!(e, Error::UnsupportedType { .. }), "{e}");
    let e = rig
        .comm
        .all_reduce_using(&data, DType::BF16, count, ReducePath::NcclBf16)
        .unwrap_err();
    assert!(matches!(e, Error::UnsupportedType { .. }), "{e}");
    if rig.comm.has_one_shot() {
        let e = rig
            .comm
            .all_reduce_using(&data, DType::F16, count, ReducePath::OneShot)
            .unwrap_err();
        assert!(matches!(e, Error::UnsupportedType { .. }), "{e}");
        let big = 1 << 20;
        let large: Vec<DataRef> = rig
            .backends
            .iter()
            .map(|be| DataRef::new(alloc(be, big * 4), 0))
            .collect();
        let e = rig
            .comm
            .all_reduce_using(&large, DType::F32, big, ReducePath::OneShot)
            .unwrap_err();
        assert!(e.to_string().contains("staging holds"), "{e}");
    }
    // The communicator still works after the refusals.
    rig.comm.all_reduce(&data, DType::F32, count).unwrap();
}
