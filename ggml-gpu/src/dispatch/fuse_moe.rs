//! The decode fusions of a mixture-of-experts layer, found by [`super::fuse`]'s node loop. The
//! router: soft_max, top_k, get_rows of the chosen probabilities (and their renormalisation,
//! sum_rows and div), or top_k, get_rows and soft_max of the chosen scores, as one `k_moe_router`
//! launch (one block per token, each stage the unfused kernel's row function). The experts' gate and up products of one activation and ids followed by their gated unit run as one
//! `k_gemv_glu_<type>` launch over the (slot, token) pairs ([`super::moe::mul_mat_id_glu`]). The
//! expert mix: the experts'
//! outputs `o [d, k, t]` multiplied by their router weights `w [1, k, t]` (`mul`), then summed over
//! the `k` chosen experts by `k - 1` adds of views of that product (as the model builder writes
//! it), run as one `k_moe_weighted_sum` launch instead of `k` (at decode, where every launch costs
//! more than its work). As with the other fusions, the kernel writes every result of the chain
//! (the product and each running sum) in the unfused order and rounding, so no consumer analysis
//! is needed, and a memory overlap falls back to separate launches. Part of the decode fusions
//! (`GGML_TP_FUSE_DECODE`).

use super::fuse::{aliasing_is_safe, span, spans_apart};
use super::fuse_decode::glu_of;
use super::rows::row_contiguous;
use super::{args, gemv, moe as experts, Launch, Runner};
use ggml_core::{DType, Graph, Layout, Op, Result, TensorId};

/// Most experts per token the fused launch sums (`MOE_SUM_MAX + 1` in moe.cu: one running sum per
/// expert after the first).
pub(super) const MAX_EXPERTS: usize = 17;

fn f32_contiguous(l: &Layout) -> bool {
    l.dtype == DType::F32 && l.is_contiguous()
}

/// Most experts the router's sort takes (`npad * 8` bytes of shared memory).
const ROUTER_MAX_EXPERTS: usize = 4096;

/// Threads per `k_moe_router` block: the block size of `k_soft_max`, `k_argsort` and `k_sum_rows`,
/// whose row functions it runs.
const ROUTER_THREADS: u32 = 256;

/// `id` through reshapes and views to the tensor whose memory it is.
pub(super) fn base(graph: &Graph, mut id: TensorId) -> TensorId {
    while graph.tensor(id).op.is_view() {
        id = graph.tensor(id).src[0];
    }
    id
}

/// The MoE router at the start of `nodes` (see the module text): its nodes, the soft_max's scale,
/// whether top_k comes first and whether the weights are renormalised.
struct Router {
    softmax: TensorId,
    top_k: TensorId,
    get_rows: TensorId,
    renorm: Option<[TensorId; 2]>,
    scale: f32,
    topk_first: bool,
}

/// Whether `l` is F32, two-dimensional and its rows contiguous (what the fused stages assume of
/// the soft_max, sum_rows and div operands and results).
fn f32_matrix(l: &Layout) -> bool {
    l.dtype == DType::F32 && l.ne[2] == 1 && l.ne[3] == 1 && row_contiguous(l)
}

/// A soft_max of one F32 matrix without mask: its scale.
fn plain_softmax(graph: &Graph, id: TensorId) -> Option<f32> {
    let t = graph.tensor(id);
    match t.op {
        Op::SoftMax { scale, .. } if t.src.len() == 1 => {
            (f32_matrix(&t.layout) && f32_matrix(graph.layout(t.src[0]))).then_some(scale)
        }
        _ => None,
    }
}

/// The router at the start of `nodes`, if there is one the fused kernel takes.
fn router(graph: &Graph, nodes: &[TensorId]) -> Option<Router> {
    if !crate::settings::settings().fuse_decode || nodes.len() < 3 {
        return None;
    }
    let topk_first = matches!(graph.tensor(nodes[0]).op, Op::TopK { .. });
    let (top_k, get_rows) = if topk_first {
        (nodes[0], nodes[1])
    } else {
        (nodes[1], nodes[2])
    };
    let (tk, gr) = (graph.tensor(top_k), graph.tensor(get_rows));
    let sorted = base(graph, tk.src[0]);
    let picks_fit = matches!(tk.op, Op::TopK { .. })
        && gr.op == Op::GetRows
        && gr.src[1] == top_k
        && base(graph, gr.src[0]) == sorted
        && f32_matrix(graph.layout(tk.src[0]))
        && graph.layout(tk.src[0]).ne[0] <= ROUTER_MAX_EXPERTS
        && gr.layout.dtype == DType::F32;
    if !picks_fit {
        return None;
    }
    if topk_first {
        let softmax = nodes[2];
        let scale = plain_softmax(graph, softmax)?;
        let picked = base(graph, graph.tensor(softmax).src[0]) == get_rows;
        return picked.then_some(Router {
            softmax,
            top_k,
            get_rows,
            renorm: None,
            scale,
            topk_first,
        });
    }
    let softmax = nodes[0];
    let scale = plain_softmax(graph, softmax)?;
    if sorted != softmax {
        return None;
    }
    let renorm = match nodes.get(3..5) {
        Some(&[sum, div]) => {
            let (st, dt) = (graph.tensor(sum), graph.tensor(div));
            let fits = st.op == Op::SumRows
                && base(graph, st.src[0]) == get_rows
                && dt.op == Op::Div
                && dt.src[..] == [st.src[0], sum]
                && f32_matrix(graph.layout(st.src[0]))
                && f32_matrix(&st.layout)
                && f32_matrix(&dt.layout);
            fits.then_some([sum, div])
        }
        _ => None,
    };
    Some(Router {
        softmax,
        top_k,
        get_rows,
        renorm,
        scale,
        topk_first,
    })
}

