//! AllReduce latency over every CUDA device of this machine, 8 KB to 32 MB: NCCL, NCCL over BF16,
//! the one-shot peer-to-peer kernel and the one-shot kernel over BF16, for F32 data (and NCCL and
//! one-shot for BF16 data). Each batch of calls is queued back to back behind a long memset on
//! every stream, so the devices run the calls without waiting for the host: CUDA events on device
//! 0 time the batch (device time per call), a clock times the queueing (host time per call). The
//! medians over the batches are printed, with Markdown tables at the end.
//!
//! `cargo run --release -p backend-cuda --example allreduce_bench [batches] [calls per batch]`

use backend_cuda::{
    cuda_devices, CudaBackend, CudaBuffer, NcclCommunicator, ReducePath, ReducePolicy,
};
use cudarc::driver::{result, sys::CUevent_flags};
use ggml_core::{Backend, DType, DataRef, Device as _, Error};
use std::sync::Arc;
use std::time::Instant;

const SIZES: [usize; 11] = [
    8 << 10,
    16 << 10,
    64 << 10,
    256 << 10,
    512 << 10,
    1 << 20,
    2 << 20,
    4 << 20,
    8 << 20,
    16 << 20,
    32 << 20,
];

const COLUMNS: [(DType, ReducePath, &str); 6] = [
    (DType::F32, ReducePath::Nccl, "NCCL F32"),
    (DType::F32, ReducePath::NcclBf16, "NCCL F32 as BF16"),
    (DType::F32, ReducePath::OneShot, "one-shot F32"),
    (DType::F32, ReducePath::OneShotBf16, "one-shot F32 as BF16"),
    (DType::BF16, ReducePath::Nccl, "NCCL BF16"),
    (DType::BF16, ReducePath::OneShot, "one-shot BF16"),
];

/// Bytes each stream memsets before a batch: long enough (about 1 ms) for the host to queue it.
const DELAY_BYTES: usize = 4 << 30;

fn driver<T, E: std::fmt::Debug>(r: Result<T, E>) -> ggml_core::Result<T> {
    r.map_err(|e| Error::Other(format!("{e:?}")))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median device and host microseconds per call of `calls` back-to-back calls, over `batches`.
fn time(
    comm: &NcclCommunicator,
    streams: &[(Arc<CudaBackend>, CudaBuffer)],
    data: &[DataRef],
    (dtype, path): (DType, ReducePath),
    count: usize,
    (batches, calls): (usize, usize),
) -> ggml_core::Result<(f64, f64)> {
    let sync = || streams.iter().try_for_each(|(b, _)| b.synchronize());
    for _ in 0..calls.min(10) {
        comm.all_reduce_using(data, dtype, count, path)?;
    }
    sync()?;
    let stream = streams[0].0.stream();
    let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let (mut device, mut host) = (Vec::new(), Vec::new());
    for _ in 0..batches {
        for (b, delay) in streams {
            driver(b.cuda_device().context().bind_to_thread())?;
            // SAFETY: the delay buffer holds DELAY_BYTES; the stream is live.
            driver(unsafe {
                result::memset_d8_async(delay.device_ptr(), 0, DELAY_BYTES, b.stream().cu_stream())
            })?;
        }
        let start = driver(stream.record_event(flags))?;
        let queued = Instant::now();
        for _ in 0..calls {
            comm.all_reduce_using(data, dtype, count, path)?;
        }
        host.push(queued.elapsed().as_secs_f64() * 1e6 / calls as f64);
        let end = driver(stream.record_event(flags))?;
        sync()?;
        device.push(driver(start.elapsed_ms(&end))? as f64 * 1000.0 / calls as f64);
    }
    Ok((median(device), median(host)))
}

fn label(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{} MB", bytes >> 20)
    } else {
        format!("{} KB", bytes >> 10)
    }
}

fn main() -> ggml_core::Result<()> {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>());
    let batches = args.next().and_then(|a| a.ok()).unwrap_or(15);
    let calls = args.next().and_then(|a| a.ok()).unwrap_or(50);
    let devs = match cuda_devices() {
        Ok(d) if d.len() >= 2 => d,
        Ok(_) => return Err(ggml_core::Error::Other("needs two CUDA devices".into())),
        Err(e) => return Err(ggml_core::Error::Other(e)),
    };
    let backends = devs
        .iter()
        .map(|d| d.open_backend())
        .collect::<ggml_core::Result<Vec<_>>>()?;
    let streams = backends
        .iter()
        .map(|b| {
            Ok((
                b.clone(),
                CudaBuffer::new(b.cuda_device().pool(), "delay".into(), DELAY_BYTES)?,
            ))
        })
        .collect::<ggml_core::Result<Vec<_>>>()?;
    // Staging for the one-shot kernel at every size measured.
    let policy = ReducePolicy {
        one_shot_max_bytes: *SIZES.iter().max().expect("sizes"),
        bf16_min_bytes: None,
    };
    let comm = NcclCommunicator::with_policy(backends.clone(), policy)?;
    println!(
        "{} devices: {}; one-shot: {}; {batches} batches of {calls} calls",
        devs.len(),
        devs.iter()
            .map(|d| format!("{} {}", d.name(), d.description()))
            .collect::<Vec<_>>()
            .join(", "),
        comm.has_one_shot()
    );
    let buffers = backends
        .iter()
        .map(|b| b.cuda_device().buffer_type().alloc(SIZES[SIZES.len() - 1]))
        .collect::<ggml_core::Result<Vec<_>>>()?;
    let data: Vec<DataRef> = buffers.iter().map(|b| DataRef::new(b.clone(), 0)).collect();
    let (mut device_rows, mut host_rows) = (Vec::new(), Vec::new());
    for bytes in SIZES {
        let (mut device_row, mut host_row) = (vec![label(bytes)], vec![label(bytes)]);
        for (dtype, path, name) in COLUMNS {
            let one_shot = matches!(path, ReducePath::OneShot | ReducePath::OneShotBf16);
            if one_shot && !comm.has_one_shot() {
                device_row.push("n/a".to_string());
                host_row.push("n/a".to_string());
                continue;
            }
            let count = bytes / dtype.type_size();
            let shape = (batches, calls);
            let (dev, host) = time(&comm, &streams, &data, (dtype, path), count, shape)?;
            println!(
                "{:>6} {name:<22} device {dev:9.1} us, host {host:7.1} us",
                label(bytes)
            );
            device_row.push(format!("{dev:.1}"));
            host_row.push(format!("{host:.1}"));
        }
        device_rows.push(device_row);
        host_rows.push(host_row);
    }
    for (title, rows) in [("device", device_rows), ("host (queueing)", host_rows)] {
        println!("\nus per call, {title}:\n");
        println!("| size | {} |", COLUMNS.map(|c| c.2).join(" | "));
        println!("|---:|{}", "---:|".repeat(COLUMNS.len()));
        for r in rows {
            println!("| {} |", r.join(" | "));
        }
    }
    Ok(())
}
