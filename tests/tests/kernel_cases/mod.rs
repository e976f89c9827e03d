//! Conformance-style cases at the sizes where the CUDA kernels change path, which the suite's small
//! shapes do not reach: GEMV with every weight type, 1..=8 columns and long rows (every thread of a
//! block busy, several units each, two rows per block with an odd row count), unaligned and odd-length
//! float rows (scalar loads); GEMM through GemmEx (9+ columns, batched and broadcast); mul_mat_id
//! with long rows; flash attention decode over long KV (split-KV partials and their merge) with GQA,
//! masks and sinks; the small ops' fast paths (row-contiguous kernels) at model sizes, odd sizes and
//! through views; the fused add -> norm -> mul chains against the same nodes run unfused (bit-equal)
//! and the float64 reference; the decode fusions (`fusions.rs`); mul_mat_id at the shapes of MoE
//! models, prompts and decode, and ids out of range (`moe.rs`). The quantized cases include the
//! regrouped Q4_0 / Q8_0 layouts GPUs keep weights in. Each result is compared with the
//! suite's float64 reference under its bound. Shared by two test binaries, each with its own
//! `kernel_device()`: `cuda_kernels` (the first CUDA device; `skipped: no CUDA device` without one)
//! and `kernels_on_host` (the kernels compiled for the host, as on CI).

use ggml_core::sched::Scheduler;
use ggml_core::{DType, Device, GluOp, Graph, RopeMode, RopeParams, TensorId, UnaryOp};
use ggml_tp_tests::case::{draw_leaf, Check, Gen, InputSpec, ViewKind};
use ggml_tp_tests::cases::{push_flash_attn, CaseSet};
use ggml_tp_tests::check::{float_bound, nmse, product_check, store_bound, weight_bound, Class};
use ggml_tp_tests::codec::{decode, encode, round_trip};
use ggml_tp_tests::dense::Dense;
use ggml_tp_tests::reference::attention::{self as at, AttnParams};
use ggml_tp_tests::reference::elementwise::{self as ew, BinOp};
use ggml_tp_tests::reference::matrix as mx;
use ggml_tp_tests::{run_cases, seed};
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::sync::Arc;

#[path = "attention.rs"]
mod attention;
#[path = "delta_net.rs"]
mod delta_net;
#[path = "eltwise_chains.rs"]
mod eltwise_chains;
#[path = "fusions.rs"]
mod fusions;
#[path = "moe.rs"]
mod moe;

use super::kernel_device;

fn run(set: CaseSet, seed: u64) {
    let Some(dev) = kernel_device() else { return };
    let report = run_cases(dev.new_backend().unwrap(), seed, &set.cases);
    println!("{}", report.summary());
    for s in &report.skipped {
        println!("{s}");
    }
    assert!(
        report.skipped.is_empty(),
        "every case must run on the kernels' device"
    );
    report.assert_ok();
}

fn push_mul_mat(set: &mut CaseSet, params: String, a: InputSpec, b: InputSpec, w: DType) {
    let check = product_check(w, a.ne[0]);
    set.push(
        "mul_mat",
        params,
        vec![a, b],
        check,
        |g, x| g.mul_mat(x[0], x[1]),
        |x| Ok(mx::mul_mat(&x[0], &x[1])),
    );
}

/// The rows `ids` of `table` (an embedding lookup).
fn push_get_rows(set: &mut CaseSet, table: InputSpec, ids: InputSpec, check: Check) {
    set.push(
        "get_rows",
        String::new(),
        vec![table, ids],
        check,
        |g, x| g.get_rows(x[0], x[1]),
        |x| Ok(mx::get_rows(&x[0], &x[1])),
    );
}

