//! The eight-row kernels of the K-quants (Q4_K, Q5_K, Q6_K) at both x86 levels, prompt and
//! decode, on the drivers of `quant_rows8_x86.rs`: eight weight rows in the eight lanes of a
//! vector, each lane a row's exact integer sums per super-block.
//!
//! Per super-block the portable kernel (`quant::kquant_scalar`) takes two integers, `isum = sum_j
//! sc_j dot_j` (sixteen 16-quant groups `j`) and `msum = sum_j mn_j bsum_j`, and one float step:
//! `sum += d d_a isum - dmin d_a msum`. Both kernels here compute the same integers with rows in
//! lanes and that float step lane by lane, so results equal the scalar level's and do not depend on
//! the batch or the level:
//! - prompt ([`KRows8::dot`]): the super-block of eight rows unpacked once per tile and
//!   interleaved ([`KGroupBlock`]: vector `4 j + k` holds quants `16 j + 4 k ..` of every row), so
//!   [`Level8::k_group`] against the broadcast activation quads gives the rows' `sc_j dot_j`
//!   (AVX-512: four `vpdpbusd` and one `vpmulld` by the rows' scales; AVX2: four `vpmaddubsw`
//!   summed in i16, two at a time for Q6_K, and `vpmaddwd` by the scales in both i16 halves of
//!   a lane), and eight [`Level8::pair_dots`] of the rows' min pairs against broadcast block-sum
//!   pairs give `msum`;
//! - decode ([`KRows8::decode_group`]): each row unpacked and dotted with AVX2 (`KUnpacked`), its
//!   lanes summed with the seven other rows' by `row_sums`; at AVX2 instead
//!   ([`Level8::K_DECODE_ROWS8`]) one row at a time, the same dots summed by [`hsum_i32`] and
//!   the same float step ([`KRows8::decode_row`]), streamed with `prefetch_ahead`.

use super::quant::{KBlock, Q8K_BSUMS, Q8K_QS, Q8K_SIZE};
use super::quant_rows8_x86::{
    bcast, decode_groups, row_sums, rows8, transpose, Group, Level8, Rows8, ROWS,
};
use super::quant_x86::{prefetch_ahead, KQuantX86};
use super::Job;
use std::arch::x86_64::*;
use std::marker::PhantomData;
use std::ops::Range;

/// A K-quant super-block unpacked ([`KBlock`]) with what every column reads of it as vectors: the
/// per-16 scales (`scv`, lanes of `vpmaddwd`) and the min terms (`mn`), for the decode kernel's
/// one-row dots ([`KUnpacked::int_sums`], [`KUnpacked::min_sums`]) and the prompt kernel's
/// interleaving.
#[derive(Clone)]
pub(super) struct KUnpacked {
    kb: KBlock,
    scv: [__m256i; 8],
    mn: __m256i,
}

impl KUnpacked {
    pub(super) fn new() -> Self {
        KUnpacked {
            kb: KBlock::new(),
            // SAFETY: vectors of plain integers, for which zero bits are valid.
            scv: unsafe { std::mem::zeroed() },
            mn: unsafe { std::mem::zeroed() },
        }
    }

    /// Replaces the block by the super-block `T` at `p`.
    #[inline(always)]
    pub(super) unsafe fn fill<T: KQuantX86>(&mut self, p: *const u8) {
        // SAFETY: AVX2 enabled by the caller, who passes a whole block.
        unsafe {
            T::unpack_x86(p, &mut self.kb);
            self.mn = _mm256_loadu_si256(self.kb.mn.as_ptr() as *const __m256i);
            for (v, s) in self.scv.iter_mut().enumerate() {
                *s = _mm256_set_m128i(
                    _mm_set1_epi16(self.kb.sc[2 * v + 1]),
                    _mm_set1_epi16(self.kb.sc[2 * v]),
                );
            }
        }
    }

    /// The block's scaled integer dots against the Q8_K block at `a`, in eight i32 lanes (lane
    /// `l`: quants `4 l .. 4 l + 4` of every 32, times their scales).
    #[inline(always)]
    pub(super) unsafe fn int_sums(&self, a: *const u8) -> __m256i {
        // SAFETY: AVX2 enabled by the caller; `a` points to a whole Q8_K block.
        unsafe {
            let mut isum = _mm256_setzero_si256();
            for (v, sc) in self.scv.iter().enumerate() {
                let q = _mm256_loadu_si256(self.kb.q.as_ptr().add(32 * v) as *const __m256i);
                let y = _mm256_loadu_si256(a.add(Q8K_QS + 32 * v) as *const __m256i);
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(_mm256_maddubs_epi16(q, y), *sc));
            }
            isum
        }
    }

    /// The block's min terms against the Q8_K block at `a` (its block sums), in eight i32 lanes.
    #[inline(always)]
    pub(super) unsafe fn min_sums(&self, a: *const u8) -> __m256i {
        // SAFETY: AVX2 enabled by the caller; `a` points to a whole Q8_K block.
        unsafe {
            let bs = _mm256_loadu_si256(a.add(Q8K_BSUMS) as *const __m256i);
            _mm256_madd_epi16(bs, self.mn)
        }
    }

    /// The unpacked block.
    pub(super) fn block(&self) -> &KBlock {
        &self.kb
    }
}

/// A super-block of eight rows interleaved: `q[4 j + k]` holds quants `16 j + 4 k .. 16 j + 4 k +
/// 4` of row `r` in i32 lane `r`, `sc[j]` the rows' scales of group `j` ([`Level8::k_scales`]),
/// `mn[p]` their
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

