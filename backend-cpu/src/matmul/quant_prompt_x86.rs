//! The AVX2 prompt kernel of the signed 4- and 5-bit legacy formats (Q4_0, Q5_0): groups of four
//! activation columns, one weight row at a time.
//!
//! The generic prompt kernel (`quant_x86::legacy_2x4`) unpacks a weight block once per group of
//! four columns, pays two `vpsignb` per block and column for the signed x signed dot, and keeps
//! sixteen accumulators, which spill at AVX2. Here the work that depends on one side only is done
//! once per tile instead:
//!
//! - the activations are made unsigned (`y + 128`) and their scales converted once per column
//!   ([`Columns`]);
//! - the weights are unpacked once per chunk of rows for every column group of the tile
//!   ([`Rows`]: the signed quants, the excess `128 * sum(q)` in the lanes of [`DotI8::dot_us`], the
//!   scale), the chunk sized to stay in L2 while a group's columns stay in L1.
//!
//! Per block and column the kernel is then `dot_us(y + 128, q) - 128 * sum(q)`, which is the signed
//! dot's lanes exactly (no pair saturates 16 bits: `2 * 255 * 16 < 2^15`), and the generic kernel's
//! float steps (the scale `d * d_a` lane by lane, one FMA into the even or odd accumulator), with
//! eight accumulators live. So every result is bit-identical to the generic and decode kernels' (a
//! token's logits must not depend on its batch).

use super::quant::{act_layout, rd16, HalfCvt};
use super::quant_offset_x86::SmallOffset;
use super::quant_x86::{finish, DotI8, F16c};
use super::Job;
use std::arch::x86_64::*;
use std::ops::Range;

/// Bytes of unpacked weight rows ([`Rows`]) a tile keeps at once.
const CHUNK_BYTES: usize = 64 << 10;

/// The activation columns of a tile, made unsigned: per column and block, `y + 128` and the scale.
struct Columns {
    y: Vec<__m256i>,
    d: Vec<f32>,
}

impl Columns {
    /// The Q8_0 rows `acts` of `nb` blocks.
    #[inline(always)]
    unsafe fn new(acts: &[*const u8], nb: usize) -> Self {
        let (aq, asz) = act_layout(false);
        let mut cols = Columns {
            y: Vec::with_capacity(acts.len() * nb),
            d: Vec::with_capacity(acts.len() * nb),
        };
        // SAFETY: AVX2 enabled by the caller; every row holds `nb` blocks. (Loops, not closures:
        // closures do not inherit the caller's target features.)
        unsafe {
            let bias = _mm256_set1_epi8(-128);
            for &act in acts {
                for i in 0..nb {
                    let a = act.add(i * asz);
                    let y = _mm256_loadu_si256(a.add(aq) as *const __m256i);
                    cols.y.push(_mm256_xor_si256(y, bias));
                    cols.d.push(F16c::cvt(rd16(a)));
                }
            }
        }
        cols
    }
}

/// Block of a weight row unpacked for every column group of a tile: the signed quants, `128` times
/// their sums in the lanes of [`DotI8::dot_us`], and the scale in every lane (a vector, so that LLVM
/// does not turn the product of two broadcasts into a scalar product and a broadcast: one
/// instruction more per block and column).
#[derive(Clone, Copy)]
struct RowBlock {
    q: __m256i,
    excess: __m256i,
    d: __m256,
}

/// A chunk of weight rows unpacked ([`RowBlock`]s, row by row).
struct Rows(Vec<RowBlock>);

impl Rows {
    /// Room for `rows` rows of `nb` blocks.
    fn new(rows: usize, nb: usize) -> Self {
        // SAFETY: vectors of plain integers and floats, for which zero bits are valid.
        Rows(vec![unsafe { std::mem::zeroed() }; rows * nb])
    }

