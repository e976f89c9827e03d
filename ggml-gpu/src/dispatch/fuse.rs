//! The node loop of both backends, [`compute_nodes`], and its fusions: the chains every transformer
//! layer has, a norm (rms_norm / norm) followed by the mul by its weight row (or by a scale: the L2
//! norms of delta-net layers) and preceded by the residual add, run as one `k_norm_rows` launch
//! when adjacent. The fused kernel writes every result of the chain, so the intermediates stay
//! valid for other consumers and no consumer analysis is needed; it computes them exactly as the
//! unfused kernels do (bit-identical). A chain whose result the next launch multiplies with
//! quantized weights also writes that result rounded to 8 bits, as `k_quantize_q8` rounds it, where
//! the products read it ([`gemv::mark_rounded`]): the products skip their own rounding launch; so
//! does decode attention before the output projection (`k_flash_attn_vec` or, after splits,
//! `k_flash_attn_combine` rounds as it writes). Adjacent single-column products of one activation
//! (q, k and v; gate and up: the model builder puts them next to each other) run as one grouped
//! GEMV launch ([`super::gemv::mul_mat_vec_group`]), unless `GGML_TP_GROUP_PRODUCTS=0`. The decode
//! step's other fusions (gate and up with their gated unit, the ropes of q and k with the cache
//! writes of k and v) are in [`super::fuse_decode`], the expert mix of a mixture-of-experts layer
//! in [`super::fuse_moe`], chains of element-wise nodes in [`super::fuse_eltwise`], a delta-net
//! rule with the copy of its state in [`super::delta_net`].

use super::delta_net;
use super::fuse_decode as decode;
use super::fuse_eltwise as eltwise;
use super::fuse_moe as moe;
use super::gemv::{self, MAX_GROUP};
use super::rows::{
    broadcasts_rows, norm_launch, norm_rounds_to_q8, row_contiguous, vec_width, NORM_ADD, NORM_MUL,
    NORM_SCALE,
};
use super::{args, compute_node, Runner, TDesc};
use ggml_core::{DType, Error, Graph, Layout, Op, Result, TensorId};
use std::sync::atomic::{AtomicU64, Ordering};

/// True for the nodes that launch nothing: views, leaves and empty tensors.
pub fn is_skipped(graph: &Graph, node: TensorId) -> bool {
    let t = graph.tensor(node);
    t.op.is_view() || t.is_leaf() || t.nelements() == 0
}

/// The launches of `nodes`, in order, as groups of nodes: single nodes, and chains that
/// [`compute_nodes`] fuses into one kernel (unless their memory overlaps, see [`aliasing_is_safe`]).
pub fn fusion_groups(graph: &Graph, nodes: &[TensorId]) -> Vec<Vec<TensorId>> {
    let live: Vec<TensorId> = nodes
        .iter()
        .copied()
        .filter(|&n| !is_skipped(graph, n))
        .collect();
    let mut groups = Vec::new();
    let mut i = 0;
    while i < live.len() {
        let len = chain_len(graph, &live[i..]);
        groups.push(live[i..i + len].to_vec());
        i += len;
    }
    groups
}

/// How many fused launches of each kind the dispatch made in this process, and how many fusion
/// groups fell back to separate launches because their memory overlaps: what tests and
/// `GGML_TP_CUDA_STATS` read to see that the fusions run in a model's graph.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FusionCounts {
    /// Gate and up products (of a matrix, or of the chosen experts) with their gated unit
    /// (`k_gemv_glu_*`).
    pub products_glu: u64,
    /// Ropes with their cache writes (`k_rope_set_rows`).
    pub rope_cache: u64,
    /// Norm chains (`k_norm_rows` with the add or the mul).
    pub norm_chains: u64,
    /// Of those, chains that also rounded their result to 8 bits for the quantized products after
    /// them (no `k_quantize_q8` launch there).
    pub norm_q8: u64,
    /// Decode attentions that rounded their result to 8 bits for the quantized product after
    /// them (no `k_quantize_q8` launch there).
    pub attn_q8: u64,
    /// Groups of products of one activation (`k_gemv_group_*`).
    pub product_groups: u64,
    /// Expert mixes of MoE layers (`k_moe_weighted_sum`).
    pub expert_sums: u64,
    /// Routers of MoE layers (`k_moe_router`).
    pub routers: u64,
    /// Chains of element-wise nodes (`k_eltwise_chain`).
    pub eltwise_chains: u64,
    /// Delta-net rules that also wrote the copy of their final state (`k_gated_delta_net`).
    pub state_copies: u64,
    /// Groups computed by separate launches after all (their memory overlaps).
    pub refused: u64,
}

