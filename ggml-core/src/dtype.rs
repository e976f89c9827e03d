//! Element types: plain scalars and the GGUF block-quantized formats, with their block sizes, byte sizes
//! and GGUF type ids. Byte layouts are those of GGUF, so a mapped file is used without conversion.

use std::fmt;

/// An element type of a tensor. Quantized types store `block_size()` elements in `type_size()` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F16,
    BF16,
    I32,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    /// Activation format for dot products with Q4_1/Q5_1 weights (Q8_0 plus the block sum).
    Q8_1,
    Q4K,
    Q5K,
    Q6K,
    /// Activation format for dot products with K-quant weights.
    Q8K,
    MXFP4,
    /// Q4_0 regrouped for GPUs (never in a file): per [`GROUP_BLOCKS`] blocks of a row, their
    /// quants (16 bytes each, block after block), then their f16 scales, so that consecutive lanes
    /// of a GPU warp read consecutive blocks with 16-byte loads. See [`crate::quant::regroup`].
    Q4_0G,
    /// Q8_0 regrouped the same way: per [`GROUP_BLOCKS`] blocks, the first 16 quants of each, then
    /// the last 16 of each, then the f16 scales.
    Q8_0G,
}

/// Blocks of a group of the regrouped layouts ([`DType::Q4_0G`], [`DType::Q8_0G`]).
pub const GROUP_BLOCKS: usize = 32;

/// Elements per super-block of the K-quant formats.
pub const QK_K: usize = 256;

impl DType {
    /// Every element type, in GGUF id order.
    pub const ALL: [DType; 15] = [
        DType::F32,
        DType::F16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q8_1,
        DType::Q4K,
        DType::Q5K,
        DType::Q6K,
        DType::Q8K,
        DType::I32,
        DType::BF16,
        DType::MXFP4,
    ];

    /// The regrouped layouts GPUs may keep weights in (see [`DType::grouped`]); not GGUF types.
    pub const GROUPED: [DType; 2] = [DType::Q4_0G, DType::Q8_0G];

