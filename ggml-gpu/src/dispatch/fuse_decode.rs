//! The fusions of the decode step's small launches, found by [`super::fuse`]'s node loop: the gate
//! and up products of one activation followed by their gated unit (`glu`) run as one
//! `k_gemv_glu_<type>` launch ([`super::gemv::mul_mat_vec_glu`]), and the rope of k followed by the
//! cache write of its result (`set_rows`, through the permute view the model builder makes) as one
//! `k_rope_set_rows`, which also takes the rope of q just before them (same rope and positions)
//! and the cache write of v just after them when the graph has them there. As with the norm
//! chains, the fused kernels write every result of the chain, so no consumer analysis is needed,
//! and a memory overlap falls back to separate launches. `GGML_TP_FUSE_DECODE=0` turns them off
//! (for A/B measurements).

use super::fuse::{aliasing_is_safe, product_group, span, spans_apart};
use super::gemv;
use super::ops::{glu_code, rope_rows_chunks, rope_rows_fit, rope_scalars};
use super::rows::{all_rows, row_contiguous};
use super::{args, Launch, Runner, TDesc};
use ggml_core::{DType, GluOp, Graph, Op, Result, TensorId};

/// Whether these fusions are on (`GGML_TP_FUSE_DECODE` is not `0`, `off` or `false`).
fn fusing() -> bool {
    crate::settings::settings().fuse_decode
}

/// The `G_*` code of `node` when it is the gated unit `glu(gate, up)` that `k_gemv_glu_*` writes:
/// swiglu, geglu or geglu_erf, not swapped, of `gate` then `up`, into F32 contiguous rows of their
/// shape.
pub(super) fn glu_of(graph: &Graph, node: TensorId, gate: TensorId, up: TensorId) -> Option<i32> {
    let t = graph.tensor(node);
    let Op::Glu { op, swapped: false } = t.op else {
        return None;
    };
    let fits = matches!(op, GluOp::Swiglu | GluOp::Geglu | GluOp::GegluErf)
        && t.src[..] == [gate, up]
        && t.layout.dtype == DType::F32
        && t.layout.is_contiguous()
        && t.layout.ne == graph.layout(gate).ne;
    fits.then(|| glu_code(op).0)
}

/// True when `nodes` (the products of one activation that [`super::fuse`] groups, then the next
/// node) are two products followed by their gated unit.
pub(super) fn products_then_glu(graph: &Graph, products: usize, nodes: &[TensorId]) -> bool {
    match nodes {
        [gate, up, glu, ..] if products == 2 => {
            fusing() && glu_of(graph, *glu, *gate, *up).is_some()
        }
        _ => false,
    }
}

/// How `set_rows` writes `rope`'s result into its cache when `k_rope_set_rows` can do both:
/// `Some(swap12)`, with `swap12` true when the set_rows source is the result's permute
/// `[0, 2, 1, 3]` view and false when it is the result itself. The rope must take `k_rope_rows`
/// with an F32 result; the cache must have F32 or F16 rows (quantized caches stay unfused).
fn rope_into_cache(graph: &Graph, rope: TensorId, set_rows: TensorId) -> Option<bool> {
    let (rt, st) = (graph.tensor(rope), graph.tensor(set_rows));
    let Op::Rope(p) = &rt.op else {
        return None;
    };
    if st.op != Op::SetRows {
        return None;
    }
    let source = graph.tensor(st.src[1]);
    let swap12 = match source.op {
        _ if st.src[1] == rope => false,
        Op::Permute { axes: [0, 2, 1, 3] } if source.src[0] == rope => true,
        _ => return None,
    };
    let cache = &st.layout;
    let fits = rope_rows_fit(p, graph.layout(rt.src[0]), &rt.layout)
        && rt.layout.dtype == DType::F32
        && matches!(cache.dtype, DType::F32 | DType::F16)
        && row_contiguous(cache);
    fits.then_some(swap12)
}

/// A fused rope and cache write (from [`rope_cache_group`]): the rope of k and the set_rows of its
/// result (`swap12` as [`rope_into_cache`] gives it), with the rope of q before them and the
/// set_rows of v after them where the graph has those there.
struct RopeCache {
    q: Option<TensorId>,
    k: TensorId,
    k_write: TensorId,
    swap12: bool,
    v_write: Option<TensorId>,
}

