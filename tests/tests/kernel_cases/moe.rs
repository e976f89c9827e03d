//! mul_mat_id at the shapes of mixture-of-experts models (part of `kernel_cases`): prompts, whose
//! products run grouped by expert (`k_moe_group`, `k_moe_mma_<type>` / `k_moe_mm_<type>`), and decode steps (the GEMV
//! kernels, one column per pair), for Qwen3-30B-A3B (n_embd 2048, n_ff_exp 768, 128 experts,
//! top-8; Q4_0, Q4_K, Q8_0) and gpt-oss-20b (2880, 2880, 32 experts, top-4; MXFP4), gate/up and
//! down. On a GPU the prompts are 64 tokens; on the host emulation (each GPU
//! thread a fiber) prompts of 16 tokens through the same expert counts and routing with weights a
//! sixteenth as long and as tall. Ids out of range give NaN columns and leave every other column
//! as it should be.

use super::*;

/// One MoE model's expert products: name, weight type, n_embd, n_ff_exp, experts, used per token.
struct MoeShape {
    model: &'static str,
    w: DType,
    n_embd: usize,
    n_ff: usize,
    n_exp: usize,
    n_used: usize,
}

const SHAPES: [MoeShape; 4] = [
    MoeShape {
        model: "qwen3-30b-a3b",
        w: DType::Q4_0,
        n_embd: 2048,
        n_ff: 768,
        n_exp: 128,
        n_used: 8,
    },
    MoeShape {
        model: "qwen3-30b-a3b",
        w: DType::Q4K,
        n_embd: 2048,
        n_ff: 768,
        n_exp: 128,
        n_used: 8,
    },
    MoeShape {
        model: "qwen3-30b-a3b",
        w: DType::Q8_0,
        n_embd: 2048,
        n_ff: 768,
        n_exp: 128,
        n_used: 8,
    },
    MoeShape {
        model: "gpt-oss-20b",
        w: DType::MXFP4,
        n_embd: 2880,
        n_ff: 2880,
        n_exp: 32,
        n_used: 4,
    },
];

/// Whether `dev` is the host emulation (model-size prompts would take minutes there).
fn emulated(dev: &Arc<dyn Device>) -> bool {
    dev.name().starts_with("emulated")
}

/// The mul_mat_id case of `n_tok` tokens through experts `[k, m]` of `s`, the activations one row
/// per token (gate/up) or one per used expert (down).
fn push_experts(set: &mut CaseSet, s: &MoeShape, (k, m): (usize, usize), n_tok: usize, down: bool) {
    let b1 = if down { s.n_used } else { 1 };
    let experts = InputSpec::new(s.w, [k, m, s.n_exp, 1]);
    let b = InputSpec::new(DType::F32, [k, b1, n_tok, 1]);
    let ids = InputSpec::ids([s.n_used, n_tok, 1, 1], s.n_exp, true);
    let part = if down { "down" } else { "gate/up" };
    set.push(
        "mul_mat_id",
        format!("{} {} {part} [{k}, {m}], {n_tok} tokens", s.model, s.w),
        vec![experts, b, ids],
        product_check(s.w, k),
        |g, x| g.mul_mat_id(x[0], x[1], x[2]),
        |x| Ok(mx::mul_mat_id(&x[0], &x[1], &x[2])),
    );
}

#[test]
fn moe_experts_at_model_shapes() {
    let Some(dev) = kernel_device() else { return };
    let seed = seed();
    let mut set = CaseSet::new(seed);
    // The host keeps every expert count and routing width, with weights cut to a sixteenth each
    // way (rows a whole number of blocks) and a short prompt. On a GPU the prompt is 64 tokens
    // (512 kept the H200 machine's float64 reference of the 128 experts busy for over a minute).
    // Drawing and quantizing the full-size experts is most of a case's time (the GPU machine spent
    // ~400 s on this test with a 3-token decode case per shape too): the decode kernels' cases are
    // `mul_mat_id_long_rows` and `moe_ids_out_of_range_give_nan_columns`.
    let host = emulated(&dev);
    let (tokens, cut): (&[usize], usize) = if host { (&[16], 16) } else { (&[64], 1) };
    for s in &SHAPES {
        let block = s.w.block_size();
        let row = |n: usize| (n / cut / block * block).max(block);
        for &n_tok in tokens {
            push_experts(&mut set, s, (row(s.n_embd), s.n_ff / cut), n_tok, false);
            push_experts(&mut set, s, (row(s.n_ff), s.n_embd / cut), n_tok, true);
        }
    }
    run(set, seed);
}

