//! The decode fusions on the kernels' device (part of `kernel_cases`): gate and up products of
//! one activation with their gated unit in one `k_gemv_glu_<type>` launch (every weight type, long
//! and short rows, one to four warps per row, odd row lengths, unaligned rows), and the rope of k
//! with its cache write in one `k_rope_set_rows` (F16 and F32 caches, through the permute view as
//! the models write K, decode and prefill), alone and with the rope of q and the cache write of v;
//! the expert mix of a MoE layer (the router-weighted expert outputs summed) in one
//! `k_moe_weighted_sum`; the experts' gate and up products with their gated unit; the MoE router
//! (soft_max, top_k, the chosen weights) in one `k_moe_router`; norm chains and decode attention
//! that round their result to 8 bits for the quantized product after them. Every result of a chain is checked: the products
//! against the float64 reference, the gated unit against the float64 unit of the products the
//! launch wrote, the rope and the cache bit-equal to the unfused run and within the reference
//! bounds. Every input stays alive to the end (an output), as a model's weights and inputs do, so
//! that the planner places no result over them and the fused launches run.

use super::*;

/// Leaves of `specs` drawn from their generators and encoded in their types.
pub(super) fn draw_inputs(rng: &mut StdRng, specs: &[InputSpec]) -> Vec<(InputSpec, Vec<u8>)> {
    specs
        .iter()
        .map(|s| {
            let leaf_ne = s.view.leaf_ne(s.ne);
            let v = draw_leaf(rng, s.gen, leaf_ne);
            (*s, encode(s.dtype, leaf_ne, &v.data).unwrap())
        })
        .collect()
}

/// The values the ops see of `inputs`: decoded from their bytes, through their views.
pub(super) fn seen_values(inputs: &[(InputSpec, Vec<u8>)]) -> Vec<Dense> {
    inputs
        .iter()
        .map(|(s, bytes)| {
            let leaf = decode(s.dtype, s.view.leaf_ne(s.ne), bytes).unwrap();
            s.view.apply(&leaf, s.ne)
        })
        .collect()
}

/// Asserts NMSE(`got`, `want`) <= `bound`, naming `what`; returns 1 (one result checked).
pub(super) fn within(what: &str, got: &Dense, want: &Dense, bound: f64) -> usize {
    let e = nmse(&got.data, &want.data);
    assert!(e <= bound, "{what}: NMSE {e:e} > {bound:e}");
    1
}

#[test]
fn gate_up_and_gated_unit_in_one_launch() {
    let Some(dev) = kernel_device() else { return };
    let mut rng = StdRng::seed_from_u64(seed());
    let ops = [GluOp::Swiglu, GluOp::Geglu, GluOp::GegluErf];
    // (weight type, row length, rows, weight view): 2560 = 10 K-quant blocks; 4096 x 1000 (four
    // warps per row), 256 x 8200 (one warp per row), odd and unaligned float rows (scalar loads).
    let mut shapes: Vec<(DType, usize, usize, ViewKind)> = DType::WEIGHTS
        .iter()
        .map(|&w| (w, 2560, 67, ViewKind::Contig))
        .collect();
    for w in [DType::F16, DType::Q8_0, DType::Q4K] {
        shapes.push((w, 4096, 1000, ViewKind::Contig));
        shapes.push((w, 256, 8200, ViewKind::Contig));
    }
    for w in [DType::F32, DType::F16, DType::BF16] {
        shapes.push((w, 4099, 19, ViewKind::Contig));
        shapes.push((w, 1024, 21, ViewKind::Pad { pad: 3, offset: 1 }));
    }
    let mut checked = 0;
    for (case, &(w, k, m, view)) in shapes.iter().enumerate() {
        let op = ops[case % ops.len()];
        let specs = [
            InputSpec::new(DType::F32, [k, 1, 1, 1]).gen(Gen::Normal(1.0)),
            InputSpec::new(w, [k, m, 1, 1]).view(view),
            InputSpec::new(w, [k, m, 1, 1]).view(view),
        ];
        let inputs = draw_inputs(&mut rng, &specs);
        let build = |g: &mut Graph, t: &[TensorId]| {
            t.iter().for_each(|&input| g.output(input));
            let gate = g.mul_mat(t[1], t[0]).unwrap();
            let up = g.mul_mat(t[2], t[0]).unwrap();
            vec![gate, up, g.glu(op, gate, up).unwrap()]
        };
        let got = run_chain(&dev, &inputs, &build, false);
        let seen = seen_values(&inputs);
        let what = format!("{w} [{k}, {m}] {view:?} {op:?}");
        let (gate, up) = (&got[0].1, &got[1].1);
        let bound = weight_bound(w);
        checked += within(
            &format!("{what}: gate"),
            gate,
            &mx::mul_mat(&seen[1], &seen[0]),
            bound,
        );
        checked += within(
            &format!("{what}: up"),
            up,
            &mx::mul_mat(&seen[2], &seen[0]),
            bound,
        );
        let class = if op == GluOp::Swiglu {
            Class::Math
        } else {
            Class::Approx
        };
        checked += within(
            &format!("{what}: gated unit"),
            &got[2].1,
            &ew::glu(op, gate, up),
            float_bound(class, DType::F32),
        );
    }
    println!("{checked} results of fused gate, up and gated unit within the reference bounds");
}

