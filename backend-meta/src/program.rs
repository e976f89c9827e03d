//! Building a meta graph's program: per-device graphs with every tensor at slice size, cut into
//! stages at the points where partial sums must be reduced or split tensors gathered. Split states
//! come from the weights' declarations and flow through the ops by the rules in [`crate::rules`] and
//! [`crate::layout`]; each conversion a rule asks for is inserted here.

use crate::buffer::MetaBuffer;
use crate::device::MetaDevice;
use crate::layout::{carry, LocalLayout};
use crate::rules::{row_split_of_mirrored_weight, rule, Want};
use crate::split::SplitState;
use ggml_core::sched::Scheduler;
use ggml_core::{Backend, DataRef, Error, Graph, Layout, Op, Result, TensorId};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// A join between stages.
pub(crate) enum Boundary {
    /// Sum the partial `locals` in place (with `doubling` when the family has no communicator).
    Reduce {
        locals: Vec<TensorId>,
        doubling: Option<crate::doubling::Doubling>,
    },
    /// Assemble split `locals` into whole `targets` on every device.
    Gather {
        layout: Layout,
        state: SplitState,
        locals: Vec<TensorId>,
        targets: Vec<TensorId>,
    },
}

/// Nodes each device computes, then the joins that follow.
#[derive(Default)]
pub(crate) struct Stage {
    pub nodes: Vec<Vec<TensorId>>,
    pub after: Vec<Boundary>,
}

/// A meta graph output and where its parts are.
pub(crate) struct Output {
    pub meta: TensorId,
    pub state: SplitState,
    pub locals: Vec<TensorId>,
}

/// Everything needed to run one meta graph structure again.
pub(crate) struct Program {
    pub key: u64,
    pub graphs: Vec<Graph>,
    /// Compute-buffer bytes each device's share needs (the memory itself is the device scheduler's,
    /// shared by every program of the stream: one program runs at a time).
    pub compute_bytes: Vec<usize>,
    pub stages: Vec<Stage>,
    /// Meta inputs copied to devices that cannot read the arena: (meta tensor, local tensor per device).
    pub inputs: Vec<(TensorId, Vec<Option<TensorId>>)>,
    pub outputs: Vec<Output>,
    /// The program as a recording, once it has one ([`crate::record`]).
    pub recorded: parking_lot::Mutex<crate::record::Recorded>,
}

struct Builder<'a> {
    meta: &'a Graph,
    device: &'a MetaDevice,
    graphs: Vec<Graph>,
    state: HashMap<TensorId, SplitState>,
    local: HashMap<TensorId, Vec<TensorId>>,
    converted: HashMap<(TensorId, SplitState), Vec<TensorId>>,
    aliased: HashSet<TensorId>,
    stages: Vec<Stage>,
    inputs: Vec<(TensorId, Vec<Option<TensorId>>)>,
    keep: Vec<Vec<TensorId>>,
}

fn meta_err(msg: String) -> Error {
    Error::Other(format!("meta: {msg}"))
}

impl<'a> Builder<'a> {
    fn n(&self) -> usize {
        self.graphs.len()
    }

    fn stage(&mut self) -> &mut Stage {
        self.stages.last_mut().expect("at least one stage")
    }

    fn new_stage(&mut self) {
        let n = self.n();
        self.stages.push(Stage {
            nodes: vec![Vec::new(); n],
            after: Vec::new(),
        });
    }

    fn push_node(&mut self, d: usize, id: TensorId) {
        self.graphs[d].expand(id);
        self.stage().nodes[d].push(id);
    }

    fn state_of(&mut self, t: TensorId) -> Result<SplitState> {
        self.local_of(t)?;
        Ok(self.state[&t].clone())
    }

    /// Local tensors of meta tensor `t`, building leaves and layout ops on demand.
    fn local_of(&mut self, t: TensorId) -> Result<Vec<TensorId>> {
        if let Some(v) = self.local.get(&t) {
            return Ok(v.clone());
        }
        let tensor = self.meta.tensor(t);
        if tensor.is_leaf() {
            self.leaf(t)?;
        } else if tensor.op.is_view() {
            self.layout_op(t)?;
        } else {
            return Err(meta_err(format!(
                "{} is used before it is computed",
                tensor.name
            )));
        }
        Ok(self.local[&t].clone())
    }

