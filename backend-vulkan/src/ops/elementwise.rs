//! Element-wise and data-movement ops on `eltwise.comp` (one invocation per element), `get_rows.comp`
//! (the same, with block loaders) and `quant.comp` (one invocation per block written): binary ops with broadcast, scale,
//! clamp, unary functions, GLU variants, cpy/cont (also block copies between tensors of one block
//! type), concat, add_id, get_rows and set_rows.

use super::{
    float, groups_for, loadable, not_family, quant_target, type_code, words, Encoded, Slot,
};
use ggml_core::{DType, GluOp, Layout, Op, UnaryOp};

const OP_ADD: u32 = 0;
const OP_SCALE: u32 = 4;
const OP_CLAMP: u32 = 5;
const OP_UNARY: u32 = 6;
const OP_GLU: u32 = 7;
const OP_CPY: u32 = 8;
const OP_CONCAT: u32 = 9;
const OP_ADD_ID: u32 = 10;
const OP_SET_ROWS: u32 = 12;

pub fn supports(op: &Op, src: &[&Layout], dst: &Layout) -> bool {
    let t = |i: usize| src.get(i).map(|l| l.dtype);
    let is = |i: usize, f: fn(DType) -> bool| t(i).is_some_and(f);
    let d = dst.dtype;
    match op {
        Op::Add | Op::Sub | Op::Mul | Op::Div => is(0, float) && is(1, float) && float(d),
        Op::Scale { .. } | Op::Clamp { .. } | Op::Unary(_) => is(0, float) && float(d),
        Op::Glu { .. } => is(0, float) && (src.len() == 1 || is(1, float)) && float(d),
        Op::Cpy | Op::Cont => match t(0) {
            // Same-type copies move the bits (blocks by 16-bit words, or bytes for odd block sizes).
            Some(s) if s == d => type_code(s).is_some(),
            // Converting copies read scalar sources (eltwise.comp has no block loaders).
            Some(s) => (float(d) || quant_target(d)) && float(s),
            None => false,
        },
        Op::Concat { .. } => t(0) == Some(d) && t(1) == Some(d) && !d.is_quantized(),
        Op::AddId => {
            t(0) == Some(DType::F32)
                && t(1) == Some(DType::F32)
                && t(2) == Some(DType::I32)
                && d == DType::F32
        }
        Op::GetRows => {
            t(1) == Some(DType::I32)
                && ((is(0, loadable) && d == DType::F32)
                    || (t(0) == Some(DType::I32) && d == DType::I32))
        }
        Op::SetRows => {
            t(1) == Some(DType::F32) && t(2) == Some(DType::I32) && (float(d) || quant_target(d))
        }
        _ => false,
    }
}

fn unary_code(u: UnaryOp) -> u32 {
    match u {
        UnaryOp::Silu => 0,
        UnaryOp::Gelu => 1,
        UnaryOp::GeluErf => 2,
        UnaryOp::Tanh => 3,
        UnaryOp::Exp => 4,
        UnaryOp::Sigmoid => 5,
        UnaryOp::Neg => 6,
        UnaryOp::Relu => 7,
        UnaryOp::Sqr => 8,
        UnaryOp::Sqrt => 9,
        UnaryOp::Softplus => 10,
    }
}

/// Shader, op words and workgroups of `op`; `slots` as built by [`super::encode`].
pub fn encode(op: &Op, slots: &[Slot]) -> Encoded {
    let dst = &slots[0].layout;
    let per_elem = groups_for(dst.nelements());
    let el = |w: &[u32]| ("eltwise", words(w), per_elem);
    Ok(match op {
        Op::Add => el(&[OP_ADD]),
        Op::Sub => el(&[OP_ADD + 1]),
        Op::Mul => el(&[OP_ADD + 2]),
        Op::Div => el(&[OP_ADD + 3]),
        Op::Scale { scale, bias } => el(&[OP_SCALE, scale.to_bits(), bias.to_bits()]),
        Op::Clamp { min, max } => el(&[OP_CLAMP, min.to_bits(), max.to_bits()]),
        Op::Unary(u) => el(&[OP_UNARY, unary_code(*u)]),
        Op::Glu { op, swapped } => {
            let (code, alpha, limit) = match op {
                GluOp::Swiglu => (0, 0.0, 0.0),
                GluOp::Geglu => (1, 0.0, 0.0),
                GluOp::GegluErf => (2, 0.0, 0.0),
                GluOp::SwigluOai { alpha, limit } => (3, *alpha, *limit),
            };
            let fused = u32::from(slots.len() == 2);
            el(&[
                OP_GLU,
                code,
                u32::from(*swapped),
                alpha.to_bits(),
                limit.to_bits(),
                fused,
            ])
        }
        Op::Cpy | Op::Cont if dst.dtype.is_quantized() && slots[1].layout.dtype == dst.dtype => (
            "quant",
            words(&[
                2,
                dst.dtype.type_size() as u32,
                dst.dtype.block_size() as u32,
            ]),
            groups_for(dst.nelements() / dst.dtype.block_size()),
        ),
        Op::Cpy | Op::Cont if quant_target(dst.dtype) => (
            "quant",
            words(&[0]),
            groups_for(dst.nelements() / dst.dtype.block_size()),
        ),
        Op::Cpy | Op::Cont => el(&[OP_CPY]),
        Op::Concat { dim } => el(&[OP_CONCAT, *dim as u32]),
        Op::AddId => el(&[OP_ADD_ID]),
        Op::GetRows => ("get_rows", words(&[]), per_elem),
        Op::SetRows => {
            let src = slots[2].layout.nelements();
            if quant_target(dst.dtype) {
                (
                    "quant",
                    words(&[1]),
                    groups_for(src / dst.dtype.block_size()),
                )
            } else {
                ("eltwise", words(&[OP_SET_ROWS]), groups_for(src))
            }
        }
        other => return Err(not_family(other, "element-wise")),
    })
}
