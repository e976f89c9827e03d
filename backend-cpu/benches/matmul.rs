//! Benchmarks of the CPU matmul kernels (criterion), at the SIMD level of `GGML_TP_SIMD` or the
//! detected one, on the global rayon pool (all cores):
//!
//! - `copy`: the memory-bandwidth baseline, a 256 MiB copy split over all cores (and on one core);
//!   bandwidth = bytes read / time (a copy also writes as many bytes). `read_*` streams the same
//!   256 MiB read-only (a stricter baseline for the read-only GEMV).
//! - `gemv`: Q4_0 / Q8_0 (and F16) weights 4096x4096 and 14336x4096, and Q5_0 4864x896 (Qwen2.5-0.5B's
//!   FFN up / gate), times one column; throughput =
//!   weight bytes / time. Several copies of the weights (>= 256 MiB in all) are cycled so every
//!   call streams its weights from DRAM, not from the 32 MiB L3.
//! - `gemm`: F32 1024^3 (GFLOP/s = 2 M N K / time), Q4_0 4096x4096 times 512 columns, and the
//!   Q5_0, Q8_0, Q4_K and Q6_K products of a Qwen2.5-0.5B prompt of 512 tokens.
//!
//! After the criterion groups, `peak` measures the clock with a dependent-add chain (one add per
//! cycle) and the per-core FMA throughput with independent FMA chains, and prints the two-core FMA
//! peak (`cores x GHz x FMA/cycle x lanes x 2`). With `MATMUL_CPU_TIME=1` in the environment, the headline
//! kernels are also timed per CPU-second of this process, a rate that stays meaningful when other
//! jobs share the cores.

use backend_cpu::matmul::{mul_mat, simd};
use backend_cpu::view::TView;
use criterion::{BenchmarkId, Criterion, Throughput};
use ggml_core::quant::quantize_row;
use ggml_core::DType;
use rand::Rng;
use std::hint::black_box;
use std::time::{Duration, Instant};

const COPY_BYTES: usize = 256 << 20;