    fn leaf(&mut self, t: TensorId) -> Result<()> {
        let tensor = self.meta.tensor(t);
        let data = tensor
            .data
            .clone()
            .ok_or_else(|| meta_err(format!("{} has no data", tensor.name)))?;
        let n = self.n();
        let mut locals = Vec::with_capacity(n);
        if let Some(mb) = data.buffer.as_any().downcast_ref::<MetaBuffer>() {
            if data.offset != 0 || mb.layout() != &tensor.layout {
                return Err(meta_err(format!(
                    "{} must cover its whole meta buffer",
                    tensor.name
                )));
            }
            for d in 0..n {
                let dr = DataRef::new(mb.parts()[d].clone(), 0);
                locals.push(self.graphs[d].new_bound(
                    mb.local_layout(d),
                    dr,
                    &tensor.name,
                    tensor.flags.weight,
                ));
            }
            self.state.insert(t, mb.state().clone());
        } else if data.buffer.host_ptr().is_some() {
            let mut copies = Vec::with_capacity(n);
            for d in 0..n {
                if self.device.devices()[d].can_access(data.buffer.as_ref()) {
                    locals.push(self.graphs[d].new_bound(
                        tensor.layout,
                        data.clone(),
                        &tensor.name,
                        tensor.flags.weight,
                    ));
                    copies.push(None);
                } else {
                    let id = self.graphs[d].new_input(tensor.dtype(), &tensor.ne())?;
                    locals.push(id);
                    copies.push(Some(id));
                }
            }
            if copies.iter().any(Option::is_some) {
                self.inputs.push((t, copies));
            }
            self.state.insert(t, SplitState::Mirrored);
            if let Some(axis) = self
                .device
                .input_split()
                .filter(|&a| tensor.flags.input && tensor.ne()[a] > 1)
            {
                let g = if axis == 0 {
                    tensor.dtype().block_size()
                } else {
                    1
                };
                if let Ok(seg) =
                    crate::split::segment(tensor.ne()[axis], g, self.device.ratios(), 0)
                {
                    let state = SplitState::Split {
                        axis,
                        segments: vec![seg],
                    };
                    locals = self.slice(&locals, &state)?;
                    self.state.insert(t, state);
                }
            }
        } else {
            return Err(meta_err(format!(
                "{} lives in {}, which the meta device cannot use",
                tensor.name,
                data.buffer.name()
            )));
        }
        self.local.insert(t, locals);
        Ok(())
    }

    fn layout_op(&mut self, t: TensorId) -> Result<()> {
        let tensor = self.meta.tensor(t).clone();
        let src = tensor.src[0];
        let mut ls = self.local_of(src)?;
        let st = self.state[&src].clone();
        let layouts: Vec<Layout> = (0..self.n())
            .map(|d| *self.graphs[d].layout(ls[d]))
            .collect();
        let carried = match carry(self.meta, t, &st, &layouts) {
            Ok(c) => c,
            // A layout the split cannot follow: work on a whole copy, unless the memory is persistent
            // (a split weight or cache), where writes through the view must reach the slices.
            Err(e) if !self.persistent(src) => {
                ls = self.convert(src, &SplitState::Mirrored)?;
                let layouts: Vec<Layout> = (0..self.n())
                    .map(|d| *self.graphs[d].layout(ls[d]))
                    .collect();
                carry(self.meta, t, &SplitState::Mirrored, &layouts)
                    .map_err(|_| meta_err(e.to_string()))?
            }
            Err(e) => return Err(meta_err(e.to_string())),
        };
        let mut locals = Vec::with_capacity(self.n());
        for (d, &lsd) in ls.iter().enumerate() {
            let g = &mut self.graphs[d];
            let id = match (&carried.locals[d], &tensor.op) {
                (LocalLayout::Same, Op::Permute { axes }) => g.permute(lsd, *axes)?,
                (LocalLayout::Same, Op::Transpose) => g.transpose(lsd)?,
                (LocalLayout::Same, Op::Reshape) => self.reshape(d, lsd, tensor.ne())?,
                (LocalLayout::Same, Op::View { offset }) => {
                    let nb = tensor.nb();
                    self.graphs[d].view(lsd, &tensor.ne(), &nb[1..], *offset)?
                }
                (LocalLayout::Reshape(ne), _) => self.reshape(d, lsd, *ne)?,
                (LocalLayout::View { ne, nb, offset }, _) => g.view(lsd, ne, nb, *offset)?,
                (LocalLayout::Same, op) => {
                    return Err(meta_err(format!("{} is not a layout op", op.name())))
                }
            };
            locals.push(id);
        }
        self.state.insert(t, carried.state);
        self.local.insert(t, locals);
        Ok(())
    }

