//! Layout ops on the meta device: how view, reshape, permute and transpose carry a source's split
//! state to their result, and the parameters of the matching view on each device's slice. One view
//! is op-aware: the final state of a head-split gated delta rule, which each device finds after its
//! own output rows.

use crate::split::{Segment, SplitState};
use ggml_core::{Graph, Layout, Op, TensorId};

/// Why a layout op cannot carry a split.
#[derive(Debug, Clone, thiserror::Error)]
#[error("no split rule for {op} ({name}) of a {state} source: {why}")]
pub struct LayoutError {
    pub op: String,
    pub name: String,
    pub state: String,
    pub why: String,
}

/// How device `d` builds its part of a layout op.
#[derive(Clone, Debug, PartialEq)]
pub enum LocalLayout {
    /// The same op with the same parameters (mirrored and partial sources, permute, transpose).
    Same,
    /// A reshape to this local shape.
    Reshape([usize; 4]),
    /// A view with these local shape, strides (`nb[1..]`) and byte offset relative to the local source.
    View {
        ne: [usize; 4],
        nb: [usize; 3],
        offset: usize,
    },
}

/// A layout op's result state plus, per device, how to build it.
pub struct Carried {
    pub state: SplitState,
    pub locals: Vec<LocalLayout>,
}

fn lerr(graph: &Graph, node: TensorId, state: &SplitState, why: impl Into<String>) -> LayoutError {
    let t = graph.tensor(node);
    LayoutError {
        op: t.op.name().into(),
        name: t.name.clone(),
        state: state.to_string(),
        why: why.into(),
    }
}

/// Carries `src_state` through the layout op `node` for `n` devices; `local_src` gives each device's
/// layout of the source.
pub fn carry(
    graph: &Graph,
    node: TensorId,
    src_state: &SplitState,
    local_src: &[Layout],
) -> Result<Carried, LayoutError> {
    let n = local_src.len();
    let t = graph.tensor(node);
    let same = |state: SplitState| Carried {
        state,
        locals: vec![LocalLayout::Same; n],
    };
    let SplitState::Split { axis, segments } = src_state else {
        return Ok(same(src_state.clone()));
    };
    let src = graph.layout(t.src[0]);
    match &t.op {
        Op::Permute { axes } => Ok(same(SplitState::Split {
            axis: axes[*axis],
            segments: segments.clone(),
        })),
        Op::Transpose => Ok(same(SplitState::Split {
            axis: [1, 0, 2, 3][*axis],
            segments: segments.clone(),
        })),
        Op::Reshape => {
            let out = &t.layout;
            let inner: usize = src.ne[..*axis].iter().product();
            let span = inner * src.ne[*axis];
            let mut found = None;
            for a in 0..4 {
                let inner2: usize = out.ne[..a].iter().product();
                if inner2 * out.ne[a] == span && out.ne[a] > 1 {
                    found = Some((a, inner2));
                }
            }
            let Some((a, inner2)) = found else {
                return Err(lerr(
                    graph,
                    node,
                    src_state,
                    "the split axis does not survive the reshape",
                ));
            };
            let mut segs = Vec::new();
            for s in segments {
                let conv = |x: usize| {
                    (x * inner)
                        .is_multiple_of(inner2)
                        .then_some(x * inner / inner2)
                };
                let len = conv(s.len).ok_or_else(|| {
                    lerr(
                        graph,
                        node,
                        src_state,
                        "segment not whole along the new axis",
                    )
                })?;
                let slices = s
                    .slices
                    .iter()
                    .map(|&x| conv(x))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| {
                        lerr(graph, node, src_state, "slice not whole along the new axis")
                    })?;
                segs.push(Segment { len, slices });
            }
            let state = SplitState::Split {
                axis: a,
                segments: segs,
            };
            let locals = (0..n)
                .map(|d| LocalLayout::Reshape(state.local_shape(out.ne, d)))
                .collect();
            Ok(Carried { state, locals })
        }
        Op::View { offset } => match delta_net_state_rows(graph, node, *axis, *offset) {
            Some((outputs, dk)) => Ok(delta_net_state(segments, local_src, outputs, dk)),
            None => view(graph, node, src, *axis, segments, *offset, local_src)
                .map_err(|why| lerr(graph, node, src_state, why)),
        },
        _ => Err(lerr(graph, node, src_state, "not a layout op")),
    }
}

/// When `node` views the final state of a head-split [`Op::GatedDeltaNet`] result `[Dv, H, T + Dk]`
/// (the `Dk·Dv·H` elements after the `T` output rows, whole and contiguous in the state's own layout
/// `[Dk, Dv, H]`, heads outermost, so that each device's part holds its heads' states): `T` and `Dk`.
fn delta_net_state_rows(
    graph: &Graph,
    node: TensorId,
    axis: usize,
    offset: usize,
) -> Option<(usize, usize)> {
    let t = graph.tensor(node);
    let src = graph.tensor(t.src[0]);
    if !matches!(src.op, Op::GatedDeltaNet { .. }) || axis != 1 {
        return None;
    }
    let state = graph.layout(src.src[4]);
    let dk = state.ne[0];
    let outputs = src.ne()[2].checked_sub(dk)?;
    let whole = t.layout.ne == state.ne && t.layout.is_contiguous();
    (whole && offset == outputs * src.nb()[2]).then_some((outputs, dk))
}