/// The length of the router at the start of `nodes` (3, or 5 with the renormalisation).
pub(super) fn router_len(graph: &Graph, nodes: &[TensorId]) -> Option<usize> {
    router(graph, nodes).map(|r| if r.renorm.is_some() { 5 } else { 3 })
}

/// Launches the router `group` (from [`router_len`]) as one `k_moe_router`; `false` (nothing
/// launched) when a result overlaps another tensor of the launch.
pub(super) fn launch_router(r: &dyn Runner, graph: &Graph, group: &[TensorId]) -> Result<bool> {
    let rt = router(graph, group).expect("router_len checked the router");
    let desc = |id: TensorId| r.desc(graph, id);
    let (sm, tk, gr) = (
        graph.tensor(rt.softmax),
        graph.tensor(rt.top_k),
        graph.tensor(rt.get_rows),
    );
    let (probs, ids, picked) = (desc(rt.softmax)?, desc(rt.top_k)?, desc(rt.get_rows)?);
    let input = desc(if rt.topk_first { tk.src[0] } else { sm.src[0] })?;
    // The renormalisation's operand (the picked weights' matrix view), sum and quotient; without
    // one, the picked weights stand in (the kernel does not touch them then).
    let (w2, sum, quotient) = match rt.renorm {
        Some([sum, div]) => (desc(graph.tensor(sum).src[0])?, desc(sum)?, desc(div)?),
        None => (picked, picked, picked),
    };
    let mut written = vec![probs, ids, picked];
    if rt.renorm.is_some() {
        written.extend([sum, quotient]);
    }
    if !aliasing_is_safe(&written, &[input]) {
        return Ok(false);
    }
    let npad = graph.layout(tk.src[0]).ne[0].next_power_of_two().max(1);
    let a = args![
        desc(sm.src[0])?,
        probs,
        desc(tk.src[0])?,
        ids,
        desc(gr.src[0])?,
        ids,
        picked,
        w2,
        sum,
        w2,
        sum,
        quotient,
        rt.scale,
        i32::from(rt.topk_first),
        i32::from(rt.renorm.is_some()),
        npad as i32
    ];
    let tokens = graph.layout(tk.src[0]).ne[1];
    r.launch(&Launch::rows(
        "k_moe_router",
        tokens,
        ROUTER_THREADS,
        (npad * 8) as u32,
        a,
    ))?;
    Ok(true)
}

/// Whether `[gate, up, glu]` at the start of `nodes` are two mul_mat_id of one activation and one
/// ids tensor, over experts of one type and shape, for few tokens (the GEMV path), followed by
/// their gated unit.
pub(super) fn experts_glu_len(graph: &Graph, nodes: &[TensorId]) -> Option<usize> {
    let &[gate, up, glu, ..] = nodes else {
        return None;
    };
    let (g, u) = (graph.tensor(gate), graph.tensor(up));
    let fits = crate::settings::settings().fuse_decode
        && g.op == Op::MulMatId
        && u.op == Op::MulMatId
        && g.src[1..] == u.src[1..]
        && graph.layout(g.src[0]).dtype == graph.layout(u.src[0]).dtype
        && graph.layout(g.src[0]).ne == graph.layout(u.src[0]).ne
        && graph.layout(g.src[1]).dtype == DType::F32
        && f32_contiguous(&g.layout)
        && f32_contiguous(&u.layout)
        && !experts::takes_grouped(graph.layout(g.src[1]).ne[2])
        && glu_of(graph, glu, gate, up).is_some();
    fits.then_some(3)
}