    /// Puts `rows` of the job's weights `T` (`nb` blocks each) at the start of the chunk.
    #[inline(always)]
    unsafe fn fill<T: SmallOffset, D: DotI8>(&mut self, job: &Job, nb: usize, rows: Range<usize>) {
        // SAFETY: AVX2 enabled by the caller; the job's rows hold `nb` blocks each. (Written in
        // place, not pushed: a push's possible reallocation made LLVM spill the vectors.)
        unsafe {
            let bias = _mm256_set1_epi8(-128);
            for (row, m) in self.0.chunks_exact_mut(nb).zip(rows) {
                let w = job.w.add(m * job.w_stride);
                for (i, b) in row.iter_mut().enumerate() {
                    let p = w.add(i * T::SIZE);
                    let q = T::unpack_x86(p);
                    *b = RowBlock {
                        q,
                        excess: D::dot_us(bias, q),
                        d: _mm256_set1_ps(T::dm::<F16c>(p).0),
                    };
                }
            }
        }
    }
}

/// Block `k` of the chunk (a row's block `i`) against block `i` of four columns from `j` (indices
/// of [`Columns`]), into `acc`.
#[inline(always)]
unsafe fn step<D: DotI8>(
    rows: &Rows,
    k: usize,
    cols: &Columns,
    j: [usize; 4],
    acc: &mut [__m256; 4],
) {
    // SAFETY: AVX2/FMA enabled by the caller; `k` and `j` index the chunk and the columns.
    unsafe {
        let RowBlock { q, excess, d } = *rows.0.get_unchecked(k);
        for c in 0..4 {
            let s = _mm256_sub_epi32(D::dot_us(*cols.y.get_unchecked(j[c]), q), excess);
            // The same product as the generic kernel's scalar `d * d_a`, lane by lane.
            let scale = _mm256_mul_ps(d, _mm256_set1_ps(*cols.d.get_unchecked(j[c])));
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale, acc[c]);
        }
    }
}

/// Row `r` of the chunk (`nb` blocks) against the four columns from tile column `g`, even and odd
/// blocks in separate accumulators as in the generic kernel.
#[inline(always)]
unsafe fn row4<D: DotI8>(rows: &Rows, r: usize, cols: &Columns, g: usize, nb: usize) -> [f32; 4] {
    let j0 = [g * nb, (g + 1) * nb, (g + 2) * nb, (g + 3) * nb];
    // SAFETY: AVX2/FMA enabled by the caller; the chunk holds row `r` and the columns `g..g + 4`.
    unsafe {
        let mut acc0 = [[_mm256_setzero_ps(); 4]];
        let mut acc1 = [[_mm256_setzero_ps(); 4]];
        let mut i = 0;
        while i + 2 <= nb {
            step::<D>(rows, r * nb + i, cols, j0.map(|j| j + i), &mut acc0[0]);
            step::<D>(
                rows,
                r * nb + i + 1,
                cols,
                j0.map(|j| j + i + 1),
                &mut acc1[0],
            );
            i += 2;
        }
        if i < nb {
            step::<D>(rows, r * nb + i, cols, j0.map(|j| j + i), &mut acc0[0]);
        }
        let [out] = finish(&acc0, &acc1, &[[0.0; 4]]);
        out
    }
}

/// `rows` x `cols` (a multiple of four columns) of a job with weights `T` of `nb` blocks per row:
/// chunks of rows ([`Rows`]), each against every group of four columns.
///
/// # Safety
/// As for `quant::rows`, with AVX2/FMA/F16C enabled in the caller.
#[inline(always)]
pub(super) unsafe fn prompt_rows<T: SmallOffset, D: DotI8>(
    job: &Job,
    nb: usize,
    rows: Range<usize>,
    cols: Range<usize>,
) {
    debug_assert!(cols.len().is_multiple_of(4));
    let chunk = (CHUNK_BYTES / (nb * size_of::<RowBlock>())).clamp(1, rows.len().max(1));
    let mut unpacked = Rows::new(chunk, nb);
    // SAFETY: the job's pointers are valid for `rows` x `cols` and these destination elements are
    // written by this thread only (caller).
    unsafe {
        let columns = Columns::new(&job.acts[cols.clone()], nb);
        for r0 in rows.clone().step_by(chunk) {
            let r1 = (r0 + chunk).min(rows.end);
            unpacked.fill::<T, D>(job, nb, r0..r1);
            for g in (0..cols.len()).step_by(4) {
                for m in r0..r1 {
                    let out = row4::<D>(&unpacked, m - r0, &columns, g, nb);
                    for (c, v) in out.into_iter().enumerate() {
                        *job.dsts[cols.start + g + c].add(m) = v;
                    }
                }
            }
        }
    }
}