#[test]
fn rope_and_cache_write_in_one_launch() {
    let Some(dev) = kernel_device() else { return };
    let mut rng = StdRng::seed_from_u64(seed());
    let mut checked = 0;
    for cache_type in [DType::F16, DType::F32] {
        for mode in [RopeMode::Neox, RopeMode::Normal] {
            // Decode and prefill of 8 KV heads of 128; a partial rotation of 64-element heads.
            for (d, n_dims, heads, tokens) in [(128, 128, 8, 1), (128, 128, 8, 37), (64, 32, 3, 5)]
            {
                // k alone, then with the rope of q (twice the heads) before it and the cache write
                // of v after it, as at decode.
                for with_qv in [false, true] {
                    let what = format!("{cache_type} cache, {mode:?}, d {d} n_dims {n_dims}, {heads} heads, {tokens} tokens, q and v {with_qv}");
                    checked += rope_cache_case(
                        &dev,
                        &mut rng,
                        cache_type,
                        mode,
                        [d, n_dims, heads, tokens],
                        with_qv,
                        &what,
                    );
                }
            }
        }
    }
    println!(
        "{checked} results of fused ropes and cache writes bit-equal to the unfused run and within the reference bounds"
    );
}

/// One case of [`rope_and_cache_write_in_one_launch`]: the results checked.
fn rope_cache_case(
    dev: &Arc<dyn Device>,
    rng: &mut StdRng,
    cache_type: DType,
    mode: RopeMode,
    [d, n_dims, heads, tokens]: [usize; 4],
    with_qv: bool,
    what: &str,
) -> usize {
    let rows = 300;
    let p = RopeParams::simple(mode, n_dims, 500000.0);
    let mut specs = vec![
        InputSpec::new(DType::F32, [d, heads, tokens, 1]),
        InputSpec::ids([tokens, 1, 1, 1], 8192, false),
        InputSpec::new(DType::F32, [n_dims / 2, 1, 1, 1]).gen(Gen::Uniform(1.0, 8.0)),
        InputSpec::new(cache_type, [d, rows, heads, 1]),
        InputSpec::ids([tokens, 1, 1, 1], rows, true),
    ];
    if with_qv {
        specs.push(InputSpec::new(DType::F32, [d, 2 * heads, tokens, 1]));
        specs.push(InputSpec::new(DType::F32, [d, heads, tokens, 1]));
        specs.push(InputSpec::new(cache_type, [d, rows, heads, 1]));
    }
    let inputs = draw_inputs(rng, &specs);
    let build = |g: &mut Graph, t: &[TensorId]| {
        t.iter().for_each(|&input| g.output(input));
        let q = with_qv.then(|| g.rope(t[5], t[1], Some(t[2]), p).unwrap());
        let k = g.rope(t[0], t[1], Some(t[2]), p).unwrap();
        let kp = g.permute(k, [0, 2, 1, 3]).unwrap();
        let mut out = vec![k, g.set_rows(t[3], kp, t[4]).unwrap()];
        if let Some(q) = q {
            let vp = g.permute(t[6], [0, 2, 1, 3]).unwrap();
            out.push(g.set_rows(t[7], vp, t[4]).unwrap());
            out.insert(0, q);
        }
        out
    };
    let fused = run_chain(dev, &inputs, &build, false);
    let unfused = run_chain(dev, &inputs, &build, true);
    let seen = seen_values(&inputs);
    let names: &[&str] = if with_qv {
        &["q rope", "rope", "cache", "v cache"]
    } else {
        &["rope", "cache"]
    };
    for (k, name) in names.iter().enumerate() {
        assert_eq!(fused[k].0, unfused[k].0, "{what}: {name} fused != unfused");
    }
    let at_k = usize::from(with_qv);
    let approx = Class::Approx;
    let rope = at::rope(&seen[0], &seen[1], Some(&seen[2]), &p);
    let mut checked = within(
        &format!("{what}: rope"),
        &fused[at_k].1,
        &rope,
        float_bound(approx, DType::F32),
    );
    let stored = round_trip(cache_type, &rope.permute([0, 2, 1, 3])).unwrap();
    let cache = mx::set_rows(&seen[3], &stored, &seen[4]);
    checked += within(
        &format!("{what}: cache"),
        &fused[at_k + 1].1,
        &cache,
        float_bound(approx, cache_type),
    );
    if with_qv {
        let q = at::rope(&seen[5], &seen[1], Some(&seen[2]), &p);
        checked += within(
            &format!("{what}: q rope"),
            &fused[0].1,
            &q,
            float_bound(approx, DType::F32),
        );
        let stored = round_trip(cache_type, &seen[6].permute([0, 2, 1, 3])).unwrap();
        let v_cache = mx::set_rows(&seen[7], &stored, &seen[4]);
        checked += within(
            &format!("{what}: v cache"),
            &fused[3].1,
            &v_cache,
            float_bound(approx, cache_type),
        );
    }
    checked
}