#[test]
fn moe_grouped_every_quantized_type() {
    let seed = seed();
    let mut set = CaseSet::new(seed);
    // 67 rows (a partial tile of 64), 2 experts, 2 slots of 40 tokens: each expert a whole tile
    // of 32 pairs and a partial one; activations per token (gate/up) or per slot (down).
    let quantized = DType::WEIGHTS.into_iter().chain(DType::GROUPED);
    for w in quantized.filter(|w| w.is_quantized()) {
        let k = w.block_size().max(64);
        for b1 in [1, 2] {
            let experts = InputSpec::new(w, [k, 67, 2, 1]);
            let b = InputSpec::new(DType::F32, [k, b1, 40, 1]);
            let ids = InputSpec::ids([2, 40, 1, 1], 2, true);
            set.push(
                "mul_mat_id",
                format!("grouped {w} [{k}, 67] x 2 experts, b1 {b1}, 40 tokens"),
                vec![experts, b, ids],
                product_check(w, k),
                |g, x| g.mul_mat_id(x[0], x[1], x[2]),
                |x| Ok(mx::mul_mat_id(&x[0], &x[1], &x[2])),
            );
        }
    }
    run(set, seed);
}

/// mul_mat_id of `inputs` on `dev` with a result filled with zeros first; the result's values.
fn mul_mat_id_on(dev: &Arc<dyn Device>, inputs: &[(InputSpec, Vec<u8>)]) -> Dense {
    let mut g = Graph::new();
    let leaves: Vec<TensorId> = inputs
        .iter()
        .map(|(s, _)| g.new_input(s.dtype, &s.ne).unwrap())
        .collect();
    leaves.iter().for_each(|&t| g.output(t));
    let out = g.mul_mat_id(leaves[0], leaves[1], leaves[2]).unwrap();
    g.output(out);
    let mut sched = Scheduler::new(vec![dev.new_backend().unwrap()]);
    sched.alloc(&mut g).unwrap();
    let d = g.data(out).unwrap();
    d.buffer.fill(d.offset, g.layout(out).nbytes(), 0).unwrap();
    for (leaf, (_, bytes)) in leaves.iter().zip(inputs) {
        g.set_bytes(*leaf, bytes).unwrap();
    }
    sched.compute(&g).unwrap();
    let l = g.layout(out);
    decode(l.dtype, l.ne, &g.get_bytes(out).unwrap()).unwrap()
}

#[test]
fn moe_ids_out_of_range_give_nan_columns() {
    let Some(dev) = kernel_device() else { return };
    let mut rng = StdRng::seed_from_u64(seed());
    let (k, m, n_exp, n_used) = (256, 67, 8, 4);
    // Decode (GEMV), a prompt (grouped; 70 tokens: two tiles of pairs per expert), float experts.
    let cases = [(DType::Q4_0, 3), (DType::Q6K, 70), (DType::F16, 5)];
    for (w, n_tok) in cases {
        let specs = [
            InputSpec::new(w, [k, m, n_exp, 1]),
            InputSpec::new(DType::F32, [k, 1, n_tok, 1]),
            InputSpec::ids([n_used, n_tok, 1, 1], n_exp, true),
        ];
        let mut values: Vec<Dense> = specs
            .iter()
            .map(|s| draw_leaf(&mut rng, s.gen, s.ne))
            .collect();
        // Every fifth pair's id out of range, below and above.
        let bad: Vec<usize> = (0..n_used * n_tok).filter(|p| p % 5 == 2).collect();
        for (i, &p) in bad.iter().enumerate() {
            values[2].data[p] = [-1.0, n_exp as f64, 1e9][i % 3];
        }
        let inputs: Vec<(InputSpec, Vec<u8>)> = specs
            .iter()
            .zip(&values)
            .map(|(s, v)| (*s, encode(s.dtype, s.ne, &v.data).unwrap()))
            .collect();
        let got = mul_mat_id_on(&dev, &inputs);
        let routed = decode(w, specs[0].ne, &inputs[0].1).unwrap();
        let mut ids = values[2].clone();
        bad.iter().for_each(|&p| ids.data[p] = 0.0);
        let b = decode(DType::F32, specs[1].ne, &inputs[1].1).unwrap();
        let want = mx::mul_mat_id(&routed, &b, &ids);
        let (mut good_got, mut good_want) = (Vec::new(), Vec::new());
        for p in 0..n_used * n_tok {
            let col = &got.data[p * m..(p + 1) * m];
            if bad.contains(&p) {
                assert!(col.iter().all(|v| v.is_nan()), "{w}: pair {p} not NaN");
            } else {
                good_got.extend_from_slice(col);
                good_want.extend_from_slice(&want.data[p * m..(p + 1) * m]);
            }
        }
        let e = nmse(&good_got, &good_want);
        assert!(e <= weight_bound(w), "{w}, {n_tok} tokens: NMSE {e:e}");
    }
}
