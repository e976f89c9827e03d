//! The AVX-512 kernels of the K-quants (Q4_K, Q5_K, Q6_K), prompt and decode, on the eight-row
//! drivers of `quant_rows8_avx512.rs`: eight weight rows in the eight lanes of a vector, each lane
//! a row's exact integer sums per super-block.
//!
//! Per super-block the portable kernel (`quant::kquant_scalar`) takes two integers, `isum = sum_j
//! sc_j dot_j` (sixteen 16-quant groups `j`) and `msum = sum_j mn_j bsum_j`, and one float step:
//! `sum += d d_a isum - dmin d_a msum`. Both kernels here compute the same integers with rows in
//! lanes and that float step lane by lane, so results equal the scalar level's and do not depend on
//! the batch:
//! - prompt ([`KRows8::dot`]): the super-block of eight rows unpacked once per tile and
//!   interleaved ([`KGroupBlock`]: vector `4 j + k` holds quants `16 j + 4 k ..` of every row), so
//!   four `vpdpbusd` against broadcast activation quads give the rows' `dot_j`, one `vpmulld` by the
//!   rows' scales adds it to `isum`, and eight `vpdpwssd` of the rows' min pairs against broadcast
//!   block-sum pairs give `msum`;
//! - decode ([`KRows8::decode_group`]): each row unpacked and dotted as the AVX2 kernels do
//!   (`KUnpacked`), its lanes summed with the seven other rows' by `row_sums`.

use super::quant::{Q8K_BSUMS, Q8K_QS, Q8K_SIZE};
use super::quant_prompt_x86::KUnpacked;
use super::quant_rows8_avx512::{row_sums, rows8, transpose, Group, Rows8, ROWS};
use super::quant_x86::KQuantX86;
use super::Job;
use std::arch::x86_64::*;
use std::marker::PhantomData;
use std::ops::Range;

/// A super-block of eight rows interleaved: `q[4 j + k]` holds quants `16 j + 4 k .. 16 j + 4 k +
/// 4` of row `r` in i32 lane `r`, `sc[j]` the rows' scales of group `j` (i32), `mn[p]` their
/// mins of groups `2 p` and `2 p + 1` (an i16 pair), `d` and `dmin` their super-block scales.
#[derive(Clone, Copy)]
pub(super) struct KGroupBlock {
    q: [__m256i; 64],
    sc: [__m256i; 16],
    mn: [__m256i; 8],
    d: __m256,
    dmin: __m256,
}

/// `acc + (d d_a) isum - (dmin d_a) msum` lane by lane: the portable kernel's float step.
#[inline(always)]
unsafe fn kstep(
    acc: __m256,
    isum: __m256i,
    msum: __m256i,
    d: __m256,
    dmin: __m256,
    da: f32,
) -> __m256 {
    // SAFETY: AVX enabled by the caller.
    unsafe {
        let da = _mm256_set1_ps(da);
        let a = _mm256_mul_ps(_mm256_mul_ps(d, da), _mm256_cvtepi32_ps(isum));
        let b = _mm256_mul_ps(_mm256_mul_ps(dmin, da), _mm256_cvtepi32_ps(msum));
        _mm256_add_ps(acc, _mm256_sub_ps(a, b))
    }
}

/// The i32 at `p` in every lane.
#[inline(always)]
unsafe fn bcast(p: *const u8) -> __m256i {
    // SAFETY: AVX enabled by the caller; four readable bytes.
    unsafe { _mm256_set1_epi32((p as *const i32).read_unaligned()) }
}

/// The K-quant (`T`) kernels against a tile's Q8_K columns.
pub(super) struct KRows8<T> {
    acts: Vec<*const u8>,
    kind: PhantomData<T>,
}

impl<T: KQuantX86> Rows8 for KRows8<T> {
    type Block = KGroupBlock;

    unsafe fn new(acts: &[*const u8], _nb: usize) -> Self {
        KRows8 {
            acts: acts.to_vec(),
            kind: PhantomData,
        }
    }

