//! The graph: an arena of tensors with builder methods for every op, and the ordered list of nodes to
//! compute (`expand`, like ggml's `build_forward_expand`). Shape rules live in [`crate::op::Op::infer`];
//! layout ops (view, reshape, permute, transpose) are built here.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op::{GluOp, HeadShare, Op, RopeParams, SortOrder, UnaryOp};
use crate::tensor::{DataRef, Layout, Tensor, TensorFlags, TensorId, ViewOf};
use std::sync::atomic::{AtomicU64, Ordering};

/// An arena of tensors plus the ordered nodes to compute.
pub struct Graph {
    tensors: Vec<Tensor>,
    nodes: Vec<TensorId>,
    visited: Vec<bool>,
    stamp: GraphStamp,
}

/// One state of one graph: equal stamps mean the same graph object with no change in between (no
/// tensor, node, layout or data binding added or altered; the contents of the bound memory are not
/// tracked). Backends key caches of per-graph work (plans, hashes) on it. A clone has a stamp of
/// its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GraphStamp {
    graph: u64,
    revision: u64,
}

impl GraphStamp {
    fn fresh() -> GraphStamp {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        GraphStamp {
            graph: NEXT.fetch_add(1, Ordering::Relaxed),
            revision: 0,
        }
    }
}

impl Default for Graph {
    fn default() -> Self {
        Graph {
            tensors: Vec::new(),
            nodes: Vec::new(),
            visited: Vec::new(),
            stamp: GraphStamp::fresh(),
        }
    }
}

impl Clone for Graph {
    fn clone(&self) -> Self {
        Graph {
            tensors: self.tensors.clone(),
            nodes: self.nodes.clone(),
            visited: self.visited.clone(),
            stamp: GraphStamp::fresh(),
        }
    }
}

fn layout_err(op: &'static str, msg: String) -> Error {
    Error::Shape { op, msg }
}

impl Graph {
    pub fn new() -> Self {
        Graph::default()
    }

    pub fn tensor(&self, id: TensorId) -> &Tensor {
        &self.tensors[id.index()]
    }

    pub fn tensor_mut(&mut self, id: TensorId) -> &mut Tensor {
        self.changed();
        &mut self.tensors[id.index()]
    }

    /// The graph's current state (see [`GraphStamp`]).
    pub fn stamp(&self) -> GraphStamp {
        self.stamp
    }

    /// Moves the stamp on: called by every method that alters the graph.
    fn changed(&mut self) {
        self.stamp.revision += 1;
    }

