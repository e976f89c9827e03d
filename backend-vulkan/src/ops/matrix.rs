//! mul_mat and mul_mat_id on `matmul.comp`: one invocation per result element, weights of any type
//! the shaders load (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4)
//! dequantized in the shader,
//! activations F32/F16/BF16.

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

pub fn encode(op: &Op, slots: &[Slot]) -> Encoded {
    let mode = match op {
        Op::MulMat => 0,
        Op::MulMatId => 1,
        other => return Err(not_family(other, "matrix")),
    };
    Ok((
        "matmul",
        words(&[mode]),
        groups_for(slots[0].layout.nelements()),
    ))
}
