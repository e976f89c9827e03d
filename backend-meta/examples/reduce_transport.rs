//! Measures the generic (recursive-doubling) AllReduce on N CPU devices for message sizes from 16 KiB
//! to 32 MiB, with partial sums travelling in F32 and in BF16, to choose the BF16 threshold
//! (`GGML_TP_ALLREDUCE_BF16_MIN_BYTES`). Each call drives the devices from threads started for it, as
//! the meta executor's driver threads would (the start costs tens of microseconds, alike for both).
//! `cargo run --release -p backend-meta --example reduce_transport -- [N]`

use backend_cpu::device::cpu_devices;
use backend_meta::doubling::Doubling;
use backend_meta::ReduceOptions;
use ggml_core::{Backend, DType, DataRef, Device, DeviceKind, Layout};
use std::sync::Arc;
use std::time::Instant;

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let devices: Vec<Arc<dyn Device>> = cpu_devices(n, n)
        .unwrap()
        .into_iter()
        .map(|d| d as Arc<dyn Device>)
        .collect();
    let backends: Vec<Arc<dyn Backend>> =
        devices.iter().map(|d| d.new_backend().unwrap()).collect();
    let default = match ReduceOptions::for_kind(DeviceKind::Cpu).bf16_min_bytes {
        usize::MAX => "never".to_string(),
        b => format!("from {b} bytes"),
    };
    println!(
        "{n} CPU devices; microseconds per AllReduce (median of 15); BF16 by default (GGML_TP_ALLREDUCE_BF16_MIN_BYTES): {default}"
    );
    println!("{:>10} {:>10} {:>10}", "bytes", "f32", "bf16");
    for kib in [16usize, 64, 256, 1024, 4096, 32768] {
        let elems = kib * 1024 / 4;
        let layout = Layout::contiguous(DType::F32, [elems, 1, 1, 1]);
        let own: Vec<DataRef> = devices
            .iter()
            .map(|d| {
                let b = d.buffer_type().alloc(layout.nbytes()).unwrap();
                b.set(0, bytemuck::cast_slice(&vec![1.0f32; elems]))
                    .unwrap();
                DataRef::new(b, 0)
            })
            .collect();
        let mut row = Vec::new();
        for threshold in [usize::MAX, 0] {
            let dbl = Doubling::new(&devices, &backends, own.clone(), layout, threshold).unwrap();
            let mut times: Vec<f64> = (0..15)
                .map(|_| {
                    let t = Instant::now();
                    dbl.all_reduce(&backends).unwrap();
                    t.elapsed().as_secs_f64() * 1e6
                })
                .collect();
            times.sort_by(f64::total_cmp);
            row.push(times[7]);
        }
        println!("{:>10} {:>10.1} {:>10.1}", kib * 1024, row[0], row[1]);
    }
}
