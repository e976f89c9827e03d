//! Vectorised `exp` of the row primitives (`vector.rs`) on x86: Cephes' `expf` (range reduction by
//! `n = round(x log2 e)` with `ln 2` split in two, a degree-6 polynomial on the remainder, times
//! `2^n`), at the AVX2 and AVX-512 levels. Every element goes through the vector code (a partial
//! last vector is computed in a padded copy), so an element's result does not depend on where it
//! sits in the row.

use crate::matmul::vec::F32Vec;
use std::arch::x86_64::*;

/// Cephes' constants: `log2 e`, `ln 2 = C1 + C2` and the polynomial's coefficients (highest first).
const LOG2E: f32 = std::f32::consts::LOG2_E;
const C1: f32 = 0.693_359_4;
const C2: f32 = -2.121_944_4e-4;
const P: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];
/// Inputs are clamped to this range (above: `exp` saturates at `exp(HI)`).
const HI: f32 = 88.37;
/// The AVX2 level builds `2^n` from exponent bits, so it stops where `n` would leave the normal range.
const LO_AVX2: f32 = -87.33;
/// AVX-512 scales by `vscalefps`, which reaches the subnormals and 0.
const LO_AVX512: f32 = -104.0;

/// `exp` of 8 lanes at the AVX2 level.
#[inline(always)]
unsafe fn exp8(x: __m256) -> __m256 {
    // SAFETY: AVX2 and FMA enabled by the caller.
    unsafe {
        let x = _mm256_min_ps(
            _mm256_max_ps(x, _mm256_set1_ps(LO_AVX2)),
            _mm256_set1_ps(HI),
        );
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(LOG2E)),
        );
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(C1), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(C2), r);
        let mut p = _mm256_set1_ps(P[0]);
        for &c in &P[1..] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let p = _mm256_add_ps(
            _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r),
            _mm256_set1_ps(1.0),
        );
        let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        ));
        _mm256_mul_ps(p, _mm256_castsi256_ps(bits))
    }
}

/// `exp` of 16 lanes at the AVX-512 level.
#[inline(always)]
unsafe fn exp16(x: __m512) -> __m512 {
    // SAFETY: AVX-512 F enabled by the caller.
    unsafe {
        let x = _mm512_min_ps(
            _mm512_max_ps(x, _mm512_set1_ps(LO_AVX512)),
            _mm512_set1_ps(HI),
        );
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(x, _mm512_set1_ps(LOG2E)),
        );
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(C1), x);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(C2), r);
        let mut p = _mm512_set1_ps(P[0]);
        for &c in &P[1..] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        let p = _mm512_add_ps(
            _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r),
            _mm512_set1_ps(1.0),
        );
        _mm512_scalef_ps(p, n)
    }
}

/// The vectors `exp` is computed on (trait methods, not closures: a closure would not inherit the
/// caller's target features and its intrinsics would become calls).
trait ExpVec: F32Vec {
    unsafe fn exp(self) -> Self;
}

// SAFETY (every `unsafe` block of these impls): the caller enables the level's features and
// passes `LANES` valid elements.
impl ExpVec for __m256 {
    #[inline(always)]
    unsafe fn exp(self) -> Self {
        unsafe { exp8(self) }
    }
}

impl ExpVec for __m512 {
    #[inline(always)]
    unsafe fn exp(self) -> Self {
        unsafe { exp16(self) }
    }
}

/// `exp` of the `n` elements at `y`, the last partial vector in a padded copy.
#[inline(always)]
unsafe fn exp_row<V: ExpVec>(y: *mut f32, n: usize) {
    let l = V::LANES;
    // SAFETY: `y` holds `n` elements (caller); the padded copy holds 16 >= `l`.
    unsafe {
        let mut i = 0;
        while i + l <= n {
            V::load(y.add(i)).exp().store(y.add(i));
            i += l;
        }
        if i < n {
            let mut pad = [0f32; 16];
            std::ptr::copy_nonoverlapping(y.add(i), pad.as_mut_ptr(), n - i);
            V::load(pad.as_ptr()).exp().store(pad.as_mut_ptr());
            std::ptr::copy_nonoverlapping(pad.as_ptr(), y.add(i), n - i);
        }
    }
}

/// `y[i] = exp(y[i])` for `n` elements at the AVX2 level.
///
/// # Safety
/// AVX2 and FMA must be available; `y` must hold `n` elements.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn exp_avx2(y: *mut f32, n: usize) {
    // SAFETY: forwarded from the caller.
    unsafe { exp_row::<__m256>(y, n) }
}

/// `y[i] = exp(y[i])` for `n` elements at the AVX-512 level.
///
/// # Safety
/// AVX-512 F must be available; `y` must hold `n` elements.
#[target_feature(enable = "avx2,fma,avx512f")]
pub(crate) unsafe fn exp_avx512(y: *mut f32, n: usize) {
    // SAFETY: forwarded from the caller.
    unsafe { exp_row::<__m512>(y, n) }
}
