//! AllReduce latency over every CUDA device of this machine, 8 KB to 32 MB: NCCL, NCCL over BF16,
//! the one-shot peer-to-peer kernel and the one-shot kernel over BF16, for F32 data (and NCCL and
//! one-shot for BF16 data). Calls are queued back to back on the devices' streams; CUDA events on
//! device 0 time batches of calls; the median per call over the batches is printed, with a
//! Markdown table at the end.
//!
//! `cargo run --release -p backend-cuda --example allreduce_bench [batches] [calls per batch]`

use backend_cuda::{cuda_devices, CudaBackend, NcclCommunicator, ReducePath, ReducePolicy};
use cudarc::driver::sys::CUevent_flags;
use ggml_core::{DType, DataRef, Device as _};
use std::sync::Arc;

const SIZES: [usize; 7] = [
    8 << 10,
    16 << 10,
    64 << 10,
    256 << 10,
    1 << 20,
    4 << 20,
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

/// Median microseconds per call of `calls` back-to-back calls, over `batches` batches.
fn time(
    comm: &NcclCommunicator,
    backends: &[Arc<CudaBackend>],
    data: &[DataRef],
    (dtype, path): (DType, ReducePath),
    count: usize,
    (batches, calls): (usize, usize),
) -> ggml_core::Result<f64> {
    let sync = || -> ggml_core::Result<()> {
        backends
            .iter()
            .try_for_each(|b| ggml_core::Backend::synchronize(b.as_ref()))
    };
    for _ in 0..calls.min(10) {
        comm.all_reduce_using(data, dtype, count, path)?;
    }
    sync()?;
    let stream = backends[0].stream();
    let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let mut per_call = Vec::with_capacity(batches);
    for _ in 0..batches {
        let start = stream
            .record_event(flags)
            .map_err(|e| ggml_core::Error::Other(format!("{e:?}")))?;
        for _ in 0..calls {
            comm.all_reduce_using(data, dtype, count, path)?;
        }
        let end = stream
            .record_event(flags)
            .map_err(|e| ggml_core::Error::Other(format!("{e:?}")))?;
        sync()?;
        let ms = start
            .elapsed_ms(&end)
            .map_err(|e| ggml_core::Error::Other(format!("{e:?}")))?;
        per_call.push(ms as f64 * 1000.0 / calls as f64);
    }
    per_call.sort_by(f64::total_cmp);
    Ok(per_call[per_call.len() / 2])
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
    let mut rows = Vec::new();
    for bytes in SIZES {
        let mut row = vec![label(bytes)];
        for (dtype, path, name) in COLUMNS {
            let one_shot = matches!(path, ReducePath::OneShot | ReducePath::OneShotBf16);
            let cell = if one_shot && !comm.has_one_shot() {
                "n/a".to_string()
            } else {
                let count = bytes / dtype.type_size();
                let us = time(
                    &comm,
                    &backends,
                    &data,
                    (dtype, path),
                    count,
                    (batches, calls),
                )?;
                println!("{:>6} {name:<22} {us:9.1} us", label(bytes));
                format!("{us:.1}")
            };
            row.push(cell);
        }
        rows.push(row);
    }
    println!("\n| size | {} |", COLUMNS.map(|c| c.2).join(" | "));
    println!("|---:|{}", "---:|".repeat(COLUMNS.len()));
    for r in rows {
        println!("| {} |", r.join(" | "));
    }
    Ok(())
}