#[test]
fn gemv_every_type_and_column_count() {
    let seed = seed();
    let mut set = CaseSet::new(seed);
    for w in DType::WEIGHTS {
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
    for w in DType::WEIGHTS {
        for n in [9, 64, 130] {
            let a = InputSpec::new(w, [512, 65, 1, 1]);
            let b = InputSpec::new(DType::F32, [512, n, 1, 1]);
            push_mul_mat(&mut set, format!("gemm {n} columns"), a, b, w);
        }
        let a = InputSpec::new(w, [256, 40, 3, 1]);
        let b = InputSpec::new(DType::F32, [256, 12, 6, 2]);
        push_mul_mat(&mut set, "gemm batched".into(), a, b, w);
    }
    // Half weights with an odd activation count (the conversion's tail after its 4-value loads).
    for w in [DType::F16, DType::BF16] {
        let a = InputSpec::new(w, [130, 17, 1, 1]);
        let b = InputSpec::new(DType::F32, [130, 11, 1, 1]);
        push_mul_mat(&mut set, "gemm odd count".into(), a, b, w);
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
        DType::Q4_0G,
        DType::Q8_0G,
    ] {
        for (n_used, b1, n_tok) in [(2, 1, 5), (4, 4, 3)] {
            let experts = InputSpec::new(w, [1024, 67, 8, 1]);
            let b = InputSpec::new(DType::F32, [1024, b1, n_tok, 1]);
            let ids = InputSpec::ids([n_used, n_tok, 1, 1], 8, true);
            set.push(
                "mul_mat_id",
                format!("{n_used} of 8 experts, b rows {b1}"),
                vec![experts, b, ids],
                product_check(w, 1024),
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
            let params = format!("decode {n_q} queries, {n_kv} keys, sinks {sinks}");
            push_flash_attn(&mut set, params, inputs, kv, p);
        }
    }
    run(set, seed);
}

#[test]
fn small_ops_fast_paths_at_model_sizes() {
    let seed = seed();
    let mut set = CaseSet::new(seed);
    let exact = Check::Nmse(float_bound(Class::Exact, DType::F32));
    let math = Check::Nmse(float_bound(Class::Math, DType::F32));
    // Decode and prefill rows, odd lengths (scalar chunks), padded rows (unaligned), permuted rows.
    let layouts = [
        ([4096, 1, 1, 1], ViewKind::Contig),
        ([4096, 13, 1, 1], ViewKind::Contig),
        ([4095, 7, 1, 1], ViewKind::Contig),
        ([1, 3, 1, 1], ViewKind::Contig),
        ([1024, 5, 1, 1], ViewKind::Pad { pad: 3, offset: 1 }),
        ([128, 3, 8, 1], ViewKind::Permute([0, 2, 1, 3])),
    ];
    for (ne, view) in layouts {
        let x = InputSpec::new(DType::F32, ne).view(view);
        let silu = UnaryOp::Silu;
        set.push(
            "silu",
            String::new(),
            vec![x],
            math,
            move |g, x| g.unary(x[0], silu),
            move |x| Ok(ew::unary(silu, &x[0])),
        );
        for (name, op) in [("add", BinOp::Add), ("mul", BinOp::Mul)] {
            for b_ne in [ne, [ne[0], 1, 1, 1]] {
                let b = InputSpec::new(DType::F32, b_ne);
                set.push(
                    name,
                    format!("b {b_ne:?}"),
                    vec![x, b],
                    exact,
                    move |g, x| match op {
                        BinOp::Add => g.add(x[0], x[1]),
                        _ => g.mul(x[0], x[1]),
                    },
                    move |x| Ok(ew::binary(op, &x[0], &x[1])),
                );
            }
        }
        let u = InputSpec::new(DType::F32, ne).view(view);
        let swiglu = GluOp::Swiglu;
        set.push(
            "glu",
            "swiglu".into(),
            vec![x, u],
            math,
            move |g, x| g.glu(swiglu, x[0], x[1]),
            move |x| Ok(ew::glu(swiglu, &x[0], &x[1])),
        );
        let both = InputSpec::new(DType::F32, [2 * ne[0], ne[1], ne[2], 1]);
        set.push(
            "glu",
            "swiglu fused, swapped".into(),
            vec![both],
            math,
            move |g, x| g.glu_fused(swiglu, x[0], true),
            move |x| Ok(ew::glu_fused(swiglu, &x[0], true)),
        );
        set.push(
            "rms_norm",
            String::new(),
            vec![x.gen(Gen::Normal(3.0))],
            math,
            |g, x| g.rms_norm(x[0], 1e-5),
            |x| Ok(ew::rms_norm(&x[0], 1e-5)),
        );
        set.push(
            "norm",
            String::new(),
            vec![x.gen(Gen::Uniform(-1.0, 5.0))],
            math,
            |g, x| g.norm(x[0], 1e-5),
            |x| Ok(ew::norm(&x[0], 1e-5)),
        );
        for t in [DType::F16, DType::BF16] {
            set.push(
                "cpy",
                format!("to {t}"),
                vec![x],
                Check::Nmse(store_bound(t)),
                move |g, x| g.cast(x[0], t),
                move |x| round_trip(t, &x[0]),
            );
            let h = InputSpec::new(t, ne).view(view);
            set.push(
                "cpy",
                format!("from {t}"),
                vec![h],
                exact,
                |g, x| g.cast(x[0], DType::F32),
                |x| Ok(x[0].clone()),
            );
        }
    }
    // Rope over decode and prefill heads, both layouts, with frequency factors.
    for mode in [RopeMode::Normal, RopeMode::Neox] {
        for (ne, view) in [
            ([128, 32, 1, 1], ViewKind::Contig),
            ([128, 8, 33, 1], ViewKind::Contig),
            ([64, 3, 5, 1], ViewKind::Pad { pad: 3, offset: 1 }),
        ] {
            let p = RopeParams::simple(mode, ne[0], 500000.0);
            let inputs = vec![
                InputSpec::new(DType::F32, ne).view(view),
                InputSpec::ids([ne[2], 1, 1, 1], 8192, false),
                InputSpec::new(DType::F32, [ne[0] / 2, 1, 1, 1]).gen(Gen::Uniform(1.0, 8.0)),
            ];
            set.push(
                "rope",
                format!("{mode:?}"),
                inputs,
                Check::Nmse(float_bound(Class::Approx, DType::F32)),
                move |g, x| g.rope(x[0], x[1], Some(x[2]), p),
                move |x| Ok(at::rope(&x[0], &x[1], Some(&x[2]), &p)),
            );
        }
    }
    // Cache writes of decode (one token) and prefill from permuted rows; embedding lookups.
    for t in [DType::F16, DType::F32] {
        for n_tok in [1, 37] {
            let dst = InputSpec::new(t, [128, 300, 8, 1]);
            let src = InputSpec::new(DType::F32, [128, n_tok, 8, 1])
                .view(ViewKind::Permute([0, 2, 1, 3]));
            let ids = InputSpec::ids([n_tok, 1, 1, 1], 300, true);
            set.push(
                "set_rows",
                format!("{n_tok} tokens"),
                vec![dst, src, ids],
                Check::Nmse(store_bound(t)),
                |g, x| g.set_rows(x[0], x[1], x[2]),
                move |x| Ok(mx::set_rows(&x[0], &round_trip(t, &x[1])?, &x[2])),
            );
        }
        let table = InputSpec::new(t, [4096, 500, 1, 1]);
        let ids = InputSpec::ids([9, 1, 1, 1], 500, false);
        push_get_rows(&mut set, table, ids, exact);
    }
    run(set, seed);
}

/// One chain (`x (+ r) -> norm -> (* w)`, or a decode fusion of `fusions.rs`) on the CUDA backend
/// with every result an output, its leaves filled with `inputs` and its results poisoned; the
/// results' bytes and values, in chain order. With `apart`, a node between each two results keeps
/// them from fusing.
fn run_chain(
    dev: &Arc<dyn Device>,
    inputs: &[(InputSpec, Vec<u8>)],
    build: &dyn Fn(&mut Graph, &[TensorId]) -> Vec<TensorId>,
    apart: bool,
) -> Vec<(Vec<u8>, Dense)> {
    let mut g = Graph::new();
    let mut leaves = Vec::new();
    let mut seen = Vec::new();
    for (spec, _) in inputs {
        let leaf = g
            .new_input(spec.dtype, &spec.view.leaf_ne(spec.ne))
            .unwrap();
        leaves.push(leaf);
        seen.push(match spec.view {
            ViewKind::Contig => leaf,
            ViewKind::Permute([1, 0, 2, 3]) => g.transpose(leaf).unwrap(),
            ViewKind::Permute(axes) => g.permute(leaf, axes).unwrap(),
            ViewKind::Pad { offset, .. } => {
                let l = *g.layout(leaf);
                let offset_bytes = offset * spec.dtype.type_size() / spec.dtype.block_size();
                g.view(leaf, &spec.ne, &l.nb[1..], offset_bytes).unwrap()
            }
        });
    }
    let results = build(&mut g, &seen);
    for (k, &t) in results.iter().enumerate() {
        g.output(t);
        if apart && k + 1 < results.len() {
            // A node between the chain's nodes keeps them from fusing.
            let between = g.scale(seen[0], 2.0).unwrap();
            g.output(between);
        }
    }
    let mut sched = Scheduler::new(vec![dev.new_backend().unwrap()]);
    sched.alloc(&mut g).unwrap();
    // Poison first: the planner may place a later result over an input the chain no longer needs.
    for &t in &results {
        let d = g.data(t).unwrap();
        d.buffer.fill(d.offset, g.layout(t).nbytes(), 0xFF).unwrap();
    }
    for (leaf, (_, bytes)) in leaves.iter().zip(inputs) {
        g.set_bytes(*leaf, bytes).unwrap();
    }
    sched.compute(&g).unwrap();
    results
        .iter()
        .map(|&t| {
            let bytes = g.get_bytes(t).unwrap();
            let l = g.layout(t);
            let values = decode(l.dtype, l.ne, &bytes).unwrap();
            (bytes, values)
        })
        .collect()
}

/// The results of `build` run fused (see [`run_chain`]), after checking that the fused run made
/// more launches of the kind `count` reads than before it and that every result is bit-equal to
/// a run whose nodes are kept apart.
fn fused_matching_unfused(
    dev: &Arc<dyn Device>,
    inputs: &[(InputSpec, Vec<u8>)],
    build: &dyn Fn(&mut Graph, &[TensorId]) -> Vec<TensorId>,
    count: fn(&ggml_gpu::dispatch::FusionCounts) -> u64,
    what: &str,
) -> Vec<(Vec<u8>, Dense)> {
    let before = ggml_gpu::dispatch::fusion_counts();
    let fused = run_chain(dev, inputs, build, false);
    let after = ggml_gpu::dispatch::fusion_counts();
    assert!(
        count(&after) > count(&before),
        "{what}: no fused launch ({before:?} -> {after:?})"
    );
    let unfused = run_chain(dev, inputs, build, true);
    for (e, (f, u)) in fused.iter().zip(&unfused).enumerate() {
        assert_eq!(f.0, u.0, "{what}: result {e} fused != unfused");
    }
    fused
}

/// What a norm chain does after its norm.
#[derive(Clone, Copy, Debug)]
enum Tail {
    None,
    Mul,
    Scale,
}

/// The scale and bias of the chains that end in a scale.
const CHAIN_SCALE: (f32, f32) = (0.0884, 0.25);

#[test]
fn fused_norm_chains_match_unfused_and_reference() {
    let Some(dev) = kernel_device() else { return };
    let mut rng = StdRng::seed_from_u64(seed());
    let mut checked = 0;
    let shapes = [
        [4096, 1, 1, 1],
        [576, 1, 1, 1],
        [4096, 13, 1, 1],
        [4095, 7, 1, 1],
        [13, 7, 1, 1],
        [1, 3, 1, 1],
    ];
    let views = [
        ViewKind::Contig,
        ViewKind::Pad { pad: 3, offset: 1 },
        ViewKind::Permute([1, 0, 2, 3]),
    ];
    for ne in shapes {
        for view in views {
            for (with_add, tail, rms, weight_first) in [
                (true, Tail::Mul, true, false),
                (true, Tail::None, true, false),
                (false, Tail::Mul, true, false),
                (true, Tail::Mul, false, true),
                (false, Tail::Scale, true, false),
                (true, Tail::Scale, false, false),
            ] {
                let x = InputSpec::new(DType::F32, ne)
                    .gen(Gen::Normal(3.0))
                    .view(view);
                let r = InputSpec::new(DType::F32, ne);
                let w_ne = if weight_first { ne } else { [ne[0], 1, 1, 1] };
                let w = InputSpec::new(DType::F32, w_ne).gen(Gen::Uniform(0.5, 2.0));
                let specs = [x, r, w];
                let inputs: Vec<(InputSpec, Vec<u8>)> = specs
                    .iter()
                    .map(|s| {
                        let leaf_ne = s.view.leaf_ne(s.ne);
                        let v = draw_leaf(&mut rng, s.gen, leaf_ne);
                        (*s, encode(DType::F32, leaf_ne, &v.data).unwrap())
                    })
                    .collect();
                let build = |g: &mut Graph, t: &[TensorId]| {
                    let mut out = Vec::new();
                    let mut h = t[0];
                    if with_add {
                        h = g.add(h, t[1]).unwrap();
                        out.push(h);
                    }
                    h = if rms {
                        g.rms_norm(h, 1e-6)
                    } else {
                        g.norm(h, 1e-5)
                    }
                    .unwrap();
                    out.push(h);
                    let last = match tail {
                        Tail::Mul if weight_first => Some(g.mul(t[2], h)),
                        Tail::Mul => Some(g.mul(h, t[2])),
                        Tail::Scale => Some(g.scale_bias(h, CHAIN_SCALE.0, CHAIN_SCALE.1)),
                        Tail::None => None,
                    };
                    out.extend(last.map(|m| m.unwrap()));
                    out
                };
                let before = ggml_gpu::dispatch::fusion_counts();
                let fused = run_chain(&dev, &inputs, &build, false);
                let after = ggml_gpu::dispatch::fusion_counts();
                // Rows read across (a transposed view) run unfused.
                let rows_contiguous = !matches!(view, ViewKind::Permute(_));
                assert!(
                    !rows_contiguous || after.norm_chains > before.norm_chains,
                    "{ne:?} {view:?} {tail:?}: no chain fused ({before:?} -> {after:?})"
                );
                let unfused = run_chain(&dev, &inputs, &build, true);
                // The float64 reference from the values the ops see.
                let seen: Vec<Dense> = inputs
                    .iter()
                    .map(|(s, bytes)| {
                        let leaf = decode(DType::F32, s.view.leaf_ne(s.ne), bytes).unwrap();
                        s.view.apply(&leaf, s.ne)
                    })
                    .collect();
                let mut want = Vec::new();
                let mut h = seen[0].clone();
                if with_add {
                    h = ew::binary(BinOp::Add, &h, &seen[1]);
                    want.push((h.clone(), Class::Exact));
                }
                h = if rms {
                    ew::rms_norm(&h, 1e-6)
                } else {
                    ew::norm(&h, 1e-5)
                };
                want.push((h.clone(), Class::Math));
                match tail {
                    Tail::Mul => want.push((ew::binary(BinOp::Mul, &h, &seen[2]), Class::Math)),
                    Tail::Scale => {
                        let mut m = h.clone();
                        let (scale, bias) = (CHAIN_SCALE.0 as f64, CHAIN_SCALE.1 as f64);
                        m.data.iter_mut().for_each(|v| *v = *v * scale + bias);
                        want.push((m, Class::Math));
                    }
                    Tail::None => {}
                }
                let what = format!(
                    "{ne:?} {view:?} add {with_add} {tail:?} rms {rms} weight first {weight_first}"
                );
                for (k, (want, class)) in want.iter().enumerate() {
                    assert_eq!(
                        fused[k].0, unfused[k].0,
                        "{what}: result {k} fused != unfused"
                    );
                    let e = nmse(&fused[k].1.data, &want.data);
                    let bound = float_bound(*class, DType::F32);
                    assert!(e <= bound, "{what}: result {k} NMSE {e:e} > {bound:e}");
                    checked += 1;
                }
            }
        }
    }
    println!(
        "{checked} chain results bit-equal to the unfused run and within the reference bounds"
    );
}

// Matrix products at the sizes of the staged K-quant GEMV (aligned rows read in chunks of 64 units
// of 32 through shared memory; the other quantized types at the same sizes through direct decoding),
// the F32 -> F16 activation conversion and the dequantizer of the GEMM path.

/// Quantized weight types, and the regrouped layouts GPUs keep Q4_0 / Q8_0 weights in.
fn quantized_weights() -> impl Iterator<Item = DType> {
    DType::WEIGHTS
        .into_iter()
        .filter(|w| w.is_quantized())
        .chain(DType::GROUPED)
}

#[test]
fn gemv_long_rows_every_quantized_type() {
    let seed = seed();
    let mut set = CaseSet::new(seed);
    for w in quantized_weights() {
        // 6144 = 3 whole chunks (aligned K-quant rows); 6656 = 208 units of the 32-blocks (K-quant
        // rows of 6656 do not exist).
        for k in [6144, 6656] {
            if w.row_size(k).is_none() {
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
        // The embedding lookup of a table in this type.
        let table = InputSpec::new(w, [4096, 300, 1, 1]);
        let ids = InputSpec::ids([7, 1, 1, 1], 300, false);
        let exact = Check::Nmse(float_bound(Class::Exact, DType::F32));
        push_get_rows(&mut set, table, ids, exact);
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
        DType::Q4_0G,
        DType::Q8_0G,
    ] {
        // K * N not a multiple of 4 (the conversion's scalar tail); units not a multiple of the
        // dequantizer's block of 128 (the regrouped layouts: 2 groups of 32 units).
        let k = match w.block_size() {
            256 => 768,
            1024 => 2048,
            _ => 544,
        };
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

// ---- grouped GEMV: adjacent products of one activation column in one launch ----

/// Products of one activation with 2 or 3 weights of `rows` rows, next to each other in the node
/// order (as the model builder lays out q, k, v and gate, up), their results joined on axis 0. The
/// inputs are kept to the end, as a model's bound weights are: the harness poisons the result
/// after filling the inputs, and the planner could otherwise put the result over them.
fn push_grouped_products(set: &mut CaseSet, w: DType, k: usize, rows: &[usize]) {
    let mut inputs: Vec<InputSpec> = rows
        .iter()
        .map(|&m| InputSpec::new(w, [k, m, 1, 1]))
        .collect();
    inputs.push(InputSpec::new(DType::F32, [k, 1, 1, 1]));
    let n = rows.len();
    set.push(
        "mul_mat",
        format!("grouped products of rows {rows:?}"),
        inputs,
        product_check(w, k),
        move |g, x| {
            let products: Vec<TensorId> = (0..n)
                .map(|i| g.mul_mat(x[i], x[n]))
                .collect::<Result<_, _>>()?;
            for &p in &products {
                g.expand(p);
            }
            x.iter().for_each(|&input| g.output(input));
            let mut out = products[0];
            for &p in &products[1..] {
                out = g.concat(out, p, 0)?;
            }
            Ok(out)
        },
        move |x| {
            let mut out = mx::mul_mat(&x[0], &x[n]);
            for i in 1..n {
                out = ew::concat(&out, &mx::mul_mat(&x[i], &x[n]), 0);
            }
            Ok(out)
        },
    );
}

#[test]
fn grouped_products_match_separate_ones() {
    let seed = seed();
    let mut set = CaseSet::new(seed);
    for w in DType::WEIGHTS {
        push_grouped_products(&mut set, w, 2560, &[67, 16, 16]);
        push_grouped_products(&mut set, w, 2560, &[300, 300]);
        push_grouped_products(&mut set, w, 2560, &[1, 5, 4096]);
    }
    for w in DType::GROUPED {
        push_grouped_products(&mut set, w, 3072, &[67, 16, 16]);
        push_grouped_products(&mut set, w, 3072, &[300, 300]);
    }
    for w in [DType::F32, DType::F16, DType::BF16] {
        // Odd row length: the scalar path of float weights.
        push_grouped_products(&mut set, w, 4099, &[19, 7, 33]);
    }
    run(set, seed);
}