/// The kinds of [`FusionCounts`], as indices of [`COUNTS`].
#[derive(Clone, Copy)]
enum Fused {
    ProductsGlu,
    RopeCache,
    NormChain,
    NormQ8,
    AttnQ8,
    ProductGroup,
    ExpertSum,
    Router,
    EltwiseChain,
    StateCopy,
    Refused,
}

static COUNTS: [AtomicU64; 11] = [const { AtomicU64::new(0) }; 11];

/// The [`FusionCounts`] so far.
pub fn fusion_counts() -> FusionCounts {
    let c = |k: Fused| COUNTS[k as usize].load(Ordering::Relaxed);
    FusionCounts {
        products_glu: c(Fused::ProductsGlu),
        rope_cache: c(Fused::RopeCache),
        norm_chains: c(Fused::NormChain),
        norm_q8: c(Fused::NormQ8),
        attn_q8: c(Fused::AttnQ8),
        product_groups: c(Fused::ProductGroup),
        expert_sums: c(Fused::ExpertSum),
        routers: c(Fused::Router),
        eltwise_chains: c(Fused::EltwiseChain),
        state_copies: c(Fused::StateCopy),
        refused: c(Fused::Refused),
    }
}

/// Counts one launch of `kind` when `launched`, else one refusal; returns `launched`.
fn counted(kind: Fused, launched: bool) -> bool {
    let k = if launched { kind } else { Fused::Refused };
    COUNTS[k as usize].fetch_add(1, Ordering::Relaxed);
    launched
}

/// The groups of [`fusion_groups`] that join several nodes: a GPU device's
/// [`ggml_core::Device::launch_groups`], so that the memory planner keeps their tensors apart.
pub fn launch_groups(graph: &Graph, nodes: &[TensorId]) -> Vec<Vec<TensorId>> {
    let mut groups = fusion_groups(graph, nodes);
    groups.retain(|g| g.len() > 1);
    groups
}

/// Computes `nodes` of `graph` through `r` in order, fusing the chains of [`fusion_groups`].
pub fn compute_nodes(r: &dyn Runner, graph: &Graph, nodes: &[TensorId]) -> Result<()> {
    let groups = fusion_groups(graph, nodes);
    let mut rounded = false;
    for (i, group) in groups.iter().enumerate() {
        if !rounded {
            gemv::forget_rounded();
        }
        let next = groups.get(i + 1).map(|g| g[0]);
        let done;
        (done, rounded) =
            launch_fused(r, graph, group, next).map_err(|e| at(graph, group[0], e))?;
        for &node in &group[done..] {
            compute_node(r, graph, node).map_err(|e| at(graph, node, e))?;
        }
    }
    gemv::forget_rounded();
    Ok(())
}

