//! Chains of element-wise nodes run as one `k_eltwise_chain` launch: 2 or 3 adjacent unary, scale,
//! clamp or binary nodes on F32 tensors of one shape, each taking the result of the one before it
//! as exactly one of its operands (the delta-net log decay `softplus(α + dt_bias) · ssm_a`, a gate's
//! sigmoid and product). Every node's result is still written, each computed by the function its
//! own kernel applies, so the results are bit-equal to the unfused launches' and other consumers
//! need no analysis. `GGML_TP_FUSE_CHAINS=0` turns these fusions off (with the norm chains' scale
//! and the delta-net state copy).

use super::fuse::aliasing_is_safe;
use super::ops::{elementwise_fn, Elementwise};
use super::{args, Launch, Runner, TDesc};
use ggml_core::{DType, Graph, Result, TensorId};

/// Most nodes of a chain (the kernel's steps).
const MAX_STEPS: usize = 3;

/// Step kinds of `k_eltwise_chain` (`STEP_*` in elementwise.cu), the high byte of a step's code.
const STEP_UNARY: i32 = 0;
const STEP_X_OP_OTHER: i32 = 1;
const STEP_OTHER_OP_X: i32 = 2;

/// Whether `node` can be a step: an element-wise op whose operands and result are F32.
fn is_step(graph: &Graph, node: TensorId) -> bool {
    let t = graph.tensor(node);
    elementwise_fn(&t.op).is_some()
        && t.layout.dtype == DType::F32
        && t.src.iter().all(|&s| graph.layout(s).dtype == DType::F32)
}

/// Whether `node` continues a chain whose last node is `prev`: a step of `prev`'s shape taking
/// `prev`'s result as exactly one operand.
fn continues(graph: &Graph, prev: TensorId, node: TensorId) -> bool {
    let t = graph.tensor(node);
    is_step(graph, node)
        && t.layout.ne == graph.layout(prev).ne
        && t.src.iter().filter(|&&s| s == prev).count() == 1
}

/// Length of the element-wise chain at the start of `nodes`, if there is one (2 nodes or more).
pub(super) fn chain_len(graph: &Graph, nodes: &[TensorId]) -> Option<usize> {
    if !crate::settings::settings().fuse_chains || !is_step(graph, nodes[0]) {
        return None;
    }
    let len = 1 + nodes
        .windows(2)
        .take(MAX_STEPS - 1)
        .take_while(|w| continues(graph, w[0], w[1]))
        .count();
    (len > 1).then_some(len)
}

/// Whether `group` is such a chain, whole.
pub(super) fn is_chain(graph: &Graph, group: &[TensorId]) -> bool {
    group.len() > 1 && chain_len(graph, group) == Some(group.len())
}

/// Launches the chain `group` (from [`chain_len`]) as one `k_eltwise_chain`; `false` (nothing
/// launched) when a result overlaps another tensor of the chain other than exactly.
pub(super) fn launch_chain(r: &dyn Runner, graph: &Graph, group: &[TensorId]) -> Result<bool> {
    let desc = |id: TensorId| r.desc(graph, id);
    let first = graph.tensor(group[0]);
    let a = desc(first.src[0])?;
    let mut read = vec![a];
    let mut written = Vec::with_capacity(MAX_STEPS);
    // Per step: the other operand, the result, the code and the parameters.
    let mut steps = Vec::with_capacity(MAX_STEPS);
    for (k, &node) in group.iter().enumerate() {
        let t = graph.tensor(node);
        let f = elementwise_fn(&t.op).expect("chain_len checked every step");
        // The chain's value: the first node's first operand, or the node before.
        let x_at = if k == 0 {
            0
        } else {
            usize::from(t.src[0] != group[k - 1])
        };
        let (code, other, p) = match f {
            Elementwise::Unary(op, p0, p1) => (STEP_UNARY << 8 | op, TDesc::absent(), (p0, p1)),
            Elementwise::Binary(op) => {
                let other = desc(t.src[1 - x_at])?;
                read.push(other);
                let kind = if x_at == 0 {
                    STEP_X_OP_OTHER
                } else {
                    STEP_OTHER_OP_X
                };
                (kind << 8 | op, other, (0.0, 0.0))
            }
        };
        let d = desc(node)?;
        written.push(d);
        steps.push((other, d, code, p));
    }
    if !aliasing_is_safe(&written, &read) {
        return Ok(false);
    }
    let absent = (TDesc::absent(), TDesc::absent(), 0, (0.0f32, 0.0f32));
    let [(o0, d0, c0, p0), (o1, d1, c1, p1), (o2, d2, c2, p2)] =
        [0, 1, 2].map(|k| steps.get(k).copied().unwrap_or(absent));
    let n = graph.layout(group[0]).nelements();
    let launch = Launch::elementwise(
        "k_eltwise_chain",
        n,
        args![
            a,
            o0,
            d0,
            o1,
            d1,
            o2,
            d2,
            group.len() as i32,
            c0,
            c1,
            c2,
            p0.0,
            p0.1,
            p1.0,
            p1.1,
            p2.0,
            p2.1
        ],
    );
    r.launch(&launch)?;
    Ok(true)
}