#[test]
fn fusions_run_on_intermediates_as_in_a_model() {
    // As in a decode step, the products' activation and the rope's input are intermediates (the
    // norm's and a product's results), which the memory planner could place the gated unit or the
    // rope's result over; the device's launch groups keep them apart so the fused kernels run.
    let Some(dev) = kernel_device() else { return };
    let mut rng = StdRng::seed_from_u64(seed());
    let (k, m, d, heads, rows) = (1536, 512, 64, 4, 40);
    let p = RopeParams::simple(RopeMode::Neox, d, 10000.0);
    let specs = [
        InputSpec::new(DType::F32, [k, 1, 1, 1]).gen(Gen::Normal(1.0)),
        InputSpec::new(DType::F32, [k, 1, 1, 1]).gen(Gen::Uniform(0.5, 1.5)),
        InputSpec::new(DType::F16, [k, m, 1, 1]),
        InputSpec::new(DType::F16, [k, m, 1, 1]),
        InputSpec::new(DType::F16, [k, d * heads, 1, 1]),
        InputSpec::ids([1, 1, 1, 1], 4096, false),
        InputSpec::new(DType::F16, [d, rows, heads, 1]),
        InputSpec::ids([1, 1, 1, 1], rows, true),
    ];
    let inputs = draw_inputs(&mut rng, &specs);
    let build = |g: &mut Graph, t: &[TensorId]| {
        let h = g.rms_norm(t[0], 1e-5).unwrap();
        let h = g.mul(h, t[1]).unwrap();
        let kin = g.mul_mat(t[4], h).unwrap();
        let kin = g.reshape(kin, &[d, heads, 1]).unwrap();
        let kr = g.rope(kin, t[5], None, p).unwrap();
        let kp = g.permute(kr, [0, 2, 1, 3]).unwrap();
        let cache = g.set_rows(t[6], kp, t[7]).unwrap();
        let gate = g.mul_mat(t[2], h).unwrap();
        let up = g.mul_mat(t[3], h).unwrap();
        vec![cache, g.glu(GluOp::Swiglu, gate, up).unwrap()]
    };
    let before = ggml_gpu::dispatch::fusion_counts();
    let got = run_chain(&dev, &inputs, &build, false);
    let after = ggml_gpu::dispatch::fusion_counts();
    assert!(
        after.products_glu > before.products_glu,
        "{before:?} -> {after:?}"
    );
    assert!(
        after.rope_cache > before.rope_cache,
        "{before:?} -> {after:?}"
    );
    let seen = seen_values(&inputs);
    let h = ew::binary(BinOp::Mul, &ew::rms_norm(&seen[0], 1e-5), &seen[1]);
    let glu = ew::glu(
        GluOp::Swiglu,
        &mx::mul_mat(&seen[2], &h),
        &mx::mul_mat(&seen[3], &h),
    );
    within("gated unit", &got[1].1, &glu, weight_bound(DType::F16));
    let kin = Dense::from_vec([d, heads, 1, 1], mx::mul_mat(&seen[4], &h).data);
    let rope = at::rope(&kin, &seen[5], None, &p);
    let stored = round_trip(DType::F16, &rope.permute([0, 2, 1, 3])).unwrap();
    let cache = mx::set_rows(&seen[6], &stored, &seen[7]);
    within("cache", &got[0].1, &cache, weight_bound(DType::F16));
}