/// Whether `q` ropes as `k` does (parameters, positions, frequency factors) into F32 rows that
/// `k_rope_rows` takes.
fn ropes_alike(graph: &Graph, q: TensorId, k: TensorId) -> bool {
    let (qt, kt) = (graph.tensor(q), graph.tensor(k));
    match (&qt.op, &kt.op) {
        (Op::Rope(pq), Op::Rope(pk)) => {
            pq == pk
                && qt.src[1..] == kt.src[1..]
                && qt.layout.dtype == DType::F32
                && rope_rows_fit(pq, graph.layout(qt.src[0]), &qt.layout)
        }
        _ => false,
    }
}

/// Whether `node` is a set_rows of float rows into an F32 or F16 cache with contiguous rows.
fn float_cache_write(graph: &Graph, node: TensorId) -> bool {
    let t = graph.tensor(node);
    t.op == Op::SetRows
        && matches!(t.layout.dtype, DType::F32 | DType::F16)
        && all_rows(&[graph.layout(t.src[1]), &t.layout])
}

/// The fused rope and cache write at the start of `nodes`, if there is one.
fn rope_cache_group(graph: &Graph, nodes: &[TensorId]) -> Option<RopeCache> {
    if !fusing() {
        return None;
    }
    let with_q = matches!(nodes, [q, k, w, ..]
        if ropes_alike(graph, *q, *k) && rope_into_cache(graph, *k, *w).is_some());
    let rest = &nodes[usize::from(with_q)..];
    let [k, k_write, ..] = *rest else {
        return None;
    };
    Some(RopeCache {
        q: with_q.then(|| nodes[0]),
        k,
        k_write,
        swap12: rope_into_cache(graph, k, k_write)?,
        v_write: rest
            .get(2)
            .copied()
            .filter(|&v| float_cache_write(graph, v)),
    })
}

/// The nodes of the fused rope and cache write at the start of `nodes` (2 to 4), if there is one.
pub(super) fn rope_cache_len(graph: &Graph, nodes: &[TensorId]) -> Option<usize> {
    rope_cache_group(graph, nodes)
        .map(|g| 2 + usize::from(g.q.is_some()) + usize::from(g.v_write.is_some()))
}

/// Launches `[gate, up, glu]` (from [`products_then_glu`]) as one `k_gemv_glu_*`; `false` (nothing
/// launched) when gate and up make no [`product_group`], their row counts differ, or the gated
/// unit's result is neither exactly one of theirs nor apart from every tensor of the launch.
pub(super) fn launch_products_glu(
    r: &dyn Runner,
    graph: &Graph,
    [gate, up, glu]: [TensorId; 3],
) -> Result<bool> {
    let code = glu_of(graph, glu, gate, up).expect("products_then_glu checked the glu");
    let Some(g) = product_group(r, graph, &[gate, up])? else {
        return Ok(false);
    };
    let &[pg, pu] = &g.products[..] else {
        unreachable!("two products make a group of two");
    };
    let out = r.desc(graph, glu)?;
    let o = span(out.ptr, graph.layout(glu));
    let out_fits =
        spans_apart(&[o], &g.read) && g.written.iter().all(|&w| w == o || spans_apart(&[o], &[w]));
    if pg.1.ne[1] != pu.1.ne[1] || !out_fits {
        return Ok(false);
    }
    gemv::mul_mat_vec_glu(r, (pg, pu), (g.b, g.lb), (out, code))?;
    Ok(true)
}

/// Whether the tensors of a fused rope and cache write may share its launch: each rope result
/// (`ropes`: result, source) is exactly its source (each element then read and written by one
/// thread) or, like the caches, shares no byte with any other tensor of the launch (`read`: the
/// positions, frequency factors, ids and v); a cache's rows are written where the ids say, so
/// even an exact alias would race.
fn rope_cache_apart(
    r: &dyn Runner,
    graph: &Graph,
    ropes: &[(TensorId, TensorId)],
    caches: &[TensorId],
    read: &[TensorId],
) -> Result<bool> {
    let desc = |id: TensorId| r.desc(graph, id);
    let at = |id: TensorId| -> Result<(u64, u64)> { Ok(span(desc(id)?.ptr, graph.layout(id))) };
    let (mut written, mut others) = (Vec::new(), Vec::new());
    for &(result, source) in ropes {
        if !aliasing_is_safe(&[desc(result)?], &[desc(source)?]) {
            return Ok(false);
        }
        let (w, s) = (at(result)?, at(source)?);
        written.push(w);
        if s != w {
            others.push(s);
        }
    }
    for &id in caches {
        written.push(at(id)?);
    }
    for &id in read {
        others.push(at(id)?);
    }
    Ok(spans_apart(&written, &others))
}

