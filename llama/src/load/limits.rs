//! The bounds of every count and size a model file or the caller gives the runtime (layers, heads,
//! head sizes, widths, experts, vocabulary, context, windows, delta-net sizes), in one place, and
//! the checked arithmetic that turns them into products and tensor layouts. Each bound lies far
//! above any published model yet keeps the products the runtime forms (a weight's elements, a
//! cache's bytes) well inside `usize`; a value outside its bound is a [`ModelError::OutOfRange`]
//! naming the key, before anything is allocated from it.

use crate::error::ModelError;
use ggml_core::{DType, Layout};

/// The inclusive range a count or size must lie in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bound {
    pub min: usize,
    pub max: usize,
}

impl Bound {
    const fn new(min: usize, max: usize) -> Bound {
        Bound { min, max }
    }

    /// The bound with 0 allowed too (a count whose 0 means "none").
    pub const fn or_zero(self) -> Bound {
        Bound::new(0, self.max)
    }

    /// `value` if it lies in the bound, else an error naming `key`.
    pub fn check(self, key: &str, value: usize) -> Result<usize, ModelError> {
        if (self.min..=self.max).contains(&value) {
            Ok(value)
        } else {
            Err(self.out_of_range(key, value as u128))
        }
    }

    /// `value` (an integer of the file, of any width) if it lies in the bound, else an error naming
    /// `key`.
    pub fn check_wide(self, key: &str, value: u128) -> Result<usize, ModelError> {
        match usize::try_from(value) {
            Ok(v) => self.check(key, v),
            Err(_) => Err(self.out_of_range(key, value)),
        }
    }

    /// The error of `value` (perhaps a product past `usize`) outside the bound.
    pub fn out_of_range(self, key: &str, value: u128) -> ModelError {
        ModelError::OutOfRange {
            key: key.to_string(),
            value,
            min: self.min,
            max: self.max,
        }
    }
}

/// Layers (`block_count`).
pub const LAYERS: Bound = Bound::new(1, 4096);
/// Query, KV and delta-net heads.
pub const HEADS: Bound = Bound::new(1, 1 << 16);
/// Per-head sizes of queries, keys and values, and the delta-net state size.
pub const HEAD_DIM: Bound = Bound::new(1, 1 << 16);
/// Rotated dimensions per head (at most the head size, checked where both are known).
pub const ROPE_DIMS: Bound = Bound::new(0, 1 << 16);
/// The model width and the width of per-layer inputs.
pub const EMBD: Bound = Bound::new(1, 1 << 20);
/// Feed-forward widths, dense and per expert (0: none).
pub const FF: Bound = Bound::new(0, 1 << 22);
/// Experts of a mixture-of-experts layer.
pub const EXPERTS: Bound = Bound::new(1, 1 << 16);
/// Vocabulary (rows of the embedding table).
pub const VOCAB: Bound = Bound::new(1, 1 << 24);
/// Context lengths: the trained one, the original one of a scaled rotary embedding, a cache's.
pub const CONTEXT: Bound = Bound::new(1, 1 << 24);
/// Sliding-window size (0: none).
pub const WINDOW: Bound = Bound::new(0, 1 << 24);
/// Layer periods (`sliding_window_pattern`, `full_attention_interval`); 0 where the key allows it.
pub const PERIOD: Bound = Bound::new(0, LAYERS.max);
/// Length of the delta-net causal convolution.
pub const CONV_KERNEL: Bound = Bound::new(2, 1 << 10);
/// Rotary-embedding section lengths (M-RoPE).
pub const ROPE_SECTION: Bound = Bound::new(0, 1 << 16);
/// Sequences of one KV cache.
pub const SEQUENCES: Bound = Bound::new(1, 1 << 16);
/// Threads of a run (0: all cores), as the command line takes them.
pub const THREADS: Bound = Bound::new(0, 4096);
/// Virtual CPU devices of a run, as the command line takes them.
pub const CPU_DEVICES: Bound = Bound::new(1, 256);
/// Rows of one tensor layout the model builds (`head_dim · n_heads`, a per-layer table's width, a
/// cache's rows of every sequence): far above any real model, and small enough that a layout of a
/// few such dimensions cannot overflow.
pub const ROWS: Bound = Bound::new(0, 1 << 32);

/// `a · b`, checked against `bound`; `key` names what the product is.
pub fn product(key: &str, a: usize, b: usize, bound: Bound) -> Result<usize, ModelError> {
    bound.check_wide(key, (a as u128) * (b as u128))
}

/// The contiguous layout of a tensor the model builds (`name`: a cache, a state, a part of a
/// weight), its byte size computed with checked arithmetic so that it is valid in release builds.
pub fn layout(name: &str, dtype: DType, ne: [usize; 4]) -> Result<Layout, ModelError> {
    let too_large = || ModelError::TooLarge(format!("{name}: {ne:?} {dtype} elements"));
    if !ne[0].is_multiple_of(dtype.block_size()) {
        return Err(ModelError::Unsupported(format!(
            "{name}: rows of {} are not whole {dtype} blocks",
            ne[0]
        )));
    }
    let row = (ne[0] / dtype.block_size())
        .checked_mul(dtype.type_size())
        .ok_or_else(too_large)?;
    ne[1..]
        .iter()
        .try_fold(row, |acc, &n| acc.checked_mul(n))
        .filter(|&n| n <= isize::MAX as usize)
        .ok_or_else(too_large)?;
    Ok(Layout::contiguous(dtype, ne))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_products_and_layouts() {
        assert_eq!(LAYERS.check("k", 32).unwrap(), 32);
        let e = LAYERS.check("llama.block_count", 1 << 40).unwrap_err();
        assert!(e.to_string().contains("llama.block_count"), "{e}");
        assert!(e.to_string().contains("1099511627776"), "{e}");
        assert!(HEADS.check("k", 0).is_err());
        assert_eq!(product("k", 1 << 16, 1 << 16, ROWS).unwrap(), 1 << 32);
        assert!(product("k", usize::MAX, 2, ROWS).is_err());
        assert!(product("k", 1 << 20, 1 << 20, ROWS).is_err());
        assert_eq!(layout("t", DType::F16, [4, 3, 2, 1]).unwrap().nbytes(), 48);
        assert!(layout("t", DType::F32, [1 << 40, 1 << 30, 1, 1]).is_err());
        assert!(layout("t", DType::Q8_0, [33, 1, 1, 1]).is_err());
    }
}
