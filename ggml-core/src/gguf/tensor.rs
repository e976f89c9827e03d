//! Tensor infos of a GGUF file and the shape checks shared by the reader and the writer.

use super::{GgufError, Result};
use crate::dtype::DType;

/// The most dims a GGUF tensor may have (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;

/// One tensor of a GGUF file.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorInfo {
    /// The tensor name (unique in the file).
    pub name: String,
    /// The element type.
    pub dtype: DType,
    /// Elements per dim in ggml order (`ne0` is the innermost, contiguous dim); 1 for dims past
    /// `n_dims`.
    pub shape: [u64; MAX_DIMS],
    /// Number of dims stored in the file (0..=4).
    pub n_dims: usize,
    /// Offset of the data, relative to the start of the data section; a multiple of the alignment.
    pub offset: u64,
    /// Bytes of data.
    pub size_bytes: usize,
}

impl TensorInfo {
    /// The dims stored in the file, `ne0` first.
    pub fn dims(&self) -> &[u64] {
        self.shape.get(..self.n_dims).unwrap_or(&self.shape)
    }

    /// Total number of elements (the product of the shape).
    pub fn n_elements(&self) -> u64 {
        self.shape
            .iter()
            .fold(1u64, |acc, &d| acc.saturating_mul(d))
    }
}

/// Checks the dims of a tensor of type `dtype` and returns its shape padded with 1s and its size in
/// bytes. Dims may be 0 (an empty tensor); each must fit `i64`, the element count must fit `i64`, the
/// size must fit `usize`, and `ne0` must be a whole number of blocks.
pub(crate) fn layout(name: &str, dtype: DType, dims: &[u64]) -> Result<([u64; MAX_DIMS], usize)> {
    let bad = |msg: String| GgufError::BadDims {
        name: name.to_string(),
        msg,
    };
    if dims.len() > MAX_DIMS {
        return Err(bad(format!(
            "{} dims, at most {MAX_DIMS} allowed",
            dims.len()
        )));
    }
    let mut shape = [1u64; MAX_DIMS];
    for (slot, &d) in shape.iter_mut().zip(dims) {
        if i64::try_from(d).is_err() {
            return Err(bad(format!("dim {d} does not fit i64")));
        }
        *slot = d;
    }
    let n_elements = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| i64::try_from(n).is_ok())
        .ok_or_else(|| bad(format!("element count of {shape:?} overflows i64")))?;
    let [ne0, ne1, ne2, ne3] = shape;
    let ne0 = usize::try_from(ne0).map_err(|_| bad(format!("ne0 {ne0} does not fit usize")))?;
    if !ne0.is_multiple_of(dtype.block_size()) {
        return Err(bad(format!(
            "ne0 {ne0} is not a multiple of the block size {} of {dtype}",
            dtype.block_size()
        )));
    }
    let overflow = || {
        bad(format!(
            "byte size of {n_elements} {dtype} elements overflows usize"
        ))
    };
    let row = dtype.row_size(ne0).ok_or_else(overflow)?;
    let size = [ne1, ne2, ne3]
        .iter()
        .try_fold(row, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?))
        .ok_or_else(overflow)?;
    Ok((shape, size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_checks_blocks_and_overflow() {
        let (shape, size) = layout("t", DType::F32, &[3, 2]).unwrap();
        assert_eq!(shape, [3, 2, 1, 1]);
        assert_eq!(size, 3 * 2 * 4);
        let (_, size) = layout("t", DType::Q8_0, &[64, 3]).unwrap();
        assert_eq!(size, 2 * 34 * 3);
        assert!(layout("t", DType::Q8_0, &[33]).is_err());
        assert!(layout("t", DType::F32, &[1, 2, 3, 4, 5]).is_err());
        assert!(layout("t", DType::F32, &[u64::MAX]).is_err());
        assert!(layout("t", DType::F32, &[1 << 32, 1 << 32]).is_err());
        assert!(layout("t", DType::F32, &[1 << 62]).is_err());
        assert_eq!(layout("t", DType::F16, &[0, 5]).unwrap().1, 0);
        assert_eq!(layout("t", DType::F16, &[]).unwrap(), ([1; 4], 2));
    }
}