#[test]
fn expert_mix_in_one_launch() {
    // As the model builder writes it: the experts' outputs times their router weights, then the
    // running sums of the k chosen experts' slices (views of the product).
    let Some(dev) = kernel_device() else { return };
    let mut rng = StdRng::seed_from_u64(seed());
    let mut checked = 0;
    for (d, k, t) in [
        (2049, 8, 1),
        (64, 2, 3),
        (768, 4, 1),
        (33, 10, 5),
        (128, 17, 2),
    ] {
        let specs = [
            InputSpec::new(DType::F32, [d, k, t, 1]).gen(Gen::Normal(1.0)),
            InputSpec::new(DType::F32, [1, k, t, 1]).gen(Gen::Uniform(0.0, 1.0)),
        ];
        let inputs = draw_inputs(&mut rng, &specs);
        let build = |g: &mut Graph, x: &[TensorId]| {
            let m = g.mul(x[0], x[1]).unwrap();
            let nb = *g.layout(m);
            let mut out = vec![m];
            let mut sum = g.view(m, &[d, t], &[nb.nb[2]], 0).unwrap();
            for e in 1..k {
                let v = g.view(m, &[d, t], &[nb.nb[2]], e * nb.nb[1]).unwrap();
                sum = g.add(sum, v).unwrap();
                out.push(sum);
            }
            out
        };
        let what = format!("[{d}, {k}, {t}]");
        let fused = fused_matching_unfused(&dev, &inputs, &build, |c| c.expert_sums, &what);
        let seen = seen_values(&inputs);
        let product = ew::binary(BinOp::Mul, &seen[0], &seen[1]);
        let mut want = vec![0.0; d * t];
        for (e, got) in fused.iter().enumerate().skip(1) {
            for (i, w) in want.iter_mut().enumerate() {
                let (i0, it) = (i % d, i / d);
                if e == 1 {
                    *w = product.data[i0 + d * k * it];
                }
                *w += product.data[i0 + d * (e + k * it)];
            }
            let want = Dense::from_vec([d, t, 1, 1], want.clone());
            checked += within(
                &format!("[{d}, {k}, {t}]: sum of {} experts", e + 1),
                &got.1,
                &want,
                float_bound(Class::Math, DType::F32),
            );
        }
    }
    println!("{checked} running sums of fused expert mixes within the reference bounds");
}

