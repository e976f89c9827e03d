//! Row ops, one workgroup per row: rms_norm, norm, sum_rows and soft_max on `rows.comp`; argsort and
//! top_k on `sort.comp` (a bitonic sort in shared memory, rows of at most [`MAX_SORT`] elements).

use super::{not_family, words, Encoded, Slot};
use ggml_core::{DType, Layout, Op};

/// Longest row `sort.comp` sorts (`MAX_SORT` there).
pub const MAX_SORT: usize = 1024;

pub fn supports_sort(src: &[&Layout], dst: &Layout) -> bool {
    src.len() == 1
        && src[0].dtype == DType::F32
        && dst.dtype == DType::I32
        && src[0].ne[0] <= MAX_SORT
}

pub fn encode(op: &Op, slots: &[Slot]) -> Encoded {
    let rows = slots[1].layout.nrows();
    let w = match op {
        Op::RmsNorm { eps } => words(&[0, eps.to_bits()]),
        Op::Norm { eps } => words(&[1, eps.to_bits()]),
        Op::SumRows => words(&[2]),
        Op::SoftMax { scale, max_bias } => words(&[
            3,
            scale.to_bits(),
            max_bias.to_bits(),
            u32::from(slots.len() > 2),
            u32::from(slots.len() > 3),
        ]),
        Op::Argsort { order } => {
            return Ok((
                "sort",
                words(&[u32::from(*order == ggml_core::SortOrder::Desc)]),
                rows,
            ))
        }
        Op::TopK { .. } => return Ok(("sort", words(&[1]), rows)),
        other => return Err(not_family(other, "row")),
    };
    Ok(("rows", w, rows))
}
