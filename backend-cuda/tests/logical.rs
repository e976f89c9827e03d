//! Logical CUDA devices (`cuda_devices_with`, `GGML_TP_CUDA_LOGICAL`) on a real GPU, 1, 2 and 3 per
//! GPU: names, descriptions and shares; memory held to an equal share of the card (an allocation
//! past it fails with `OutOfMemory`); copies between the logical devices of one GPU; work ordered
//! across their streams by events (host waits and stream waits); and the registry's same-GPU
//! AllReduce in F32, BF16 and F16 against an F64 sum, back to back without host waits. Prints
//! `skipped: ...` without a GPU. The tests take one lock: they count the bytes each device holds.

mod common;

use backend_cuda::{cuda_devices_with, CudaBackend, CudaDevice, CudaReg, Share};
use common::random;
use ggml_core::registry::BackendReg;
use ggml_core::{Backend, Buffer, DType, DataRef, Device, Error};
use half::{bf16, f16};
use parking_lot::Mutex;
use std::sync::Arc;

/// Held by every test: memory figures are checked exactly.
static SERIAL: Mutex<()> = parking_lot::const_mutex(());

/// Every GPU as `n` devices, or `None` after printing why the test is skipped.
fn all(n: usize) -> Option<Vec<Arc<CudaDevice>>> {
    cuda_devices_with(n)
        .inspect_err(|reason| println!("skipped: no CUDA device ({reason})"))
        .ok()
}

/// The `n` logical devices of GPU 0, or `None` after printing why the test is skipped.
fn logical(n: usize) -> Option<Vec<Arc<CudaDevice>>> {
    Some(all(n)?.into_iter().filter(|d| d.ordinal() == 0).collect())
}

fn alloc(d: &CudaDevice, bytes: usize) -> Arc<dyn Buffer> {
    d.buffer_type().alloc(bytes).unwrap()
}

fn read(b: &dyn Buffer) -> Vec<u8> {
    let mut out = vec![0u8; b.size()];
    b.get(0, &mut out).unwrap();
    out
}

fn random_bytes(n: usize) -> Vec<u8> {
    random(n.div_ceil(4))
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .take(n)
        .collect()
}

#[test]
fn names_descriptions_and_shares() {
    let _serial = SERIAL.lock();
    let Some(gpus) = all(1) else { return };
    for n in [1, 2, 3] {
        let devs = cuda_devices_with(n).unwrap();
        assert_eq!(devs.len(), n * gpus.len());
        for (k, d) in devs.iter().enumerate() {
            println!("{}: {}", d.name(), d.description());
            assert_eq!(d.name(), format!("cuda:{k}"));
            assert_eq!(d.index(), k);
            assert_eq!(d.ordinal(), k / n);
            assert_eq!(
                d.share(),
                Share {
                    index: k % n,
                    count: n
                }
            );
            let gpu = gpus[k / n].description();
            if n == 1 {
                assert_eq!(d.description(), gpu);
                assert!(!gpu.contains("logical"), "{gpu}");
            } else {
                let want = format!("logical {} of {n} of GPU {}", k % n + 1, k / n);
                assert!(d.description().contains(&want), "{}", d.description());
                assert!(
                    Arc::ptr_eq(d.gpu(), gpus[k / n].gpu()),
                    "one GPU, one context"
                );
            }
        }
        assert!(Arc::ptr_eq(&devs[0], &cuda_devices_with(n).unwrap()[0]));
    }
    if std::env::var_os("GGML_TP_CUDA_LOGICAL").is_none() {
        let registered = backend_cuda::cuda_devices().unwrap();
        assert!(Arc::ptr_eq(&registered[0], &gpus[0]), "default: 1 per GPU");
    }
    // The kernels are compiled once per GPU, shared by its logical devices.
    let two = logical(2).unwrap();
    assert!(Arc::ptr_eq(
        &two[0].kernels().unwrap(),
        &two[1].kernels().unwrap()
    ));
}