    pub fn tensors(&self) -> &[Tensor] {
        &self.tensors
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    pub fn layout(&self, id: TensorId) -> &Layout {
        &self.tensors[id.index()].layout
    }

    /// Nodes to compute, in execution order (layout ops included; backends skip them).
    pub fn nodes(&self) -> &[TensorId] {
        &self.nodes
    }

    /// Adds `id` and everything it depends on to the nodes, sources first (once each).
    pub fn expand(&mut self, id: TensorId) {
        self.changed();
        self.visited.resize(self.tensors.len(), false);
        let mut stack = vec![(id, false)];
        while let Some((t, children_done)) = stack.pop() {
            if children_done {
                if !self.tensors[t.index()].is_leaf() {
                    self.nodes.push(t);
                }
                continue;
            }
            if self.visited[t.index()] {
                continue;
            }
            self.visited[t.index()] = true;
            stack.push((t, true));
            for &s in self.tensors[t.index()].src.iter().rev() {
                if !self.visited[s.index()] {
                    stack.push((s, false));
                }
            }
        }
    }

    /// Marks `id` as an output (its memory is kept) and expands it.
    pub fn output(&mut self, id: TensorId) {
        self.changed();
        self.tensors[id.index()].flags.output = true;
        self.expand(id);
    }

    /// The tensor that owns the memory of `id` (itself unless it is a view) and the byte offset into it.
    pub fn storage_of(&self, id: TensorId) -> ViewOf {
        self.tensors[id.index()].view.unwrap_or(ViewOf {
            root: id,
            offset: 0,
        })
    }

    /// The data of `id`, resolved through views.
    pub fn data(&self, id: TensorId) -> Result<DataRef> {
        let t = &self.tensors[id.index()];
        if let Some(d) = &t.data {
            return Ok(d.clone());
        }
        if let Some(v) = t.view {
            if let Some(d) = &self.tensors[v.root.index()].data {
                return Ok(d.advanced(v.offset));
            }
        }
        Err(Error::NoData(t.name.clone()))
    }

    /// Copies bytes into a tensor (contiguous tensors only), through its buffer.
    pub fn set_bytes(&self, id: TensorId, bytes: &[u8]) -> Result<()> {
        let t = self.tensor(id);
        if !t.is_contiguous() || bytes.len() != t.nbytes() {
            return Err(layout_err(
                "set",
                format!(
                    "{}: {} bytes for {:?} (contiguous: {})",
                    t.name,
                    bytes.len(),
                    t.ne(),
                    t.is_contiguous()
                ),
            ));
        }
        let d = self.data(id)?;
        d.buffer.set(d.offset, bytes)
    }

    /// Reads the bytes of a contiguous tensor.
    pub fn get_bytes(&self, id: TensorId) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.tensor(id).nbytes()];
        self.read_into(id, &mut out)?;
        Ok(out)
    }

    /// Reads a contiguous tensor into `out` (its size in bytes).
    fn read_into(&self, id: TensorId, out: &mut [u8]) -> Result<()> {
        let t = self.tensor(id);
        if !t.is_contiguous() {
            return Err(layout_err("get", format!("{} is not contiguous", t.name)));
        }
        let d = self.data(id)?;
        d.buffer.get(d.offset, out)
    }

    pub fn set_f32(&self, id: TensorId, values: &[f32]) -> Result<()> {
        self.set_bytes(id, bytemuck::cast_slice(values))
    }

    pub fn set_i32(&self, id: TensorId, values: &[i32]) -> Result<()> {
        self.set_bytes(id, bytemuck::cast_slice(values))
    }

    /// Writes every element of a contiguous F32 tensor with `write`: in the tensor's memory itself
    /// when its buffer is host memory (no copy), else in `scratch` (resized to the element count;
    /// kept by the caller across writes, so large inputs cost no fresh allocation), then copied in
    /// with [`Graph::set_f32`]. `write` gets the elements' previous values, which it must not read.
    /// Like [`Buffer::set`](crate::Buffer::set), the caller orders it with the computations that
    /// use the tensor.
    pub fn write_f32(
        &self,
        id: TensorId,
        scratch: &mut Vec<f32>,
        write: impl FnOnce(&mut [f32]),
    ) -> Result<()> {
        let t = self.tensor(id);
        if t.dtype() != DType::F32 || !t.is_contiguous() {
            return Err(layout_err(
                "write_f32",
                format!("{}: {} {:?}, not contiguous F32", t.name, t.dtype(), t.ne()),
            ));
        }
        let (n, d) = (t.nbytes() / 4, self.data(id)?);
        let host = d.host_ptr().filter(|p| p.align_offset(4) == 0);
        if let Some(ptr) = host {
            crate::backend::check_range(d.offset, t.nbytes(), d.buffer.size())?;
            // SAFETY: the range lies inside the host buffer (checked) and is aligned for f32; as for
            // `Buffer::set`, no other access to it runs while the caller writes (every f32 bit
            // pattern is a valid value).
            let values = unsafe { std::slice::from_raw_parts_mut(ptr.cast::<f32>(), n) };
            write(values);
            return Ok(());
        }
        scratch.resize(n, 0.0);
        write(scratch);
        self.set_f32(id, scratch)
    }

    /// Reads an F32 tensor.
    pub fn get_f32(&self, id: TensorId) -> Result<Vec<f32>> {
        let t = self.tensor(id);
        if t.dtype() != DType::F32 {
            return Err(Error::UnsupportedType {
                dtype: t.dtype(),
                what: "get_f32".into(),
            });
        }
        let mut out = vec![0f32; t.nbytes() / 4];
        self.read_into(id, bytemuck::cast_slice_mut(out.as_mut_slice()))?;
        Ok(out)
    }

    pub fn set_name(&mut self, id: TensorId, name: impl Into<String>) {
        self.changed();
        self.tensors[id.index()].name = name.into();
    }

    /// Appends a tensor as is (used by schedulers for cross-backend copies); not added to the nodes.
    pub fn push_tensor(&mut self, t: Tensor) -> TensorId {
        self.push(t)
    }

    fn push(&mut self, t: Tensor) -> TensorId {
        self.changed();
        let id = TensorId(self.tensors.len() as u32);
        self.tensors.push(t);
        id
    }

    fn check_id(&self, id: TensorId) -> Result<()> {
        if id.index() < self.tensors.len() {
            Ok(())
        } else {
            Err(Error::Other(format!(
                "tensor id {} is not in this graph",
                id.0
            )))
        }
    }

    // ---- leaves ----

    /// A new leaf tensor (input or weight) with a contiguous layout.
    pub fn new_tensor(&mut self, dtype: DType, ne: &[usize]) -> Result<TensorId> {
        if ne.is_empty() || ne.len() > 4 {
            return Err(layout_err("new_tensor", format!("{} dimensions", ne.len())));
        }
        let mut full = [1usize; 4];
        full[..ne.len()].copy_from_slice(ne);
        if !full[0].is_multiple_of(dtype.block_size()) {
            return Err(layout_err(
                "new_tensor",
                format!("rows of {} are not whole {dtype} blocks", full[0]),
            ));
        }
        full.iter()
            .try_fold(1usize, |acc, &n| acc.checked_mul(n))
            .ok_or_else(|| layout_err("new_tensor", format!("{full:?} overflows")))?;
        let id = self.push(Tensor {
            name: String::new(),
            layout: Layout::contiguous(dtype, full),
            op: Op::None,
            src: vec![],
            view: None,
            flags: TensorFlags::default(),
            data: None,
        });
        self.tensors[id.index()].name = format!("leaf_{}", id.0);
        Ok(id)
    }

    /// A leaf flagged as input.
    pub fn new_input(&mut self, dtype: DType, ne: &[usize]) -> Result<TensorId> {
        let id = self.new_tensor(dtype, ne)?;
        self.tensors[id.index()].flags.input = true;
        Ok(id)
    }

    /// A leaf bound to existing data (a weight or a cache), flagged as weight when `weight` is set.
    pub fn new_bound(
        &mut self,
        layout: Layout,
        data: DataRef,
        name: &str,
        weight: bool,
    ) -> TensorId {
        self.push(Tensor {
            name: name.to_string(),
            layout,
            op: Op::None,
            src: vec![],
            view: None,
            flags: TensorFlags {
                weight,
                ..Default::default()
            },
            data: Some(data),
        })
    }

    // ---- computed ops ----

    /// Adds a computed node after validating its sources through the op's shape rule.
    pub fn op(&mut self, op: Op, srcs: &[TensorId], out_type: Option<DType>) -> Result<TensorId> {
        for &s in srcs {
            self.check_id(s)?;
        }
        let layouts: Vec<&Layout> = srcs.iter().map(|s| self.layout(*s)).collect();
        let (dtype, ne) = op.infer(&layouts, out_type)?;
        let (layout, view) = if op.writes_in_place() {
            let dst = srcs[if op == Op::Cpy { 1 } else { 0 }];
            (*self.layout(dst), Some(self.storage_of(dst)))
        } else {
            (Layout::contiguous(dtype, ne), None)
        };
        let name = format!("{}_{}", op.name(), self.tensors.len());
        Ok(self.push(Tensor {
            name,
            layout,
            op,
            src: srcs.to_vec(),
            view,
            flags: TensorFlags::default(),
            data: None,
        }))
    }

    pub fn get_rows(&mut self, table: TensorId, ids: TensorId) -> Result<TensorId> {
        self.op(Op::GetRows, &[table, ids], None)
    }
    pub fn set_rows(&mut self, dst: TensorId, src: TensorId, ids: TensorId) -> Result<TensorId> {
        self.op(Op::SetRows, &[dst, src, ids], None)
    }
    pub fn mul_mat(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.op(Op::MulMat, &[a, b], None)
    }
    pub fn mul_mat_id(
        &mut self,
        experts: TensorId,
        b: TensorId,
        ids: TensorId,
    ) -> Result<TensorId> {
        self.op(Op::MulMatId, &[experts, b, ids], None)
    }
    pub fn add(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.op(Op::Add, &[a, b], None)
    }
    pub fn add_id(&mut self, a: TensorId, b: TensorId, ids: TensorId) -> Result<TensorId> {
        self.op(Op::AddId, &[a, b, ids], None)
    }
    pub fn sub(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.op(Op::Sub, &[a, b], None)
    }
    pub fn mul(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.op(Op::Mul, &[a, b], None)
    }
    pub fn div(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.op(Op::Div, &[a, b], None)
    }
    pub fn scale(&mut self, a: TensorId, scale: f32) -> Result<TensorId> {
        self.op(Op::Scale { scale, bias: 0.0 }, &[a], None)
    }
    pub fn scale_bias(&mut self, a: TensorId, scale: f32, bias: f32) -> Result<TensorId> {
        self.op(Op::Scale { scale, bias }, &[a], None)
    }
    pub fn clamp(&mut self, a: TensorId, min: f32, max: f32) -> Result<TensorId> {
        self.op(Op::Clamp { min, max }, &[a], None)
    }
    pub fn unary(&mut self, a: TensorId, u: UnaryOp) -> Result<TensorId> {
        self.op(Op::Unary(u), &[a], None)
    }
    pub fn sqr(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary(a, UnaryOp::Sqr)
    }
    pub fn sqrt(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary(a, UnaryOp::Sqrt)
    }
    pub fn silu(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary(a, UnaryOp::Silu)
    }
    pub fn gelu(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary(a, UnaryOp::Gelu)
    }
    /// `f(gate) * up` with separate gate and up tensors.
    pub fn glu(&mut self, op: GluOp, gate: TensorId, up: TensorId) -> Result<TensorId> {
        self.op(Op::Glu { op, swapped: false }, &[gate, up], None)
    }
    /// `f(gate) * up` with gate and up as the two halves of axis 0 (gate first unless `swapped`).
    pub fn glu_fused(&mut self, op: GluOp, a: TensorId, swapped: bool) -> Result<TensorId> {
        self.op(Op::Glu { op, swapped }, &[a], None)
    }
    pub fn rms_norm(&mut self, a: TensorId, eps: f32) -> Result<TensorId> {
        self.op(Op::RmsNorm { eps }, &[a], None)
    }
    pub fn norm(&mut self, a: TensorId, eps: f32) -> Result<TensorId> {
        self.op(Op::Norm { eps }, &[a], None)
    }
    pub fn rope(
        &mut self,
        a: TensorId,
        pos: TensorId,
        freq_factors: Option<TensorId>,
        p: RopeParams,
    ) -> Result<TensorId> {
        let mut srcs = vec![a, pos];
        srcs.extend(freq_factors);
        self.op(Op::Rope(p), &srcs, None)
    }
    pub fn soft_max(
        &mut self,
        a: TensorId,
        mask: Option<TensorId>,
        sinks: Option<TensorId>,
        scale: f32,
        max_bias: f32,
    ) -> Result<TensorId> {
        let srcs = optional_tail(a, &[], mask, sinks)?;
        self.op(Op::SoftMax { scale, max_bias }, &srcs, None)
    }
    #[allow(clippy::too_many_arguments)]
    pub fn flash_attn_ext(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        mask: Option<TensorId>,
        sinks: Option<TensorId>,
        scale: f32,
        max_bias: f32,
        softcap: f32,
    ) -> Result<TensorId> {
        let srcs = optional_tail(q, &[k, v], mask, sinks)?;
        self.op(
            Op::FlashAttnExt {
                scale,
                max_bias,
                softcap,
            },
            &srcs,
            None,
        )
    }
    pub fn concat(&mut self, a: TensorId, b: TensorId, dim: usize) -> Result<TensorId> {
        self.op(Op::Concat { dim }, &[a, b], None)
    }
    pub fn argsort(&mut self, a: TensorId, order: SortOrder) -> Result<TensorId> {
        self.op(Op::Argsort { order }, &[a], None)
    }
    pub fn top_k(&mut self, a: TensorId, k: usize) -> Result<TensorId> {
        self.op(Op::TopK { k }, &[a], None)
    }
    pub fn sum_rows(&mut self, a: TensorId) -> Result<TensorId> {
        self.op(Op::SumRows, &[a], None)
    }
    /// The gated delta rule ([`Op::GatedDeltaNet`]): `[q, k, v, gates, state]` in that order.
    pub fn gated_delta_net(&mut self, srcs: [TensorId; 5], heads: HeadShare) -> Result<TensorId> {
        self.op(Op::GatedDeltaNet { heads }, &srcs, None)
    }
    /// Copies `src` into `dst` (converting the type); the result aliases `dst`.
    pub fn cpy(&mut self, src: TensorId, dst: TensorId) -> Result<TensorId> {
        self.op(Op::Cpy, &[src, dst], None)
    }
    /// A contiguous copy of `a` in its own type.
    pub fn cont(&mut self, a: TensorId) -> Result<TensorId> {
        self.op(Op::Cont, &[a], None)
    }
    /// A contiguous copy of `a` converted to `dtype`.
    pub fn cast(&mut self, a: TensorId, dtype: DType) -> Result<TensorId> {
        self.op(Op::Cont, &[a], Some(dtype))
    }

    // ---- layout ops ----

    fn push_view(
        &mut self,
        src: TensorId,
        op: Op,
        layout: Layout,
        extra_offset: usize,
    ) -> Result<TensorId> {
        let base = self.storage_of(src);
        let name = format!("{}({})", op.name(), self.tensor(src).name);
        let view = ViewOf {
            root: base.root,
            offset: base.offset + extra_offset,
        };
        let root_bytes = self.tensor(base.root).nbytes();
        if view.offset + layout.nbytes() > root_bytes {
            return Err(layout_err(
                op.name(),
                format!(
                    "view of {} bytes at {} exceeds {} bytes of {}",
                    layout.nbytes(),
                    view.offset,
                    root_bytes,
                    self.tensor(base.root).name
                ),
            ));
        }
        let flags = TensorFlags {
            weight: self.tensor(src).flags.weight,
            ..Default::default()
        };
        Ok(self.push(Tensor {
            name,
            layout,
            op,
            src: vec![src],
            view: Some(view),
            flags,
            data: None,
        }))
    }

    /// A strided view: `ne` elements with byte strides `nb[1..]` (`nb[0]` is the element size) at `offset`.
    pub fn view(
        &mut self,
        src: TensorId,
        ne: &[usize],
        nb_rest: &[usize],
        offset: usize,
    ) -> Result<TensorId> {
        self.check_id(src)?;
        if ne.is_empty() || ne.len() > 4 || nb_rest.len() + 1 != ne.len() {
            return Err(layout_err(
                "view",
                format!("{} dims with {} strides", ne.len(), nb_rest.len()),
            ));
        }
        let dtype = self.tensor(src).dtype();
        let mut full = [1usize; 4];
        full[..ne.len()].copy_from_slice(ne);
        if !full[0].is_multiple_of(dtype.block_size()) {
            return Err(layout_err(
                "view",
                format!("rows of {} are not whole {dtype} blocks", full[0]),
            ));
        }
        let mut layout = Layout::contiguous(dtype, full);
        for (i, &s) in nb_rest.iter().enumerate() {
            layout.nb[i + 1] = s;
        }
        for d in ne.len()..4 {
            layout.nb[d] = layout.nb[d - 1] * full[d - 1].max(1);
        }
        self.push_view(src, Op::View { offset }, layout, offset)
    }

    /// Same bytes, new shape; the source must be contiguous.
    pub fn reshape(&mut self, src: TensorId, ne: &[usize]) -> Result<TensorId> {
        self.check_id(src)?;
        let t = self.tensor(src);
        if !t.is_contiguous() {
            return Err(layout_err(
                "reshape",
                format!("{} is not contiguous", t.name),
            ));
        }
        if ne.is_empty() || ne.len() > 4 {
            return Err(layout_err("reshape", format!("{} dimensions", ne.len())));
        }
        let mut full = [1usize; 4];
        full[..ne.len()].copy_from_slice(ne);
        if full.iter().product::<usize>() != t.nelements()
            || !full[0].is_multiple_of(t.dtype().block_size())
        {
            return Err(layout_err(
                "reshape",
                format!("{:?} into {:?}", t.ne(), full),
            ));
        }
        let layout = Layout::contiguous(t.dtype(), full);
        self.push_view(src, Op::Reshape, layout, 0)
    }

    /// Axis `i` of the source becomes axis `axes[i]` of the result.
    pub fn permute(&mut self, src: TensorId, axes: [usize; 4]) -> Result<TensorId> {
        self.check_id(src)?;
        let mut seen = [false; 4];
        for &a in &axes {
            if a > 3 || seen[a] {
                return Err(layout_err(
                    "permute",
                    format!("{axes:?} is not a permutation"),
                ));
            }
            seen[a] = true;
        }
        let t = self.tensor(src);
        if t.dtype().is_quantized() && axes[0] != 0 {
            return Err(layout_err(
                "permute",
                "axis 0 of a quantized tensor must stay".into(),
            ));
        }
        let mut layout = t.layout;
        for (i, &to) in axes.iter().enumerate() {
            layout.ne[to] = t.layout.ne[i];
            layout.nb[to] = t.layout.nb[i];
        }
        self.push_view(src, Op::Permute { axes }, layout, 0)
    }

    /// Swaps axes 0 and 1.
    pub fn transpose(&mut self, src: TensorId) -> Result<TensorId> {
        self.check_id(src)?;
        let t = self.tensor(src);
        if t.dtype().is_quantized() {
            return Err(layout_err(
                "transpose",
                "cannot transpose a quantized tensor".into(),
            ));
        }
        let mut layout = t.layout;
        layout.ne.swap(0, 1);
        layout.nb.swap(0, 1);
        self.push_view(src, Op::Transpose, layout, 0)
    }
}

