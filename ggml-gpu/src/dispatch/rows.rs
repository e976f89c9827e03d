//! The fast paths of the small ops (the `_rows` kernels): which operands they take (float rows that
//! are contiguous, counts that fit 32-bit index arithmetic), the vector width of a launch (4 when
//! every row starts 4-element aligned), the launches of the element-wise and row-gather kernels, and
//! the launch shape of `k_norm_rows`, shared by the plain norms and the fused chains of
//! [`super::fuse`].

use super::{Launch, TDesc};
use ggml_core::{DType, Layout};

/// Threads per row of `k_norm_rows` never fall below a warp nor exceed a block.
const NORM_MIN_THREADS: usize = 32;
const NORM_MAX_THREADS: usize = 1024;
/// Chunks each thread of `k_norm_rows` aims to handle: `NORM_KEEP` in norm.cu, the chunks a thread
/// loads at once and keeps in registers from the first pass to the last.
const NORM_CHUNKS_PER_THREAD: usize = 2;
/// Threads of a `k_norm_rows` block when rows are short (several rows per block).
const NORM_BLOCK_THREADS: usize = 256;

/// Flags of `k_norm_rows` (`NORM_ADD`, `NORM_MUL`, `NORM_SCALE` in norm.cu).
pub(super) const NORM_ADD: i32 = 1;
pub(super) const NORM_MUL: i32 = 2;
pub(super) const NORM_SCALE: i32 = 4;

/// The types the row kernels read and write.
fn row_type(t: DType) -> bool {
    matches!(t, DType::F32 | DType::F16 | DType::BF16)
}

/// True when `l` is a float tensor with contiguous rows whose element count fits the kernels'
/// 32-bit arithmetic.
pub(super) fn row_contiguous(l: &Layout) -> bool {
    row_type(l.dtype)
        && l.nb[0] == l.dtype.type_size()
        && l.ne[0] > 0
        && l.nelements() < (1usize << 31)
}

/// True when every layout is [`row_contiguous`].
pub(super) fn all_rows(ls: &[&Layout]) -> bool {
    ls.iter().all(|l| row_contiguous(l))
}

/// True when `l` has `of`'s row length and its rows broadcast over `of`'s (ggml's repeat rule).
pub(super) fn broadcasts_rows(l: &Layout, of: &Layout) -> bool {
    l.ne[0] == of.ne[0] && (1..4).all(|k| l.ne[k] > 0 && of.ne[k].is_multiple_of(l.ne[k]))
}

/// Size in bytes of an element of a row-kernel type code (`T_F32` 4, `T_F16`/`T_BF16` 2).
fn elem_bytes(d: &TDesc) -> i64 {
    if d.dtype == 0 {
        4
    } else {
        2
    }
}

/// The vector width of a row kernel over rows of `ne0` elements of these operands: 4 when `ne0` is
/// a multiple of 4 and every operand's rows start at 4-element aligned addresses, else 1.
pub(super) fn vec_width(ne0: usize, ops: &[TDesc]) -> i32 {
    let aligned = |d: &TDesc| {
        let a = 4 * elem_bytes(d);
        d.ptr.is_multiple_of(a as u64) && d.nb[1..].iter().all(|nb| nb % a == 0)
    };
    if ne0.is_multiple_of(4) && ops.iter().all(aligned) {
        4
    } else {
        1
    }
}

/// A launch of a chunked row kernel over the `n` elements of the result, in chunks of `vec`; its
/// arguments are `args` followed by `vec`.
pub(super) fn chunked(
    kernel: &'static str,
    n: usize,
    vec: i32,
    mut args: Vec<super::KernelArg>,
) -> Launch {
    args.push(vec.into());
    Launch::elementwise(kernel, n / vec as usize, args)
}

/// Threads per row of `k_norm_rows` over rows of `ne0` elements in chunks of `vec`: about
/// [`NORM_CHUNKS_PER_THREAD`] chunks each.
fn norm_threads_per_row(ne0: usize, vec: i32) -> usize {
    (ne0 / vec as usize)
        .div_ceil(NORM_CHUNKS_PER_THREAD)
        .next_power_of_two()
        .clamp(NORM_MIN_THREADS, NORM_MAX_THREADS)
}

/// True when `k_norm_rows` can round its last result to 8 bits for quantized products: every chunk
/// of a row of `ne0` elements stays in a thread's registers, and rows are whole units of 32.
pub(super) fn norm_rounds_to_q8(ne0: usize, vec: i32) -> bool {
    let chunks = ne0 / vec as usize;
    ne0.is_multiple_of(32) && chunks <= NORM_CHUNKS_PER_THREAD * norm_threads_per_row(ne0, vec)
}