fn rand_f32(n: usize) -> Vec<f32> {
    let mut rng = rand::thread_rng();
    (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
}

/// `copies` copies of a weight matrix of `wt` [k, m]: 256 random rows quantized (the reference
/// quantizers are slow), repeated to `m` rows.
fn weight_copies(wt: DType, k: usize, m: usize, copies: usize) -> Vec<Vec<u8>> {
    let rows = m.min(256);
    let x = rand_f32(k * rows);
    let rb = wt.row_size(k).unwrap();
    let mut q = vec![0u8; rb * rows];
    for r in 0..rows {
        quantize_row(wt, &x[r * k..(r + 1) * k], &mut q[r * rb..(r + 1) * rb]).unwrap();
    }
    let full: Vec<u8> = q.iter().copied().cycle().take(rb * m).collect();
    (0..copies).map(|_| full.clone()).collect()
}

fn bench_copy(c: &mut Criterion) {
    let mut g = c.benchmark_group("copy");
    g.sample_size(10).measurement_time(Duration::from_secs(3));
    let src = vec![1u8; COPY_BYTES];
    let mut dst = vec![0u8; COPY_BYTES];
    g.throughput(Throughput::Bytes(COPY_BYTES as u64));
    let threads = rayon::current_num_threads();
    g.bench_function(format!("memcpy_256MiB_{threads}threads"), |bch| {
        bch.iter(|| {
            use rayon::prelude::*;
            let chunk = COPY_BYTES / threads;
            dst.par_chunks_mut(chunk)
                .zip(src.par_chunks(chunk))
                .for_each(|(d, s)| d.copy_from_slice(s));
            black_box(&dst);
        })
    });
    // A stricter baseline: read-only streaming (sum of u64 words), which has no write traffic.
    g.bench_function(format!("read_256MiB_{threads}threads"), |bch| {
        bch.iter(|| {
            use rayon::prelude::*;
            let words: &[u64] = bytemuck::cast_slice(&src);
            let s: u64 = words
                .par_chunks(words.len() / threads)
                .map(|c| c.iter().fold(0u64, |a, &w| a.wrapping_add(w)))
                .reduce(|| 0, u64::wrapping_add);
            black_box(s)
        })
    });
    g.bench_function("memcpy_256MiB_1thread", |bch| {
        bch.iter(|| {
            dst.copy_from_slice(&src);
            black_box(&dst);
        })
    });
    g.finish();
}

fn bench_gemv(c: &mut Criterion) {
    let mut g = c.benchmark_group("gemv");
    g.sample_size(20).measurement_time(Duration::from_secs(3));
    let llama_shapes = [DType::Q4_0, DType::Q8_0, DType::F16, DType::Q4K, DType::Q6K]
        .into_iter()
        .flat_map(|wt| [(wt, 4096usize, 4096usize), (wt, 14336, 4096)]);
    // Qwen2.5-0.5B's FFN up / gate: rows of 896 elements, 616 bytes.
    for (wt, m, k) in llama_shapes.chain([(DType::Q5_0, 4864, 896)]) {
        {
            let bytes = wt.row_size(k).unwrap() * m;
            let copies = (COPY_BYTES).div_ceil(bytes).max(2);
            let mut ws = weight_copies(wt, k, m, copies);
            let mut b: Vec<u8> = bytemuck::cast_slice(&rand_f32(k)).to_vec();
            let mut d = vec![0u8; m * 4];
            let bv = TView::of_slice(&mut b, DType::F32, [k, 1, 1, 1]);
            let dv = TView::of_slice(&mut d, DType::F32, [m, 1, 1, 1]);
            let views: Vec<TView> = ws
                .iter_mut()
                .map(|w| TView::of_slice(w, wt, [k, m, 1, 1]))
                .collect();
            g.throughput(Throughput::Bytes(bytes as u64));
            let mut i = 0;
            g.bench_function(BenchmarkId::new(wt.name(), format!("{m}x{k}")), |bch| {
                bch.iter(|| {
                    mul_mat(&views[i % views.len()], &bv, &dv).unwrap();
                    i += 1;
                })
            });
        }
    }
    g.finish();
}

fn bench_gemm(c: &mut Criterion) {
    let mut g = c.benchmark_group("gemm");
    g.sample_size(10).measurement_time(Duration::from_secs(4));
    for (wt, m, n, k) in [
        (DType::F32, 1024usize, 1024usize, 1024usize),
        (DType::Q4_0, 4096, 512, 4096),
        (DType::Q5_0, 4864, 512, 896),
        (DType::Q8_0, 896, 512, 896),
        (DType::Q4K, 896, 512, 4864),
        (DType::Q6K, 896, 512, 4864),
    ] {
        let mut w = weight_copies(wt, k, m, 1).pop().unwrap();
        let mut b: Vec<u8> = bytemuck::cast_slice(&rand_f32(k * n)).to_vec();
        let mut d = vec![0u8; m * n * 4];
        let av = TView::of_slice(&mut w, wt, [k, m, 1, 1]);
        let bv = TView::of_slice(&mut b, DType::F32, [k, n, 1, 1]);
        let dv = TView::of_slice(&mut d, DType::F32, [m, n, 1, 1]);
        g.throughput(Throughput::Elements((2 * m * n * k) as u64));
        g.bench_function(
            BenchmarkId::new(wt.name(), format!("{m}x{n}x{k}_flop")),
            |bch| bch.iter(|| mul_mat(&av, &bv, &dv).unwrap()),
        );
    }
    g.finish();
}

#[cfg(target_arch = "x86_64")]
/// The best of 200 short (~1 ms) runs of `f` (which returns a rate): the runs that were not preempted.
fn best_of(f: impl Fn() -> f64) -> f64 {
    (0..200).map(|_| f()).fold(0.0, f64::max)
}

/// Clock (GHz) from a chain of dependent 1-cycle adds.
#[cfg(target_arch = "x86_64")]
fn measure_ghz() -> f64 {
    let iters: u64 = 4_000_000;
    let t = Instant::now();
    let mut x: u64 = 0;
    // SAFETY: pure register arithmetic.
    unsafe {
        std::arch::asm!(
            "2:",
            "add {x}, 1", "add {x}, 1", "add {x}, 1", "add {x}, 1",
            "add {x}, 1", "add {x}, 1", "add {x}, 1", "add {x}, 1",
            "sub {n}, 8",
            "jnz 2b",
            x = inout(reg) x, n = inout(reg) iters => _,
            options(nomem, nostack),
        );
    }
    black_box(x);
    // 8 dependent adds per loop iteration; the loop counter runs in parallel.
    iters as f64 / t.elapsed().as_secs_f64() / 1e9
}

/// Per-core FMA instructions per cycle at the widest vector of the level, from 12 independent
/// chains of 512-bit (AVX-512) or 256-bit (AVX2) FMAs.
#[cfg(target_arch = "x86_64")]
fn measure_fma_per_cycle(ghz: f64, zmm: bool) -> f64 {
    let iters: u64 = 400_000;
    let t = Instant::now();
    macro_rules! fma_loop {
        ($reg:literal) => {
            // SAFETY: register-only FMAs on vector registers declared as clobbered.
            unsafe {
                std::arch::asm!(
                    concat!("vxorps ", $reg, "12, ", $reg, "12, ", $reg, "12"),
                    concat!("vxorps ", $reg, "13, ", $reg, "13, ", $reg, "13"),
                    "2:",
                    concat!("vfmadd231ps ", $reg, "0, ", $reg, "12, ", $reg, "13"),
                    concat!("vfmadd231ps ", $reg, "1, ", $reg, "12, ", $reg, "13"),
                    concat!("vfmadd231ps ", $reg, "2, ", $reg, "12, ", $reg, "13"),
                    concat!("vfmadd231ps ", $reg, "3, ", $reg, "12, ", $reg, "13"),
                    concat!("vfmadd231ps ", $reg, "4, ", $reg, "12, ", $reg, "13"),
                    concat!("vfmadd231ps ", $reg, "5, ", $reg, "12, ", $reg, "13"),
                    concat!("vfmadd231ps ", $reg, "6, ", $reg, "12, ", $reg, "13"),
                    concat!("vfmadd231ps ", $reg, "7, ", $reg, "12, ", $reg, "13"),
                    concat!("vfmadd231ps ", $reg, "8, ", $reg, "12, ", $reg, "13"),
                    concat!("vfmadd231ps ", $reg, "9, ", $reg, "12, ", $reg, "13"),
                    concat!("vfmadd231ps ", $reg, "10, ", $reg, "12, ", $reg, "13"),
                    concat!("vfmadd231ps ", $reg, "11, ", $reg, "12, ", $reg, "13"),
                    "sub {n}, 1",
                    "jnz 2b",
                    n = inout(reg) iters => _,
                    out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _, out("xmm4") _, out("xmm5") _,
                    out("xmm6") _, out("xmm7") _, out("xmm8") _, out("xmm9") _, out("xmm10") _, out("xmm11") _, out("xmm12") _, out("xmm13") _,
                    options(nomem, nostack),
                )
            }
        };
    }
    if zmm {
        fma_loop!("zmm");
    } else {
        fma_loop!("ymm");
    }
    (iters * 12) as f64 / t.elapsed().as_secs_f64() / 1e9 / ghz
}

fn peak() {
    #[cfg(target_arch = "x86_64")]
    {
        let level = simd::level();
        let zmm = level == simd::SimdLevel::Avx512;
        let lanes = if zmm { 16.0 } else { 8.0 };
        let ghz = best_of(measure_ghz);
        let fpc = best_of(|| measure_fma_per_cycle(ghz, zmm));
        let cores = rayon::current_num_threads() as f64;
        let units = fpc.round().max(1.0);
        println!(
            "peak: level {}, {ghz:.2} GHz (dependent adds), {fpc:.2} FMA/cycle/core measured -> {units} FMA units, \
             {lanes} lanes, {cores} cores: FMA peak = cores x GHz x units x lanes x 2 = {:.1} GFLOP/s \
             (measured FMA throughput x 2 cores: {:.1} GFLOP/s)",
            level.name(),
            cores * ghz * units * lanes * 2.0,
            cores * ghz * fpc * lanes * 2.0
        );
    }
}

/// User + system CPU seconds of this process so far (from /proc/self/stat, 100 ticks a second).
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// Runs `f` (doing `work` units per call) for about `secs` seconds and prints the rate per wall
/// second and per CPU second: on a machine shared with other jobs the second shows what the
/// kernel does while it actually runs (wall rate x cores when the machine is idle).
fn rate_per_cpu(name: &str, unit: &str, work: f64, secs: f64, mut f: impl FnMut()) {
    f();
    let (t, c0) = (Instant::now(), cpu_seconds());
    let mut n = 0u64;
    while t.elapsed().as_secs_f64() < secs {
        f();
        n += 1;
    }
    let wall = t.elapsed().as_secs_f64();
    let total = work * n as f64 / 1e9;
    match (c0, cpu_seconds()) {
        (Some(a), Some(b)) if b > a => println!(
            "cpu-time: {name}: {:.1} {unit}/s wall, {:.1} {unit} per CPU-second ({:.2} CPUs busy on average)",
            total / wall,
            total / (b - a),
            (b - a) / wall
        ),
        _ => println!("cpu-time: {name}: {:.1} {unit}/s wall", total / wall),
    }
}

/// Load-robust rates of the headline kernels (see [`rate_per_cpu`]).
fn cpu_time_rates() {
    let k = 1024;
    let mut w: Vec<u8> = bytemuck::cast_slice(&rand_f32(k * k)).to_vec();
    let mut b: Vec<u8> = bytemuck::cast_slice(&rand_f32(k * k)).to_vec();
    let mut d = vec![0u8; k * k * 4];
    let av = TView::of_slice(&mut w, DType::F32, [k, k, 1, 1]);
    let bv = TView::of_slice(&mut b, DType::F32, [k, k, 1, 1]);
    let dv = TView::of_slice(&mut d, DType::F32, [k, k, 1, 1]);
    rate_per_cpu(
        "gemm f32 1024^3",
        "GFLOP",
        2.0 * (k * k * k) as f64,
        5.0,
        || mul_mat(&av, &bv, &dv).unwrap(),
    );
    let src = vec![1u8; COPY_BYTES];
    let mut dst = vec![0u8; COPY_BYTES];
    let threads = rayon::current_num_threads();
    rate_per_cpu(
        "memcpy 256MiB (bytes read)",
        "GB",
        COPY_BYTES as f64,
        3.0,
        || {
            use rayon::prelude::*;
            let chunk = COPY_BYTES / threads;
            dst.par_chunks_mut(chunk)
                .zip(src.par_chunks(chunk))
                .for_each(|(d, s)| d.copy_from_slice(s));
            black_box(&dst);
        },
    );
    for (wt, m) in [(DType::Q4_0, 14336usize), (DType::Q8_0, 14336)] {
        let k = 4096;
        let bytes = wt.row_size(k).unwrap() * m;
        let mut ws = weight_copies(wt, k, m, COPY_BYTES.div_ceil(bytes).max(2));
        let mut b: Vec<u8> = bytemuck::cast_slice(&rand_f32(k)).to_vec();
        let mut d = vec![0u8; m * 4];
        let bv = TView::of_slice(&mut b, DType::F32, [k, 1, 1, 1]);
        let dv = TView::of_slice(&mut d, DType::F32, [m, 1, 1, 1]);
        let views: Vec<TView> = ws
            .iter_mut()
            .map(|w| TView::of_slice(w, wt, [k, m, 1, 1]))
            .collect();
        let mut i = 0;
        rate_per_cpu(
            &format!("gemv {} {m}x{k} (weight bytes)", wt.name()),
            "GB",
            bytes as f64,
            3.0,
            || {
                mul_mat(&views[i % views.len()], &bv, &dv).unwrap();
                i += 1;
            },
        );
    }
}

fn main() {
    println!("matmul benches at SIMD level {}", simd::level().name());
    let mut c = Criterion::default().configure_from_args();
    bench_copy(&mut c);
    bench_gemv(&mut c);
    bench_gemm(&mut c);
    peak();
    if std::env::var_os("MATMUL_CPU_TIME").is_some() {
        cpu_time_rates();
    }
    c.final_summary();
}
