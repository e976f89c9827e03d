//! Speed of mul_mat on `vulkan:0`: for each shape `MxKxN:TYPE` given (default: SmolLM2-135M's decode
//! matrices and a 4096x4096 Q4_0 GEMV), weights of TYPE times N F32 activation columns, timed over
//! repeated `compute` calls after a warm-up (each call submits and waits, as the runtime does).
//! Prints µs per call and the weight bytes read per second.
//!
//! `cargo run --release -p backend-vulkan --example matmul_speed -- 1536x576x1:q4_1 49152x576x1:q8_0`

use backend_vulkan::open_devices;
use ggml_core::sched::Scheduler;
use ggml_core::{DType, Device, Graph};
use std::time::Instant;

const DEFAULT: &[&str] = &[
    "1536x576x1:q4_1",
    "576x1536x1:q4_1",
    "49152x576x1:q8_0",
    "1536x576x9:q4_1",
    "4096x4096x1:q4_0",
    "4096x4096x1:q4_K",
    "4096x4096x512:q4_0",
];

/// `MxKxN:TYPE` as (m, k, n, type).
fn parse(spec: &str) -> Option<(usize, usize, usize, DType)> {
    let (dims, ty) = spec.split_once(':')?;
    let d: Vec<usize> = dims
        .split('x')
        .map(|v| v.parse().ok())
        .collect::<Option<_>>()?;
    match d[..] {
        [m, k, n] => Some((m, k, n, DType::from_name(ty)?)),
        _ => None,
    }
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let specs: Vec<String> = if args.is_empty() {
        DEFAULT.iter().map(|s| s.to_string()).collect()
    } else {
        args
    };
    let dev = open_devices(1)?.remove(0);
    println!("{}: {}", dev.name(), dev.description());
    for spec in &specs {
        let (m, k, n, t) = parse(spec).ok_or(format!("{spec}: want MxKxN:TYPE"))?;
        let backend = dev.new_backend().map_err(|e| e.to_string())?;
        let mut g = Graph::new();
        let w = g.new_input(t, &[k, m]).map_err(|e| e.to_string())?;
        let x = g
            .new_input(DType::F32, &[k, n])
            .map_err(|e| e.to_string())?;
        let y = g.mul_mat(w, x).map_err(|e| e.to_string())?;
        g.output(y);
        let mut sched = Scheduler::new(vec![backend]);
        sched.alloc(&mut g).map_err(|e| e.to_string())?;
        let bytes = g.layout(w).nbytes();
        // Small values of every type: 0x11 bytes are finite in all of them.
        g.set_bytes(w, &vec![0x11u8; bytes])
            .map_err(|e| e.to_string())?;
        g.set_f32(x, &vec![0.5; k * n]).map_err(|e| e.to_string())?;
        sched.compute(&g).map_err(|e| e.to_string())?;
        let reps = 20;
        let start = Instant::now();
        for _ in 0..reps {
            sched.compute(&g).map_err(|e| e.to_string())?;
        }
        let secs = start.elapsed().as_secs_f64() / reps as f64;
        println!(
            "{spec:>22}: {:9.1} µs per call, weights {:7.1} GB/s, {:8.1} GFLOP/s",
            secs * 1e6,
            bytes as f64 / secs / 1e9,
            2.0 * (m * k * n) as f64 / secs / 1e9
        );
    }
    Ok(())
}
