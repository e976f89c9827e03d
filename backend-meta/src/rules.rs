//! Split rules: for each op, the split state of its result and the state each source must be in,
//! given the sources' states. One rule per op. Where sources are not in a state the op can use as is,
//! the rule names the state to convert them to (partial → mirrored is an AllReduce, split → mirrored a
//! gather, mirrored → split a local slice), and the executor inserts the conversion.

use crate::split::{Segment, SplitError, SplitState};
use ggml_core::{Graph, HeadShare, Op, TensorId};

/// The state an op needs a source in.
#[derive(Clone, Debug, PartialEq)]
pub enum Want {
    /// Whatever it is now.
    AsIs,
    /// This exact state (conversions inserted as needed).
    State(SplitState),
}

/// What an op does with split sources.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    pub srcs: Vec<Want>,
    pub out: SplitState,
    /// The op adds a mirrored term to a partial sum: only device 0 applies that term.
    pub once: bool,
}

/// Errors of split-state derivation.
#[derive(Debug, Clone, thiserror::Error)]
#[error("no split rule for {op} ({name}) with source states [{states}]: {why}")]
pub struct RuleError {
    pub op: String,
    pub name: String,
    pub states: String,
    pub why: String,
}

fn err(graph: &Graph, node: TensorId, s: &[SplitState], why: impl Into<String>) -> RuleError {
    let t = graph.tensor(node);
    RuleError {
        op: t.op.name().into(),
        name: t.name.clone(),
        states: s
            .iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        why: why.into(),
    }
}

use SplitState::{Mirrored, Partial};

fn all_mirrored(n: usize) -> Vec<Want> {
    vec![Want::State(Mirrored); n]
}

/// A rule computing on mirrored copies of every source (reducing or gathering them first).
fn mirrored_rule(n: usize) -> Rule {
    Rule {
        srcs: all_mirrored(n),
        out: Mirrored,
        once: false,
    }
}

/// A mirrored source used next to a split one: slice it like `like` when it spans the split axis,
/// keep it when it broadcasts along that axis.
fn slice_or_broadcast(graph: &Graph, src: TensorId, like: &SplitState, full_len: usize) -> Want {
    let axis = like.axis().expect("split state");
    let len = graph.layout(src).ne[axis];
    if len == 1 && full_len != 1 {
        Want::State(Mirrored)
    } else {
        Want::State(like.clone())
    }
}

/// Element-wise ops on one source (scale, clamp, unary, cont, cast).
fn unary_rule(s: &SplitState, linear: bool) -> Rule {
    match s {
        Partial if linear => Rule {
            srcs: vec![Want::AsIs],
            out: Partial,
            once: false,
        },
        Partial => mirrored_rule(1),
        other => Rule {
            srcs: vec![Want::AsIs],
            out: other.clone(),
            once: false,
        },
    }
}

/// Ops that reduce or permute along axis 0 (norms, softmax rows, sorts): any split but axis 0 passes.
fn row_rule(graph: &Graph, node: TensorId, s: &[SplitState]) -> Rule {
    match &s[0] {
        st @ SplitState::Split { axis, .. } if *axis != 0 => {
            let full = graph.layout(node).ne[*axis];
            let mut srcs = vec![Want::AsIs];
            for (i, _) in s.iter().enumerate().skip(1) {
                let src = graph.tensor(node).src[i];
                srcs.push(slice_or_broadcast(graph, src, st, full));
            }
            Rule {
                srcs,
                out: st.clone(),
                once: false,
            }
        }
        _ => mirrored_rule(s.len()),
    }
}

