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

// ---- flash attention: the vector kernels and the BLAS path (queries >= 16) ----

/// One flash_attn_ext case: head sizes, heads, queries, keys, sequences, K/V type and the op's
/// options; `kv_view` lays K and V out as the KV cache does (heads inside key rows).
#[derive(Clone, Copy)]
struct AttnCase {
    d: usize,
    dv: usize,
    heads: usize,
    kv_heads: usize,
    queries: usize,
    keys: usize,
    seqs: usize,
    kv: DType,
    sinks: bool,
    softcap: f32,
    max_bias: f32,
    kv_view: bool,
}

impl AttnCase {
    fn new(kv: DType, heads: usize, kv_heads: usize, queries: usize, keys: usize) -> AttnCase {
        AttnCase {
            d: 128,
            dv: 128,
            heads,
            kv_heads,
            queries,
            keys,
            seqs: 1,
            kv,
            sinks: false,
            softcap: 0.0,
            max_bias: 0.0,
            kv_view: false,
        }
    }

    fn params(&self) -> AttnParams {
        AttnParams {
            scale: 1.0 / (self.d as f32).sqrt(),
            max_bias: self.max_bias,
            softcap: self.softcap,
        }
    }

    fn name(&self) -> String {
        let c = self;
        format!(
            "D {}/{} heads {}/{} {} queries {} keys {} seqs, sinks {} softcap {} alibi {} cache view {}",
            c.d, c.dv, c.heads, c.kv_heads, c.queries, c.keys, c.seqs, c.sinks, c.softcap,
            c.max_bias, c.kv_view
        )
    }

    /// Q (a permuted view, as the models make it), K, V, and the sinks when used.
    fn inputs(&self) -> (Vec<InputSpec>, Option<InputSpec>) {
        let c = self;
        let permuted = ViewKind::Permute([0, 2, 1, 3]);
        let kv_layout = if c.kv_view {
            permuted
        } else {
            ViewKind::Contig
        };
        let qkv = vec![
            InputSpec::new(DType::F32, [c.d, c.queries, c.heads, c.seqs]).view(permuted),
            InputSpec::new(c.kv, [c.d, c.keys, c.kv_heads, c.seqs]).view(kv_layout),
            InputSpec::new(c.kv, [c.dv, c.keys, c.kv_heads, c.seqs]).view(kv_layout),
        ];
        let sinks = c
            .sinks
            .then(|| InputSpec::new(DType::F32, [c.heads, 1, 1, 1]).gen(Gen::Normal(2.0)));
        (qkv, sinks)
    }
}

/// Pushes `c` with a random mask (rows padded past the queries, as ggml pads them, and shared by
/// the sequences).
fn push_attn(set: &mut CaseSet, c: AttnCase) {
    let (mut inputs, sinks) = c.inputs();
    inputs.push(InputSpec::new(DType::F16, [c.keys, c.queries + 3, 1, 1]).gen(Gen::Mask));
    inputs.extend(sinks);
    let p = c.params();
    set.push(
        "flash_attn_ext",
        c.name(),
        inputs,
        ggml_tp_tests::case::Check::Nmse(attn_bound(c.kv)),
        move |g, x| {
            g.flash_attn_ext(
                x[0],
                x[1],
                x[2],
                Some(x[3]),
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
                Some(&x[3]),
                x.get(4),
                p,
            ))
        },
    );
}

#[test]
fn flash_attn_prefill_blas_path() {
    let seed = seed();
    let mut set = CaseSet::new(seed);
    // Llama-like prefill with the KV cache's layout, every K/V type.
    for kv in [DType::F16, DType::F32, DType::BF16, DType::Q8_0] {
        push_attn(
            &mut set,
            AttnCase {
                kv_view: true,
                ..AttnCase::new(kv, 8, 2, 512, 300)
            },
        );
    }
    // Key counts 1, 7, 4100 with GQA 8; GQA 1; several sequences with sinks.
    for keys in [1, 7, 4100] {
        push_attn(&mut set, AttnCase::new(DType::F16, 8, 1, 64, keys));
    }
    push_attn(&mut set, AttnCase::new(DType::F16, 4, 4, 33, 300));
    push_attn(
        &mut set,
        AttnCase {
            seqs: 2,
            sinks: true,
            ..AttnCase::new(DType::F16, 4, 2, 40, 77)
        },
    );
    // Head sizes 64, 192 -> 128 (D_v != D_k), 512; softcap; ALiBi.
    push_attn(
        &mut set,
        AttnCase {
            d: 64,
            dv: 64,
            softcap: 20.0,
            ..AttnCase::new(DType::F16, 4, 1, 20, 77)
        },
    );
    push_attn(
        &mut set,
        AttnCase {
            d: 192,
            dv: 128,
            max_bias: 8.0,
            ..AttnCase::new(DType::F16, 4, 2, 24, 100)
        },
    );
    push_attn(
        &mut set,
        AttnCase {
            d: 512,
            dv: 512,
            ..AttnCase::new(DType::F32, 2, 1, 17, 50)
        },
    );
    run(set, seed);
}

#[test]
fn flash_attn_vector_kernels() {
    let seed = seed();
    let mut set = CaseSet::new(seed);
    // One query (decode) over 1, 7, 300, 4100 keys, GQA 1/4/8, every K/V type for the split path.
    for (heads, kv_heads) in [(4, 4), (8, 2), (16, 2)] {
        for keys in [1, 7, 300, 4100] {
            push_attn(
                &mut set,
                AttnCase {
                    kv_view: true,
                    ..AttnCase::new(DType::F16, heads, kv_heads, 1, keys)
                },
            );
        }
    }
    for kv in [DType::F32, DType::BF16, DType::Q8_0] {
        push_attn(
            &mut set,
            AttnCase {
                sinks: true,
                ..AttnCase::new(kv, 8, 2, 1, 4100)
            },
        );
    }
    // Five queries (under the BLAS threshold): GQA 8 (two blocks per group), GQA 6 (4 + 2 heads).
    push_attn(
        &mut set,
        AttnCase {
            sinks: true,
            ..AttnCase::new(DType::F16, 8, 1, 5, 700)
        },
    );
    push_attn(&mut set, AttnCase::new(DType::F16, 6, 1, 5, 33));
    // Wide heads (d256 and d512 kernels), D_v != D_k, softcap, ALiBi, several sequences.
    push_attn(
        &mut set,
        AttnCase {
            d: 256,
            dv: 256,
            softcap: 30.0,
            ..AttnCase::new(DType::F16, 4, 2, 1, 1000)
        },
    );
    push_attn(
        &mut set,
        AttnCase {
            d: 192,
            dv: 128,
            max_bias: 8.0,
            ..AttnCase::new(DType::Q8_0, 4, 1, 2, 300)
        },
    );
    push_attn(
        &mut set,
        AttnCase {
            d: 512,
            dv: 512,
            seqs: 2,
            ..AttnCase::new(DType::F16, 2, 1, 3, 500)
        },
    );
    push_attn(
        &mut set,
        AttnCase {
            d: 64,
            dv: 64,
            ..AttnCase::new(DType::F32, 4, 1, 1, 5000)
        },
    );
    run(set, seed);
}