#[test]
fn expert_gate_up_and_gated_unit_in_one_launch() {
    // A MoE decode step: the chosen experts' gate and up products of one activation and their
    // gated unit, fused over the (slot, token) pairs; bit-equal to the separate launches.
    let Some(dev) = kernel_device() else { return };
    let mut rng = StdRng::seed_from_u64(seed());
    let mut checked = 0;
    // (weight type, row length, rows, experts, experts per token, tokens)
    let shapes = [
        (DType::Q4_0, 2048, 96, 16, 8, 1),
        (DType::Q8_0, 512, 67, 8, 2, 3),
        (DType::Q4K, 1024, 40, 6, 4, 2),
        (DType::F16, 264, 33, 5, 3, 1),
        (DType::F32, 128, 17, 4, 2, 8),
    ];
    for (w, k, m, n_exp, n_used, t) in shapes {
        let specs = [
            InputSpec::new(DType::F32, [k, 1, t, 1]).gen(Gen::Normal(1.0)),
            InputSpec::new(w, [k, m, n_exp, 1]),
            InputSpec::new(w, [k, m, n_exp, 1]),
            InputSpec::ids([n_used, t, 1, 1], n_exp, true),
        ];
        let inputs = draw_inputs(&mut rng, &specs);
        let build = |g: &mut Graph, x: &[TensorId]| {
            x.iter().for_each(|&input| g.output(input));
            let gate = g.mul_mat_id(x[1], x[0], x[3]).unwrap();
            let up = g.mul_mat_id(x[2], x[0], x[3]).unwrap();
            vec![gate, up, g.glu(GluOp::Swiglu, gate, up).unwrap()]
        };
        let what = format!("{w} [{k}, {m}] x {n_exp} experts, {n_used} of them, {t} tokens");
        let fused = fused_matching_unfused(&dev, &inputs, &build, |c| c.products_glu, &what);
        let seen = seen_values(&inputs);
        let bound = weight_bound(w);
        let gate = mx::mul_mat_id(&seen[1], &seen[0], &seen[3]);
        let up = mx::mul_mat_id(&seen[2], &seen[0], &seen[3]);
        checked += within(&format!("{what}: gate"), &fused[0].1, &gate, bound);
        checked += within(&format!("{what}: up"), &fused[1].1, &up, bound);
        checked += within(
            &format!("{what}: gated unit"),
            &fused[2].1,
            &ew::glu(GluOp::Swiglu, &fused[0].1, &fused[1].1),
            float_bound(Class::Math, DType::F32),
        );
    }
    println!(
        "{checked} results of fused expert gate, up and gated unit within the reference bounds"
    );
}

#[test]
fn moe_router_in_one_launch() {
    // The routers of the MoE models as the model builder writes them: soft_max, top_k and the
    // chosen probabilities (renormalised or not: Qwen3-style), or top_k, the chosen scores and
    // their soft_max (gpt-oss-style); bit-equal to the separate launches.
    let Some(dev) = kernel_device() else { return };
    let mut rng = StdRng::seed_from_u64(seed());
    let mut checked = 0;
    // (experts, chosen, tokens, top_k first, renormalised)
    let shapes = [
        (128, 8, 1, false, true),
        (60, 4, 3, false, false),
        (300, 10, 2, false, true),
        (32, 4, 1, true, false),
        (17, 2, 5, true, false),
    ];
    for (n_exp, k, t, topk_first, renorm) in shapes {
        let specs = [InputSpec::new(DType::F32, [n_exp, t, 1, 1]).gen(Gen::Normal(2.0))];
        let inputs = draw_inputs(&mut rng, &specs);
        let build = |g: &mut Graph, x: &[TensorId]| {
            let scores = x[0];
            if topk_first {
                let ids = g.top_k(scores, k).unwrap();
                let s3 = g.reshape(scores, &[1, n_exp, t]).unwrap();
                let w = g.get_rows(s3, ids).unwrap();
                let w2 = g.reshape(w, &[k, t]).unwrap();
                return vec![ids, w, g.soft_max(w2, None, None, 1.0, 0.0).unwrap()];
            }
            let probs = g.soft_max(scores, None, None, 1.0, 0.0).unwrap();
            let ids = g.top_k(probs, k).unwrap();
            let p3 = g.reshape(probs, &[1, n_exp, t]).unwrap();
            let w = g.get_rows(p3, ids).unwrap();
            let mut out = vec![probs, ids, w];
            if renorm {
                let w2 = g.reshape(w, &[k, t]).unwrap();
                let sum = g.sum_rows(w2).unwrap();
                out.push(sum);
                out.push(g.div(w2, sum).unwrap());
            }
            out
        };
        let what = format!(
            "{n_exp} experts, {k} chosen, {t} tokens, top_k first {topk_first}, renorm {renorm}"
        );
        let fused = fused_matching_unfused(&dev, &inputs, &build, |c| c.routers, &what);
        let seen = seen_values(&inputs);
        let bound = float_bound(Class::Math, DType::F32);
        let sorted = if topk_first {
            &seen[0]
        } else {
            &at::soft_max(&seen[0], None, None, 1.0, 0.0)
        };
        let ids = &fused[if topk_first { 0 } else { 1 }].1;
        assert_eq!(
            ids.data,
            mx::top_k(sorted, k).data,
            "{what}: chosen experts"
        );
        if topk_first {
            let s3 = Dense::from_vec([1, n_exp, t, 1], seen[0].data.clone());
            let w = mx::get_rows(&s3, ids);
            let w = Dense::from_vec([k, t, 1, 1], w.data);
            checked += within(
                &format!("{what}: weights"),
                &fused[2].1,
                &at::soft_max(&w, None, None, 1.0, 0.0),
                bound,
            );
        } else {
            checked += within(
                &format!("{what}: probabilities"),
                &fused[0].1,
                sorted,
                bound,
            );
        }
    }
    println!("{checked} fused MoE routers within the reference bounds");
}

