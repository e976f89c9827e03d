//! Kernel micro-benchmark on cuda:0: matrix-vector products at Llama-3-8B shapes in each weight
//! format (GB/s of weight bytes and the fraction of 3.70 TB/s; weight copies cycled past the L2
//! cache), a few column counts, GEMM TFLOP/s at the 512-token prompt shapes with F32 and F16
//! activations, and decode attention over padded KV cache views. GEMV and attention times come
//! from CUDA events around the replay of a CUDA graph of many computes (kernel time, no host launch
//! gaps); GEMM times from events around many direct computes queued behind a large GEMM. Medians of
//! several rounds.
//!
//! `cargo run --release -p backend-cuda --example gemv_bw [SECTION...]` (sections: launch, gemv,
//! columns, gemm, prompt-attention, decode-attention; all without arguments; `kernels` is not in
//! "all": it computes each 1-column product of the gemv section once, for a profiler to catch)

use backend_cuda::{cuda_devices, CudaBackend};
use ggml_core::sched::Scheduler;
use ggml_core::{quant, Backend, DType, Graph, TensorId};
use half::{bf16, f16};
use std::sync::Arc;

/// HBM bandwidth the fractions refer to (H200, measured copy bandwidth).
const PEAK_BYTES_PER_S: f64 = 3.70e12;
const ROUNDS: usize = 7;

/// Deterministic pseudo-normal values (sum of uniforms), enough for timing.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            let mut acc = 0.0f32;
            for _ in 0..4 {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                acc += (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            }
            acc
        })
        .collect()
}

/// Bytes of a `[k, rows]` tensor of `dtype`: one encoded chunk of 64 rows, repeated.
fn weight_bytes(dtype: DType, k: usize, rows: usize) -> Vec<u8> {
    let chunk_rows = rows.min(64);
    let v = values(k * chunk_rows, 7);
    let chunk: Vec<u8> = match dtype {
        DType::F32 => bytemuck::cast_slice(&v).to_vec(),
        DType::F16 => v
            .iter()
            .flat_map(|&x| f16::from_f32(x).to_bits().to_le_bytes())
            .collect(),
        DType::BF16 => v
            .iter()
            .flat_map(|&x| bf16::from_f32(x).to_bits().to_le_bytes())
            .collect(),
        t => quant::quantize_to_vec(t, &v).expect("quantizable type"),
    };
    let total = chunk.len() / chunk_rows * rows;
    chunk.iter().copied().cycle().take(total).collect()
}

/// A graph ready to compute on `backend`, with its inputs filled.
struct Bench {
    graph: Graph,
    nodes: Vec<TensorId>,
}

impl Bench {
    fn new(
        backend: &Arc<dyn Backend>,
        build: impl FnOnce(&mut Graph) -> Vec<(TensorId, Vec<u8>)>,
    ) -> Bench {
        let mut graph = Graph::new();
        let inputs = build(&mut graph);
        let mut sched = Scheduler::new(vec![backend.clone()]);
        sched.alloc(&mut graph).expect("alloc");
        for (t, bytes) in inputs {
            graph.set_bytes(t, &bytes).expect("fill input");
        }
        let nodes = graph.nodes().to_vec();
        Bench { graph, nodes }
    }

    fn compute(&self, backend: &CudaBackend) {
        backend.compute(&self.graph, &self.nodes).expect("compute");
    }
}

/// Weight bytes a GEMV benchmark cycles through: more than the L2 cache holds (60 MB on H200), so
/// that every product reads its weights from HBM as in a model.
const COLD_BYTES: usize = 256 << 20;

/// `copies` mul_mats, each of its own `[k, m]` weights of `dtype`, with the same `n` F32 columns
/// (`b_type` activations when not F32: converted from F32 by a cpy in the graph, before the
/// products).
fn mul_mats(
    backend: &Arc<dyn Backend>,
    dtype: DType,
    (k, m, n): (usize, usize, usize),
    b_type: DType,
    copies: usize,
) -> Bench {
    Bench::new(backend, |g| {
        let b = g.new_input(DType::F32, &[k, n]).unwrap();
        let x = if b_type == DType::F32 {
            b
        } else {
            let t = g.new_tensor(b_type, &[k, n]).unwrap();
            g.cpy(b, t).unwrap()
        };
        let bytes = weight_bytes(dtype, k, m);
        let mut inputs = vec![(b, bytemuck::cast_slice(&values(k * n, 3)).to_vec())];
        for _ in 0..copies {
            let a = g.new_input(dtype, &[k, m]).unwrap();
            let out = g.mul_mat(a, x).unwrap();
            g.output(out);
            inputs.push((a, bytes.clone()));
        }
        inputs
    })
}