/// Launches the fused rope and cache write `group` (from [`rope_cache_len`]) as one
/// `k_rope_set_rows`; `false` (nothing launched) when [`rope_cache_apart`] refuses its memory.
pub(super) fn launch_rope_cache(r: &dyn Runner, graph: &Graph, group: &[TensorId]) -> Result<bool> {
    let g = rope_cache_group(graph, group).expect("rope_cache_len checked the group");
    let (kt, wt) = (graph.tensor(g.k), graph.tensor(g.k_write));
    let Op::Rope(p) = &kt.op else {
        unreachable!("rope_into_cache checked the op");
    };
    let mut ropes = vec![(g.k, kt.src[0])];
    ropes.extend(g.q.map(|q| (q, graph.tensor(q).src[0])));
    let mut caches = vec![g.k_write];
    let mut read: Vec<TensorId> = kt.src[1..].iter().chain([&wt.src[2]]).copied().collect();
    if let Some(v) = g.v_write {
        caches.push(v);
        read.extend(&graph.tensor(v).src[1..]);
    }
    if !rope_cache_apart(r, graph, &ropes, &caches, &read)? {
        return Ok(false);
    }
    let desc = |id: TensorId| r.desc(graph, id);
    let absent = TDesc::absent();
    let (a, pos, d) = (desc(kt.src[0])?, desc(kt.src[1])?, desc(g.k)?);
    let ff = kt.src.get(2).map(|&f| desc(f)).transpose()?;
    let (cache, ids) = (desc(g.k_write)?, desc(wt.src[2])?);
    let (qa, qd, q_chunks) = match g.q {
        Some(q) => (
            desc(graph.tensor(q).src[0])?,
            desc(q)?,
            rope_rows_chunks(p, graph.layout(q)),
        ),
        None => (absent, absent, 0),
    };
    let (vs, vc, vids, v_chunks) = match g.v_write {
        Some(v) => {
            let vt = graph.tensor(v);
            let n = graph.layout(vt.src[1]).nelements();
            (desc(vt.src[1])?, desc(v)?, desc(vt.src[2])?, n)
        }
        None => (absent, absent, absent, 0),
    };
    let chunks = q_chunks + rope_rows_chunks(p, &kt.layout) + v_chunks;
    if chunks >= 1 << 31 {
        return Ok(false);
    }
    let ff = ff.unwrap_or(absent);
    let mut a = args![a, pos, ff, d, cache, ids, i32::from(g.swap12)];
    a.extend(args![
        qa,
        qd,
        q_chunks as i32,
        vs,
        vc,
        vids,
        v_chunks as i32
    ]);
    a.extend(rope_scalars(p, kt.src.len() > 2));
    r.launch(&Launch::elementwise("k_rope_set_rows", chunks, a))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::super::fuse::{compute_nodes, fusion_groups};
    use super::super::{GemmCall, GemmTypes};
    use super::*;
    use ggml_core::{RopeMode, RopeParams};
    use std::cell::RefCell;
    use std::collections::HashMap;

    /// A runner that records the kernels launched; tensor `id` lives at `(id + 1) << 32` unless
    /// placed elsewhere (to make results overlap operands as the memory planner may).
    #[derive(Default)]
    struct Placed {
        at: HashMap<TensorId, u64>,
        kernels: RefCell<Vec<String>>,
    }

    impl Runner for Placed {
        fn device_name(&self) -> String {
            "test:0".into()
        }
        fn family(&self) -> &'static str {
            "test"
        }
        fn desc(&self, graph: &Graph, id: TensorId) -> Result<TDesc> {
            let ptr = self.at.get(&id).copied();
            TDesc::new(ptr.unwrap_or((u64::from(id.0) + 1) << 32), graph.layout(id))
        }
        fn scratch(&self, slot: usize, _bytes: usize) -> Result<u64> {
            Ok((1 << 48) + ((slot as u64) << 40))
        }
        fn launch(&self, launch: &Launch) -> Result<()> {
            self.kernels.borrow_mut().push(launch.kernel.to_string());
            Ok(())
        }
        fn gemm_types(&self) -> GemmTypes {
            GemmTypes::Mixed
        }
        fn gemm(&self, _call: &GemmCall) -> Result<()> {
            Ok(())
        }
    }

    /// The kernels `compute_nodes` launches for `g` with tensors placed at `at`.
    fn launched(g: &Graph, at: &[(TensorId, TensorId)]) -> Vec<String> {
        let mut r = Placed::default();
        let home = |id: TensorId| (u64::from(id.0) + 1) << 32;
        r.at = at.iter().map(|&(t, over)| (t, home(over))).collect();
        compute_nodes(&r, g, g.nodes()).unwrap();
        r.kernels.into_inner()
    }

    /// Gate and up products of `x` by `[k, m]` weights of type `w`, the nodes next to each other.
    fn gate_up(g: &mut Graph, x: TensorId, w: DType, m: usize) -> [TensorId; 2] {
        let k = g.layout(x).ne[0];
        let wg = g.new_input(w, &[k, m]).unwrap();
        let wu = g.new_input(w, &[k, m]).unwrap();
        let (gate, up) = (g.mul_mat(wg, x).unwrap(), g.mul_mat(wu, x).unwrap());
        g.expand(gate);
        g.expand(up);
        [gate, up]
    }

    #[test]
    fn gate_and_up_take_their_gated_unit() {
        for op in [GluOp::Swiglu, GluOp::Geglu, GluOp::GegluErf] {
            let mut g = Graph::new();
            let x = g.new_input(DType::F32, &[64, 1]).unwrap();
            let [gate, up] = gate_up(&mut g, x, DType::Q8_0, 96);
            let h = g.glu(op, gate, up).unwrap();
            g.output(h);
            assert_eq!(fusion_groups(&g, g.nodes()), vec![vec![gate, up, h]]);
        }
    }

    #[test]
    fn other_gated_units_stay_apart() {
        const OAI: GluOp = GluOp::SwigluOai {
            alpha: 1.7,
            limit: 7.0,
        };
        type Build = fn(&mut Graph, TensorId, TensorId) -> TensorId;
        let cases: [(&str, Build); 4] = [
            ("up first", |g, gate, up| {
                g.glu(GluOp::Swiglu, up, gate).unwrap()
            }),
            ("swiglu_oai", |g, gate, up| g.glu(OAI, gate, up).unwrap()),
            ("one source", |g, gate, up| {
                let both = g.concat(gate, up, 0).unwrap();
                g.glu_fused(GluOp::Swiglu, both, false).unwrap()
            }),
            ("a node between", |g, gate, up| {
                let s = g.scale(gate, 2.0).unwrap();
                g.glu(GluOp::Swiglu, s, up).unwrap()
            }),
        ];
        for (what, build) in cases {
            let mut g = Graph::new();
            let x = g.new_input(DType::F32, &[64, 1]).unwrap();
            let [gate, up] = gate_up(&mut g, x, DType::F16, 32);
            let h = build(&mut g, gate, up);
            g.output(h);
            let groups = fusion_groups(&g, g.nodes());
            assert_eq!(groups[0], vec![gate, up], "{what}");
            assert!(groups.iter().all(|grp| grp.len() <= 2), "{what}");
        }
        // Three products of one activation group among themselves; the glu runs alone.
        let mut g = Graph::new();
        let x = g.new_input(DType::F32, &[64, 1]).unwrap();
        let [gate, up] = gate_up(&mut g, x, DType::F16, 32);
        let w = g.new_input(DType::F16, &[64, 32]).unwrap();
        let third = g.mul_mat(w, x).unwrap();
        g.expand(third);
        let h = g.glu(GluOp::Swiglu, gate, up).unwrap();
        g.output(h);
        g.output(third);
        let groups = fusion_groups(&g, g.nodes());
        assert_eq!(groups, vec![vec![gate, up, third], vec![h]]);
    }

    /// A rope of `[d, heads, tokens]` F32 rows and the write of its result into a cache of type
    /// `cache_type` through the permute view (or directly when `!permuted`).
    fn rope_and_write(cache_type: DType, permuted: bool) -> (Graph, TensorId, TensorId) {
        let (d, heads, tokens) = (64, 4, 3);
        let mut g = Graph::new();
        let x = g.new_input(DType::F32, &[d, heads, tokens]).unwrap();
        let pos = g.new_input(DType::I32, &[tokens]).unwrap();
        let cache_ne: &[usize] = if permuted {
            &[d, 100, heads]
        } else {
            &[d, 100, tokens]
        };
        let cache = g.new_input(cache_type, cache_ne).unwrap();
        // The set_rows source's rows: tokens of the permute view, heads of the result itself.
        let rows = if permuted { tokens } else { heads };
        let ids = g.new_input(DType::I32, &[rows]).unwrap();
        let p = RopeParams::simple(RopeMode::Neox, d, 10000.0);
        let rope = g.rope(x, pos, None, p).unwrap();
        let source = if permuted {
            g.permute(rope, [0, 2, 1, 3]).unwrap()
        } else {
            rope
        };
        let w = g.set_rows(cache, source, ids).unwrap();
        g.output(w);
        g.output(rope);
        (g, rope, w)
    }

    #[test]
    fn rope_takes_the_cache_write_of_its_result() {
        for (cache, permuted) in [(DType::F16, true), (DType::F32, true), (DType::F16, false)] {
            let (g, rope, w) = rope_and_write(cache, permuted);
            assert_eq!(
                fusion_groups(&g, g.nodes()),
                vec![vec![rope, w]],
                "{cache} permuted {permuted}"
            );
            assert_eq!(rope_into_cache(&g, rope, w), Some(permuted));
        }
        let (g, rope, w) = rope_and_write(DType::Q8_0, true);
        assert_eq!(
            fusion_groups(&g, g.nodes()),
            vec![vec![rope], vec![w]],
            "quantized caches stay unfused"
        );
    }

    /// The attention inputs of a decode step as the model builder makes them: ropes of q and k
    /// (q's with `q_base` as its frequency base), k and v written into their caches through
    /// permute views. Returns the graph and its nodes `[q, k, k write, v write]`.
    fn ropes_and_writes(q_base: f32) -> (Graph, [TensorId; 4]) {
        let (d, heads, tokens) = (64, 2, 1);
        let mut g = Graph::new();
        let xq = g.new_input(DType::F32, &[d, 2 * heads, tokens]).unwrap();
        let xk = g.new_input(DType::F32, &[d, heads, tokens]).unwrap();
        let v = g.new_input(DType::F32, &[d, heads, tokens]).unwrap();
        let pos = g.new_input(DType::I32, &[tokens]).unwrap();
        let ids = g.new_input(DType::I32, &[tokens]).unwrap();
        let kc = g.new_input(DType::F16, &[d, 100, heads]).unwrap();
        let vc = g.new_input(DType::F16, &[d, 100, heads]).unwrap();
        let p = RopeParams::simple(RopeMode::Neox, d, 10000.0);
        let q = g
            .rope(
                xq,
                pos,
                None,
                RopeParams {
                    freq_base: q_base,
                    ..p
                },
            )
            .unwrap();
        let k = g.rope(xk, pos, None, p).unwrap();
        let kp = g.permute(k, [0, 2, 1, 3]).unwrap();
        let kw = g.set_rows(kc, kp, ids).unwrap();
        let vp = g.permute(v, [0, 2, 1, 3]).unwrap();
        let vw = g.set_rows(vc, vp, ids).unwrap();
        for n in [q, k, kw, vw] {
            g.output(n);
        }
        (g, [q, k, kw, vw])
    }

    #[test]
    fn q_rope_and_v_write_join_the_k_rope_and_write() {
        let (g, nodes) = ropes_and_writes(10000.0);
        assert_eq!(fusion_groups(&g, g.nodes()), vec![nodes.to_vec()]);
        assert_eq!(launched(&g, &[]), ["k_rope_set_rows"]);
        let [q, k, kw, vw] = nodes;
        let xq = g.tensor(q).src[0];
        assert_eq!(
            launched(&g, &[(q, xq)]),
            ["k_rope_set_rows"],
            "q's rope in place"
        );
        // (This runner places a view apart from its base: the set_rows source is the view.)
        let v = g.tensor(vw).src[1];
        assert_eq!(
            launched(&g, &[(q, v)]),
            [
                "k_rope_rows",
                "k_rope_rows",
                "k_set_rows_rows",
                "k_set_rows_rows"
            ],
            "q's rope over v, which another thread reads"
        );
        assert_eq!(
            launched(&g, &[(q, g.tensor(k).src[0])]),
            [
                "k_rope_rows",
                "k_rope_rows",
                "k_set_rows_rows",
                "k_set_rows_rows"
            ],
            "q's rope over k's source"
        );
        // Another rope for q: it stays apart, k and v still fuse.
        let (g, [q, k, kw2, vw2]) = ropes_and_writes(500000.0);
        assert_eq!(
            fusion_groups(&g, g.nodes()),
            vec![vec![q], vec![k, kw2, vw2]]
        );
        assert_eq!(kw2, kw);
        assert_eq!(vw2, vw);
    }

    #[test]
    fn overlapping_memory_falls_back_to_separate_launches() {
        let mut g = Graph::new();
        let x = g.new_input(DType::F32, &[64, 1]).unwrap();
        let [gate, up] = gate_up(&mut g, x, DType::F16, 64);
        let h = g.glu(GluOp::Swiglu, gate, up).unwrap();
        g.output(h);
        assert_eq!(launched(&g, &[]), ["k_gemv_glu_f16"]);
        assert_eq!(
            launched(&g, &[(h, gate)]),
            ["k_gemv_glu_f16"],
            "the gated unit over gate: written last by the same thread"
        );
        assert_eq!(
            launched(&g, &[(h, x)]),
            ["k_gemv_group_f16", "k_glu_rows"],
            "the gated unit over the activation the products still read"
        );
        assert_eq!(
            launched(&g, &[(up, x)]),
            ["k_gemv_f16_1", "k_gemv_f16_1", "k_glu_rows"],
            "a product over the activation"
        );
        let (g, rope, w) = rope_and_write(DType::F16, true);
        let [x, pos] = [0, 1].map(|i| g.tensor(rope).src[i]);
        assert_eq!(launched(&g, &[]), ["k_rope_set_rows"]);
        assert_eq!(
            launched(&g, &[(rope, x)]),
            ["k_rope_set_rows"],
            "rope in place"
        );
        assert_eq!(
            launched(&g, &[(rope, pos)]),
            ["k_rope_rows", "k_set_rows_rows"],
            "the rope's result over the positions"
        );
        assert_eq!(
            launched(&g, &[(w, x)]),
            ["k_rope_rows", "k_set_rows_rows"],
            "the cache over the rope's source"
        );
    }

    #[test]
    fn a_cache_exactly_over_an_operand_falls_back() {
        // [d, 4, 4] rope result and source; an F32 cache [d, 4, 4] written through the permute
        // view: the cache has the very layout of the source and of the result, yet its rows are
        // written where `ids` say, not where the thread reads or writes them.
        let (d, n) = (64, 4);
        let mut g = Graph::new();
        let x = g.new_input(DType::F32, &[d, n, n]).unwrap();
        let pos = g.new_input(DType::I32, &[n]).unwrap();
        let cache = g.new_input(DType::F32, &[d, n, n]).unwrap();
        let ids = g.new_input(DType::I32, &[n]).unwrap();
        let p = RopeParams::simple(RopeMode::Neox, d, 10000.0);
        let rope = g.rope(x, pos, None, p).unwrap();
        let source = g.permute(rope, [0, 2, 1, 3]).unwrap();
        let w = g.set_rows(cache, source, ids).unwrap();
        g.output(w);
        g.output(rope);
        assert_eq!(launched(&g, &[]), ["k_rope_set_rows"]);
        assert_eq!(
            launched(&g, &[(rope, x)]),
            ["k_rope_set_rows"],
            "rope in place"
        );
        for over in [x, rope] {
            assert_eq!(
                launched(&g, &[(w, over)]),
                ["k_rope_rows", "k_set_rows_rows"],
                "the cache exactly over {over:?}"
            );
        }
    }
}