/// The rule of `node` given its sources' states.
pub fn rule(graph: &Graph, node: TensorId, s: &[SplitState]) -> Result<Rule, RuleError> {
    let t = graph.tensor(node);
    Ok(match &t.op {
        Op::MulMat => mul_mat(graph, node, s)?,
        Op::MulMatId => mul_mat_id(s),
        Op::Add | Op::Sub | Op::Mul | Op::Div => binary(graph, node, s),
        Op::AddId => add_id(s),
        Op::Scale { .. } | Op::Clamp { .. } | Op::Unary(_) | Op::Cont => {
            elementwise(graph, node, s)
        }
        Op::Glu { .. } if t.src.len() == 2 => glu_pair(s),
        Op::Glu { .. } => glu_fused(s),
        Op::RmsNorm { .. } | Op::Norm { .. } | Op::Argsort { .. } | Op::TopK { .. } => {
            row_rule(graph, node, s)
        }
        Op::SumRows => sum_rows(graph, node, s),
        Op::SoftMax { max_bias, .. } => soft_max(graph, node, s, *max_bias),
        Op::Rope(_) => rope(graph, node, s),
        Op::FlashAttnExt { max_bias, .. } => flash_attn_ext(graph, node, s, *max_bias)?,
        Op::GetRows => get_rows(s),
        Op::SetRows => set_rows(graph, node, s)?,
        Op::Cpy => cpy(graph, node, s)?,
        Op::Concat { dim } => concat(s, *dim),
        Op::GatedDeltaNet { heads } => gated_delta_net(graph, node, s, *heads),
        Op::None | Op::View { .. } | Op::Reshape | Op::Permute { .. } | Op::Transpose => {
            return Err(err(
                graph,
                node,
                s,
                "layout ops carry their source's state (see the layout module)",
            ));
        }
    })
}

/// True when the slices of `a` and `b` (cut from axes of `na` and `nb` units) are in proportion,
/// device by device: whole heads of `b` for whole heads of `a`.
fn slices_line_up(a: &[Segment], b: &[Segment], na: usize, nb: usize) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.slices
                .iter()
                .zip(&y.slices)
                .all(|(&p, &q)| q * na == p * nb)
        })
}

/// `mul_mat`: a split by rows of a gives a split result along axis 0, a split along K a partial sum,
/// batch splits of both sources (heads) stay split, a mirrored a follows b's split.
fn mul_mat(graph: &Graph, node: TensorId, s: &[SplitState]) -> Result<Rule, RuleError> {
    let src = |i: usize| graph.tensor(node).src[i];
    Ok(match (&s[0], &s[1]) {
        (SplitState::Split { axis: 1, segments }, Mirrored) => Rule {
            srcs: vec![Want::AsIs, Want::AsIs],
            out: SplitState::Split {
                axis: 0,
                segments: segments.clone(),
            },
            once: false,
        },
        (a @ SplitState::Split { axis: 0, .. }, b) if !matches!(b, Partial) => Rule {
            srcs: vec![Want::AsIs, Want::State(a.clone())],
            out: Partial,
            once: false,
        },
        (
            SplitState::Split {
                axis: ax @ (2 | 3),
                segments: sa,
            },
            SplitState::Split {
                axis: bx,
                segments: sb,
            },
        ) if ax == bx => {
            let (na, nb) = (graph.layout(src(0)).ne[*ax], graph.layout(src(1)).ne[*ax]);
            if !slices_line_up(sa, sb, na, nb) {
                return Err(err(graph, node, s, "head slices of a and b do not line up"));
            }
            Rule {
                srcs: vec![Want::AsIs, Want::AsIs],
                out: s[1].clone(),
                once: false,
            }
        }
        (Mirrored, b @ SplitState::Split { axis, .. }) if *axis >= 1 => {
            let full = graph.layout(src(1)).ne[*axis];
            let wa = if *axis == 1 {
                Want::AsIs
            } else {
                slice_or_broadcast(graph, src(0), b, full)
            };
            Rule {
                srcs: vec![wa, Want::AsIs],
                out: b.clone(),
                once: false,
            }
        }
        _ => mirrored_rule(2),
    })
}