/// Device by device, the part of a head-split delta-net result's final state (`outputs` rows in,
/// `dk` rows long): the states of the device's heads after its own output rows.
fn delta_net_state(
    segments: &[Segment],
    local_src: &[Layout],
    outputs: usize,
    dk: usize,
) -> Carried {
    let locals = local_src
        .iter()
        .map(|ls| {
            let [dv, h, _, _] = ls.ne;
            let elem = ls.nb[0];
            LocalLayout::View {
                ne: [dk, dv, h, 1],
                nb: [dk * elem, dk * dv * elem, dk * dv * h * elem],
                // An empty slice (a device with no head) reads nothing: keep its view at the start.
                offset: if h == 0 { 0 } else { outputs * ls.nb[2] },
            }
        })
        .collect();
    Carried {
        state: SplitState::Split {
            axis: 2,
            segments: segments.to_vec(),
        },
        locals,
    }
}

/// A view whose axes are axes of its source (same strides): it may restrict non-split axes freely and
/// the split axis to whole segments.
fn view(
    graph: &Graph,
    node: TensorId,
    src: &Layout,
    axis: usize,
    segments: &[Segment],
    offset: usize,
    local_src: &[Layout],
) -> Result<Carried, String> {
    let out = graph.layout(node);
    let bs = src.dtype.block_size();
    // Map each view axis of extent > 1 to the source axis with the same stride.
    let mut map = [None; 4];
    for k in 0..4 {
        if out.ne[k] > 1 || k == 0 {
            let m = (0..4).find(|&m| {
                src.nb[m] == out.nb[k] && (src.ne[m] > 1 || m == k) && !map.contains(&Some(m))
            });
            match m {
                Some(m) => map[k] = Some(m),
                None => {
                    return Err(format!(
                        "view axis {k} (stride {}) is not an axis of the source",
                        out.nb[k]
                    ))
                }
            }
        }
    }
    if map[0] != Some(0) {
        return Err("view axis 0 must be source axis 0".into());
    }
    // Start index of the view on every source axis.
    let mut order: Vec<usize> = (0..4).filter(|&m| src.ne[m] > 1).collect();
    order.sort_by(|&a, &b| src.nb[b].cmp(&src.nb[a]));
    let mut start = [0usize; 4];
    let mut rest = offset;
    for &m in &order {
        start[m] = rest / src.nb[m];
        rest %= src.nb[m];
    }
    if rest != 0 {
        return Err(format!("offset {offset} is not on an element boundary"));
    }
    start[0] *= bs;
    let k_split = (0..4).find(|&k| map[k] == Some(axis));
    let Some(k) = k_split else {
        return Err("the view picks one index of the split axis (it lives on one device)".into());
    };
    // The view's range on the split axis must be whole segments.
    let (lo, hi) = (start[axis], start[axis] + out.ne[k]);
    let mut pos = 0;
    let (mut first, mut last) = (None, None);
    for (i, s) in segments.iter().enumerate() {
        if pos == lo {
            first = Some(i);
        }
        pos += s.len;
        if pos == hi {
            last = Some(i);
        }
    }
    let (Some(first), Some(last)) = (first, last) else {
        return Err(format!(
            "range {lo}..{hi} of the split axis is not made of whole segments"
        ));
    };
    let kept: Vec<Segment> = segments[first..=last].to_vec();
    let state = SplitState::Split {
        axis: k,
        segments: kept.clone(),
    };
    let unit = |m: usize| if m == 0 { bs } else { 1 };
    let locals = (0..local_src.len())
        .map(|d| {
            let ls = &local_src[d];
            let local_start: usize = segments[..first].iter().map(|s| s.slices[d]).sum();
            let mut ne = out.ne;
            ne[k] = kept.iter().map(|s| s.slices[d]).sum();
            let mut nb = [0usize; 3];
            for j in 1..4 {
                nb[j - 1] = match map[j] {
                    Some(m) => ls.nb[m],
                    None => out.nb[j],
                };
            }
            let mut off = 0;
            // An empty slice (a device with no share) reads nothing: keep its view at the start.
            if !ne.contains(&0) {
                for (m, &s) in start.iter().enumerate() {
                    let idx = if m == axis { local_start } else { s };
                    off += idx / unit(m) * ls.nb[m];
                }
            }
            LocalLayout::View {
                ne,
                nb,
                offset: off,
            }
        })
        .collect();
    Ok(Carried { state, locals })
}