/// `k_norm_rows` over `rows` rows of `ne0` elements: threads per row for about
/// [`NORM_CHUNKS_PER_THREAD`] chunks each, several short rows per block; one row of 4-wide chunks
/// (a decode step) runs `k_norm_row1`, the same kernel with its row indices fixed. `args` are the
/// kernel's up to `post_bias`; the launch appends the 8-bit copy's values and scales (`q8`, see
/// [`norm_rounds_to_q8`]; 0 for none), `tpr` and `vec`.
pub(super) fn norm_launch(
    ne0: usize,
    rows: usize,
    vec: i32,
    q8: Option<(u64, u64)>,
    mut args: Vec<super::KernelArg>,
) -> Launch {
    let tpr = norm_threads_per_row(ne0, vec);
    let one_row = rows == 1 && vec == 4;
    let rows_per_block = if one_row {
        1
    } else {
        (NORM_BLOCK_THREADS / tpr).max(1)
    };
    let (xq, xd) = q8.unwrap_or((0, 0));
    args.push(xq.into());
    args.push(xd.into());
    args.push((tpr as i32).into());
    args.push(vec.into());
    let kernel = if one_row {
        "k_norm_row1"
    } else {
        "k_norm_rows"
    };
    Launch::rows(
        kernel,
        rows.div_ceil(rows_per_block),
        (tpr * rows_per_block) as u32,
        0,
        args,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vector_width_needs_aligned_rows() {
        let mut d = TDesc::contiguous(256, DType::F32, [4096, 3, 1, 1]).unwrap();
        assert_eq!(vec_width(4096, &[d]), 4);
        assert_eq!(vec_width(4095, &[d]), 1);
        d.ptr += 4;
        assert_eq!(vec_width(4096, &[d]), 1);
        let h = TDesc::contiguous(8, DType::F16, [12, 5, 1, 1]).unwrap();
        assert_eq!(vec_width(12, &[h]), 4);
        let padded = TDesc::contiguous(0, DType::F16, [14, 5, 1, 1]).unwrap();
        assert_eq!(vec_width(12, &[padded]), 1, "28-byte rows");
    }

    #[test]
    fn norm_threads_follow_the_row_length() {
        let l = norm_launch(4096, 1, 4, None, vec![]);
        assert_eq!((l.grid[0], l.threads), (1, 512));
        let l = norm_launch(128, 100, 4, None, vec![]);
        assert_eq!(
            (l.grid[0], l.threads),
            (13, 256),
            "8 rows of 32 threads per block"
        );
        let l = norm_launch(1 << 20, 2, 1, None, vec![]);
        assert_eq!((l.grid[0], l.threads), (2, 1024));
    }

    #[test]
    fn norms_round_to_8_bits_only_rows_held_in_registers() {
        assert!(norm_rounds_to_q8(4096, 4) && norm_rounds_to_q8(8192, 4));
        assert!(norm_rounds_to_q8(2048, 1) && norm_rounds_to_q8(32, 1));
        assert!(
            !norm_rounds_to_q8(16384, 4),
            "4096 chunks over 1024 threads"
        );
        assert!(!norm_rounds_to_q8(4096, 1), "4096 chunks over 1024 threads");
        assert!(!norm_rounds_to_q8(4100, 4), "not whole units of 32");
    }

    #[test]
    fn norm_constants_match_the_source() {
        let src = crate::kernels::shared_source();
        for (name, value) in [
            ("NORM_ADD", NORM_ADD as usize),
            ("NORM_MUL", NORM_MUL as usize),
            ("NORM_SCALE", NORM_SCALE as usize),
            ("NORM_KEEP", NORM_CHUNKS_PER_THREAD),
        ] {
            assert!(src.contains(&format!("#define {name} {value}\n")), "{name}");
        }
    }

    #[test]
    fn row_broadcast_rule() {
        let x = Layout::contiguous(DType::F32, [64, 6, 2, 1]);
        let w = Layout::contiguous(DType::F32, [64, 1, 1, 1]);
        let r = Layout::contiguous(DType::F32, [64, 3, 1, 1]);
        let short = Layout::contiguous(DType::F32, [1, 6, 2, 1]);
        assert!(broadcasts_rows(&w, &x) && broadcasts_rows(&r, &x) && broadcasts_rows(&x, &x));
        assert!(!broadcasts_rows(&short, &x));
        assert!(
            row_contiguous(&x) && !row_contiguous(&Layout::contiguous(DType::Q8_0, [64, 1, 1, 1]))
        );
    }
}