/// One norm chain (the add with `with_add`, the mul by its weight row with `with_mul`) over
/// `cols` rows of `k`, then the product of weights of type `wt` with its result, fused (`apart`
/// false) or with a node between the chain and the product; the chain's result and the product.
fn norm_then_product(
    dev: &Arc<dyn Device>,
    inputs: &[(InputSpec, Vec<u8>)],
    (with_add, with_mul): (bool, bool),
    apart: bool,
) -> Vec<(Vec<u8>, Dense)> {
    let build = |g: &mut Graph, t: &[TensorId]| {
        t.iter().for_each(|&input| g.output(input));
        let x = if with_add {
            g.add(t[0], t[1]).unwrap()
        } else {
            t[0]
        };
        let mut h = g.rms_norm(x, 1e-5).unwrap();
        if with_mul {
            h = g.mul(h, t[2]).unwrap();
        }
        vec![h, g.mul_mat(t[3], h).unwrap()]
    };
    run_chain(dev, inputs, &build, apart)
}

/// Runs a node and the quantized product after it fused (`chain(false)`) and with a node between
/// them (`chain(true)`): the fused run must bump the fusion counter `counter` exactly when it
/// `rounds` (writes its result's 8-bit copy for the product), and both runs must give the same
/// bits (the node's result and the product). Returns the fused run's results.
fn rounding_matches_apart(
    what: &str,
    rounds: bool,
    counter: fn(&ggml_gpu::dispatch::FusionCounts) -> u64,
    chain: impl Fn(bool) -> Vec<(Vec<u8>, Dense)>,
) -> Vec<(Vec<u8>, Dense)> {
    let before = ggml_gpu::dispatch::fusion_counts();
    let fused = chain(false);
    let after = ggml_gpu::dispatch::fusion_counts();
    assert_eq!(
        counter(&after) > counter(&before),
        rounds,
        "{what}: {before:?} -> {after:?}"
    );
    let unfused = chain(true);
    assert_eq!(fused[0].0, unfused[0].0, "{what}: the first node's result");
    assert_eq!(fused[1].0, unfused[1].0, "{what}: the product");
    fused
}

#[test]
fn norm_chains_round_the_activations_of_quantized_products() {
    // The decode chain add + rms_norm + mul writes its result's 8-bit copy for the product after
    // it (no k_quantize_q8 launch): the product must equal the one after a separate rounding, bit
    // for bit, and the reference within the weights' bound. Rows of 16384 keep too few chunks in
    // registers: the chain rounds nothing there and the product rounds for itself.
    let Some(dev) = kernel_device() else { return };
    let mut rng = StdRng::seed_from_u64(seed());
    let mut checked = 0;
    let cases = [
        (DType::Q4_0, 4096, 1, (true, true)),
        (DType::Q8_0, 4096, 3, (true, true)),
        (DType::Q4K, 2048, 2, (false, true)),
        (DType::Q6K, 256, 1, (true, false)),
        (DType::Q4_1, 4096, 8, (true, true)),
        (DType::Q4_0, 16384, 1, (true, true)),
    ];
    for (wt, k, cols, chain) in cases {
        let specs = [
            InputSpec::new(DType::F32, [k, cols, 1, 1]).gen(Gen::Normal(2.0)),
            InputSpec::new(DType::F32, [k, cols, 1, 1]).gen(Gen::Normal(1.0)),
            InputSpec::new(DType::F32, [k, 1, 1, 1]).gen(Gen::Uniform(0.5, 1.5)),
            InputSpec::new(wt, [k, 96, 1, 1]),
        ];
        let inputs = draw_inputs(&mut rng, &specs);
        let what = format!("{wt} [{k}, {cols}] chain {chain:?}");
        let fused = rounding_matches_apart(
            &what,
            k <= 8192,
            |c| c.norm_q8,
            |apart| norm_then_product(&dev, &inputs, chain, apart),
        );
        let seen = seen_values(&inputs);
        checked += within(
            &format!("{what}: product"),
            &fused[1].1,
            &mx::mul_mat(&seen[3], &fused[0].1),
            weight_bound(wt),
        );
    }
    println!("{checked} products after norm chains that rounded their activations");
}