    /// The types a weight matrix may be stored in: what `mul_mat`, `mul_mat_id` and `get_rows` take
    /// as weights on every backend (the one list the kernels, their dispatch and the tests share).
    pub const WEIGHTS: [DType; 12] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q4K,
        DType::Q5K,
        DType::Q6K,
        DType::MXFP4,
    ];

    /// Elements per block (1 for scalar types).
    pub const fn block_size(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 | DType::I32 => 1,
            DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0 | DType::Q8_1 => 32,
            DType::MXFP4 => 32,
            DType::Q4K | DType::Q5K | DType::Q6K | DType::Q8K => QK_K,
            DType::Q4_0G | DType::Q8_0G => 32 * GROUP_BLOCKS,
        }
    }

    /// Bytes per block.
    pub const fn type_size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q4_0 => 2 + 16,
            DType::Q4_1 => 2 + 2 + 16,
            DType::Q5_0 => 2 + 4 + 16,
            DType::Q5_1 => 2 + 2 + 4 + 16,
            DType::Q8_0 => 2 + 32,
            DType::Q8_1 => 2 + 2 + 32,
            DType::Q4K => 2 + 2 + 12 + QK_K / 2,
            DType::Q5K => 2 + 2 + 12 + QK_K / 8 + QK_K / 2,
            DType::Q6K => QK_K / 2 + QK_K / 4 + QK_K / 16 + 2,
            DType::Q8K => 4 + QK_K + QK_K / 16 * 2,
            DType::MXFP4 => 1 + 16,
            DType::Q4_0G => (2 + 16) * GROUP_BLOCKS,
            DType::Q8_0G => (2 + 32) * GROUP_BLOCKS,
        }
    }

    /// The regrouped layout of this type's rows, for types that have one (Q4_0, Q8_0).
    pub const fn grouped(self) -> Option<DType> {
        match self {
            DType::Q4_0 => Some(DType::Q4_0G),
            DType::Q8_0 => Some(DType::Q8_0G),
            _ => None,
        }
    }

    /// The type a regrouped layout holds the blocks of (the type itself for every other type).
    pub const fn base(self) -> DType {
        match self {
            DType::Q4_0G => DType::Q4_0,
            DType::Q8_0G => DType::Q8_0,
            t => t,
        }
    }

    /// True for block-quantized types.
    pub const fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// True for floating-point scalar types.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// Bytes of one row of `n` elements; `None` if `n` is not a whole number of blocks.
    pub const fn row_size(self, n: usize) -> Option<usize> {
        if !n.is_multiple_of(self.block_size()) {
            return None;
        }
        match (n / self.block_size()).checked_mul(self.type_size()) {
            Some(v) => Some(v),
            None => None,
        }
    }

    /// The GGUF / ggml type id; for the regrouped layouts, which no file holds, ids no ggml type
    /// uses (the GGUF writer refuses them).
    pub const fn gguf_id(self) -> u32 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::Q4_0 => 2,
            DType::Q4_1 => 3,
            DType::Q5_0 => 6,
            DType::Q5_1 => 7,
            DType::Q8_0 => 8,
            DType::Q8_1 => 9,
            DType::Q4K => 12,
            DType::Q5K => 13,
            DType::Q6K => 14,
            DType::Q8K => 15,
            DType::I32 => 26,
            DType::BF16 => 30,
            DType::MXFP4 => 39,
            DType::Q4_0G => 1002,
            DType::Q8_0G => 1008,
        }
    }

    /// The type with this GGUF / ggml id, if supported.
    pub fn from_gguf_id(id: u32) -> Option<DType> {
        DType::ALL.into_iter().find(|t| t.gguf_id() == id)
    }

    /// The lower-case name used by ggml (`f32`, `q4_0`, `q4_K`, `mxfp4`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::Q4_0 => "q4_0",
            DType::Q4_1 => "q4_1",
            DType::Q5_0 => "q5_0",
            DType::Q5_1 => "q5_1",
            DType::Q8_0 => "q8_0",
            DType::Q8_1 => "q8_1",
            DType::Q4K => "q4_K",
            DType::Q5K => "q5_K",
            DType::Q6K => "q6_K",
            DType::Q8K => "q8_K",
            DType::MXFP4 => "mxfp4",
            DType::Q4_0G => "q4_0_g",
            DType::Q8_0G => "q8_0_g",
        }
    }

    /// Parses a name as printed by [`DType::name`] (case-insensitive).
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL
            .into_iter()
            .chain(DType::GROUPED)
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gguf_ids_round_trip_and_sizes_match_ggml() {
        for t in DType::ALL {
            assert_eq!(DType::from_gguf_id(t.gguf_id()), Some(t));
            assert_eq!(DType::from_name(t.name()), Some(t));
        }
        assert_eq!(DType::Q4K.type_size(), 144);
        assert_eq!(DType::Q5K.type_size(), 176);
        assert_eq!(DType::Q6K.type_size(), 210);
        assert_eq!(DType::Q8K.type_size(), 292);
        assert_eq!(DType::Q4_0.row_size(64), Some(36));
        assert_eq!(DType::Q4_0.row_size(33), None);
    }

    #[test]
    fn grouped_layouts_hold_whole_groups_of_their_base_blocks_and_no_gguf_id() {
        for g in DType::GROUPED {
            let base = g.base();
            assert_eq!(base.grouped(), Some(g));
            assert_eq!(g.block_size(), GROUP_BLOCKS * base.block_size());
            assert_eq!(g.type_size(), GROUP_BLOCKS * base.type_size());
            assert_eq!(g.row_size(4096), base.row_size(4096));
            assert_eq!(g.row_size(4096 - 32), None);
            assert_eq!(DType::from_gguf_id(g.gguf_id()), None);
            assert_eq!(DType::from_name(g.name()), Some(g));
        }
    }
}
