//! x86 one-column kernels of the 4- and 5-bit legacy formats, the decode products of most legacy
//! models: the offset kernel of the signed ones (Q4_0, Q5_0; at AVX2, AVX-512 takes
//! `quant_rows8_avx512`) and, at the end, the kernel of the
//! `d * q + m` ones (Q4_1, Q5_1, [`min_rows`]), whose Q8_1 activation scales and sums are converted
//! once per column and tile instead of once per weight row (same values, same order of the float
//! steps as the generic kernel's, so again bit-identical).
//!
//! The generic kernel (`quant_x86::legacy`) multiplies signed quants with signed activations, which
//! at AVX2 costs two `vpsignb` per block before the unsigned x signed `vpmaddubsw`. Here the
//! quants are made unsigned instead (`q + OFFSET`, [`LegacyX86::unpack_u`], at most 31), and the
//! excess `OFFSET * sum(y)` is subtracted per lane. That term depends on the activations only, so
//! it is computed once per column and tile ([`ColumnTerms`], with the activation scales), not once
//! per weight row. The integer lanes equal the generic kernel's exactly (no product saturates:
//! `2 * 31 * 127 < 2^15`) and the float steps are the same, so every result is bit-identical to
//! the generic and prompt kernels' (a token's logits must not depend on its batch).

use super::quant::{act_layout, rd16, HalfCvt, Q4_0, Q5_0};
use super::quant_x86::{finish, prefetch_ahead, DotI8, F16c, LegacyX86};
use super::Job;
use std::arch::x86_64::*;
use std::ops::Range;

/// Legacy formats whose quants plus [`LegacyX86::OFFSET`] stay below 32, so that the unsigned x
/// signed byte products of a pair sum without saturating 16 bits.
pub(super) trait SmallOffset: LegacyX86 {
    /// [`LegacyX86::unpack_u`]'s bytes with AVX-512 BW/VL (the kernels of `quant_rows8_avx512`):
    /// the nibbles from one broadcast load and a per-lane shift, Q5_0's fifth bits as a mask.
    unsafe fn unpack_u_avx512(p: *const u8) -> __m256i;
}

/// Low nibbles of the 16 bytes at `qs` in the low lane, high nibbles in the high lane (AVX-512
/// BW/VL enabled by the caller; 16 readable bytes).
#[inline(always)]
unsafe fn nibbles_avx512(qs: *const u8) -> __m256i {
    // SAFETY: forwarded from the caller.
    unsafe {
        let v = _mm256_broadcastsi128_si256(_mm_loadu_si128(qs as *const __m128i));
        let shift = _mm256_set_epi64x(0x0004_0004_0004_0004, 0x0004_0004_0004_0004, 0, 0);
        _mm256_and_si256(_mm256_srlv_epi16(v, shift), _mm256_set1_epi8(15))
    }
}

// SAFETY (every `unsafe` block of these impls): AVX-512 BW/VL are enabled by the caller, who
// passes a whole block.
impl SmallOffset for Q4_0 {
    #[inline(always)]
    unsafe fn unpack_u_avx512(p: *const u8) -> __m256i {
        unsafe { nibbles_avx512(p.add(2)) }
    }
}
impl SmallOffset for Q5_0 {
    #[inline(always)]
    unsafe fn unpack_u_avx512(p: *const u8) -> __m256i {
        unsafe {
            let n = nibbles_avx512(p.add(6));
            let bits = (p.add(2) as *const u32).read_unaligned();
            _mm256_mask_add_epi8(n, bits, n, _mm256_set1_epi8(16))
        }
    }
}

/// Per block of one activation column: `OFFSET` times the activation sums in the lanes of
/// [`DotI8::dot_us`], and the activation scale (one allocation per column and tile).
struct ColumnTerms(Vec<(__m256i, f32)>);

impl ColumnTerms {
    /// The terms of the Q8_0 row at `act` (`nb` blocks) against quants offset by `offset`.
    #[inline(always)]
    unsafe fn new<D: DotI8>(act: *const u8, nb: usize, offset: u8) -> Self {
        let (aq, asz) = act_layout(false);
        let mut terms = Vec::with_capacity(nb);
        // SAFETY: AVX2 enabled by the caller; the row holds `nb` blocks. (A loop, not a closure:
        // closures do not inherit the caller's target features.)
        unsafe {
            let off = _mm256_set1_epi8(offset as i8);
            for i in 0..nb {
                let a = act.add(i * asz);
                let y = _mm256_loadu_si256(a.add(aq) as *const __m256i);
                terms.push((D::dot_us(off, y), F16c::cvt(rd16(a))));
            }
        }
        ColumnTerms(terms)
    }
}

/// Block `i` of weight row `w` against the column of `terms` (quants at `y`), into `acc`: the
/// generic kernel's `legacy_step` for one row and column, with the offset quants.
#[inline(always)]
unsafe fn offset_step<T: SmallOffset, D: DotI8>(
    w: *const u8,
    y: *const u8,
    terms: &ColumnTerms,
    i: usize,
    acc: &mut __m256,
) {
    // SAFETY: AVX2/FMA enabled by the caller; block `i` exists in the row and the column, whose
    // terms hold `nb > i` blocks.
    unsafe {
        let p = w.add(i * T::SIZE);
        let q = T::unpack_u(p);
        let y = _mm256_loadu_si256(y as *const __m256i);
        let &(excess, act_scale) = terms.0.get_unchecked(i);
        let s = _mm256_sub_epi32(D::dot_us(q, y), excess);
        let scale = _mm256_set1_ps(T::dm::<F16c>(p).0 * act_scale);
        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale, *acc);
    }
}