/// A mul_mat of `[k, m]` weights of `dtype` with `n` F32 columns.
fn mul_mat(backend: &Arc<dyn Backend>, dtype: DType, k: usize, m: usize, n: usize) -> Bench {
    mul_mats(backend, dtype, (k, m, n), DType::F32, 1)
}

/// Weight copies of `[k, m]` `dtype` that exceed [`COLD_BYTES`] together.
fn cold_copies(dtype: DType, k: usize, m: usize) -> usize {
    COLD_BYTES.div_ceil(k / dtype.block_size() * dtype.type_size() * m)
}

/// Median seconds of one compute of `bench`, timed with CUDA events around `iters` computes queued
/// behind a large GEMM (so that the host's launch rate does not limit the timed work).
fn time(backend: &CudaBackend, busy: &Bench, bench: &Bench, iters: usize) -> f64 {
    let stream = backend.stream();
    bench.compute(backend);
    let mut samples: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            for _ in 0..3 {
                busy.compute(backend);
            }
            let start = stream.record_event(TIMING).expect("event");
            for _ in 0..iters {
                bench.compute(backend);
            }
            let end = stream.record_event(TIMING).expect("event");
            end.synchronize().expect("sync");
            start.elapsed_ms(&end).expect("elapsed") as f64 / 1e3 / iters as f64
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    samples[ROUNDS / 2]
}

const TIMING: Option<cudarc::driver::sys::CUevent_flags> =
    Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);

/// Median seconds of one compute of `bench` replayed from a CUDA graph of `iters` computes: the
/// kernels' own time, without host launch gaps (what a decode step sees once captured). `None` when
/// capture fails.
fn time_graph(backend: &CudaBackend, bench: &Bench, iters: usize) -> Option<f64> {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let stream = backend.stream();
    bench.compute(backend);
    stream.synchronize().ok()?;
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        .ok()?;
    for _ in 0..iters {
        if backend.compute(&bench.graph, &bench.nodes).is_err() {
            let _ = stream.end_capture(CUgraphInstantiate_flags(0));
            return None;
        }
    }
    let graph = stream
        .end_capture(CUgraphInstantiate_flags(0))
        .ok()
        .flatten()?;
    graph.launch().ok()?;
    let mut samples: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let start = stream.record_event(TIMING).expect("event");
            graph.launch().expect("graph launch");
            let end = stream.record_event(TIMING).expect("event");
            end.synchronize().expect("sync");
            start.elapsed_ms(&end).expect("elapsed") as f64 / 1e3 / iters as f64
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    Some(samples[ROUNDS / 2])
}

/// Graph-replay time when capture works, else event time over direct computes.
fn kernel_time(backend: &CudaBackend, busy: &Bench, bench: &Bench, iters: usize) -> f64 {
    time_graph(backend, bench, iters).unwrap_or_else(|| {
        println!("(graph capture failed: timing direct computes)");
        time(backend, busy, bench, iters)
    })
}

