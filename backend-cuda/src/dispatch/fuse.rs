//! The node loop of both backends, [`compute_nodes`], and its fusions: the chains every transformer
//! layer has, a norm (rms_norm / norm) followed by the mul by its weight row and preceded by the
//! residual add, run as one `k_norm_rows` launch when adjacent. The fused kernel writes every
//! result of the chain, so the intermediates stay valid for other consumers and no consumer
//! analysis is needed; it computes them exactly as the unfused kernels do (bit-identical).

use super::rows::{broadcasts_rows, norm_launch, row_contiguous, vec_width, NORM_ADD, NORM_MUL};
use super::{args, compute_node, Runner, TDesc};
use ggml_core::{DType, Error, Graph, Layout, Op, Result, TensorId};

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

/// Computes `nodes` of `graph` through `r` in order, fusing the chains of [`fusion_groups`].
pub fn compute_nodes(r: &dyn Runner, graph: &Graph, nodes: &[TensorId]) -> Result<()> {
    for group in fusion_groups(graph, nodes) {
        if group.len() > 1 && launch_chain(r, graph, &group).map_err(|e| at(graph, group[0], e))? {
            continue;
        }
        for &node in &group {
            compute_node(r, graph, node).map_err(|e| at(graph, node, e))?;
        }
    }
    Ok(())
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

/// Length of the fusable chain at the start of `nodes` (1 when there is none).
fn chain_len(graph: &Graph, nodes: &[TensorId]) -> usize {
    let norm_at = match nodes {
        [add, norm, ..] if fusable_norm(graph, *norm) && fusable_add(graph, *add, *norm) => 1,
        [norm, ..] if fusable_norm(graph, *norm) => 0,
        _ => return 1,
    };
    let norm = nodes[norm_at];
    let with_mul = nodes
        .get(norm_at + 1)
        .is_some_and(|&m| fused_weight(graph, m, norm).is_some());
    norm_at + 1 + usize::from(with_mul)
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
fn aliasing_is_safe(written: &[TDesc], read: &[TDesc]) -> bool {
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

/// Launches the chain `group` (from [`chain_len`]) as one `k_norm_rows`; `false` (nothing
/// launched) when its memory overlaps.
fn launch_chain(r: &dyn Runner, graph: &Graph, group: &[TensorId]) -> Result<bool> {
    let has_add = graph.tensor(group[0]).op == Op::Add;
    let norm = group[usize::from(has_add)];
    let mul = group.get(usize::from(has_add) + 1).copied();
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
    let (w, m) = match mul {
        Some(m) => {
            let w = fused_weight(graph, m, norm).expect("chain_len checked the mul");
            (desc(w)?, desc(m)?)
        }
        None => (absent, absent),
    };
    let mut written = vec![n];
    let mut read = vec![a];
    if has_add {
        written.push(s);
        read.push(b);
    }
    if mul.is_some() {
        written.push(m);
        read.push(w);
    }
    if !aliasing_is_safe(&written, &read) {
        return Ok(false);
    }
    let flags = if has_add { NORM_ADD } else { 0 } | if mul.is_some() { NORM_MUL } else { 0 };
    let ne0 = nt.layout.ne[0];
    let v = vec_width(ne0, &[written, read].concat());
    let launch = norm_launch(
        ne0,
        nt.layout.nrows(),
        v,
        args![a, b, s, n, w, m, eps, rms, flags],
    );
    r.launch(&launch)?;
    Ok(true)
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
}
