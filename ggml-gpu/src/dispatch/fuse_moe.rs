//! The decode fusions of a mixture-of-experts layer, found by [`super::fuse`]'s node loop. The
//! experts' gate and up products of one activation and ids followed by their gated unit run as one
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
