//! The rms_norm chain folded into the float-weight products of its result (part of
//! `kernel_cases`): the residual add, the norm and the mul by its weight row followed by q, k and
//! v (one grouped launch), by gate, up and their gated unit, or by one product (a MoE router), as
//! a decode step has them, for F32, F16 and BF16 weights. Every result of the group is checked
//! against the float64 reference: the sum exactly, the normalized row and its product with the
//! weights as math, the products within their weight type's bound. Weights the folded kernels
//! cannot read with vector loads (padded rows) take the separate launches and must give the same
//! results.

use super::*;

/// What follows the norm chain in one case.
#[derive(Clone, Copy, Debug)]
enum Tail {
    /// Three products of the given row counts (q, k and v).
    Qkv([usize; 3]),
    /// Gate and up of this many rows and their SwiGLU.
    GatedUnit(usize),
    /// One product of this many rows.
    One(usize),
}

/// One case: the results of the group (the chain's, then the products', then the gated unit's)
/// checked; returns how many, and whether the group folded (the fusion counter moved).
fn folded_case(
    dev: &Arc<dyn Device>,
    rng: &mut StdRng,
    (w, k, view): (DType, usize, ViewKind),
    with_add: bool,
    tail: Tail,
) -> (usize, bool) {
    let rows: Vec<usize> = match tail {
        Tail::Qkv(r) => r.to_vec(),
        Tail::GatedUnit(m) => vec![m, m],
        Tail::One(m) => vec![m],
    };
    let mut specs = vec![
        InputSpec::new(DType::F32, [k, 1, 1, 1]).gen(Gen::Normal(2.0)),
        InputSpec::new(DType::F32, [k, 1, 1, 1]),
        InputSpec::new(DType::F32, [k, 1, 1, 1]).gen(Gen::Uniform(0.5, 1.5)),
    ];
    specs.extend(
        rows.iter()
            .map(|&m| InputSpec::new(w, [k, m, 1, 1]).view(view)),
    );
    let inputs: Vec<(InputSpec, Vec<u8>)> = specs
        .iter()
        .map(|s| {
            let leaf_ne = s.view.leaf_ne(s.ne);
            let v = draw_leaf(rng, s.gen, leaf_ne);
            (*s, encode(s.dtype, leaf_ne, &v.data).unwrap())
        })
        .collect();
    let build = |g: &mut Graph, t: &[TensorId]| {
        t.iter().for_each(|&input| g.output(input));
        let mut out = Vec::new();
        let mut h = t[0];
        if with_add {
            h = g.add(h, t[1]).unwrap();
            out.push(h);
        }
        let n = g.rms_norm(h, 1e-6).unwrap();
        let m = g.mul(n, t[2]).unwrap();
        out.extend([n, m]);
        let products: Vec<TensorId> = t[3..].iter().map(|&wt| g.mul_mat(wt, m).unwrap()).collect();
        out.extend(&products);
        if let Tail::GatedUnit(_) = tail {
            out.push(g.glu(GluOp::Swiglu, products[0], products[1]).unwrap());
        }
        out
    };
    let before = ggml_gpu::dispatch::fusion_counts().norm_products;
    let got = run_chain(dev, &inputs, &build, false);
    let folded = ggml_gpu::dispatch::fusion_counts().norm_products > before;
    let seen: Vec<Dense> = inputs
        .iter()
        .map(|(s, bytes)| {
            let leaf = decode(s.dtype, s.view.leaf_ne(s.ne), bytes).unwrap();
            s.view.apply(&leaf, s.ne)
        })
        .collect();
    let mut want = Vec::new();
    let mut h = seen[0].clone();
    if with_add {
        h = ew::binary(BinOp::Add, &h, &seen[1]);
        want.push((h.clone(), float_bound(Class::Exact, DType::F32)));
    }
    let n = ew::rms_norm(&h, 1e-6);
    let m = ew::binary(BinOp::Mul, &n, &seen[2]);
    want.push((n, float_bound(Class::Math, DType::F32)));
    want.push((m.clone(), float_bound(Class::Math, DType::F32)));
    let products: Vec<Dense> = seen[3..].iter().map(|wt| mx::mul_mat(wt, &m)).collect();
    want.extend(products.iter().map(|p| (p.clone(), weight_bound(w))));
    if let Tail::GatedUnit(_) = tail {
        let unit = ew::glu(GluOp::Swiglu, &products[0], &products[1]);
        want.push((
            unit,
            weight_bound(w).max(float_bound(Class::Math, DType::F32)),
        ));
    }
    let what = format!("{w} K {k} {view:?} add {with_add} {tail:?}");
    for (i, ((_, got), (want, bound))) in got.iter().zip(&want).enumerate() {
        let e = nmse(&got.data, &want.data);
        assert!(e <= *bound, "{what}: result {i} NMSE {e:e} > {bound:e}");
    }
    (want.len(), folded)
}

#[test]
fn norm_chain_folded_into_float_products() {
    let Some(dev) = kernel_device() else { return };
    let mut rng = StdRng::seed_from_u64(seed());
    let mut checked = 0;
    let tails = [
        Tail::Qkv([256, 64, 64]),
        Tail::GatedUnit(300),
        Tail::One(37),
    ];
    for w in [DType::F32, DType::F16, DType::BF16] {
        for (case, tail) in tails.into_iter().enumerate() {
            // 2048: one warp per row for the longer tails, several for the short ones.
            for k in [2048, 520] {
                let with_add = (case + k) % 2 == 0 || matches!(tail, Tail::Qkv(_));
                let (n, folded) =
                    folded_case(&dev, &mut rng, (w, k, ViewKind::Contig), with_add, tail);
                assert!(
                    folded,
                    "{w} K {k} {tail:?}: the chain folds into the products"
                );
                checked += n;
            }
            // Padded weight rows take no vector loads: the chain and products run apart.
            let padded = (w, 520, ViewKind::Pad { pad: 3, offset: 1 });
            let (n, folded) = folded_case(&dev, &mut rng, padded, true, tail);
            assert!(!folded, "{w} padded {tail:?}: unaligned rows do not fold");
            checked += n;
        }
    }
    println!(
        "{checked} results of norm chains folded into their products within the reference bounds"
    );
}