    /// True when `t` views memory of a meta buffer (split weights and caches outlive the graph).
    fn persistent(&self, t: TensorId) -> bool {
        let root = self.meta.storage_of(t).root;
        self.meta
            .tensor(root)
            .data
            .as_ref()
            .is_some_and(|d| d.buffer.as_any().is::<MetaBuffer>())
    }

    fn reshape(&mut self, d: usize, src: TensorId, ne: [usize; 4]) -> Result<TensorId> {
        let src = self.contiguous(d, src)?;
        self.graphs[d].reshape(src, &ne)
    }

    fn contiguous(&mut self, d: usize, id: TensorId) -> Result<TensorId> {
        if self.graphs[d].layout(id).is_contiguous() {
            return Ok(id);
        }
        let c = self.graphs[d].cont(id)?;
        self.push_node(d, c);
        Ok(c)
    }

    /// Local tensors of `t` in state `want`, inserting joins and slices as needed.
    fn convert(&mut self, t: TensorId, want: &SplitState) -> Result<Vec<TensorId>> {
        let cur = self.state_of(t)?;
        if &cur == want {
            return self.local_of(t);
        }
        if let Some(v) = self.converted.get(&(t, want.clone())) {
            return Ok(v.clone());
        }
        let out = match (&cur, want) {
            // One device holds everything already: a partial sum or a split of one is whole.
            (SplitState::Partial | SplitState::Split { .. }, SplitState::Mirrored)
                if self.n() == 1 =>
            {
                self.local_of(t)?
            }
            (SplitState::Partial, SplitState::Mirrored) => self.reduce(t)?,
            (SplitState::Split { .. }, SplitState::Mirrored) => self.gather(t, &cur)?,
            (SplitState::Mirrored, SplitState::Split { .. }) => {
                let ls = self.local_of(t)?;
                self.slice(&ls, want)?
            }
            (_, SplitState::Split { .. }) => {
                let whole = self.convert(t, &SplitState::Mirrored)?;
                self.slice(&whole, want)?
            }
            _ => {
                return Err(meta_err(format!(
                    "cannot turn {} from {cur} into {want}",
                    self.meta.tensor(t).name
                )))
            }
        };
        self.converted.insert((t, want.clone()), out.clone());
        Ok(out)
    }

    fn reduce(&mut self, t: TensorId) -> Result<Vec<TensorId>> {
        let ls = self.local_of(t)?;
        let in_place = self.meta.tensor(t).view.is_none() && !self.aliased.contains(&t);
        let mut targets = Vec::with_capacity(self.n());
        for (d, &l) in ls.iter().enumerate() {
            let c = if in_place && self.graphs[d].layout(l).is_contiguous() {
                l
            } else {
                let c = self.graphs[d].cont(l)?;
                self.push_node(d, c);
                c
            };
            targets.push(c);
        }
        self.keep.push(targets.clone());
        self.stage().after.push(crate::program::Boundary::Reduce {
            locals: targets.clone(),
            doubling: None,
        });
        self.new_stage();
        if in_place {
            self.state.insert(t, SplitState::Mirrored);
        }
        Ok(targets)
    }

