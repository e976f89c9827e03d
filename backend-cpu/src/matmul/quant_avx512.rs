//! The AVX-512 prompt kernel of the legacy formats but Q4_0 / Q5_0 (those take
//! `quant_rows8_x86`, and the K-quants `quant_rows8_k_x86`): two weight rows x four
//! activation columns.
//!
//! [`legacy_2x4`]: two blocks per 512-bit vector. The low half of every vector holds an even block
//! and the high half the next, odd one, so the accumulator of a (row, column) is `quant_x86`'s even (low) and odd (high)
//! `__m256` accumulators side by side, updated with the same per-lane operations: every result is
//! bit-identical to the one-row kernels' (a token's logits do not depend on its batch), at half the
//! instructions.
//!
//! The integer dot products use VNNI's unsigned x signed `vpdpbusd` on the weights made unsigned
//! ([`LegacyX86::unpack_u`]), starting from minus `OFFSET` times the activations' sums (one
//! `vpdpbusd` per column and block pair, shared by both rows), which gives the signed dot exactly.

use super::quant::{act_layout, rd16, HalfCvt};
use super::quant_x86::{finish, legacy_step, F16c, LegacyX86, VnniDot};
use std::arch::x86_64::*;

/// `a` in the low eight lanes, `b` in the high eight.
#[inline(always)]
unsafe fn halves(a: f32, b: f32) -> __m512 {
    // SAFETY: AVX-512 F enabled by the caller.
    unsafe { _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(a), _mm512_set1_ps(b)) }
}

/// `lo` in the low 256 bits, `hi` in the high 256 bits.
#[inline(always)]
unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
    // SAFETY: AVX-512 F enabled by the caller.
    unsafe { _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi) }
}

/// The accumulators of [`legacy_2x4`]: per (row, column) the even and odd blocks' lanes, and the
/// min terms per row with one lane per column.
struct Acc {
    dot: [[__m512; 4]; 2],
    min: [__m128; 2],
}

/// Blocks `i` (low halves) and `i + 1` (high halves) of both weight rows against four columns.
#[inline(always)]
unsafe fn pair_step<T: LegacyX86>(
    w: &[*const u8; 2],
    acts: &[*const u8; 4],
    i: usize,
    acc: &mut Acc,
) {
    let (aq, asz) = act_layout(T::MIN);
    // SAFETY: AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C enabled by the caller; blocks `i` and
    // `i + 1` exist in every row.
    unsafe {
        let mut q = [_mm512_setzero_si512(); 2];
        let mut d = [_mm512_setzero_ps(); 2];
        let mut m = [[0f32; 2]; 2];
        for r in 0..2 {
            let p = w[r].add(i * T::SIZE);
            let pn = p.add(T::SIZE);
            q[r] = join(T::unpack_u(p), T::unpack_u(pn));
            let ((d0, m0), (d1, m1)) = (T::dm::<F16c>(p), T::dm::<F16c>(pn));
            d[r] = halves(d0, d1);
            m[r] = [m0, m1];
        }
        let mut sa = [[0f32; 4]; 2];
        for c in 0..4 {
            let a = acts[c].add(i * asz);
            let an = a.add(asz);
            let y = join(
                _mm256_loadu_si256(a.add(aq) as *const __m256i),
                _mm256_loadu_si256(an.add(aq) as *const __m256i),
            );
            let da = halves(F16c::cvt(rd16(a)), F16c::cvt(rd16(an)));
            let start = if T::OFFSET == 0 {
                _mm512_setzero_si512()
            } else {
                let off = _mm512_set1_epi8(T::OFFSET as i8);
                _mm512_sub_epi32(
                    _mm512_setzero_si512(),
                    _mm512_dpbusd_epi32(_mm512_setzero_si512(), off, y),
                )
            };
            if T::MIN {
                sa[0][c] = F16c::cvt(rd16(a.add(2)));
                sa[1][c] = F16c::cvt(rd16(an.add(2)));
            }
            for r in 0..2 {
                let s = _mm512_dpbusd_epi32(start, q[r], y);
                let scale = _mm512_mul_ps(d[r], da);
                acc.dot[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale, acc.dot[r][c]);
            }
        }
        if T::MIN {
            for h in 0..2 {
                let s = _mm_loadu_ps(sa[h].as_ptr());
                for (min, mr) in acc.min.iter_mut().zip(&m) {
                    *min = _mm_add_ps(*min, _mm_mul_ps(_mm_set1_ps(mr[h]), s));
                }
            }
        }
    }
}

/// Legacy kernel of the prompt products at the AVX-512 level: two weight rows of `nb` blocks
/// against four Q8_0 / Q8_1 rows (see the module docs), the last block of an odd count by
/// `quant_x86`'s 256-bit step into the even accumulators.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C must be enabled in the caller; every row holds `nb`
/// blocks.
#[inline(always)]
pub(super) unsafe fn legacy_2x4<T: LegacyX86>(
    w: &[*const u8; 2],
    acts: &[*const u8; 4],
    nb: usize,
) -> [[f32; 4]; 2] {
    // SAFETY: see the function's contract.
    unsafe {
        let mut acc = Acc {
            dot: [[_mm512_setzero_ps(); 4]; 2],
            min: [_mm_setzero_ps(); 2],
        };
        let mut i = 0;
        while i + 2 <= nb {
            pair_step::<T>(w, acts, i, &mut acc);
            i += 2;
        }
        let mut even = [[_mm256_setzero_ps(); 4]; 2];
        let mut odd = [[_mm256_setzero_ps(); 4]; 2];
        let mut msum = [[0f32; 4]; 2];
        for r in 0..2 {
            for c in 0..4 {
                let v = _mm512_castps_pd(acc.dot[r][c]);
                even[r][c] = _mm256_castpd_ps(_mm512_castpd512_pd256(v));
                odd[r][c] = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(v));
            }
            _mm_storeu_ps(msum[r].as_mut_ptr(), acc.min[r]);
        }
        if i < nb {
            legacy_step::<T, VnniDot, 2, 4>(w, acts, i, &mut even, &mut msum);
        }
        finish(&even, &odd, &msum)
    }
}