/// `mul_mat_id`: experts split by rows give a split result, split along K a partial sum.
fn mul_mat_id(s: &[SplitState]) -> Rule {
    match (&s[0], &s[1]) {
        (SplitState::Split { axis: 1, segments }, _) => Rule {
            srcs: vec![Want::AsIs, Want::State(Mirrored), Want::State(Mirrored)],
            out: SplitState::Split {
                axis: 0,
                segments: segments.clone(),
            },
            once: false,
        },
        (a @ SplitState::Split { axis: 0, .. }, _) => Rule {
            srcs: vec![Want::AsIs, Want::State(a.clone()), Want::State(Mirrored)],
            out: Partial,
            once: false,
        },
        _ => mirrored_rule(3),
    }
}

/// `add`, `sub`, `mul`, `div`: partial sums pass where the op is linear in them and the other term
/// multiplies (a mirrored term is added after the join instead: on every device, where a GPU folds
/// the residual add into the RMS norm after it, and the residual stream never travels in BF16),
/// splits pass with the other source sliced alike or broadcast.
fn binary(graph: &Graph, node: TensorId, s: &[SplitState]) -> Rule {
    let t = graph.tensor(node);
    let src = |i: usize| t.src[i];
    let linear_in_a = true;
    let linear_in_b = matches!(t.op, Op::Add | Op::Sub | Op::Mul);
    let additive = matches!(t.op, Op::Add | Op::Sub);
    match (&s[0], &s[1]) {
        (Partial, Partial) if additive => Rule {
            srcs: vec![Want::AsIs, Want::AsIs],
            out: Partial,
            once: false,
        },
        (Partial, Mirrored) if linear_in_a && !additive => Rule {
            srcs: vec![Want::AsIs, Want::AsIs],
            out: Partial,
            once: false,
        },
        (Mirrored, Partial) if linear_in_b && !additive => Rule {
            srcs: vec![Want::AsIs, Want::AsIs],
            out: Partial,
            once: false,
        },
        (a @ SplitState::Split { axis, .. }, b)
            if !matches!(b, Partial) && (a == b || matches!(b, Mirrored)) =>
        {
            let full = graph.layout(node).ne[*axis];
            let wb = if a == b {
                Want::AsIs
            } else {
                slice_or_broadcast(graph, src(1), a, full)
            };
            Rule {
                srcs: vec![Want::AsIs, wb],
                out: a.clone(),
                once: false,
            }
        }
        (Mirrored, b @ SplitState::Split { axis, .. })
            if graph.layout(src(0)).ne[*axis] == graph.layout(src(1)).ne[*axis] =>
        {
            Rule {
                srcs: vec![Want::State(b.clone()), Want::AsIs],
                out: b.clone(),
                once: false,
            }
        }
        _ => mirrored_rule(2),
    }
}

/// `add_id`: a partial sum takes the biases once; a split along axis 0 slices the biases alike.
fn add_id(s: &[SplitState]) -> Rule {
    match (&s[0], &s[1]) {
        (Partial, Mirrored) => Rule {
            srcs: vec![Want::AsIs, Want::AsIs, Want::State(Mirrored)],
            out: Partial,
            once: true,
        },
        (a @ SplitState::Split { axis: 0, .. }, _) => Rule {
            srcs: vec![Want::AsIs, Want::State(a.clone()), Want::State(Mirrored)],
            out: a.clone(),
            once: false,
        },
        _ => mirrored_rule(3),
    }
}

/// `scale`, `clamp`, the unary functions and `cont`: any state passes but a partial sum, which
/// only the linear ones (scale, neg) keep; scale's bias is added once.
fn elementwise(graph: &Graph, node: TensorId, s: &[SplitState]) -> Rule {
    let t = graph.tensor(node);
    match &t.op {
        Op::Scale { bias, .. } => {
            let mut r = unary_rule(&s[0], true);
            r.once = r.out == Partial && *bias != 0.0;
            r
        }
        Op::Unary(ggml_core::UnaryOp::Neg) => unary_rule(&s[0], true),
        // A cast to a block type needs whole blocks in every slice of axis 0.
        Op::Cont if cuts_blocks(&s[0], t.dtype().block_size()) => mirrored_rule(1),
        _ => unary_rule(&s[0], false),
    }
}

