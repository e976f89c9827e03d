//! Attention ops: rope (normal and NeoX, YaRN, frequency factors) on `rope.comp`, one invocation per
//! element; flash_attn_ext on `flash_attn.comp`, one workgroup per result row, with up to
//! [`MAX_KV`] keys (scores live in shared memory).

use super::{float, groups_for, loadable, not_family, words, Encoded, Slot};
use ggml_core::{DType, Layout, Op, RopeMode, RopeParams};

/// Most keys `flash_attn.comp` handles (`MAX_KV` there).
pub const MAX_KV: usize = 2048;

pub fn supports(op: &Op, src: &[&Layout], dst: &Layout) -> bool {
    let t = |i: usize| src.get(i).map(|l| l.dtype);
    match op {
        Op::Rope(_) => {
            t(0).is_some_and(float)
                && t(1) == Some(DType::I32)
                && src.get(2).is_none_or(|l| l.dtype == DType::F32)
                && float(dst.dtype)
        }
        Op::FlashAttnExt { .. } => {
            src.len() >= 3
                && t(0) == Some(DType::F32)
                && t(1).is_some_and(loadable)
                && t(2).is_some_and(loadable)
                && src.get(3).is_none_or(|l| float(l.dtype))
                && src.get(4).is_none_or(|l| l.dtype == DType::F32)
                && src[1].ne[1] <= MAX_KV
                && dst.dtype == DType::F32
        }
        _ => false,
    }
}

/// YaRN correction dimensions (as ggml's `ggml_rope_yarn_corr_dims`).
fn yarn_corr_dims(p: &RopeParams) -> [f32; 2] {
    let dim = |n_rot: f32| {
        p.n_dims as f32 * (p.n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln()
            / (2.0 * p.freq_base.ln())
    };
    let start = dim(p.beta_fast).floor();
    let end = dim(p.beta_slow).ceil();
    [start.max(0.0), end.min(p.n_dims as f32 - 1.0)]
}

pub fn encode(op: &Op, slots: &[Slot]) -> Encoded {
    let dst = &slots[0].layout;
    match op {
        Op::Rope(p) => {
            let corr = yarn_corr_dims(p);
            Ok((
                "rope",
                words(&[
                    u32::from(p.mode == RopeMode::Neox),
                    p.n_dims as u32,
                    p.freq_base.to_bits(),
                    p.freq_scale.to_bits(),
                    p.ext_factor.to_bits(),
                    p.attn_factor.to_bits(),
                    corr[0].to_bits(),
                    corr[1].to_bits(),
                    u32::from(slots.len() > 3),
                ]),
                groups_for(dst.nelements()),
            ))
        }
        Op::FlashAttnExt {
            scale,
            max_bias,
            softcap,
        } => Ok((
            "flash_attn",
            words(&[
                scale.to_bits(),
                max_bias.to_bits(),
                softcap.to_bits(),
                u32::from(slots.len() > 4),
                u32::from(slots.len() > 5),
            ]),
            dst.nrows(),
        )),
        other => Err(not_family(other, "attention")),
    }
}