/// A section of the benchmark: the name the command line picks it with, and what it runs.
type Section = (&'static str, fn(&Ctx));

/// The benchmark's sections.
const SECTIONS: [Section; 7] = [
    ("launch", launch_gaps),
    ("gemv", gemv_types),
    ("columns", gemv_columns),
    ("gemm", gemm_prompt),
    ("prompt-attention", prompt_attention),
    ("decode-attention", decode_attention),
    ("kernels", gemv_once),
];

/// The device every section runs on, and a large product that keeps the stream busy.
struct Ctx {
    cuda: Arc<CudaBackend>,
    backend: Arc<dyn Backend>,
    busy: Bench,
}

/// Runs the sections named on the command line (all without arguments).
fn main() {
    let devs = match cuda_devices() {
        Ok(d) => d,
        Err(e) => {
            println!("skipped: no CUDA device ({e})");
            return;
        }
    };
    let wanted: Vec<String> = std::env::args().skip(1).collect();
    if let Some(bad) = wanted
        .iter()
        .find(|w| !SECTIONS.iter().any(|(name, _)| name == w))
    {
        let names: Vec<&str> = SECTIONS.iter().map(|(n, _)| *n).collect();
        eprintln!("unknown section {bad}; sections: {}", names.join(", "));
        std::process::exit(2);
    }
    let dev = devs[0].clone();
    let cuda = Arc::new(CudaBackend::new(dev.clone()).expect("backend"));
    let backend: Arc<dyn Backend> = cuda.clone();
    use ggml_core::Device as _;
    println!("device: {} {}", dev.name(), dev.description());
    let busy = mul_mat(&backend, DType::F16, 4096, 4096, 4096);
    let ctx = Ctx {
        cuda,
        backend,
        busy,
    };
    for (name, section) in SECTIONS {
        let in_all = name != "kernels";
        if (wanted.is_empty() && in_all) || wanted.iter().any(|w| w == name) {
            section(&ctx);
        }
    }
}

fn launch_gaps(c: &Ctx) {
    println!("\nhost-launched GEMV, 1 column, 4096 x 4096 (includes launch gaps):");
    for t in [DType::Q4_0, DType::F16] {
        let b = mul_mat(&c.backend, t, 4096, 4096, 1);
        println!("{t}: {:.1} us", time(&c.cuda, &c.busy, &b, 200) * 1e6);
    }
}

/// The product shapes of Llama-3-8B: (K, M) of q/o, k/v, gate/up and down.
const SHAPES: [(usize, usize); 4] = [(4096, 4096), (4096, 1024), (4096, 14336), (14336, 4096)];

/// The weight types of the GEMV sections (Q4_0 and Q8_0 also in the regrouped layouts the
/// loader gives GPUs).
const GEMV_TYPES: [DType; 11] = [
    DType::Q4_0,
    DType::Q4_0G,
    DType::Q8_0,
    DType::Q8_0G,
    DType::BF16,
    DType::F16,
    DType::Q4K,
    DType::Q6K,
    DType::Q5_0,
    DType::Q4_1,
    DType::MXFP4,
];

fn gemv_types(c: &Ctx) {
    println!(
        "\nGEMV, 1 column (weights [K, M] x F32 vector), weights from HBM (copies cycled past L2),"
    );
    println!("kernel time per product from graph replay:");
    println!("| type | M x K | us | GB/s | of 3.70 TB/s |");
    println!("|---|---|---|---|---|");
    for t in GEMV_TYPES {
        for (k, m) in SHAPES {
            let copies = cold_copies(t, k, m);
            let b = mul_mats(&c.backend, t, (k, m, 1), DType::F32, copies);
            let s = kernel_time(&c.cuda, &c.busy, &b, 10) / copies as f64;
            let bytes = (k / t.block_size() * t.type_size() * m) as f64;
            println!(
                "| {t} | {m} x {k} | {:.1} | {:.0} | {:.2} |",
                s * 1e6,
                bytes / s / 1e9,
                bytes / s / PEAK_BYTES_PER_S
            );
        }
    }
}

/// Each 1-column product of [`gemv_types`] computed once from one weight copy, for a profiler (ncu
/// flushes the caches between its passes, so the weights come from HBM there).
fn gemv_once(c: &Ctx) {
    for t in GEMV_TYPES {
        for (k, m) in SHAPES {
            mul_mat(&c.backend, t, k, m, 1).compute(&c.cuda);
        }
    }
    c.cuda.stream().synchronize().expect("sync");
    println!("computed each product once");
}

fn gemv_columns(c: &Ctx) {
    println!("\nGEMV columns (M x K = 14336 x 4096, weights from HBM): GB/s of weight bytes");
    for t in [DType::Q4_0, DType::Q4K, DType::F16] {
        let mut line = format!("{t}:");
        for n in [1, 2, 3, 4, 8] {
            let copies = cold_copies(t, 4096, 14336);
            let b = mul_mats(&c.backend, t, (4096, 14336, n), DType::F32, copies);
            let s = kernel_time(&c.cuda, &c.busy, &b, 5) / copies as f64;
            let bytes = (4096 / t.block_size() * t.type_size() * 14336) as f64;
            line += &format!("  N={n} {:.0}", bytes / s / 1e9);
        }
        println!("{line}");
    }
}

fn gemm_prompt(c: &Ctx) {
    println!("\nGEMM, 512 columns (Llama-3-8B prompt shapes), us and TFLOP/s per product:");
    println!("| weights | M x K | F32 activations | F16 activations |");
    println!("|---|---|---|---|");
    for t in [DType::F16, DType::BF16, DType::Q4_0, DType::Q4K, DType::F32] {
        for (k, m) in SHAPES {
            let mut line = format!("| {t} | {m} x {k} |");
            for b_type in [DType::F32, DType::F16] {
                let copies = 4;
                let b = mul_mats(&c.backend, t, (k, m, 512), b_type, copies);
                let s = time(&c.cuda, &c.busy, &b, 5) / copies as f64;
                let tflops = 2.0 * 512.0 * (k * m) as f64 / s / 1e12;
                line += &format!(" {:.1} us, {tflops:.0} |", s * 1e6);
            }
            println!("{line}");
        }
    }
}

fn prompt_attention(c: &Ctx) {
    println!("\nprompt attention block (512 tokens, 32 heads, 8 KV heads, D 128), us per compute:");
    let fa_then_o = |with_o: bool| {
        Bench::new(&c.backend, |g| {
            let q = g.new_input(DType::F32, &[128, 32, 512]).unwrap();
            let k = g.new_input(DType::F16, &[128, 512, 8]).unwrap();
            let v = g.new_input(DType::F16, &[128, 512, 8]).unwrap();
            let mask = g.new_input(DType::F32, &[512, 512]).unwrap();
            let wo = g.new_input(DType::F16, &[4096, 4096]).unwrap();
            let qp = g.permute(q, [0, 2, 1, 3]).unwrap();
            let o = g
                .flash_attn_ext(qp, k, v, Some(mask), None, 0.088, 0.0, 0.0)
                .unwrap();
            let o = g.reshape(o, &[4096, 512]).unwrap();
            let out = if with_o { g.mul_mat(wo, o).unwrap() } else { o };
            g.output(out);
            vec![
                (q, bytemuck::cast_slice(&values(128 * 32 * 512, 1)).to_vec()),
                (k, weight_bytes(DType::F16, 128, 512 * 8)),
                (v, weight_bytes(DType::F16, 128, 512 * 8)),
                (mask, vec![0u8; 512 * 512 * 4]),
                (wo, weight_bytes(DType::F16, 4096, 4096)),
            ]
        })
    };
    let fa = time(&c.cuda, &c.busy, &fa_then_o(false), 10);
    let fa_o = time(&c.cuda, &c.busy, &fa_then_o(true), 10);
    let o_alone = time(
        &c.cuda,
        &c.busy,
        &mul_mat(&c.backend, DType::F16, 4096, 4096, 512),
        10,
    );
    println!(
        "flash_attn {:.1}, flash_attn + o-proj {:.1} (o-proj {:.1}), o-proj alone {:.1}",
        fa * 1e6,
        fa_o * 1e6,
        (fa_o - fa) * 1e6,
        o_alone * 1e6
    );
}

/// Keys of the KV cache view the model attends: the used ones rounded up to this (llama's
/// `KV_PAD`), the rest masked.
const KV_PAD: usize = 256;

/// Decode attention as the model runs it: one query of 32 heads against `used` keys of a KV
/// cache view padded to [`KV_PAD`] (the padding masked), 8 KV heads of D 128, F16 K and V; one
/// attention per layer copy, enough copies that K and V come from HBM.
fn decode_attention(c: &Ctx) {
    println!(
        "\ndecode attention (32 heads, 8 KV heads, D 128, F16 K/V, one query, padded cache view),"
    );
    println!("kernel time per attention from graph replay (the combine of splits included):");
    println!("| keys used | keys in view | us | GB/s of used K/V bytes |");
    println!("|---|---|---|---|");
    for used in [16usize, 200, 1024, 4096, 8192, 32768] {
        let n_kv = used.next_multiple_of(KV_PAD);
        let kv_bytes = 2 * 128 * n_kv * 8 * 2;
        let copies = COLD_BYTES.div_ceil(kv_bytes).clamp(1, 64);
        let b = Bench::new(&c.backend, |g| {
            let q = g.new_input(DType::F32, &[128, 1, 32, 1]).unwrap();
            let mask = g.new_input(DType::F32, &[n_kv, 1]).unwrap();
            let mask_row: Vec<f32> = (0..n_kv)
                .map(|j| if j < used { 0.0 } else { f32::NEG_INFINITY })
                .collect();
            let mut inputs = vec![
                (q, bytemuck::cast_slice(&values(128 * 32, 1)).to_vec()),
                (mask, bytemuck::cast_slice(&mask_row).to_vec()),
            ];
            let rows = weight_bytes(DType::F16, 128, n_kv * 8);
            for _ in 0..copies {
                let k = g.new_input(DType::F16, &[128, n_kv, 8, 1]).unwrap();
                let v = g.new_input(DType::F16, &[128, n_kv, 8, 1]).unwrap();
                let out = g
                    .flash_attn_ext(q, k, v, Some(mask), None, 0.088, 0.0, 0.0)
                    .unwrap();
                g.output(out);
                inputs.push((k, rows.clone()));
                inputs.push((v, rows.clone()));
            }
            inputs
        });
        let s = kernel_time(&c.cuda, &c.busy, &b, 4) / copies as f64;
        let used_bytes = (2 * 128 * used * 8 * 2) as f64;
        println!(
            "| {used} | {n_kv} | {:.1} | {:.0} |",
            s * 1e6,
            used_bytes / s / 1e9
        );
    }
}