#[test]
fn memory_is_held_to_the_share() {
    let _serial = SERIAL.lock();
    let Some(whole) = logical(1) else { return };
    let card = whole[0].context().total_mem().unwrap();
    assert_eq!(whole[0].buffer_type().max_size(), card);
    for n in [2, 3] {
        let devs = logical(n).unwrap();
        let (a, b) = (&devs[0], &devs[1]);
        let share = card / n;
        let m = a.memory();
        println!("{} of {n}: {m:?}", a.name());
        assert_eq!(m.total, share);
        assert_eq!(a.buffer_type().max_size(), share);
        let (before_a, before_b) = (m.allocated.unwrap(), b.memory().allocated.unwrap());
        assert!(m.free <= share - before_a);
        let buf = alloc(a, 64 << 20);
        assert_eq!(a.memory().allocated, Some(before_a + (64 << 20)));
        assert_eq!(
            b.memory().allocated,
            Some(before_b),
            "each device counts its own"
        );
        // Past the share: refused before the driver is asked, as by a card of that size.
        let room = share - a.memory().allocated.unwrap();
        match a.buffer_type().alloc(room + 1) {
            Err(Error::OutOfMemory {
                device,
                requested,
                available,
            }) => {
                assert_eq!(device, a.name());
                assert_eq!((requested, available), (room + 1, room));
            }
            other => panic!("{} bytes past the share: {:?}", room + 1, other.map(|_| ())),
        }
        assert_eq!(a.memory().allocated, Some(before_a + (64 << 20)));
        // Up to the share (less 16 MiB), then nothing more; the other device still allocates.
        let rest = alloc(a, room - (16 << 20));
        assert!(a.memory().free <= 16 << 20);
        assert!(matches!(
            a.buffer_type().alloc(32 << 20),
            Err(Error::OutOfMemory { .. })
        ));
        drop(alloc(b, 32 << 20));
        drop((rest, buf));
        assert_eq!(a.memory().allocated, Some(before_a));
        drop(alloc(a, 32 << 20));
    }
}

#[test]
fn copies_between_logical_devices() {
    let _serial = SERIAL.lock();
    for n in [2, 3] {
        let Some(devs) = logical(n) else { return };
        let len = (1 << 20) + 13;
        let data = random_bytes(len);
        let src = alloc(&devs[0], len);
        src.set(0, &data).unwrap();
        for d in &devs[1..] {
            assert!(!d.can_access(src.as_ref()) && !d.owns(src.as_ref()));
            let be = d.new_backend().unwrap();
            let dst = alloc(d, len + 8);
            assert!(d.owns(dst.as_ref()));
            be.copy_async(
                &DataRef::new(src.clone(), 0),
                &DataRef::new(dst.clone(), 8),
                len,
            )
            .unwrap();
            be.synchronize().unwrap();
            let got = read(dst.as_ref());
            assert_eq!(&got[8..], &data[..], "{} -> {}", devs[0].name(), d.name());
            assert_eq!(&got[..8], &[0u8; 8]);
        }
    }
}

/// Queues `rounds` copies of `a` into `b` and back on `be` (busy work that ends with `a` intact).
fn busy(be: &dyn Backend, a: &Arc<dyn Buffer>, b: &Arc<dyn Buffer>, rounds: usize) {
    for _ in 0..rounds {
        let (ra, rb) = (DataRef::new(a.clone(), 0), DataRef::new(b.clone(), 0));
        be.copy_async(&ra, &rb, a.size()).unwrap();
        be.copy_async(&rb, &ra, a.size()).unwrap();
    }
}

#[test]
fn events_order_work_across_streams() {
    let _serial = SERIAL.lock();
    let Some(devs) = logical(3) else { return };
    let len = 64 << 20;
    let data = random_bytes(len);
    let a = alloc(&devs[0], len);
    let tmp = alloc(&devs[0], len);
    let b = alloc(&devs[1], len);
    let c = alloc(&devs[2], len);
    let be0 = devs[0].open_backend().unwrap();
    let be1 = devs[1].open_backend().unwrap();
    let be2 = devs[2].open_backend().unwrap();
    // Through the trait: device 1 waits for device 0's event, then copies what it wrote.
    be0.set_async(&DataRef::new(a.clone(), 0), &data).unwrap();
    busy(be0.as_ref(), &a, &tmp, 8);
    let e = be0.record_event().unwrap();
    be1.wait_event(e.as_ref()).unwrap();
    be1.copy_async(
        &DataRef::new(a.clone(), 0),
        &DataRef::new(b.clone(), 0),
        len,
    )
    .unwrap();
    be1.synchronize().unwrap();
    assert!(read(b.as_ref()) == data, "trait event");
    // On the device (as the same-GPU AllReduce orders streams): no host wait before the copy.
    a.fill(0, len, 0).unwrap();
    be0.set_async(&DataRef::new(a.clone(), 0), &data).unwrap();
    busy(be0.as_ref(), &a, &tmp, 8);
    let ev = be0.stream().record_event(None).unwrap();
    be2.stream().wait(&ev).unwrap();
    be2.copy_async(
        &DataRef::new(a.clone(), 0),
        &DataRef::new(c.clone(), 0),
        len,
    )
    .unwrap();
    be2.synchronize().unwrap();
    assert!(read(c.as_ref()) == data, "stream wait");
}

/// Values as stored in `dtype` and their bytes.
fn encode(values: &[f32], dtype: DType) -> (Vec<f32>, Vec<u8>) {
    match dtype {
        DType::F32 => (values.to_vec(), bytemuck::cast_slice(values).to_vec()),
        DType::BF16 => {
            let h: Vec<bf16> = values.iter().map(|&v| bf16::from_f32(v)).collect();
            let stored = h.iter().map(|v| v.to_f32()).collect();
            (stored, bytemuck::cast_slice(&h).to_vec())
        }
        _ => {
            let h: Vec<f16> = values.iter().map(|&v| f16::from_f32(v)).collect();
            let stored = h.iter().map(|v| v.to_f32()).collect();
            (stored, bytemuck::cast_slice(&h).to_vec())
        }
    }
}

