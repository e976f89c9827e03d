//! What the x86 kernels of the 4- and 5-bit legacy formats share beyond `quant_x86`: the
//! unsigned quants of the signed ones (Q4_0, Q5_0: [`SmallOffset`], which the eight-row kernels of
//! `quant_rows8_x86` multiply) and the one-column kernel of the `d * q + m` ones (Q4_1, Q5_1,
//! [`min_rows`]: the decode products of their models), whose Q8_1 activation scales and sums are
//! converted once per column and tile instead of once per weight row (same values, same order of
//! the float steps as the generic kernel's, so bit-identical to it and to the prompt kernel).

use super::quant::{act_layout, rd16, HalfCvt, Q4_0, Q5_0};
use super::quant_x86::{finish, prefetch_ahead, DotI8, F16c, LegacyX86};
use super::Job;
use std::arch::x86_64::*;
use std::ops::Range;

/// Legacy formats whose quants plus [`LegacyX86::OFFSET`] stay below 32, so that the unsigned x
/// signed byte products of a pair (and of four pairs) sum without saturating 16 bits. At AVX2
/// their unsigned quants are [`LegacyX86::unpack_u`]'s.
pub(super) trait SmallOffset: LegacyX86 {
    /// [`LegacyX86::unpack_u`]'s bytes with AVX-512 BW/VL (the kernels of `quant_rows8_x86`):
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

/// Per block of one Q8_1 activation column: its scale and scaled sum, converted once per column
/// and tile for the `d * q + m` formats (Q4_1, Q5_1), side by side as the block's own `d` and `m`
/// are, so that one vector product gives both `d * da` and `m * sa`.
struct MinColumnTerms(Vec<[f32; 2]>);

impl MinColumnTerms {
    #[inline(always)]
    unsafe fn new(act: *const u8, nb: usize) -> Self {
        let (_, asz) = act_layout(true);
        let mut terms = Vec::with_capacity(nb);
        for i in 0..nb {
            // SAFETY: the row holds `nb` blocks (caller).
            unsafe {
                let a = act.add(i * asz);
                terms.push([F16c::cvt(rd16(a)), F16c::cvt(rd16(a.add(2)))]);
            }
        }
        MinColumnTerms(terms)
    }
}

/// Block `i` of weight row `w` against the column of `terms` (quants at `y`): the generic
/// kernel's `legacy_step` for one row and column with the activation terms converted beforehand.
/// The block's `d` and `m` (two halves side by side) are widened by one `vcvtph2ps` from a
/// zero-extended load and multiplied by the column's terms in one `vmulps`: lane 0 is the
/// generic kernel's `d * da`, lane 1 its `m * sa`, which `msum` adds up in lane 1 in the generic
/// kernel's order (exact conversions, the same single-rounded products and sums).
#[inline(always)]
unsafe fn min_step<T: LegacyX86, D: DotI8>(
    w: *const u8,
    y: *const u8,
    terms: &MinColumnTerms,
    i: usize,
    acc: &mut __m256,
    msum: &mut __m128,
) {
    debug_assert!(T::MIN);
    // SAFETY: AVX2/FMA/F16C enabled by the caller; block `i` exists in the row and the column.
    unsafe {
        let p = w.add(i * T::SIZE);
        let q = T::unpack_x86(p);
        let y = _mm256_loadu_si256(y as *const __m256i);
        let dm = _mm_cvtph_ps(_mm_cvtsi32_si128((p as *const i32).read_unaligned()));
        let t = _mm_castpd_ps(_mm_load_sd(terms.0.as_ptr().add(i) as *const f64));
        let prod = _mm_mul_ps(dm, t);
        let scale = _mm256_broadcastss_ps(prod);
        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(D::dot_us(q, y)), scale, *acc);
        *msum = _mm_add_ps(*msum, prod);
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
                let mut msum = _mm_setzero_ps();
                let mut i = 0;
                while i + 2 <= nb {
                    prefetch_ahead(w.add(i * T::SIZE), 2 * T::SIZE);
                    let y = act.add(i * asz + aq);
                    min_step::<T, D>(w, y, &terms, i, &mut acc0[0][0], &mut msum);
                    let y = act.add((i + 1) * asz + aq);
                    min_step::<T, D>(w, y, &terms, i + 1, &mut acc1[0][0], &mut msum);
                    i += 2;
                }
                if i < nb {
                    let y = act.add(i * asz + aq);
                    min_step::<T, D>(w, y, &terms, i, &mut acc0[0][0], &mut msum);
                }
                let msum = [[_mm_cvtss_f32(_mm_movehdup_ps(msum))]];
                *job.dsts[c].add(m) = finish(&acc0, &acc1, &msum)[0][0];
            }
        }
    }
}