fn optional_tail(
    first: TensorId,
    rest: &[TensorId],
    mask: Option<TensorId>,
    sinks: Option<TensorId>,
) -> Result<Vec<TensorId>> {
    let mut srcs = vec![first];
    srcs.extend_from_slice(rest);
    match (mask, sinks) {
        (Some(m), s) => {
            srcs.push(m);
            srcs.extend(s);
        }
        (None, Some(_)) => {
            return Err(layout_err(
                "attention",
                "sinks need a mask source slot; pass a mask".into(),
            ))
        }
        (None, None) => {}
    }
    Ok(srcs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamp_moves_on_every_change_and_clones_get_their_own() {
        let mut g = Graph::new();
        let a = g.new_input(DType::F32, &[4]).unwrap();
        let before = g.stamp();
        assert_eq!(g.stamp(), before, "reading changes nothing");
        let _ = g.layout(a);
        assert_eq!(g.stamp(), before);
        let s = g.silu(a).unwrap();
        let built = g.stamp();
        assert_ne!(built, before, "a new node");
        g.expand(s);
        let expanded = g.stamp();
        assert_ne!(expanded, built, "nodes changed");
        g.tensor_mut(a).flags.input = true;
        assert_ne!(g.stamp(), expanded, "mutable access");
        let c = g.clone();
        assert_ne!(c.stamp(), g.stamp(), "a clone is another graph");
        assert_ne!(Graph::new().stamp(), Graph::new().stamp());
    }
}