/// One weight row of `nb` blocks against the Q8_0 row at `act`, even and odd blocks in separate
/// accumulators as in the generic kernel.
#[inline(always)]
unsafe fn offset_row<T: SmallOffset, D: DotI8>(
    w: *const u8,
    act: *const u8,
    terms: &ColumnTerms,
    nb: usize,
) -> f32 {
    let (aq, asz) = act_layout(false);
    // SAFETY: AVX2/FMA enabled by the caller; both rows hold `nb` blocks.
    unsafe {
        let mut acc0 = [[_mm256_setzero_ps(); 1]];
        let mut acc1 = [[_mm256_setzero_ps(); 1]];
        let mut i = 0;
        while i + 2 <= nb {
            prefetch_ahead(w.add(i * T::SIZE), 2 * T::SIZE);
            offset_step::<T, D>(w, act.add(i * asz + aq), terms, i, &mut acc0[0][0]);
            offset_step::<T, D>(
                w,
                act.add((i + 1) * asz + aq),
                terms,
                i + 1,
                &mut acc1[0][0],
            );
            i += 2;
        }
        if i < nb {
            offset_step::<T, D>(w, act.add(i * asz + aq), terms, i, &mut acc0[0][0]);
        }
        finish(&acc0, &acc1, &[[0.0]])[0][0]
    }
}

/// `rows` x `cols` of a job with weights `T` of `nb` blocks per row, column by column.
///
/// # Safety
/// As for `quant::rows`, with AVX2/FMA/F16C (and what `D` needs) enabled in the caller.
#[inline(always)]
pub(super) unsafe fn offset_rows<T: SmallOffset, D: DotI8>(
    job: &Job,
    nb: usize,
    rows: Range<usize>,
    cols: Range<usize>,
) {
    // SAFETY: the job's pointers are valid for `rows` x `cols` and these destination elements are
    // written by this thread only (caller).
    unsafe {
        for c in cols {
            let act = job.acts[c];
            let terms = ColumnTerms::new::<D>(act, nb, T::OFFSET);
            for m in rows.clone() {
                let w = job.w.add(m * job.w_stride);
                *job.dsts[c].add(m) = offset_row::<T, D>(w, act, &terms, nb);
            }
        }
    }
}

/// Per block of one Q8_1 activation column: its scale and scaled sum, converted once per column
/// and tile for the `d * q + m` formats (Q4_1, Q5_1).
struct MinColumnTerms(Vec<(f32, f32)>);

impl MinColumnTerms {
    #[inline(always)]
    unsafe fn new(act: *const u8, nb: usize) -> Self {
        let (_, asz) = act_layout(true);
        let mut terms = Vec::with_capacity(nb);
        for i in 0..nb {
            // SAFETY: the row holds `nb` blocks (caller).
            unsafe {
                let a = act.add(i * asz);
                terms.push((F16c::cvt(rd16(a)), F16c::cvt(rd16(a.add(2)))));
            }
        }
        MinColumnTerms(terms)
    }
}

/// Block `i` of weight row `w` against the column of `terms` (quants at `y`): the generic
/// kernel's `legacy_step` for one row and column with the activation terms converted beforehand.
#[inline(always)]
unsafe fn min_step<T: LegacyX86, D: DotI8>(
    w: *const u8,
    y: *const u8,
    terms: &MinColumnTerms,
    i: usize,
    acc: &mut __m256,
    msum: &mut f32,
) {
    // SAFETY: AVX2/FMA enabled by the caller; block `i` exists in the row and the column.
    unsafe {
        let p = w.add(i * T::SIZE);
        let q = T::unpack_x86(p);
        let y = _mm256_loadu_si256(y as *const __m256i);
        let &(da, sa) = terms.0.get_unchecked(i);
        let (d, m) = T::dm::<F16c>(p);
        let scale = _mm256_set1_ps(d * da);
        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(D::dot_us(q, y)), scale, *acc);
        *msum += m * sa;
    }
}

/// `rows` x `cols` of a job with `d * q + m` weights `T` of `nb` blocks per row, column by column.
///
/// # Safety
/// As for `quant::rows`, with AVX2/FMA/F16C (and what `D` needs) enabled in the caller.
#[inline(always)]
pub(super) unsafe fn min_rows<T: LegacyX86, D: DotI8>(
    job: &Job,
    nb: usize,
    rows: Range<usize>,
    cols: Range<usize>,
) {
    let (aq, asz) = act_layout(true);
    // SAFETY: the job's pointers are valid for `rows` x `cols` and these destination elements are
    // written by this thread only (caller).
    unsafe {
        for c in cols {
            let act = job.acts[c];
            let terms = MinColumnTerms::new(act, nb);
            for m in rows.clone() {
                let w = job.w.add(m * job.w_stride);
                let mut acc0 = [[_mm256_setzero_ps(); 1]];
                let mut acc1 = [[_mm256_setzero_ps(); 1]];
                let mut msum = [[0f32; 1]];
                let mut i = 0;
                while i + 2 <= nb {
                    prefetch_ahead(w.add(i * T::SIZE), 2 * T::SIZE);
                    let y = act.add(i * asz + aq);
                    min_step::<T, D>(w, y, &terms, i, &mut acc0[0][0], &mut msum[0][0]);
                    let y = act.add((i + 1) * asz + aq);
                    min_step::<T, D>(w, y, &terms, i + 1, &mut acc1[0][0], &mut msum[0][0]);
                    i += 2;
                }
                if i < nb {
                    let y = act.add(i * asz + aq);
                    min_step::<T, D>(w, y, &terms, i, &mut acc0[0][0], &mut msum[0][0]);
                }
                *job.dsts[c].add(m) = finish(&acc0, &acc1, &msum)[0][0];
            }
        }
    }
}