    fn gather(&mut self, t: TensorId, state: &SplitState) -> Result<Vec<TensorId>> {
        let ls = self.local_of(t)?;
        let layout = *self.meta.layout(t);
        let mut locals = Vec::new();
        let mut targets = Vec::new();
        for (d, &l) in ls.iter().enumerate() {
            locals.push(self.contiguous(d, l)?);
            // An input to the memory planner: written at the stage boundary, before its first
            // consumer, so its memory must not be shared with anything live before that consumer
            // (such as another input's local copy that a later stage still reads).
            targets.push(self.graphs[d].new_input(layout.dtype, &layout.ne)?);
        }
        self.keep.push(locals.clone());
        self.stage().after.push(Boundary::Gather {
            layout,
            state: state.clone(),
            locals,
            targets: targets.clone(),
        });
        self.new_stage();
        Ok(targets)
    }

    /// Each device's slice of whole local tensors, as views (and a concat for several segments).
    fn slice(&mut self, whole: &[TensorId], want: &SplitState) -> Result<Vec<TensorId>> {
        let SplitState::Split { axis, segments } = want else {
            unreachable!("slice to a split state")
        };
        let mut out = Vec::with_capacity(self.n());
        for (d, &w) in whole.iter().enumerate() {
            // Views keep axis 0 dense: slice a dense copy when the whole tensor is not.
            let w = if self.graphs[d].layout(w).rows_contiguous() {
                w
            } else {
                self.contiguous(d, w)?
            };
            let lay = *self.graphs[d].layout(w);
            let unit = if *axis == 0 {
                lay.dtype.block_size()
            } else {
                1
            };
            let mut pieces = Vec::new();
            let mut base = 0;
            for seg in segments {
                let len = seg.slices[d];
                if len > 0 {
                    let mut ne = lay.ne;
                    ne[*axis] = len;
                    let offset = (base + seg.start_of(d)) / unit * lay.nb[*axis];
                    pieces.push(self.graphs[d].view(w, &ne, &lay.nb[1..], offset)?);
                }
                base += seg.len;
            }
            if pieces.is_empty() {
                let mut ne = lay.ne;
                ne[*axis] = 0;
                pieces.push(self.graphs[d].view(w, &ne, &lay.nb[1..], 0)?);
            }
            let mut acc = pieces[0];
            for &p in &pieces[1..] {
                acc = self.graphs[d].concat(acc, p, *axis)?;
                self.push_node(d, acc);
            }
            out.push(acc);
        }
        Ok(out)
    }

    fn compute_op(&mut self, t: TensorId) -> Result<()> {
        let tensor = self.meta.tensor(t).clone();
        let states = tensor
            .src
            .iter()
            .map(|&s| self.state_of(s))
            .collect::<Result<Vec<_>>>()?;
        let mut states = states;
        let row_split = row_split_of_mirrored_weight(self.meta, t, &states, self.device.ratios())
            .map_err(|e| meta_err(e.to_string()))?;
        if let Some(split) = &row_split {
            states[0] = split.clone();
        }
        let mut r = rule(self.meta, t, &states).map_err(|e| meta_err(e.to_string()))?;
        if let Some(split) = row_split {
            r.srcs[0] = Want::State(split);
        }
        let mut srcs: Vec<Vec<TensorId>> = Vec::with_capacity(tensor.src.len());
        for (i, &s) in tensor.src.iter().enumerate() {
            srcs.push(match &r.srcs[i] {
                Want::AsIs => self.local_of(s)?,
                Want::State(w) => self.convert(s, w)?,
            });
        }
        let mut locals = Vec::with_capacity(self.n());
        for d in 0..self.n() {
            let ls: Vec<TensorId> = srcs.iter().map(|v| v[d]).collect();
            let op = match (&tensor.op, r.once && d != 0) {
                (Op::AddId, true) => {
                    locals.push(ls[0]);
                    continue;
                }
                (Op::Scale { scale, .. }, true) => Op::Scale {
                    scale: *scale,
                    bias: 0.0,
                },
                (op, true) => {
                    return Err(meta_err(format!("{} cannot apply a term once", op.name())))
                }
                (op, false) => op.clone(),
            };
            let out_type = matches!(op, Op::Cont).then(|| tensor.dtype());
            let id = self.graphs[d].op(op, &ls, out_type)?;
            let expect = r.out.local_shape(tensor.ne(), d);
            if self.graphs[d].layout(id).ne != expect {
                return Err(meta_err(format!(
                    "{} on device {d}: local shape {:?}, expected {:?} for {}",
                    tensor.name,
                    self.graphs[d].layout(id).ne,
                    expect,
                    r.out
                )));
            }
            self.push_node(d, id);
            locals.push(id);
        }
        self.state.insert(t, r.out);
        self.local.insert(t, locals);
        Ok(())
    }
}