/// Launches `[gate, up, glu]` (from [`experts_glu_len`]) as one launch; `false` (nothing
/// launched) when a weight needs converting first or a result overlaps another tensor of it.
pub(super) fn launch_experts_glu(
    r: &dyn Runner,
    graph: &Graph,
    [gate, up, glu]: [TensorId; 3],
) -> Result<bool> {
    let code = glu_of(graph, glu, gate, up).expect("experts_glu_len checked the glu");
    let (g, u) = (graph.tensor(gate), graph.tensor(up));
    let desc = |id: TensorId| r.desc(graph, id);
    let (gw, uw, b, ids) = (
        desc(g.src[0])?,
        desc(u.src[0])?,
        desc(g.src[1])?,
        desc(g.src[2])?,
    );
    let (gd, ud, out) = (desc(gate)?, desc(up)?, desc(glu)?);
    let (lgw, luw, lb, lids) = (
        graph.layout(g.src[0]),
        graph.layout(u.src[0]),
        graph.layout(g.src[1]),
        graph.layout(g.src[2]),
    );
    let [_, b1, n_tok, _] = lb.ne;
    let shapes_fit = lgw.ne[3] == 1
        && lids.ne[1] == n_tok
        && (b1 == 1 || b1 == lids.ne[0])
        && gemv::rows_readable(&gw, lgw)
        && gemv::rows_readable(&uw, luw);
    let written = [span(gd.ptr, &g.layout), span(ud.ptr, &u.layout)];
    let read = [
        span(b.ptr, lb),
        span(gw.ptr, lgw),
        span(uw.ptr, luw),
        span(ids.ptr, lids),
    ];
    let o = span(out.ptr, graph.layout(glu));
    let out_fits =
        spans_apart(&[o], &read) && written.iter().all(|&w| w == o || spans_apart(&[o], &[w]));
    if !shapes_fit || !spans_apart(&written, &read) || !out_fits {
        return Ok(false);
    }
    let products = [(gw, lgw, gd), (uw, luw, ud)];
    experts::mul_mat_id_glu(r, products, (b, lb), (ids, lids), (out, code))?;
    Ok(true)
}

/// Whether `view` is expert `e`'s `[d, t]` slice of the product `m` (`[d, k, t]`).
fn expert_slice(graph: &Graph, view: TensorId, m: TensorId, e: usize) -> bool {
    let (v, ml) = (graph.tensor(view), graph.layout(m));
    v.op == (Op::View {
        offset: e * ml.nb[1],
    }) && v.src[0] == m
        && v.layout.ne == [ml.ne[0], ml.ne[2], 1, 1]
        && v.layout.nb[0] == 4
        && v.layout.nb[1] == ml.nb[2]
}

/// The length (`k`: the product and `k - 1` adds) of the expert mix at the start of `nodes`, if
/// there is one the fused kernel takes.
pub(super) fn expert_sum_len(graph: &Graph, nodes: &[TensorId]) -> Option<usize> {
    if !crate::settings::settings().fuse_decode {
        return None;
    }
    let m = *nodes.first()?;
    let t = graph.tensor(m);
    let [d, k, n_tok, one] = t.layout.ne;
    if t.op != Op::Mul || one != 1 || !(2..=MAX_EXPERTS).contains(&k) || nodes.len() < k {
        return None;
    }
    let (o, w) = (graph.layout(t.src[0]), graph.layout(t.src[1]));
    let operands_fit = f32_contiguous(&t.layout)
        && o.dtype == DType::F32
        && row_contiguous(o)
        && o.ne == t.layout.ne
        && w.dtype == DType::F32
        && w.ne == [1, k, n_tok, 1];
    if !operands_fit || d == 0 {
        return None;
    }
    let mut prev = None;
    for (e, &add) in nodes[1..k].iter().enumerate().map(|(i, n)| (i + 1, n)) {
        let a = graph.tensor(add);
        let [x, y] = a.src[..] else {
            return None;
        };
        let first_fits = match prev {
            None => expert_slice(graph, x, m, 0),
            Some(p) => x == p,
        };
        let fits = a.op == Op::Add
            && first_fits
            && expert_slice(graph, y, m, e)
            && f32_contiguous(&a.layout)
            && a.layout.ne == [d, n_tok, 1, 1];
        if !fits {
            return None;
        }
        prev = Some(add);
    }
    Some(k)
}

/// Launches the expert mix `group` (from [`expert_sum_len`]) as one `k_moe_weighted_sum`; `false`
/// (nothing launched) when a result overlaps another tensor of the launch.
pub(super) fn launch_expert_sum(r: &dyn Runner, graph: &Graph, group: &[TensorId]) -> Result<bool> {
    let t = graph.tensor(group[0]);
    let (o, w, m) = (
        r.desc(graph, t.src[0])?,
        r.desc(graph, t.src[1])?,
        r.desc(graph, group[0])?,
    );
    let mut written = vec![m];
    for &add in &group[1..] {
        written.push(r.desc(graph, add)?);
    }
    if !aliasing_is_safe(&written, &[o, w]) {
        return Ok(false);
    }
    let mut sums = [0u64; MAX_EXPERTS - 1];
    for (s, d) in sums.iter_mut().zip(&written[1..]) {
        *s = d.ptr;
    }
    let mut a = args![o, w, m, group.len() as i32];
    a.extend(sums.map(Into::into));
    let n = t.layout.ne[0] * t.layout.ne[2];
    r.launch(&Launch::elementwise("k_moe_weighted_sum", n, a))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::MAX_EXPERTS;

    #[test]
    fn the_expert_limit_matches_the_kernel() {
        let src = crate::kernels::shared_source();
        assert!(src.contains(&format!("#define MOE_SUM_MAX {}\n", MAX_EXPERTS - 1)));
        let params = src
            .split("k_moe_weighted_sum(")
            .nth(1)
            .and_then(|s| s.split(')').next())
            .expect("the kernel's parameters");
        assert_eq!(params.matches("u64 s").count(), MAX_EXPERTS - 1);
    }
}