/// True when `s` splits axis 0 into slices that are not whole blocks of `block` elements.
fn cuts_blocks(s: &SplitState, block: usize) -> bool {
    match s {
        SplitState::Split { axis: 0, segments } => segments
            .iter()
            .any(|g| g.slices.iter().any(|&x| !x.is_multiple_of(block))),
        _ => false,
    }
}

/// A gated unit over `[gate, up]`: both in one state (not partial) give that state.
fn glu_pair(s: &[SplitState]) -> Rule {
    match (&s[0], &s[1]) {
        (a, b) if a == b && *a != Partial => Rule {
            srcs: vec![Want::AsIs, Want::AsIs],
            out: a.clone(),
            once: false,
        },
        _ => mirrored_rule(2),
    }
}

/// A gated unit over fused halves: a split of axis 0 with matching gate and up segments gives the
/// split of one half; splits of other axes pass.
fn glu_fused(s: &[SplitState]) -> Rule {
    match &s[0] {
        SplitState::Split { axis: 0, segments }
            if segments.len() == 2 && segments[0].slices == segments[1].slices =>
        {
            Rule {
                srcs: vec![Want::AsIs],
                out: SplitState::Split {
                    axis: 0,
                    segments: vec![segments[0].clone()],
                },
                once: false,
            }
        }
        st @ SplitState::Split { axis, .. } if *axis != 0 => Rule {
            srcs: vec![Want::AsIs],
            out: st.clone(),
            once: false,
        },
        _ => mirrored_rule(1),
    }
}

/// `sum_rows`: linear, so a partial sum passes; otherwise a row rule.
fn sum_rows(graph: &Graph, node: TensorId, s: &[SplitState]) -> Rule {
    match &s[0] {
        Partial => Rule {
            srcs: vec![Want::AsIs],
            out: Partial,
            once: false,
        },
        _ => row_rule(graph, node, s),
    }
}

/// `soft_max`: a row rule for the logits and mask; sinks follow a head split.
fn soft_max(graph: &Graph, node: TensorId, s: &[SplitState], max_bias: f32) -> Rule {
    if max_bias > 0.0 && matches!(s[0], SplitState::Split { axis: 2, .. }) {
        // ALiBi slopes depend on the global head index: compute whole.
        return mirrored_rule(s.len());
    }
    let mut r = row_rule(graph, node, &s[..s.len().min(2)]);
    if s.len() == 3 {
        let sinks = match &r.out {
            SplitState::Split { axis: 2, segments } => Want::State(SplitState::Split {
                axis: 0,
                segments: segments.clone(),
            }),
            SplitState::Split { .. } => return mirrored_rule(3),
            _ => Want::State(Mirrored),
        };
        r.srcs.push(sinks);
    }
    r
}

/// `rope`: splits of heads or tokens pass; positions follow a token split.
fn rope(graph: &Graph, node: TensorId, s: &[SplitState]) -> Rule {
    let t = graph.tensor(node);
    match &s[0] {
        st @ SplitState::Split { axis, segments } if *axis >= 1 => {
            // Positions run along axis 2 (tokens): they follow a token split.
            let pos = if *axis == 2 {
                Want::State(SplitState::Split {
                    axis: 0,
                    segments: segments.clone(),
                })
            } else {
                Want::State(Mirrored)
            };
            let mut srcs = vec![Want::AsIs, pos];
            if t.src.len() == 3 {
                srcs.push(Want::State(Mirrored));
            }
            Rule {
                srcs,
                out: st.clone(),
                once: false,
            }
        }
        _ => mirrored_rule(t.src.len()),
    }
}

