//! Weights in device memory: where each weight goes for a [`Placement`] (one device, a device per range
//! of layers, or sharded over a meta device with the split the architecture declares), and the copy from
//! the memory-mapped GGUF file into the device buffers.

use super::{limits, Placement};
use crate::error::ModelError;
use backend_meta::{MetaDevice, WeightSplit};
use ggml_core::gguf::{GgufFile, TensorInfo};
use ggml_core::{DType, DataRef, Device, Graph, Layout, TensorId};
use std::sync::Arc;

/// A weight (or cache) tensor bound to device memory.
#[derive(Clone, Debug)]
pub struct Weight {
    pub name: String,
    pub layout: Layout,
    pub data: DataRef,
}

impl Weight {
    /// A graph leaf bound to this weight's memory.
    pub fn bind(&self, g: &mut Graph) -> TensorId {
        g.new_bound(self.layout, self.data.clone(), &self.name, true)
    }

    pub fn dtype(&self) -> DType {
        self.layout.dtype
    }

    pub fn ne(&self) -> [usize; 4] {
        self.layout.ne
    }
}

/// Which device of a layer split holds a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Home {
    /// The device of layer `l`; also the rotation of the remainder of tensor splits.
    Layer(usize),
    /// The device of layer `layer`, with tensor splits rotated like those of layer `like` (a layer
    /// that attends to another layer's KV cache cuts its heads as that layer does).
    LayerLike { layer: usize, like: usize },
    /// The first device (embeddings).
    First,
    /// The last device (output norm and head).
    Last,
}

/// Allocates tensors for a placement.
pub struct Alloc<'a> {
    pub placement: &'a Placement,
    /// Device index of each layer (layer split), else all 0.
    pub layer_device: &'a [usize],
}

/// Where a tensor at some [`Home`] goes: one device, or the meta device with the rotation of its
/// split's remainders.
enum Target<'b> {
    Device(&'b Arc<dyn Device>),
    Meta(&'b MetaDevice, usize),
}

impl Alloc<'_> {
    fn target(&self, home: Home) -> Target<'_> {
        match self.placement {
            Placement::Single(dev) => Target::Device(dev),
            Placement::Layers { devices, .. } => Target::Device(match home {
                Home::Layer(l) | Home::LayerLike { layer: l, .. } => &devices[self.layer_device[l]],
                Home::First => &devices[0],
                Home::Last => &devices[devices.len() - 1],
            }),
            Placement::Tensor(meta) => Target::Meta(
                meta,
                match home {
                    Home::Layer(l) | Home::LayerLike { like: l, .. } => l,
                    _ => 0,
                },
            ),
        }
    }

    /// The type the devices at `home` keep a weight of `layout` (split as `split`) in: the file's,
    /// or a faster layout of the same values ([`Device::weight_dtype`]).
    pub fn weight_dtype(
        &self,
        name: &str,
        layout: &Layout,
        split: &WeightSplit,
        home: Home,
    ) -> Result<DType, ModelError> {
        Ok(match self.target(home) {
            Target::Device(dev) => dev.weight_dtype(layout.dtype, layout.ne[0]),
            Target::Meta(meta, rotate) => meta.split_weight_dtype(layout, split, rotate, name)?,
        })
    }

    /// Allocates memory for `layout` at `home`, split as `split` on a meta device.
    pub fn alloc(
        &self,
        name: &str,
        layout: Layout,
        split: &WeightSplit,
        home: Home,
    ) -> Result<DataRef, ModelError> {
        let buffer: Arc<dyn ggml_core::Buffer> = match self.target(home) {
            Target::Device(dev) => dev.buffer_type().alloc(layout.nbytes())?,
            Target::Meta(meta, rotate) => meta.alloc_tensor(layout, split, rotate, name)?,
        };
        Ok(DataRef::new(buffer, 0))
    }
}

/// Reads named tensors from a GGUF file into device memory.
pub struct Loader<'a> {
    pub file: &'a GgufFile,
    pub alloc: Alloc<'a>,
}

fn shape_of(info: &TensorInfo) -> [usize; 4] {
    info.shape.map(|d| d as usize)
}