/// Decode attention over `heads` query heads (`kv_heads` KV heads, F16 K and V of `keys` keys,
/// head size 128, the mask's prefix of `live` keys unmasked) and the product of quantized weights
/// with its result, reshaped as the models feed the output projection: fused (`apart` false) or
/// with a node between them; the attention's result and the product.
fn attention_then_product(
    dev: &Arc<dyn Device>,
    inputs: &[(InputSpec, Vec<u8>)],
    apart: bool,
) -> Vec<(Vec<u8>, Dense)> {
    let build = |g: &mut Graph, t: &[TensorId]| {
        t.iter().for_each(|&input| g.output(input));
        let scale = 1.0 / (128f32).sqrt();
        let a = g
            .flash_attn_ext(t[0], t[1], t[2], Some(t[3]), None, scale, 0.0, 0.0)
            .unwrap();
        let n = g.layout(a).nelements();
        let flat = g.reshape(a, &[n, 1]).unwrap();
        vec![a, g.mul_mat(t[4], flat).unwrap()]
    };
    run_chain(dev, inputs, &build, apart)
}

#[test]
fn decode_attention_rounds_the_activations_of_quantized_products() {
    // Decode attention before a quantized product writes its result's 8-bit copy as it writes the
    // result (no k_quantize_q8 launch): k_flash_attn_vec for few keys (one split), and
    // k_flash_attn_combine after several splits. The product must equal the one after a separate
    // rounding, bit for bit, and the reference within the weights' bound.
    let Some(dev) = kernel_device() else { return };
    let mut rng = StdRng::seed_from_u64(seed());
    let mut checked = 0;
    // (weight type, heads, KV heads, keys, unmasked keys)
    let cases = [
        (DType::Q4_0, 32, 8, 64, 17),
        (DType::Q8_0, 8, 2, 256, 200),
        (DType::Q4K, 16, 4, 4096, 3000),
    ];
    for (wt, heads, kv_heads, keys, live) in cases {
        let permuted = ViewKind::Permute([0, 2, 1, 3]);
        let specs = [
            InputSpec::new(DType::F32, [128, 1, heads, 1]).view(permuted),
            InputSpec::new(DType::F16, [128, keys, kv_heads, 1]),
            InputSpec::new(DType::F16, [128, keys, kv_heads, 1]),
            InputSpec::new(DType::F16, [keys, 4, 1, 1]).gen(Gen::PrefixMask(live)),
            InputSpec::new(wt, [128 * heads, 96, 1, 1]),
        ];
        let inputs = draw_inputs(&mut rng, &specs);
        let what = format!("{wt} heads {heads}/{kv_heads} keys {live}/{keys}");
        let fused = rounding_matches_apart(
            &what,
            true,
            |c| c.attn_q8,
            |apart| attention_then_product(&dev, &inputs, apart),
        );
        let seen = seen_values(&inputs);
        let flat = Dense::from_vec([128 * heads, 1, 1, 1], fused[0].1.data.clone());
        checked += within(
            &format!("{what}: product"),
            &fused[1].1,
            &mx::mul_mat(&seen[4], &flat),
            weight_bound(wt),
        );
    }
    println!("{checked} products after decode attentions that rounded their activations");
}