/// The K-quant (`T`) kernels at level `L` against a tile's Q8_K columns.
pub(super) struct KRows8<T, L> {
    acts: Vec<*const u8>,
    kind: PhantomData<(T, L)>,
}

impl<T: KQuantX86, L: Level8> Rows8 for KRows8<T, L> {
    type Level = L;
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
        // SAFETY: the level's features are enabled by the caller; super-block `i` exists in every
        // row.
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
            for sc in &mut b.sc {
                *sc = L::k_scales(*sc);
            }
            b
        }
    }

    #[inline(always)]
    unsafe fn dot<const C: usize>(&self, blocks: &[KGroupBlock], cols: [usize; C]) -> [__m256; C] {
        // SAFETY: the level's features are enabled by the caller; the columns hold `blocks.len()`
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
                    let q = [b.q[4 * j], b.q[4 * j + 1], b.q[4 * j + 2], b.q[4 * j + 3]];
                    for c in 0..C {
                        let y = a[c].add(Q8K_QS + 16 * j);
                        let y = [bcast(y), bcast(y.add(4)), bcast(y.add(8)), bcast(y.add(12))];
                        let t = L::k_group(q, y, b.sc[j], T::I16_QUADS);
                        isum[c] = _mm256_add_epi32(isum[c], t);
                    }
                }
                let mut msum = [_mm256_setzero_si256(); C];
                for (p, &mn) in b.mn.iter().enumerate() {
                    for c in 0..C {
                        let bs = bcast(a[c].add(Q8K_BSUMS + 4 * p));
                        msum[c] = L::pair_dots(msum[c], mn, bs);
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

    /// At AVX2 one row at a time ([`KRows8::decode_row`], [`Level8::K_DECODE_ROWS8`]), else
    /// eight ([`KRows8::decode_group`]).
    #[inline(always)]
    unsafe fn decode_column(&self, job: &Job, nb: usize, rows: &Range<usize>, c: usize) {
        // SAFETY: the job's pointers are valid for `rows` x column `c`, whose destination
        // elements are this thread's to write (caller).
        unsafe {
            if L::K_DECODE_ROWS8 {
                decode_groups(self, job, nb, rows, c);
            } else {
                for m in rows.clone() {
                    *job.dsts[c].add(m) = self.decode_row(job.w.add(m * job.w_stride), nb);
                }
            }
        }
    }

    /// Super-block by super-block, each row unpacked and dotted as the AVX2 kernels do, the eight
    /// rows' lanes summed by `row_sums` (`Group::prefetch_next`).
    #[inline(always)]
    unsafe fn decode_group(&self, group: &Group, nb: usize) -> __m256 {
        let mut ku = KUnpacked::new();
        // SAFETY: the level's features are enabled by the caller; the rows and the column hold
        // `nb` super-blocks.
        unsafe {
            let mut acc = _mm256_setzero_ps();
            for i in 0..nb {
                group.prefetch_next(i);
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

impl<T: KQuantX86, L: Level8> KRows8<T, L> {
    /// The weight row at `w` (`nb` super-blocks) against column 0, streamed with
    /// `prefetch_ahead`: per super-block the same integers and float step as
    /// [`KRows8::decode_group`]'s (`kstep` in every lane), so the same result.
    #[inline(always)]
    unsafe fn decode_row(&self, w: *const u8, nb: usize) -> f32 {
        let mut ku = KUnpacked::new();
        // SAFETY: the level's features are enabled by the caller; the row and the column hold
        // `nb` super-blocks.
        unsafe {
            let mut acc = _mm256_setzero_ps();
            for i in 0..nb {
                let p = w.add(i * T::SIZE);
                prefetch_ahead(p, T::SIZE);
                let a = self.acts[0].add(i * Q8K_SIZE);
                ku.fill::<T>(p);
                let isum = _mm256_set1_epi32(hsum_i32(ku.int_sums(a)));
                let msum = _mm256_set1_epi32(hsum_i32(ku.min_sums(a)));
                let (d, dmin) = (
                    _mm256_set1_ps(ku.block().d),
                    _mm256_set1_ps(ku.block().dmin),
                );
                let da = (a as *const f32).read_unaligned();
                acc = kstep(acc, isum, msum, d, dmin, da);
            }
            _mm256_cvtss_f32(acc)
        }
    }
}

/// The sum of the eight i32 lanes of `v`.
#[inline(always)]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    // SAFETY: AVX2 enabled by the caller.
    unsafe {
        let h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let h = _mm_add_epi32(h, _mm_shuffle_epi32::<0b01_00_11_10>(h));
        _mm_cvtsi128_si32(_mm_add_epi32(h, _mm_shuffle_epi32::<0b10_11_00_01>(h)))
    }
}

/// K-quant weights `T` of `nb` super-blocks per row at level `L`: `rows` x `cols` of a job
/// (`rows8`).
///
/// # Safety
/// As for `quant::rows`, with the features of `L` enabled in the caller.
#[inline(always)]
pub(super) unsafe fn kquant_rows8<T: KQuantX86, L: Level8>(
    job: &Job,
    nb: usize,
    rows: Range<usize>,
    cols: Range<usize>,
) {
    // SAFETY: forwarded from the caller.
    unsafe { rows8::<KRows8<T, L>>(job, nb, rows, cols) }
}
