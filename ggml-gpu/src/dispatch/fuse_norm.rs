//! An rms_norm chain (the residual add, the norm, the mul by its weight row) folded into the
//! single-column products of its result, for float weights: q, k and v after the attention norm,
//! gate and up (with their gated unit) after the FFN norm, a MoE router. The products then read
//! the chain's input instead of its result and scale their sums by the norm's factor, which every
//! row group of the launch finds from the squares of the activations it loads anyway, so the
//! decode step loses the norm's launch and its wait (`k_gemv_group_norm_*`,
//! `k_gemv_glu_norm_*`; block 0 still writes the chain's results for their other readers). The
//! sums are not bit-equal to the separate launches' (the factor is applied after the dot product
//! instead of to each element). Quantized weights keep the separate chain: their activations are
//! rounded to 8 bits first. `GGML_TP_FUSE_NORM=0` (or the decode fusions off) turns it off.

use super::fuse::{fused_weight, products_len, span, spans_apart};
use super::fuse_decode::{glu_of, products_then_glu};
use super::gemv::{self, rows_readable, vector_loads, GluProduct, NormIn};
use super::{Runner, TDesc};
use ggml_core::{DType, Graph, Layout, Op, Result, TensorId};

/// Whether norm chains fold into their products (`GGML_TP_FUSE_NORM` and `GGML_TP_FUSE_DECODE`).
fn folding() -> bool {
    let s = crate::settings::settings();
    s.fuse_decode && s.fuse_norm
}

fn float_weights(t: DType) -> bool {
    matches!(t, DType::F32 | DType::F16 | DType::BF16)
}

/// How many nodes of `rest` (the nodes after a norm chain whose norm is `norm` and whose last node
/// is the mul `mul`) fold into the chain: the single-column products of `mul`'s result with float
/// weights of one type that the dispatch groups, and the gated unit after two of them. `None` when
/// none fold.
pub(super) fn products_after(
    graph: &Graph,
    rest: &[TensorId],
    norm: TensorId,
    mul: TensorId,
) -> Option<usize> {
    let first = graph.tensor(*rest.first()?);
    let fits = folding()
        && matches!(graph.tensor(norm).op, Op::RmsNorm { .. })
        && graph.layout(mul).nrows() == 1
        && first.op == Op::MulMat
        && first.src[1] == mul
        && float_weights(graph.layout(first.src[0]).dtype)
        && graph.layout(mul).ne[1..] == [1, 1, 1];
    if !fits {
        return None;
    }
    let products = products_len(graph, rest);
    Some(products + usize::from(products_then_glu(graph, products, rest)))
}

/// The length of the norm chain at the start of `group` when the group is a chain with folded
/// products (from [`products_after`]).
pub(super) fn folded_chain(graph: &Graph, group: &[TensorId]) -> Option<usize> {
    let chain = if graph.tensor(group[0]).op == Op::Add {
        3
    } else {
        2
    };
    let folded = group.len() > chain
        && matches!(graph.tensor(group[chain - 2]).op, Op::RmsNorm { .. })
        && graph.tensor(group[chain]).op == Op::MulMat;
    folded.then_some(chain)
}

