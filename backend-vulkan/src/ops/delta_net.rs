//! gated_delta_net on `delta_net.comp`: the whole batch in one dispatch, one invocation per value
//! column of a head's state (workgroups: value heads × column tiles of [`super::WG`]), keys of at
//! most [`MAX_DK`].

use super::{not_family, words, Encoded, Slot, WG};
use ggml_core::{DType, HeadShare, Layout, Op};

/// Largest key head size (`MAX_DK` in delta_net.comp).
pub const MAX_DK: usize = 256;

pub fn supports(src: &[&Layout], dst: &Layout) -> bool {
    src.len() == 5
        && src.iter().all(|l| l.dtype == DType::F32)
        && src[1].ne[0] <= MAX_DK
        && dst.dtype == DType::F32
}

pub fn encode(op: &Op, slots: &[Slot]) -> Encoded {
    let Op::GatedDeltaNet { heads } = op else {
        return Err(not_family(op, "delta net"));
    };
    let v = &slots[3].layout;
    let tiles = v.ne[0].div_ceil(WG);
    let tiled = u32::from(*heads == HeadShare::Tiled);
    Ok(("delta_net", words(&[tiled, tiles as u32]), v.ne[1] * tiles))
}
