//! From graph nodes to shader dispatches: [`supports`] says which op/type combinations the shaders
//! handle, [`encode`] turns one node into a [`Dispatch`] (shader, tensors bound to slots, op
//! parameters, workgroup count). The per-family rules live in the submodules.

mod attention;
mod delta_net;
mod elementwise;
mod matrix;
mod rows;

use crate::pipeline::SLOTS;
use ggml_core::{DType, DataRef, Error, Graph, Layout, Op, Result, TensorId};

/// Threads per workgroup of every shader (`WG` in `common.glsl`).
pub const WG: usize = 64;
/// Op parameter words (from word 60 of a dispatch's parameters).
pub const OP_WORDS: usize = 36;

/// What the encoders need to know of the device that runs the shaders.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    /// The subgroup size, when the `fast` shaders (subgroup arithmetic) are in use.
    pub subgroup: Option<usize>,
    /// A CPU implementation of Vulkan (lavapipe), where barriers are costly.
    pub cpu: bool,
}

impl Target {
    /// Dot-product rows per workgroup of `matvec.comp`: one per subgroup, or one per workgroup.
    pub fn matvec_rows(&self) -> usize {
        self.subgroup.map_or(1, |s| WG / s.clamp(1, WG))
    }
}

/// One tensor bound to a slot: where its bytes are and its layout.
#[derive(Clone, Debug)]
pub struct Slot {
    pub data: DataRef,
    pub layout: Layout,
}

/// One shader invocation over a grid of `groups` workgroups.
#[derive(Clone, Debug)]
pub struct Dispatch {
    pub shader: &'static str,
    /// Slot 0 is the destination, then the sources (at most [`SLOTS`]).
    pub slots: Vec<Slot>,
    pub op: [u32; OP_WORDS],
    pub groups: usize,
}

/// What a family's `encode` returns: shader name, op parameter words, workgroups.
pub type Encoded = Result<(&'static str, [u32; OP_WORDS], usize)>;

/// The error of a family's `encode` called with an op of another family.
fn not_family(op: &Op, family: &str) -> Error {
    Error::Backend {
        backend: "vulkan".into(),
        msg: format!("{} is not a {family} op", op.name()),
    }
}

/// Op parameters from a list of words (`f32` values by their bits).
pub fn words(values: &[u32]) -> [u32; OP_WORDS] {
    let mut w = [0u32; OP_WORDS];
    w[..values.len()].copy_from_slice(values);
    w
}

/// Shader type code of `t` (`T_*` in `common.glsl`), for the types the shaders load.
pub fn type_code(t: DType) -> Option<u32> {
    Some(match t {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::BF16 => 2,
        DType::I32 => 3,
        DType::Q4_0 => 4,
        DType::Q8_0 => 5,
        DType::Q4_1 => 6,
        DType::Q5_0 => 7,
        DType::Q5_1 => 8,
        DType::Q4K => 9,
        DType::Q5K => 10,
        DType::Q6K => 11,
        DType::MXFP4 => 12,
        _ => return None,
    })
}

/// Types the shaders read as numbers (I32 excluded).
pub fn loadable(t: DType) -> bool {
    t != DType::I32 && type_code(t).is_some()
}

/// Byte alignment the shaders need for tensors of type `t` (offsets and strides).
pub fn alignment(t: DType) -> usize {
    match t {
        DType::F32 | DType::I32 => 4,
        DType::MXFP4 => 1,
        _ => 2,
    }
}

/// Scalar float types the shaders store.
pub fn float(t: DType) -> bool {
    matches!(t, DType::F32 | DType::F16 | DType::BF16)
}

/// Block types the quantizing shader writes.
pub fn quant_target(t: DType) -> bool {
    matches!(t, DType::Q8_0 | DType::Q4_0)
}

/// Workgroups for one invocation per item.
pub fn groups_for(items: usize) -> usize {
    items.div_ceil(WG)
}

/// True when the shaders compute `op` with these source and result layouts.
pub fn supports(op: &Op, src: &[&Layout], dst: &Layout) -> bool {
    if src.len() + 1 > SLOTS || !src.iter().all(|l| type_code(l.dtype).is_some()) {
        return false;
    }
    let t = |i: usize| src.get(i).map(|l| l.dtype);
    match op {
        Op::None | Op::View { .. } | Op::Reshape | Op::Permute { .. } | Op::Transpose => true,
        Op::MulMat | Op::MulMatId => matrix::supports(op, src, dst),
        Op::Rope(_) | Op::FlashAttnExt { .. } => attention::supports(op, src, dst),
        Op::RmsNorm { .. } | Op::Norm { .. } | Op::SumRows | Op::SoftMax { .. } => {
            t(0) == Some(DType::F32)
                && dst.dtype == DType::F32
                && src[1..].iter().all(|l| float(l.dtype))
        }
        Op::Argsort { .. } | Op::TopK { .. } => rows::supports_sort(src, dst),
        Op::GatedDeltaNet { .. } => delta_net::supports(src, dst),
        _ => elementwise::supports(op, src, dst),
    }
}

/// The slot of tensor `id`.
fn slot(graph: &Graph, id: TensorId) -> Result<Slot> {
    Ok(Slot {
        data: graph.data(id)?,
        layout: *graph.layout(id),
    })
}

/// The dispatch computing `node` on `target`: the result in slot 0, the sources from slot 1.
pub fn encode(graph: &Graph, node: TensorId, target: &Target) -> Result<Dispatch> {
    let t = graph.tensor(node);
    let mut slots = vec![slot(graph, node)?];
    for &s in &t.src {
        slots.push(slot(graph, s)?);
    }
    let src: Vec<&Layout> = slots[1..].iter().map(|s| &s.layout).collect();
    if !supports(&t.op, &src, &t.layout) {
        return Err(Error::UnsupportedOp {
            op: format!(
                "{} ({:?} -> {})",
                t.op.name(),
                src.iter().map(|l| l.dtype).collect::<Vec<_>>(),
                t.layout.dtype
            ),
            backend: "vulkan".into(),
        });
    }
    let (shader, op, groups) = match &t.op {
        Op::MulMat | Op::MulMatId => matrix::encode(&t.op, &slots, target),
        Op::Rope(_) | Op::FlashAttnExt { .. } => attention::encode(&t.op, &slots),
        Op::GatedDeltaNet { .. } => delta_net::encode(&t.op, &slots),
        Op::RmsNorm { .. }
        | Op::Norm { .. }
        | Op::SumRows
        | Op::SoftMax { .. }
        | Op::Argsort { .. }
        | Op::TopK { .. } => rows::encode(&t.op, &slots),
        op => elementwise::encode(op, &slots),
    }?;
    Ok(Dispatch {
        shader,
        slots,
        op,
        groups,
    })
}