/// The chain's operands and results as the kernels take them, with the byte spans it reads and
/// writes; `None` when a row cannot take 16-byte loads.
fn norm_in(
    r: &dyn Runner,
    graph: &Graph,
    group: &[TensorId],
    chain: usize,
) -> Result<Option<(NormIn, Vec<(u64, u64)>, Vec<(u64, u64)>)>> {
    let (norm, mul) = (group[chain - 2], group[chain - 1]);
    let Op::RmsNorm { eps } = graph.tensor(norm).op else {
        unreachable!("folded_chain checked the norm");
    };
    let w = fused_weight(graph, mul, norm).expect("chain_len checked the mul");
    let spanned = |id: TensorId| -> Result<(u64, (u64, u64))> {
        let d = r.desc(graph, id)?;
        Ok((d.ptr, span(d.ptr, graph.layout(id))))
    };
    let (mut written, mut read) = (Vec::new(), Vec::new());
    let mut nm = NormIn {
        eps,
        ..Default::default()
    };
    let input = if chain == 3 {
        let add = graph.tensor(group[0]);
        let (b, sb) = spanned(add.src[1])?;
        let (s, ss) = spanned(group[0])?;
        (nm.b, nm.s, nm.has_add) = (b, s, 1);
        read.push(sb);
        written.push(ss);
        add.src[0]
    } else {
        graph.tensor(norm).src[0]
    };
    let row = |id: TensorId| graph.layout(id).is_contiguous() && graph.layout(id).nrows() == 1;
    let rows_fit = [input, w, norm, mul].into_iter().all(row)
        && (chain == 2 || row(graph.tensor(group[0]).src[1]));
    let [(a, sa), (g, sg), (n, sn), (m, sm)] =
        [spanned(input)?, spanned(w)?, spanned(norm)?, spanned(mul)?];
    (nm.a, nm.g, nm.n, nm.m) = (a, g, n, m);
    read.extend([sa, sg]);
    written.extend([sn, sm]);
    let aligned = [nm.a, nm.b, nm.g].iter().all(|p| p.is_multiple_of(16));
    Ok((rows_fit && aligned).then_some((nm, written, read)))
}

/// Launches `group` (a norm chain of `chain` nodes and the products of its result, from
/// [`folded_chain`]) as one `k_gemv_group_norm_*` or `k_gemv_glu_norm_*`; `false` (nothing
/// launched) when the weights or the memory do not allow it.
pub(super) fn launch_norm_products(
    r: &dyn Runner,
    graph: &Graph,
    group: &[TensorId],
    chain: usize,
) -> Result<bool> {
    let Some((nm, mut written, mut read)) = norm_in(r, graph, group, chain)? else {
        return Ok(false);
    };
    let mul = group[chain - 1];
    let last = *group.last().expect("a folded group has products");
    let glu = matches!(graph.tensor(last).op, Op::Glu { .. });
    let product_nodes = &group[chain..group.len() - usize::from(glu)];
    let k = graph.layout(mul).ne[0];
    let mut products: Vec<GluProduct> = Vec::with_capacity(product_nodes.len());
    for &p in product_nodes {
        let w = graph.tensor(p).src[0];
        let (a, la, d) = (r.desc(graph, w)?, graph.layout(w), r.desc(graph, p)?);
        read.push(span(a.ptr, la));
        written.push(span(d.ptr, graph.layout(p)));
        products.push((a, la, d));
    }
    let wt = products[0].1.dtype;
    let weights_fit = products.iter().all(|(a, la, _)| {
        la.dtype == wt
            && la.ne[0] == k
            && la.ne[2..] == [1, 1]
            && rows_readable(a, la)
            && vector_loads(a, la, nm.a)
    });
    if !weights_fit || !spans_apart(&written, &read) {
        return Ok(false);
    }
    let m = (r.desc(graph, mul)?, graph.layout(mul));
    if !glu {
        gemv::mul_mat_vec_group(r, &products, m, Some(&nm))?;
        return Ok(true);
    }
    glu_launch(r, graph, (&products, last), (&written, &read), m, &nm)
}

/// The gated-unit form of [`launch_norm_products`]: gate and up of one row count, the unit's result
/// apart from everything read and equal to or apart from every other result.
fn glu_launch(
    r: &dyn Runner,
    graph: &Graph,
    (products, glu): (&[GluProduct], TensorId),
    (written, read): (&[(u64, u64)], &[(u64, u64)]),
    m: (TDesc, &Layout),
    nm: &NormIn,
) -> Result<bool> {
    let &[gate, up] = products else {
        return Ok(false);
    };
    let gate_node = graph.tensor(glu).src[0];
    let up_node = graph.tensor(glu).src[1];
    let code = glu_of(graph, glu, gate_node, up_node).expect("products_then_glu checked the glu");
    let out = r.desc(graph, glu)?;
    let o = span(out.ptr, graph.layout(glu));
    let out_fits =
        spans_apart(&[o], read) && written.iter().all(|&w| w == o || spans_apart(&[o], &[w]));
    if gate.1.ne[1] != up.1.ne[1] || !out_fits {
        return Ok(false);
    }
    gemv::mul_mat_vec_glu(r, (gate, up), m, (out, code), Some(nm))?;
    Ok(true)
}