/// Builds the program of `meta` computing `nodes` and places each device's share in the compute
/// memory of that device's scheduler (`scheds[d]`, one per backend).
pub(crate) fn build(
    meta: &Graph,
    nodes: &[TensorId],
    device: &MetaDevice,
    backends: &[Arc<dyn Backend>],
    scheds: &mut [Scheduler],
    key: u64,
    has_communicator: bool,
) -> Result<Program> {
    let n = backends.len();
    let aliased: HashSet<TensorId> = meta
        .tensors()
        .iter()
        .filter_map(|t| t.view.map(|v| v.root))
        .collect();
    let mut b = Builder {
        meta,
        device,
        graphs: (0..n).map(|_| Graph::new()).collect(),
        state: HashMap::new(),
        local: HashMap::new(),
        converted: HashMap::new(),
        aliased,
        stages: Vec::new(),
        inputs: Vec::new(),
        keep: Vec::new(),
    };
    b.new_stage();
    for &t in nodes {
        if !b.local.contains_key(&t) && !meta.tensor(t).is_leaf() {
            if meta.tensor(t).op.is_view() {
                b.layout_op(t)?;
            } else {
                b.compute_op(t)?;
            }
        }
    }
    let mut outputs = Vec::new();
    let flagged: Vec<TensorId> = (0..meta.len() as u32)
        .map(TensorId)
        .filter(|&t| meta.tensor(t).flags.output && !meta.tensor(t).is_leaf())
        .collect();
    for t in flagged {
        {
            let ls = b.local_of(t)?;
            let state = b.state[&t].clone();
            let locals = (0..n)
                .map(|d| b.contiguous(d, ls[d]))
                .collect::<Result<Vec<_>>>()?;
            b.keep.push(locals.clone());
            outputs.push(Output {
                meta: t,
                state,
                locals,
            });
        }
    }
    let mut graphs = std::mem::take(&mut b.graphs);
    for keep in &b.keep {
        for (d, &l) in keep.iter().enumerate() {
            let root = graphs[d].storage_of(l).root;
            graphs[d].tensor_mut(root).flags.output = true;
        }
    }
    let mut compute_bytes = Vec::with_capacity(n);
    for (g, s) in graphs.iter_mut().zip(scheds.iter_mut()) {
        s.alloc(g)?;
        compute_bytes.push(s.memory().iter().map(|m| m.planned).sum());
    }
    let mut stages = b.stages;
    if !has_communicator && n > 1 {
        let threshold = device.reduce_options().bf16_min_bytes;
        for stage in &mut stages {
            for boundary in &mut stage.after {
                if let Boundary::Reduce { locals, doubling } = boundary {
                    let own = locals
                        .iter()
                        .enumerate()
                        .map(|(d, &l)| graphs[d].data(l))
                        .collect::<Result<Vec<_>>>()?;
                    let layout = *graphs[0].layout(locals[0]);
                    *doubling = Some(crate::doubling::Doubling::new(
                        device.devices(),
                        backends,
                        own,
                        layout,
                        threshold,
                    )?);
                }
            }
        }
    }
    Ok(Program {
        key,
        graphs,
        compute_bytes,
        stages,
        inputs: b.inputs,
        outputs,
        recorded: Default::default(),
    })
}