/// `flash_attn_ext`: q, k and v split by heads in whole GQA groups give a head split of the result;
/// the mask and sinks follow.
fn flash_attn_ext(
    graph: &Graph,
    node: TensorId,
    s: &[SplitState],
    max_bias: f32,
) -> Result<Rule, RuleError> {
    let t = graph.tensor(node);
    let src = |i: usize| t.src[i];
    Ok(match (&s[0], &s[1], &s[2]) {
        (
            SplitState::Split {
                axis: 2,
                segments: sq,
            },
            k @ SplitState::Split {
                axis: 2,
                segments: sk,
            },
            v,
        ) if k == v => {
            if max_bias > 0.0 {
                // ALiBi slopes depend on the global head index: compute whole.
                return Ok(mirrored_rule(t.src.len()));
            }
            let (hq, hk) = (graph.layout(src(0)).ne[2], graph.layout(src(1)).ne[2]);
            if !slices_line_up(sq, sk, hq, hk) {
                return Err(err(
                    graph,
                    node,
                    s,
                    "query heads and KV heads are not split by whole GQA groups",
                ));
            }
            let mut srcs = vec![Want::AsIs, Want::AsIs, Want::AsIs];
            if t.src.len() >= 4 {
                let mask = src(3);
                srcs.push(if graph.layout(mask).ne[2] == 1 {
                    Want::State(Mirrored)
                } else {
                    Want::State(s[0].clone())
                });
            }
            if t.src.len() == 5 {
                srcs.push(Want::State(SplitState::Split {
                    axis: 0,
                    segments: sq.clone(),
                }));
            }
            Rule {
                srcs,
                out: SplitState::Split {
                    axis: 1,
                    segments: sq.clone(),
                },
                once: false,
            }
        }
        _ => mirrored_rule(t.src.len()),
    })
}

/// `gated_delta_net` over `[q, k, v, gates, state]`: value heads split by whole key heads (each
/// device holds the key heads its value heads read) give a head split of the result `[Dv, H, T + Dk]`
/// (its outputs, then its final state: see [`crate::layout`]). Grouped sharing needs one value
/// segment cut `ratio` heads per key head; tiled sharing (value head `h` reads key head `h % n_k`)
/// needs the value heads as `ratio` segments each cut like the key heads, so that every device's
/// value heads tile its own key heads. Anything else is computed whole.
fn gated_delta_net(graph: &Graph, node: TensorId, s: &[SplitState], heads: HeadShare) -> Rule {
    let split = |i: usize, ax: usize| match &s[i] {
        SplitState::Split { axis, segments } if *axis == ax => Some(segments),
        _ => None,
    };
    let (Some(sq), Some(sk), Some(sv), Some(sg), Some(ss)) = (
        split(0, 1),
        split(1, 1),
        split(2, 1),
        split(3, 0),
        split(4, 2),
    ) else {
        return mirrored_rule(s.len());
    };
    let t = graph.tensor(node);
    let (nk, nv) = (graph.layout(t.src[0]).ne[1], graph.layout(t.src[2]).ne[1]);
    let ratio = nv / nk.max(1);
    let keys_fit = sq == sk && sq.len() == 1;
    let values_fit = match heads {
        HeadShare::Grouped => {
            sv.len() == 1
                && sq[0]
                    .slices
                    .iter()
                    .zip(&sv[0].slices)
                    .all(|(&k, &v)| v == k * ratio)
        }
        HeadShare::Tiled => sv.len() == ratio && sv.iter().all(|seg| seg == &sq[0]),
    };
    if !(keys_fit && values_fit && sg == sv && ss == sv) {
        return mirrored_rule(s.len());
    }
    Rule {
        srcs: vec![Want::AsIs; 5],
        out: s[2].clone(),
        once: false,
    }
}

/// `get_rows`: a table split along axis 0 gives rows split alike.
fn get_rows(s: &[SplitState]) -> Rule {
    match &s[0] {
        st @ SplitState::Split { axis: 0, .. } => Rule {
            srcs: vec![Want::AsIs, Want::State(Mirrored)],
            out: st.clone(),
            once: false,
        },
        _ => mirrored_rule(2),
    }
}