impl Loader<'_> {
    /// True when weights are sharded (splits matter).
    pub fn tensor_parallel(&self) -> bool {
        matches!(self.alloc.placement, Placement::Tensor(_))
    }

    /// Type and shape of a tensor of the file, if present.
    pub fn info(&self, name: &str) -> Option<(DType, [usize; 4])> {
        self.file.tensor(name).map(|i| (i.dtype, shape_of(i)))
    }

    /// Loads `name`, checking its shape against `ne` (trailing 1s may be left out).
    pub fn get(
        &self,
        name: &str,
        ne: &[usize],
        split: WeightSplit,
        home: Home,
    ) -> Result<Weight, ModelError> {
        self.opt(name, ne, split, home)?
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))
    }

    /// Loads `name` if the file has it.
    pub fn opt(
        &self,
        name: &str,
        ne: &[usize],
        split: WeightSplit,
        home: Home,
    ) -> Result<Option<Weight>, ModelError> {
        let Some((layout, bytes)) = self.checked(name, ne)? else {
            return Ok(None);
        };
        self.upload(name, layout, bytes, split, home).map(Some)
    }

    /// Loads, of every group of `group` rows (axis 1) of the 2-D tensor `name` of shape `ne`, the
    /// `len` rows from `start`: e.g. the query or the gate part of every head of a projection that
    /// yields both per head.
    #[allow(clippy::too_many_arguments)]
    pub fn get_row_groups(
        &self,
        name: &str,
        ne: [usize; 2],
        group: usize,
        start: usize,
        len: usize,
        split: WeightSplit,
        home: Home,
    ) -> Result<Weight, ModelError> {
        let (layout, bytes) = self
            .checked(name, &ne)?
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        if group == 0 || !ne[1].is_multiple_of(group) || start + len > group {
            return Err(ModelError::BadTensor {
                name: name.to_string(),
                msg: format!(
                    "rows {start}..{} of groups of {group} in {ne:?}",
                    start + len
                ),
            });
        }
        let row = layout.nb[1];
        let picked: Vec<u8> = bytes
            .chunks_exact(group * row)
            .flat_map(|g| &g[start * row..(start + len) * row])
            .copied()
            .collect();
        let part = format!("{name}[{start}..{} of {group}]", start + len);
        let layout = limits::layout(&part, layout.dtype, [ne[0], ne[1] / group * len, 1, 1])?;
        self.upload(&part, layout, &picked, split, home)
    }

    /// The layout and bytes of `name`, its shape checked against `ne` (trailing 1s may be left out).
    fn checked(&self, name: &str, ne: &[usize]) -> Result<Option<(Layout, &[u8])>, ModelError> {
        let Some(info) = self.file.tensor(name) else {
            return Ok(None);
        };
        let mut want = [1usize; 4];
        want[..ne.len()].copy_from_slice(ne);
        let got = shape_of(info);
        if got != want {
            return Err(ModelError::BadTensor {
                name: name.to_string(),
                msg: format!("shape {got:?}, expected {want:?}"),
            });
        }
        let layout = Layout::contiguous(info.dtype, got);
        let bytes = self.file.tensor_data(info);
        if bytes.len() != layout.nbytes() {
            return Err(ModelError::BadTensor {
                name: name.to_string(),
                msg: format!(
                    "{} bytes of data, {} expected",
                    bytes.len(),
                    layout.nbytes()
                ),
            });
        }
        Ok(Some((layout, bytes)))
    }

    /// Copies `bytes` of `layout` into device memory allocated for `split` at `home`.
    fn upload(
        &self,
        name: &str,
        layout: Layout,
        bytes: &[u8],
        split: WeightSplit,
        home: Home,
    ) -> Result<Weight, ModelError> {
        let split = if self.tensor_parallel() {
            split
        } else {
            WeightSplit::Mirrored
        };
        let dtype = self.alloc.weight_dtype(name, &layout, &split, home)?;
        let regrouped;
        let (layout, bytes) = if dtype == layout.dtype {
            (layout, bytes)
        } else {
            regrouped = regroup(layout.dtype, dtype, bytes)?;
            (limits::layout(name, dtype, layout.ne)?, &regrouped[..])
        };
        let data = self.alloc.alloc(name, layout, &split, home)?;
        data.buffer.set(data.offset, bytes)?;
        Ok(Weight {
            name: name.to_string(),
            layout,
            data,
        })
    }
}

/// `bytes` of `base` (whole groups) in the regrouped layout `grouped`, regrouped in parallel
/// pieces of whole groups (a Q8_0 8B model: 8 GB through one thread took 5 s).
fn regroup(base: DType, grouped: DType, bytes: &[u8]) -> Result<Vec<u8>, ModelError> {
    use rayon::prelude::*;
    /// Groups per piece.
    const GROUPS: usize = 256;
    let piece = GROUPS * grouped.type_size();
    let mut out = vec![0u8; bytes.len()];
    out.par_chunks_mut(piece)
        .zip(bytes.par_chunks(piece))
        .try_for_each(|(d, s)| ggml_core::quant::regroup_into(base, s, d))?;
    Ok(out)
}