/// Launches the fused chain or product group `group` (from [`chain_len`]) where its memory allows;
/// returns how many of its leading nodes that computed (0 for none, and for a single node). Gate
/// and up whose gated unit cannot join them still run as one grouped launch. Second: whether a
/// norm chain or a decode attention (a group of its own) also left the 8-bit copy of its result
/// for `next`, the first node of the next group (see [`rounds_for`]).
fn launch_fused(
    r: &dyn Runner,
    graph: &Graph,
    group: &[TensorId],
    next: Option<TensorId>,
) -> Result<(usize, bool)> {
    let whole = |launched: bool| if launched { group.len() } else { 0 };
    let done = match (group, &graph.tensor(group[0]).op) {
        (
            &[node],
            &Op::FlashAttnExt {
                scale,
                max_bias,
                softcap,
            },
        ) => {
            let params = [scale, max_bias, softcap];
            let q8 = if rounds_for(graph, node, next) {
                let n = graph.layout(node).nelements();
                Some(gemv::q8_scratch(r, n)?)
            } else {
                None
            };
            let rounded = super::attention::flash_attn_ext(r, graph, node, params, q8)?;
            if rounded {
                COUNTS[Fused::AttnQ8 as usize].fetch_add(1, Ordering::Relaxed);
                gemv::mark_rounded(r.desc(graph, node)?.ptr, graph.layout(node).nelements());
            }
            return Ok((1, rounded));
        }
        ([_], _) => 0,
        (g, _) if eltwise::is_chain(graph, g) => whole(counted(
            Fused::EltwiseChain,
            eltwise::launch_chain(r, graph, g)?,
        )),
        (&[gate, up, glu], Op::MulMat) if matches!(graph.tensor(glu).op, Op::Glu { .. }) => {
            if counted(
                Fused::ProductsGlu,
                decode::launch_products_glu(r, graph, [gate, up, glu])?,
            ) {
                3
            } else if counted(Fused::ProductGroup, launch_products(r, graph, &[gate, up])?) {
                2
            } else {
                0
            }
        }
        (&[gate, up, glu], Op::MulMatId) => whole(counted(
            Fused::ProductsGlu,
            moe::launch_experts_glu(r, graph, [gate, up, glu])?,
        )),
        (_, Op::MulMat) => whole(counted(
            Fused::ProductGroup,
            launch_products(r, graph, group)?,
        )),
        (_, Op::Rope(_)) => whole(counted(
            Fused::RopeCache,
            decode::launch_rope_cache(r, graph, group)?,
        )),
        (_, Op::GatedDeltaNet { .. }) => whole(counted(
            Fused::StateCopy,
            delta_net::launch_with_state_copy(r, graph, group)?,
        )),
        (_, Op::SoftMax { .. } | Op::TopK { .. }) => {
            whole(counted(Fused::Router, moe::launch_router(r, graph, group)?))
        }
        (_, Op::Mul) => whole(counted(
            Fused::ExpertSum,
            moe::launch_expert_sum(r, graph, group)?,
        )),
        _ => {
            let last = *group.last().expect("groups are not empty");
            let launched = launch_chain(r, graph, group, rounds_for(graph, last, next))?;
            let rounded = launched == Some(true);
            if counted(Fused::NormChain, launched.is_some()) && rounded {
                COUNTS[Fused::NormQ8 as usize].fetch_add(1, Ordering::Relaxed);
            }
            return Ok((whole(launched.is_some()), rounded));
        }
    };
    Ok((done, false))
}

/// `e` with the op and name of the node it happened at.
fn at(graph: &Graph, node: TensorId, e: Error) -> Error {
    let t = graph.tensor(node);
    match e {
        Error::Backend { backend, msg } => Error::Backend {
            backend,
            msg: format!("{} at node {}: {msg}", t.op.name(), t.name),
        },
        other => other,
    }
}

fn f32_rows(l: &Layout) -> bool {
    l.dtype == DType::F32 && row_contiguous(l)
}

/// The node's operands and result are F32 rows the fused kernel takes.
fn fusable_norm(graph: &Graph, node: TensorId) -> bool {
    let t = graph.tensor(node);
    matches!(t.op, Op::RmsNorm { .. } | Op::Norm { .. })
        && f32_rows(&t.layout)
        && f32_rows(graph.layout(t.src[0]))
}

/// `node` adds two F32 row tensors (the second broadcast over rows) and `norm` normalizes its result.
fn fusable_add(graph: &Graph, node: TensorId, norm: TensorId) -> bool {
    let t = graph.tensor(node);
    let (a, b) = match t.src[..] {
        [a, b] => (graph.layout(a), graph.layout(b)),
        _ => return false,
    };
    t.op == Op::Add
        && graph.tensor(norm).src[0] == node
        && f32_rows(&t.layout)
        && f32_rows(a)
        && f32_rows(b)
        && a.ne == t.layout.ne
        && broadcasts_rows(b, &t.layout)
}