/// `set_rows`: the written rows follow the destination's state (never partial, never split by rows).
fn set_rows(graph: &Graph, node: TensorId, s: &[SplitState]) -> Result<Rule, RuleError> {
    match &s[0] {
        Partial => Err(err(
            graph,
            node,
            s,
            "cannot write rows into a partial tensor",
        )),
        dst => {
            let wsrc = if let SplitState::Split { axis, .. } = dst {
                if *axis == 1 {
                    return Err(err(graph, node, s, "rows are the written axis"));
                } else {
                    Want::State(dst.clone())
                }
            } else {
                Want::State(Mirrored)
            };
            Ok(Rule {
                srcs: vec![Want::AsIs, wsrc, Want::State(Mirrored)],
                out: dst.clone(),
                once: false,
            })
        }
    }
}

/// `cpy`: the source takes the destination's state (never partial; a split one of the same shape).
fn cpy(graph: &Graph, node: TensorId, s: &[SplitState]) -> Result<Rule, RuleError> {
    let src = |i: usize| graph.tensor(node).src[i];
    match &s[1] {
        Partial => Err(err(graph, node, s, "cannot copy into a partial tensor")),
        SplitState::Split { .. } if graph.layout(src(0)).ne != graph.layout(src(1)).ne => Err(err(
            graph,
            node,
            s,
            "a reshaping copy into a split destination",
        )),
        dst => Ok(Rule {
            srcs: vec![Want::State(dst.clone()), Want::AsIs],
            out: dst.clone(),
            once: false,
        }),
    }
}

/// `concat`: two sources split alike along another axis than `dim` stay split.
fn concat(s: &[SplitState], dim: usize) -> Rule {
    match (&s[0], &s[1]) {
        (a @ SplitState::Split { axis, .. }, b) if a == b && *axis != dim => Rule {
            srcs: vec![Want::AsIs, Want::AsIs],
            out: a.clone(),
            once: false,
        },
        _ => mirrored_rule(2),
    }
}

/// Mirrored weights from this size up are multiplied by rows shared out over the devices (when the
/// activation is mirrored too): reading that much takes longer than the join that then gathers the
/// result's rows. Output heads (15 MiB and more even for SmolLM2-135M in Q4_0) are; MoE routers
/// (F32: 1 MiB for Qwen3-30B-A3B, 4 MiB for Qwen3-Next, 7.3 MiB for DeepSeek-V3) are not: their
/// rows would be gathered through host memory in every layer (on GPUs a synchronization each;
/// Qwen3-30B-A3B over two logical GPUs made 48 gathers a token).
const ROW_SPLIT_MIN_BYTES: usize = 8 << 20;

/// A split by rows for the weight of a product of a large mirrored weight with a mirrored
/// activation (a tied output head) on devices with `ratios`: each device multiplies its share of the
/// rows, in place of every device computing the whole product. The weight stays whole in memory;
/// devices read their rows through views.
pub(crate) fn row_split_of_mirrored_weight(
    graph: &Graph,
    node: TensorId,
    states: &[SplitState],
    ratios: &[f32],
) -> Result<Option<SplitState>, SplitError> {
    let tensor = graph.tensor(node);
    if ratios.len() == 1 || tensor.op != Op::MulMat || states.iter().any(|s| s != &Mirrored) {
        return Ok(None);
    }
    let weight = graph.tensor(tensor.src[0]);
    let [_, rows, d2, d3] = weight.ne();
    if !weight.is_leaf()
        || !weight.flags.weight
        || weight.nbytes() < ROW_SPLIT_MIN_BYTES
        || d2 * d3 != 1
    {
        return Ok(None);
    }
    let seg = crate::split::segment(rows, 1, ratios, 0)?;
    Ok(Some(SplitState::Split {
        axis: 1,
        segments: vec![seg],
    }))
}
