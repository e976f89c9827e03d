//! Conformance-style cases at the sizes where the CUDA kernels change path, which the suite's small
//! shapes do not reach: GEMV with every weight type, 1..=8 columns and long rows (every thread of a
//! block busy, several units each, two rows per block with an odd row count), unaligned and odd-length
//! float rows (scalar loads); GEMM through GemmEx (9+ columns, batched and broadcast); mul_mat_id
//! with long rows; flash attention decode over long KV (split-KV partials and their merge) with GQA,
//! masks and sinks. Each result is compared with the suite's float64 reference under its bound.
//! Prints `skipped: no CUDA device` without one.

use backend_cuda as _;
use ggml_core::{DType, Device};
use ggml_tp_tests::case::{Gen, InputSpec, ViewKind};
use ggml_tp_tests::cases::{CaseSet, WEIGHTS};
use ggml_tp_tests::check::{attn_bound, weight_bound};
use ggml_tp_tests::reference::attention::{self as at, AttnParams};
use ggml_tp_tests::reference::matrix as mx;
use ggml_tp_tests::{family_devices, run_cases, seed};
use std::sync::Arc;

/// The first CUDA device, or `None` after printing why there is none.
fn cuda0() -> Option<Arc<dyn Device>> {
    family_devices("cuda", "CUDA").map(|mut d| d.remove(0))
}

fn run(set: CaseSet, seed: u64) {
    let Some(dev) = cuda0() else { return };
    let report = run_cases(dev.new_backend().unwrap(), seed, &set.cases);
    println!("{}", report.summary());
    for s in &report.skipped {
        println!("{s}");
    }
    assert!(report.skipped.is_empty(), "every case must run on CUDA");
    report.assert_ok();
}

fn push_mul_mat(set: &mut CaseSet, params: String, a: InputSpec, b: InputSpec, w: DType) {
    set.push(
        "mul_mat",
        params,
        vec![a, b],
        ggml_tp_tests::case::Check::Nmse(weight_bound(w)),
        |g, x| g.mul_mat(x[0], x[1]),
        |x| Ok(mx::mul_mat(&x[0], &x[1])),
    );
}

#[test]
fn gemv_every_type_and_column_count() {
    let seed = seed();
    let mut set = CaseSet::new(seed);
    for w in WEIGHTS {
        // 2560 = 10 K-quant blocks, 80 units of 32 (quantized) or 320 of 8 (floats).
        let (k, m) = (2560, 67);
        for n in 1..=8 {
            let a = InputSpec::new(w, [k, m, 1, 1]);
            let b = InputSpec::new(DType::F32, [k, n, 1, 1]);
            push_mul_mat(&mut set, format!("gemv {n} columns"), a, b, w);
        }
        // Broadcast batches with several columns.
        let a = InputSpec::new(w, [k, 33, 2, 1]);
        let b = InputSpec::new(DType::F32, [k, 3, 4, 2]);
        push_mul_mat(&mut set, "gemv batched".into(), a, b, w);
    }
    for w in [DType::F32, DType::F16, DType::BF16] {
        // Odd row length: scalar loads only.
        let a = InputSpec::new(w, [4099, 19, 1, 1]);
        let b = InputSpec::new(DType::F32, [4099, 5, 1, 1]);
        push_mul_mat(&mut set, "gemv odd K".into(), a, b, w);
        // Rows one element off 16-byte alignment, activations F16 through a padded view.
        let a = InputSpec::new(w, [1024, 21, 1, 1]).view(ViewKind::Pad { pad: 3, offset: 1 });
        let b =
            InputSpec::new(DType::F16, [1024, 2, 1, 1]).view(ViewKind::Pad { pad: 8, offset: 8 });
        push_mul_mat(&mut set, "gemv unaligned".into(), a, b, w);
    }
    run(set, seed);
}

#[test]
fn gemm_through_cublas() {
    let seed = seed();
    let mut set = CaseSet::new(seed);
    for w in WEIGHTS {
        for n in [9, 64, 130] {
            let a = InputSpec::new(w, [512, 65, 1, 1]);
            let b = InputSpec::new(DType::F32, [512, n, 1, 1]);
            push_mul_mat(&mut set, format!("gemm {n} columns"), a, b, w);
        }
        let a = InputSpec::new(w, [256, 40, 3, 1]);
        let b = InputSpec::new(DType::F32, [256, 12, 6, 2]);
        push_mul_mat(&mut set, "gemm batched".into(), a, b, w);
    }
    // Permuted weights and F16 activations: converted operands.
    let a = InputSpec::new(DType::F16, [64, 3, 20, 1]).view(ViewKind::Permute([0, 2, 1, 3]));
    let b = InputSpec::new(DType::F16, [64, 16, 20, 1]);
    push_mul_mat(&mut set, "gemm permuted".into(), a, b, DType::F16);
    run(set, seed);
}

#[test]
fn mul_mat_id_long_rows() {
    let seed = seed();
    let mut set = CaseSet::new(seed);
    for w in [
        DType::F16,
        DType::BF16,
        DType::Q8_0,
        DType::Q4K,
        DType::Q6K,
        DType::MXFP4,
    ] {
        for (n_used, b1, n_tok) in [(2, 1, 5), (4, 4, 3)] {
            let experts = InputSpec::new(w, [1024, 67, 8, 1]);
            let b = InputSpec::new(DType::F32, [1024, b1, n_tok, 1]);
            let ids = InputSpec::ids([n_used, n_tok, 1, 1], 8, true);
            set.push(
                "mul_mat_id",
                format!("{n_used} of 8 experts, b rows {b1}"),
                vec![experts, b, ids],
                ggml_tp_tests::case::Check::Nmse(weight_bound(w)),
                |g, x| g.mul_mat_id(x[0], x[1], x[2]),
                |x| Ok(mx::mul_mat_id(&x[0], &x[1], &x[2])),
            );
        }
    }
    run(set, seed);
}