/// The weight of `node` when it multiplies `norm`'s result by F32 rows broadcast over it.
fn fused_weight(graph: &Graph, node: TensorId, norm: TensorId) -> Option<TensorId> {
    let t = graph.tensor(node);
    let w = match t.src[..] {
        [x, w] if x == norm => w,
        [w, x] if x == norm => w,
        _ => return None,
    };
    let wl = graph.layout(w);
    let fits = t.op == Op::Mul
        && t.layout.ne == graph.layout(norm).ne
        && f32_rows(&t.layout)
        && f32_rows(wl)
        && broadcasts_rows(wl, &t.layout);
    fits.then_some(w)
}

/// What a chain does after its norm: the mul by a weight, or a scale (and bias).
#[derive(Clone, Copy)]
enum Tail {
    Mul(TensorId),
    Scale(f32, f32),
}

/// The tail `node` adds to a chain ending at `norm`, if it can join it.
fn chain_tail(graph: &Graph, node: TensorId, norm: TensorId) -> Option<Tail> {
    let t = graph.tensor(node);
    match t.op {
        Op::Scale { scale, bias }
            if crate::settings::settings().fuse_chains
                && t.src[0] == norm
                && t.layout.ne == graph.layout(norm).ne
                && f32_rows(&t.layout) =>
        {
            Some(Tail::Scale(scale, bias))
        }
        _ => fused_weight(graph, node, norm).map(Tail::Mul),
    }
}

/// Whether products are grouped (`GGML_TP_GROUP_PRODUCTS` is not `0`, `off` or `false`).
fn grouping_products() -> bool {
    crate::settings::settings().group_products
}

/// Number of adjacent single-column products at the start of `nodes` that share their
/// activation and weight type (at most [`MAX_GROUP`]; 1 when there is no such run).
fn products_len(graph: &Graph, nodes: &[TensorId]) -> usize {
    let single_product = |n: TensorId| {
        let t = graph.tensor(n);
        t.op == Op::MulMat && graph.layout(t.src[1]).ne[1..] == [1, 1, 1]
    };
    if !grouping_products() || !single_product(nodes[0]) {
        return 1;
    }
    let first = graph.tensor(nodes[0]);
    let same = |n: TensorId| {
        let t = graph.tensor(n);
        single_product(n)
            && t.src[1] == first.src[1]
            && graph.layout(t.src[0]).dtype == graph.layout(first.src[0]).dtype
    };
    1 + nodes[1..]
        .iter()
        .take(MAX_GROUP - 1)
        .take_while(|&&n| same(n))
        .count()
}

/// Length of the fusable chain or product group at the start of `nodes` (1 when there is none).
fn chain_len(graph: &Graph, nodes: &[TensorId]) -> usize {
    if graph.tensor(nodes[0]).op == Op::MulMat {
        let products = products_len(graph, nodes);
        return products + usize::from(decode::products_then_glu(graph, products, nodes));
    }
    let moe_len = || {
        moe::experts_glu_len(graph, nodes)
            .or_else(|| moe::expert_sum_len(graph, nodes))
            .or_else(|| moe::router_len(graph, nodes))
    };
    let other_len = || moe_len().or_else(|| delta_net::state_copy_len(graph, nodes));
    if let Some(len) = decode::rope_cache_len(graph, nodes).or_else(other_len) {
        return len;
    }
    let norm_at = match nodes {
        [add, norm, ..] if fusable_norm(graph, *norm) && fusable_add(graph, *add, *norm) => 1,
        [norm, ..] if fusable_norm(graph, *norm) => 0,
        _ => return eltwise::chain_len(graph, nodes).unwrap_or(1),
    };
    let norm = nodes[norm_at];
    let with_tail = nodes
        .get(norm_at + 1)
        .is_some_and(|&m| chain_tail(graph, m, norm).is_some());
    norm_at + 1 + usize::from(with_tail)
}

/// First and one-past-last byte an F32 tensor spans.
fn extent(d: &TDesc) -> (u64, u64) {
    let span: i64 = (0..4).map(|k| (d.ne[k] - 1) * d.nb[k]).sum();
    (d.ptr, d.ptr + span as u64 + 4)
}