    #[inline(always)]
    unsafe fn interleave(&self, group: &Group, i: usize) -> KGroupBlock {
        // Per row: its eight 32-quant chunks, scales (two halves widened to i32) and min pairs.
        let mut rows = [[_mm256_setzero_si256(); 11]; ROWS];
        let (mut d, mut dmin) = ([0f32; ROWS], [0f32; ROWS]);
        let mut ku = KUnpacked::new();
        // SAFETY: AVX-512 F/BW/VL enabled by the caller; super-block `i` exists in every row.
        unsafe {
            for (r, w) in group.w.iter().enumerate() {
                ku.fill::<T>(w.add(i * T::SIZE));
                let kb = ku.block();
                for (c, v) in rows[r][..8].iter_mut().enumerate() {
                    *v = _mm256_loadu_si256(kb.q.as_ptr().add(32 * c) as *const __m256i);
                }
                let sc = _mm256_loadu_si256(kb.sc.as_ptr() as *const __m256i);
                rows[r][8] = _mm256_cvtepi16_epi32(_mm256_castsi256_si128(sc));
                rows[r][9] = _mm256_cvtepi16_epi32(_mm256_extracti128_si256::<1>(sc));
                rows[r][10] = _mm256_loadu_si256(kb.mn.as_ptr() as *const __m256i);
                (d[r], dmin[r]) = (kb.d, kb.dmin);
            }
            let column = |k: usize| rows.map(|row| row[k]);
            let mut b = KGroupBlock {
                q: [_mm256_setzero_si256(); 64],
                sc: [_mm256_setzero_si256(); 16],
                mn: transpose(column(10)),
                d: _mm256_loadu_ps(d.as_ptr()),
                dmin: _mm256_loadu_ps(dmin.as_ptr()),
            };
            for c in 0..8 {
                b.q[8 * c..8 * c + 8].copy_from_slice(&transpose(column(c)));
            }
            b.sc[..8].copy_from_slice(&transpose(column(8)));
            b.sc[8..].copy_from_slice(&transpose(column(9)));
            b
        }
    }

    #[inline(always)]
    unsafe fn dot<const C: usize>(&self, blocks: &[KGroupBlock], cols: [usize; C]) -> [__m256; C] {
        // SAFETY: AVX-512 VL/VNNI enabled by the caller; the columns hold `blocks.len()`
        // super-blocks.
        unsafe {
            let mut acc = [_mm256_setzero_ps(); C];
            for (i, b) in blocks.iter().enumerate() {
                let mut a = [std::ptr::null::<u8>(); C];
                for c in 0..C {
                    a[c] = self.acts[cols[c]].add(i * Q8K_SIZE);
                }
                let mut isum = [_mm256_setzero_si256(); C];
                for j in 0..16 {
                    let mut t = [_mm256_setzero_si256(); C];
                    for k in 0..4 {
                        let q = b.q[4 * j + k];
                        for c in 0..C {
                            let y = bcast(a[c].add(Q8K_QS + 16 * j + 4 * k));
                            t[c] = _mm256_dpbusd_epi32(t[c], q, y);
                        }
                    }
                    for c in 0..C {
                        isum[c] = _mm256_add_epi32(isum[c], _mm256_mullo_epi32(t[c], b.sc[j]));
                    }
                }
                let mut msum = [_mm256_setzero_si256(); C];
                for (p, &mn) in b.mn.iter().enumerate() {
                    for c in 0..C {
                        let bs = bcast(a[c].add(Q8K_BSUMS + 4 * p));
                        msum[c] = _mm256_dpwssd_epi32(msum[c], mn, bs);
                    }
                }
                for c in 0..C {
                    let da = (a[c] as *const f32).read_unaligned();
                    acc[c] = kstep(acc[c], isum[c], msum[c], b.d, b.dmin, da);
                }
            }
            acc
        }
    }

    /// Super-block by super-block, each row unpacked and dotted as the AVX2 kernels do, the eight
    /// rows' lanes summed by `row_sums` (`Group::prefetch_next`).
    #[inline(always)]
    unsafe fn decode_group(&self, group: &Group, nb: usize) -> __m256 {
        let mut ku = KUnpacked::new();
        // SAFETY: AVX-512 F/BW/VL enabled by the caller; the rows and the column hold `nb`
        // super-blocks.
        unsafe {
            let mut acc = _mm256_setzero_ps();
            for i in 0..nb {
                group.prefetch_next(i, nb);
                let a = self.acts[0].add(i * Q8K_SIZE);
                let (mut isum, mut msum) = (
                    [_mm256_setzero_si256(); ROWS],
                    [_mm256_setzero_si256(); ROWS],
                );
                let (mut d, mut dmin) = ([0f32; ROWS], [0f32; ROWS]);
                for (r, w) in group.w.iter().enumerate() {
                    ku.fill::<T>(w.add(i * T::SIZE));
                    (isum[r], msum[r]) = (ku.int_sums(a), ku.min_sums(a));
                    (d[r], dmin[r]) = (ku.block().d, ku.block().dmin);
                }
                let da = (a as *const f32).read_unaligned();
                let (d, dmin) = (_mm256_loadu_ps(d.as_ptr()), _mm256_loadu_ps(dmin.as_ptr()));
                acc = kstep(acc, row_sums(isum), row_sums(msum), d, dmin, da);
            }
            acc
        }
    }
}

/// K-quant weights `T` of `nb` super-blocks per row: `rows` x `cols` of a job (`rows8`).
///
/// # Safety
/// As for `quant::rows`, with AVX2/FMA/F16C and AVX-512 F/BW/VL/VNNI enabled in the caller.
#[inline(always)]
pub(super) unsafe fn kquant_rows8<T: KQuantX86>(
    job: &Job,
    nb: usize,
    rows: Range<usize>,
    cols: Range<usize>,
) {
    // SAFETY: forwarded from the caller.
    unsafe { rows8::<KRows8<T>>(job, nb, rows, cols) }
}
