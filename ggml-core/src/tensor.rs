//! Tensor descriptors: element type, 4-D shape with byte strides, view relation, flags, data binding.
//! A `Tensor` lives inside a [`crate::graph::Graph`] and is addressed by its [`TensorId`].

use crate::backend::Buffer;
use crate::dtype::DType;
use crate::op::Op;
use std::sync::Arc;

/// Index of a tensor inside its graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(pub u32);

impl TensorId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Where a tensor's bytes live: a buffer and a byte offset into it.
#[derive(Clone)]
pub struct DataRef {
    pub buffer: Arc<dyn Buffer>,
    pub offset: usize,
}

impl DataRef {
    pub fn new(buffer: Arc<dyn Buffer>, offset: usize) -> Self {
        DataRef { buffer, offset }
    }

    /// The same buffer, `extra` bytes further.
    pub fn advanced(&self, extra: usize) -> DataRef {
        DataRef {
            buffer: self.buffer.clone(),
            offset: self.offset + extra,
        }
    }

    /// Host address of the first byte, if the buffer is host-accessible.
    pub fn host_ptr(&self) -> Option<*mut u8> {
        self.buffer.host_ptr().map(|p| p.wrapping_add(self.offset))
    }
}

impl std::fmt::Debug for DataRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DataRef({} @ {})", self.buffer.name(), self.offset)
    }
}

/// Tensor role flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TensorFlags {
    /// Filled by the caller before compute (token ids, positions, masks).
    pub input: bool,
    /// Read by the caller after compute; its memory is not reused.
    pub output: bool,
    /// A model weight: data bound at load time, never written by compute.
    pub weight: bool,
}

/// The tensor this one aliases: the root owner of the memory and a byte offset into it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ViewOf {
    pub root: TensorId,
    pub offset: usize,
}

/// Shape and byte strides of a tensor (ggml order: `ne[0]` is the innermost, contiguous dimension).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    pub dtype: DType,
    pub ne: [usize; 4],
    pub nb: [usize; 4],
}

impl Layout {
    /// A contiguous layout; `ne[0]` must be a whole number of blocks for quantized types.
    pub fn contiguous(dtype: DType, ne: [usize; 4]) -> Layout {
        let bs = dtype.block_size();
        let mut nb = [0usize; 4];
        nb[0] = dtype.type_size();
        nb[1] = nb[0] * (ne[0] / bs);
        nb[2] = nb[1] * ne[1];
        nb[3] = nb[2] * ne[2];
        Layout { dtype, ne, nb }
    }

    pub fn nelements(&self) -> usize {
        self.ne.iter().product()
    }

    pub fn nrows(&self) -> usize {
        self.ne[1] * self.ne[2] * self.ne[3]
    }

    /// Bytes of one contiguous row of `ne[0]` elements.
    pub fn row_bytes(&self) -> usize {
        self.ne[0] / self.dtype.block_size() * self.dtype.type_size()
    }

    /// Bytes spanned from the first to one past the last element (0 for an empty tensor).
    pub fn nbytes(&self) -> usize {
        if self.ne.contains(&0) {
            return 0;
        }
        if self.dtype.block_size() == 1 {
            let mut n = self.dtype.type_size();
            for d in 0..4 {
                n += (self.ne[d] - 1) * self.nb[d];
            }
            n
        } else {
            let mut n = self.row_bytes();
            for d in 1..4 {
                n += (self.ne[d] - 1) * self.nb[d];
            }
            n
        }
    }

    /// True when the elements are densely packed in ggml order (dimensions of size 1 may have any stride).
    pub fn is_contiguous(&self) -> bool {
        if self.nelements() == 0 {
            return true;
        }
        if self.ne[0] != 1 && self.nb[0] != self.dtype.type_size() {
            return false;
        }
        let mut expected = self.row_bytes();
        for d in 1..4 {
            if self.ne[d] != 1 && self.nb[d] != expected {
                return false;
            }
            expected *= self.ne[d];
        }
        true
    }

    /// True when rows are contiguous inside (`nb[0]` is the element size), whatever the row strides.
    pub fn rows_contiguous(&self) -> bool {
        self.nb[0] == self.dtype.type_size()
    }

    /// Byte offset of element (i0, i1, i2, i3) for scalar types, or of the block holding i0 for quantized ones.
    pub fn offset_of(&self, i: [usize; 4]) -> usize {
        (i[0] / self.dtype.block_size()) * self.nb[0]
            + i[1] * self.nb[1]
            + i[2] * self.nb[2]
            + i[3] * self.nb[3]
    }
}

/// A node or leaf of a graph.
#[derive(Clone, Debug)]
pub struct Tensor {
    pub name: String,
    pub layout: Layout,
    pub op: Op,
    pub src: Vec<TensorId>,
    pub view: Option<ViewOf>,
    pub flags: TensorFlags,
    pub data: Option<DataRef>,
}

impl Tensor {
    pub fn dtype(&self) -> DType {
        self.layout.dtype
    }
    pub fn ne(&self) -> [usize; 4] {
        self.layout.ne
    }
    pub fn nb(&self) -> [usize; 4] {
        self.layout.nb
    }
    pub fn nelements(&self) -> usize {
        self.layout.nelements()
    }
    pub fn nbytes(&self) -> usize {
        self.layout.nbytes()
    }
    pub fn is_contiguous(&self) -> bool {
        self.layout.is_contiguous()
    }
    /// True for tensors with no op (weights and inputs).
    pub fn is_leaf(&self) -> bool {
        matches!(self.op, Op::None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_layouts_and_sizes() {
        let l = Layout::contiguous(DType::F32, [3, 5, 7, 2]);
        assert_eq!(l.nb, [4, 12, 60, 420]);
        assert_eq!(l.nbytes(), 840);
        assert!(l.is_contiguous());
        let q = Layout::contiguous(DType::Q4_0, [64, 3, 1, 1]);
        assert_eq!(q.nb, [18, 36, 108, 108]);
        assert_eq!(q.nbytes(), 108);
        let mut t = l;
        t.ne.swap(0, 1);
        t.nb.swap(0, 1);
        assert!(!t.is_contiguous());
        assert_eq!(t.nbytes(), 840);
    }
}