#[test]
fn flash_attn_decode_long_kv() {
    let seed = seed();
    let mut set = CaseSet::new(seed);
    for kv in [DType::F16, DType::F32, DType::Q8_0] {
        for (n_q, n_kv, sinks) in [(1, 1000, false), (1, 4099, true), (3, 700, true)] {
            let (d, n_head, n_head_kv) = (128, 8, 2);
            let p = AttnParams {
                scale: 1.0 / (d as f32).sqrt(),
                max_bias: 0.0,
                softcap: 0.0,
            };
            let mut inputs = vec![
                InputSpec::new(DType::F32, [d, n_q, n_head, 1]),
                InputSpec::new(kv, [d, n_kv, n_head_kv, 1]),
                InputSpec::new(kv, [d, n_kv, n_head_kv, 1]),
                InputSpec::new(DType::F16, [n_kv, n_q, 1, 1]).gen(Gen::Mask),
            ];
            if sinks {
                inputs.push(InputSpec::new(DType::F32, [n_head, 1, 1, 1]).gen(Gen::Normal(2.0)));
            }
            set.push(
                "flash_attn_ext",
                format!("decode {n_q} queries, {n_kv} keys, sinks {sinks}"),
                inputs,
                ggml_tp_tests::case::Check::Nmse(attn_bound(kv)),
                move |g, x| {
                    g.flash_attn_ext(
                        x[0],
                        x[1],
                        x[2],
                        x.get(3).copied(),
                        x.get(4).copied(),
                        p.scale,
                        p.max_bias,
                        p.softcap,
                    )
                },
                move |x| {
                    Ok(at::flash_attn_ext(
                        &x[0],
                        &x[1],
                        &x[2],
                        x.get(3),
                        x.get(4),
                        p,
                    ))
                },
            );
        }
    }
    run(set, seed);
}

// Matrix products at the sizes of the staged K-quant GEMV (aligned rows read in chunks of 64 units
// of 32 through shared memory; the other quantized types at the same sizes through direct decoding),
// the F32 -> F16 activation conversion and the dequantizer of the GEMM path.

/// Quantized weight types.
fn quantized_weights() -> impl Iterator<Item = DType> {
    WEIGHTS.into_iter().filter(|w| w.is_quantized())
}

#[test]
fn gemv_long_rows_every_quantized_type() {
    let seed = seed();
    let mut set = CaseSet::new(seed);
    for w in quantized_weights() {
        // 6144 = 3 whole chunks (aligned K-quant rows); 6656 = 208 units of the 32-blocks (K-quant
        // rows of 6656 do not exist).
        for k in [6144, 6656] {
            if w.block_size() == 256 && k % 256 != 0 {
                continue;
            }
            for n in [1, 2, 3, 8] {
                let a = InputSpec::new(w, [k, 67, 1, 1]);
                let b = InputSpec::new(DType::F32, [k, n, 1, 1]);
                push_mul_mat(&mut set, format!("gemv K {k}, {n} columns"), a, b, w);
            }
        }
        // Few rows (four warps per row), broadcast batches.
        let a = InputSpec::new(w, [14336, 5, 1, 1]);
        let b = InputSpec::new(DType::F32, [14336, 1, 1, 1]);
        push_mul_mat(&mut set, "gemv 5 long rows".into(), a, b, w);
        let a = InputSpec::new(w, [4096, 33, 2, 1]);
        let b = InputSpec::new(DType::F32, [4096, 3, 4, 2]);
        push_mul_mat(&mut set, "gemv staged batched".into(), a, b, w);
        // Strided weight rows (still 16-byte aligned: staged K-quants) and strided activations.
        let a = InputSpec::new(w, [6144, 19, 1, 1]).view(ViewKind::Pad {
            pad: 2048,
            offset: 0,
        });
        let b =
            InputSpec::new(DType::F32, [6144, 2, 1, 1]).view(ViewKind::Pad { pad: 4, offset: 1 });
        push_mul_mat(&mut set, "gemv staged strided".into(), a, b, w);
    }
    run(set, seed);
}

#[test]
fn gemm_converted_activations_and_dequantized_weights() {
    let seed = seed();
    let mut set = CaseSet::new(seed);
    for w in [
        DType::F16,
        DType::Q4_0,
        DType::Q8_0,
        DType::Q4K,
        DType::Q6K,
        DType::MXFP4,
    ] {
        // K * N not a multiple of 4 (the conversion's scalar tail); units not a multiple of the
        // dequantizer's block of 128.
        let k = if w.block_size() == 256 { 768 } else { 544 };
        let a = InputSpec::new(w, [k, 301, 1, 1]);
        let b = InputSpec::new(DType::F32, [k, 13, 1, 1]);
        push_mul_mat(&mut set, "gemm odd sizes".into(), a, b, w);
        // Non-contiguous F32 activations (the generic copy).
        let a = InputSpec::new(w, [k, 64, 1, 1]);
        let b = InputSpec::new(DType::F32, [k, 24, 1, 1]).view(ViewKind::Pad { pad: 3, offset: 2 });
        push_mul_mat(&mut set, "gemm strided activations".into(), a, b, w);
    }
    run(set, seed);
}