/// True when every result of a fused chain either is exactly another tensor of it (same address
/// and layout: each element is then read and written by the same thread, in order) or shares no
/// byte with it. The memory planner may place a result over an operand that the unfused order no
/// longer needs; the fused kernel cannot run then.
pub(super) fn aliasing_is_safe(written: &[TDesc], read: &[TDesc]) -> bool {
    let apart = |x: &TDesc, y: &TDesc| {
        let ((x0, x1), (y0, y1)) = (extent(x), extent(y));
        x1 <= y0 || y1 <= x0
    };
    let same = |x: &TDesc, y: &TDesc| x.ptr == y.ptr && x.ne == y.ne && x.nb == y.nb;
    written.iter().enumerate().all(|(i, w)| {
        let others = written.iter().skip(i + 1).chain(read);
        others.into_iter().all(|o| same(w, o) || apart(w, o))
    })
}

/// Single-column products of one activation checked for one launch: the activation (descriptor,
/// layout), each product's `(weights, their layout, result)`, and the byte spans the products write
/// (their results) and read (the activation, then the weights).
pub(super) struct ProductGroup<'g> {
    pub b: TDesc,
    pub lb: &'g Layout,
    pub products: Vec<(TDesc, &'g Layout, TDesc)>,
    pub written: Vec<(u64, u64)>,
    pub read: Vec<(u64, u64)>,
}

/// The products `group` of one activation as a [`ProductGroup`]; `None` when their weights cannot
/// be grouped or a result overlaps the activation, a weight or another result. (In node order a
/// product may write where an earlier product's weights were: the memory planner reuses operands
/// that the order no longer needs. Bound weights never move.)
pub(super) fn product_group<'g>(
    r: &dyn Runner,
    graph: &'g Graph,
    group: &[TensorId],
) -> Result<Option<ProductGroup<'g>>> {
    let x = graph.tensor(group[0]).src[1];
    let (b, lb) = (r.desc(graph, x)?, graph.layout(x));
    let mut products = Vec::with_capacity(group.len());
    let mut written = Vec::with_capacity(group.len());
    let mut read = vec![span(b.ptr, lb)];
    for &n in group {
        let w = graph.tensor(n).src[0];
        let (a, la, d) = (r.desc(graph, w)?, graph.layout(w), r.desc(graph, n)?);
        written.push(span(d.ptr, graph.layout(n)));
        read.push(span(a.ptr, la));
        products.push((a, la, d));
    }
    let fits = gemv::groupable(&products, lb) && spans_apart(&written, &read);
    Ok(fits.then_some(ProductGroup {
        b,
        lb,
        products,
        written,
        read,
    }))
}

/// Launches the products `group` (from [`products_len`]) as one grouped GEMV; `false` (nothing
/// launched) when [`product_group`] refuses them.
fn launch_products(r: &dyn Runner, graph: &Graph, group: &[TensorId]) -> Result<bool> {
    let Some(g) = product_group(r, graph, group)? else {
        return Ok(false);
    };
    gemv::mul_mat_vec_group(r, &g.products, (g.b, g.lb))?;
    Ok(true)
}

/// First and one-past-last byte of a tensor of layout `l` at `ptr` (rows of whole blocks).
pub(super) fn span(ptr: u64, l: &Layout) -> (u64, u64) {
    if l.nelements() == 0 {
        return (ptr, ptr);
    }
    let row = (l.ne[0] / l.dtype.block_size()) * l.dtype.type_size();
    let rest: usize = (1..4).map(|k| (l.ne[k] - 1) * l.nb[k]).sum();
    (ptr, ptr + (rest + row) as u64)
}

/// True when no two `written` spans and no written and `read` span share a byte.
pub(super) fn spans_apart(written: &[(u64, u64)], read: &[(u64, u64)]) -> bool {
    let apart = |(x0, x1): (u64, u64), (y0, y1): (u64, u64)| x1 <= y0 || y1 <= x0;
    written.iter().enumerate().all(|(i, &w)| {
        let others = written.iter().skip(i + 1).chain(read);
        others.into_iter().all(|&o| apart(w, o))
    })
}