fn decode(bytes: &[u8], dtype: DType) -> Vec<f32> {
    match dtype {
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        DType::BF16 => bytes
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        _ => bytes
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
    }
}

/// Streams on `devs` and the registry's communicator over them (the same-GPU reduce).
fn communicator(
    devs: &[Arc<CudaDevice>],
) -> (Vec<Arc<CudaBackend>>, Arc<dyn ggml_core::Communicator>) {
    let backends: Vec<Arc<CudaBackend>> = devs.iter().map(|d| d.open_backend().unwrap()).collect();
    let dyns: Vec<Arc<dyn Backend>> = backends
        .iter()
        .map(|b| b.clone() as Arc<dyn Backend>)
        .collect();
    let comm = CudaReg::new()
        .new_communicator(&dyns)
        .expect("a communicator over logical devices of one GPU")
        .unwrap();
    assert_eq!(comm.size(), devs.len());
    assert!(comm.is_stream_ordered());
    (backends, comm)
}

#[test]
fn all_reduce_over_logical_devices_sums() {
    let _serial = SERIAL.lock();
    const GUARD: usize = 256;
    for n in [2, 3] {
        let Some(devs) = logical(n) else { return };
        let (backends, comm) = communicator(&devs);
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            for count in [1, 3, 1000, 4097, 65_537, (1 << 20) + 5] {
                let len = count * dtype.type_size();
                let (mut inputs, mut data) = (Vec::new(), Vec::new());
                for d in &devs {
                    let (values, bytes) = encode(&random(count), dtype);
                    let buf = alloc(d, len + 2 * GUARD);
                    buf.fill(0, buf.size(), 0xff).unwrap();
                    buf.set(GUARD, &bytes).unwrap();
                    inputs.push(values);
                    data.push(DataRef::new(buf, GUARD));
                }
                comm.all_reduce(&data, dtype, count).unwrap();
                backends.iter().for_each(|b| b.synchronize().unwrap());
                let want: Vec<f64> = (0..count)
                    .map(|i| inputs.iter().map(|v| v[i] as f64).sum())
                    .collect();
                let energy: f64 = inputs.iter().flatten().map(|&v| (v as f64).powi(2)).sum();
                let tol = if dtype == DType::F32 { 1e-12 } else { 1e-4 };
                let mut first = None;
                for (r, d) in data.iter().enumerate() {
                    let all = read(d.buffer.as_ref());
                    let what = format!("{n} ranks, {dtype}, {count}: rank {r}");
                    assert!(all[..GUARD].iter().all(|&b| b == 0xff), "{what}: guard");
                    assert!(
                        all[GUARD + len..].iter().all(|&b| b == 0xff),
                        "{what}: guard"
                    );
                    let got = decode(&all[GUARD..GUARD + len], dtype);
                    let e: f64 = got
                        .iter()
                        .zip(&want)
                        .map(|(&g, &w)| (g as f64 - w).powi(2))
                        .sum::<f64>()
                        / energy;
                    assert!(e <= tol, "{what}: error {e:e}");
                    let first = first.get_or_insert_with(|| got.clone());
                    assert!(*first == got, "{what}: differs from rank 0");
                }
            }
        }
        println!("{n} logical devices: F32, BF16 and F16 sums match");
    }
}

#[test]
fn all_reduce_calls_queue_back_to_back() {
    let _serial = SERIAL.lock();
    for n in [2, 3] {
        let Some(devs) = logical(n) else { return };
        let (backends, comm) = communicator(&devs);
        let count = 4097;
        // Rank r holds r + 1: after k calls every element is n (n + 1) / 2 * n^(k - 1), exact in F32.
        let data: Vec<DataRef> = devs
            .iter()
            .enumerate()
            .map(|(r, d)| {
                let buf = alloc(d, count * 4);
                buf.set(0, bytemuck::cast_slice(&vec![(r + 1) as f32; count]))
                    .unwrap();
                DataRef::new(buf, 0)
            })
            .collect();
        let calls = 12;
        for _ in 0..calls {
            comm.all_reduce(&data, DType::F32, count).unwrap();
        }
        backends.iter().for_each(|b| b.synchronize().unwrap());
        let want = (n * (n + 1) / 2) as f32 * (n as f32).powi(calls - 1);
        for (r, d) in data.iter().enumerate() {
            let got = decode(&read(d.buffer.as_ref()), DType::F32);
            assert!(
                got.iter().all(|&v| v == want),
                "rank {r}: {} != {want}",
                got[0]
            );
        }
        // Memory of the wrong device is refused.
        let mut swapped = data.clone();
        swapped.swap(0, 1);
        assert!(comm.all_reduce(&swapped, DType::F32, count).is_err());
    }
}
