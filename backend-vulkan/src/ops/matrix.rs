//! mul_mat and mul_mat_id: `matvec.comp` (one subgroup, or workgroup, per weight row, its lanes
//! splitting K) for mul_mat_id, for mul_mat with at most [`MATVEC_MAX_COLS`] activation columns
//! (decode) and for every mul_mat on CPU devices; `matmul_tiled.comp` (32x32 output tiles, K chunks
//! dequantized once into shared memory) for more columns on GPUs. Weights of any type the shaders
//! load (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4) are dequantized in
//! the shader; activations F32/F16/BF16. With F32 activations, the shader variant specialized for
//! the weight type runs (`matvec_q4_0`, ...: no type dispatch in the inner loop).

use super::{float, loadable, not_family, words, Encoded, Slot, Target};
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

/// Most activation columns `matvec.comp` takes at once (`MAX_COLS` there).
pub const MATVEC_MAX_COLS: usize = 8;
/// Output tile of `matmul_tiled.comp` (`T` x `T`).
const TILE: usize = 32;

/// `base` specialized for weights of type `w` (F32 activations), or `base` itself.
fn specialized(base: &'static str, w: DType, activations: DType) -> &'static str {
    if activations != DType::F32 {
        return base;
    }
    crate::pipeline::shader_named(&format!("{base}_{}", w.name().to_lowercase())).unwrap_or(base)
}

pub fn encode(op: &Op, slots: &[Slot], target: &Target) -> Encoded {
    let dst = &slots[0].layout;
    let (w, act) = (slots[1].layout.dtype, slots[2].layout.dtype);
    let batches = dst.ne[2] * dst.ne[3];
    let per_group = target.matvec_rows();
    let matvec = |by_id: u32, rows: usize| {
        Ok((
            specialized("matvec", w, act),
            words(&[by_id, per_group as u32]),
            rows.div_ceil(per_group),
        ))
    };
    match op {
        Op::MulMat if dst.ne[1] > MATVEC_MAX_COLS && !target.cpu => {
            let tiles = dst.ne[0].div_ceil(TILE) * dst.ne[1].div_ceil(TILE);
            Ok((
                specialized("matmul_tiled", w, act),
                words(&[]),
                tiles * batches,
            ))
        }
        // Dot-product rows (weight row, chunk of columns, batch).
        Op::MulMat => matvec(0, dst.ne[0] * dst.ne[1].div_ceil(MATVEC_MAX_COLS) * batches),
        // Dot-product rows (weight row, used expert, token).
        Op::MulMatId => matvec(1, dst.ne[0] * dst.ne[1] * dst.ne[2]),
        other => Err(not_family(other, "matrix")),
    }
}