/// Whether the launch that computes `result` should also round it to 8 bits: `next` multiplies
/// it, or a contiguous reshape of it, as the activation of at most [`gemv::MAX_COLUMNS`] columns
/// with quantized weights, which the GEMV kernels take with 8-bit activations.
fn rounds_for(graph: &Graph, result: TensorId, next: Option<TensorId>) -> bool {
    let l = graph.layout(result);
    next.is_some_and(|n| {
        let t = graph.tensor(n);
        if t.op != Op::MulMat {
            return false;
        }
        let lb = graph.layout(t.src[1]);
        moe::base(graph, t.src[1]) == result
            && graph.layout(t.src[0]).dtype.is_quantized()
            && lb.nrows() <= gemv::MAX_COLUMNS
            && lb.is_contiguous()
            && lb.nelements() == l.nelements()
            && l.is_contiguous()
    })
}

/// Launches the chain `group` (from [`chain_len`]) as one `k_norm_rows`, with `q8` also its last
/// result's 8-bit copy where the kernel can make it ([`gemv::mark_rounded`] records it). Whether
/// it made that copy; `None` (nothing launched) when the chain's memory overlaps.
fn launch_chain(
    r: &dyn Runner,
    graph: &Graph,
    group: &[TensorId],
    q8: bool,
) -> Result<Option<bool>> {
    let has_add = graph.tensor(group[0]).op == Op::Add;
    let norm = group[usize::from(has_add)];
    let tail = group.get(usize::from(has_add) + 1).map(|&m| {
        let tail = chain_tail(graph, m, norm).expect("chain_len checked the tail");
        (m, tail)
    });
    let nt = graph.tensor(norm);
    let (eps, rms) = match nt.op {
        Op::RmsNorm { eps } => (eps, 1i32),
        Op::Norm { eps } => (eps, 0),
        _ => unreachable!("chain_len starts chains at a norm or the add before one"),
    };
    let desc = |id: TensorId| r.desc(graph, id);
    let absent = TDesc::absent();
    let (a, b, s) = if has_add {
        let at = graph.tensor(group[0]);
        (desc(at.src[0])?, desc(at.src[1])?, desc(group[0])?)
    } else {
        (desc(nt.src[0])?, absent, absent)
    };
    let n = desc(norm)?;
    let (w, m, post, tail_flag) = match tail {
        Some((m, Tail::Mul(w))) => (desc(w)?, desc(m)?, (1.0, 0.0), NORM_MUL),
        Some((m, Tail::Scale(scale, bias))) => (absent, desc(m)?, (scale, bias), NORM_SCALE),
        None => (absent, absent, (1.0f32, 0.0f32), 0),
    };
    let mut written = vec![n];
    let mut read = vec![a];
    if has_add {
        written.push(s);
        read.push(b);
    }
    if tail.is_some() {
        written.push(m);
    }
    if tail_flag == NORM_MUL {
        read.push(w);
    }
    if !aliasing_is_safe(&written, &read) {
        return Ok(None);
    }
    let flags = if has_add { NORM_ADD } else { 0 } | tail_flag;
    let ne0 = nt.layout.ne[0];
    let v = vec_width(ne0, &[written, read].concat());
    let rows = nt.layout.nrows();
    let last = if tail.is_some() { m } else { n };
    let q8 = q8 && norm_rounds_to_q8(ne0, v);
    let targets = if q8 {
        Some(gemv::q8_scratch(r, ne0 * rows)?)
    } else {
        None
    };
    let launch = norm_launch(
        ne0,
        rows,
        v,
        targets,
        args![a, b, s, n, w, m, eps, rms, flags, post.0, post.1],
    );
    r.launch(&launch)?;
    if q8 {
        gemv::mark_rounded(last.ptr, ne0 * rows);
    }
    Ok(Some(q8))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32d(ptr: u64, ne: [usize; 4]) -> TDesc {
        TDesc::contiguous(ptr, DType::F32, ne).unwrap()
    }

    #[test]
    fn results_may_alias_exactly_or_not_at_all() {
        let x = f32d(0, [64, 4, 1, 1]);
        let y = f32d(1024, [64, 4, 1, 1]);
        assert!(aliasing_is_safe(&[x], &[y]));
        assert!(aliasing_is_safe(&[x], &[x]), "in place");
        let shifted = f32d(512, [64, 4, 1, 1]);
        assert!(!aliasing_is_safe(&[x], &[shifted]));
        assert!(!aliasing_is_safe(&[x, shifted], &[]));
        let row = f32d(0, [64, 1, 1, 1]);
        assert!(
            !aliasing_is_safe(&[x], &[row]),
            "a broadcast row under a result"
        );
        assert!(!aliasing_is_safe(&[x], &[f32d(1020, [1, 1, 1, 1])]));
        assert!(aliasing_is_safe(&[x], &[f32d(1024, [1, 1, 1, 1])]));
    }

    #[test]
    fn chains_are_found_in_node_order() {
        let mut g = Graph::new();
        let x = g.new_input(DType::F32, &[64, 3]).unwrap();
        let r = g.new_input(DType::F32, &[64, 3]).unwrap();
        let w = g.new_input(DType::F32, &[64]).unwrap();
        let s = g.add(x, r).unwrap();
        let n = g.rms_norm(s, 1e-6).unwrap();
        let m = g.mul(n, w).unwrap();
        let n2 = g.rms_norm(m, 1e-6).unwrap();
        let q = g.add(n2, m).unwrap();
        g.output(q);
        let groups = fusion_groups(&g, g.nodes());
        assert_eq!(groups, vec![vec![s, n, m], vec![n2], vec![q]]);
        // A norm after a mul, and a mul whose other operand is not a row of the norm's width.
        let mut g = Graph::new();
        let x = g.new_input(DType::F32, &[64, 3]).unwrap();
        let w = g.new_input(DType::F32, &[64]).unwrap();
        let col = g.new_input(DType::F32, &[1, 3]).unwrap();
        let n = g.norm(x, 1e-5).unwrap();
        let m = g.mul(n, w).unwrap();
        let n2 = g.norm(m, 1e-5).unwrap();
        let m2 = g.mul(n2, col).unwrap();
        g.output(m2);
        let groups = fusion_groups(&g, g.nodes());
        assert_eq!(groups, vec![vec![n, m], vec![n2], vec![m2]]);
    }

    #[test]
    fn spans_cover_whole_blocks_and_strides() {
        let q = Layout::contiguous(DType::Q4_0, [64, 3, 1, 1]);
        assert_eq!(span(1000, &q), (1000, 1000 + 3 * 36));
        let f = Layout::contiguous(DType::F32, [5, 2, 2, 1]);
        assert_eq!(span(0, &f), (0, 80));
        assert!(spans_apart(&[(0, 10), (10, 20)], &[(20, 30)]));
        assert!(
            !spans_apart(&[(0, 10), (9, 20)], &[]),
            "two results overlap"
        );
        assert!(
            !spans_apart(&[(0, 10)], &[(5, 6)]),
            "a result over an operand"
        );
    }

    #[test]
    fn adjacent_products_of_one_activation_are_grouped() {
        let mut g = Graph::new();
        let x = g.new_input(DType::F32, &[64, 1]).unwrap();
        let y = g.new_input(DType::F32, &[64, 1]).unwrap();
        let w: Vec<TensorId> = (0..5)
            .map(|_| g.new_input(DType::Q8_0, &[64, 32]).unwrap())
            .collect();
        let wf = g.new_input(DType::F16, &[64, 32]).unwrap();
        let p: Vec<TensorId> = w.iter().map(|&w| g.mul_mat(w, x).unwrap()).collect();
        let other_x = g.mul_mat(w[0], y).unwrap();
        let other_type = g.mul_mat(wf, y).unwrap();
        for &n in p.iter().chain([&other_x, &other_type]) {
            g.expand(n);
        }
        let groups = fusion_groups(&g, g.nodes());
        assert_eq!(
            groups,
            vec![
                vec![p[0], p[1], p[2]],
                vec![p[3], p[4]],
                vec![other_x],
                vec![other_type]
            ],
            "at most MAX_GROUP, one activation and weight type each"
        );
        let mut g = Graph::new();
        let x = g.new_input(DType::F32, &[64, 2]).unwrap();
        let w1 = g.new_input(DType::Q8_0, &[64, 32]).unwrap();
        let w2 = g.new_input(DType::Q8_0, &[64, 32]).unwrap();
        let a = g.mul_mat(w1, x).unwrap();
        let b = g.mul_mat(w2, x).unwrap();
        g.expand(a);
        g.expand(b);
        assert_eq!(
            fusion_groups(&g, g.nodes()),
            vec![vec![a], vec![b]],
            "two columns"
        );
    }
}
