//! mul_mat and mul_mat_id on `matmul.comp` (one invocation per result element) and, for mul_mat
//! with several activation columns, `matmul_tiled.comp` (8x8 output tiles, K chunks dequantized once
//! into shared memory). Weights of any type the shaders load (F32, F16, BF16, Q4_0, Q4_1, Q5_0,
//! Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4) are dequantized in the shader; activations F32/F16/BF16.

use super::{float, groups_for, loadable, not_family, words, Encoded, Slot};
use ggml_core::{DType, Layout, Op};

pub fn supports(op: &Op, src: &[&Layout], dst: &Layout) -> bool {
    let ok =
        src.len() >= 2 && loadable(src[0].dtype) && float(src[1].dtype) && dst.dtype == DType::F32;
    match op {
        Op::MulMat => ok,
        Op::MulMatId => ok && src.get(2).is_some_and(|l| l.dtype == DType::I32),
        _ => false,
    }
}

/// Activation columns from which mul_mat uses the tiled shader.
pub const TILED_MIN_COLS: usize = 4;
/// Output tile of `matmul_tiled.comp` (`TM` x `TN`).
const TILE: usize = 8;

pub fn encode(op: &Op, slots: &[Slot]) -> Encoded {
    let dst = &slots[0].layout;
    match op {
        Op::MulMat if dst.ne[1] >= TILED_MIN_COLS => {
            let tiles = dst.ne[0].div_ceil(TILE) * dst.ne[1].div_ceil(TILE);
            Ok(("matmul_tiled", words(&[]), tiles * dst.ne[2] * dst.ne[3]))
        }
        Op::MulMat => Ok(("matmul", words(&[0]), groups_for(dst.nelements()))),
        Op::MulMatId => Ok(("matmul", words(&[1]), groups_for(dst.nelements()))),
        other => Err(not_family(other, "matrix")),
    }
}
