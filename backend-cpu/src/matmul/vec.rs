//! `F32Vec`: the few f32 vector operations the float kernels need (load f32/f16/bf16, splat, fused
//! multiply-add, horizontal sum), implemented once per ISA: a portable 8-lane array (`Scalar8`),
//! AVX2/FMA/F16C `__m256`, AVX-512 `__m512` and NEON `Neon8` (two `float32x4_t`). The float dot products and the GEMM micro-kernel
//! are written once, generic over this trait, and instantiated inside `#[target_feature]`
//! functions so that the intrinsics inline.

/// An f32 SIMD vector of `LANES` lanes.
///
/// # Safety
/// The methods are `unsafe` because the x86 implementations require their CPU features (the caller
/// has checked them) and because the loads and stores read and write `LANES` elements at raw
/// pointers, which must be valid (no alignment is required).
pub(crate) trait F32Vec: Copy {
    const LANES: usize;
    unsafe fn zero() -> Self;
    unsafe fn splat(x: f32) -> Self;
    unsafe fn load(p: *const f32) -> Self;
    unsafe fn store(self, p: *mut f32);
    /// Loads `LANES` IEEE half-precision values and widens them (exactly).
    unsafe fn load_f16(p: *const u16) -> Self;
    /// Loads `LANES` bfloat16 values and widens them (exactly).
    unsafe fn load_bf16(p: *const u16) -> Self;
    /// `a * b + c`.
    unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self;
    unsafe fn add(a: Self, b: Self) -> Self;
    unsafe fn hsum(self) -> f32;
}

/// Portable vector: 8 lanes in an array, element-wise loops the compiler may vectorize.
#[derive(Clone, Copy)]
pub(crate) struct Scalar8([f32; 8]);

impl F32Vec for Scalar8 {
    const LANES: usize = 8;
    #[inline(always)]
    unsafe fn zero() -> Self {
        Scalar8([0.0; 8])
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        Scalar8([x; 8])
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: the caller guarantees 8 readable f32 at `p`.
        Scalar8(unsafe { (p as *const [f32; 8]).read_unaligned() })
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        // SAFETY: the caller guarantees 8 writable f32 at `p`.
        unsafe { (p as *mut [f32; 8]).write_unaligned(self.0) }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u16) -> Self {
        // SAFETY: the caller guarantees 8 readable u16 at `p`.
        let h = unsafe { (p as *const [u16; 8]).read_unaligned() };
        Scalar8(h.map(ggml_core::quant::f16_bits_to_f32))
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u16) -> Self {
        // SAFETY: the caller guarantees 8 readable u16 at `p`.
        let h = unsafe { (p as *const [u16; 8]).read_unaligned() };
        Scalar8(h.map(|b| f32::from_bits(u32::from(b) << 16)))
    }
    #[inline(always)]
    unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self {
        // Plain multiply-add: `mul_add` would call libm's fmaf without the FMA feature.
        Scalar8(std::array::from_fn(|i| a.0[i] * b.0[i] + c.0[i]))
    }
    #[inline(always)]
    unsafe fn add(a: Self, b: Self) -> Self {
        Scalar8(std::array::from_fn(|i| a.0[i] + b.0[i]))
    }
    #[inline(always)]
    unsafe fn hsum(self) -> f32 {
        let v = self.0;
        ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]))
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::F32Vec;
    use std::arch::x86_64::*;

    /// AVX2 + FMA + F16C: 8 lanes.
    impl F32Vec for __m256 {
        const LANES: usize = 8;
        #[inline(always)]
        unsafe fn zero() -> Self {
            // SAFETY (all methods of this impl): the caller runs inside a function compiled with
            // avx2, fma and f16c after checking them at run time, and passes valid pointers.
            unsafe { _mm256_setzero_ps() }
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> Self {
            // SAFETY: see `zero`.
            unsafe { _mm256_set1_ps(x) }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            // SAFETY: see `zero`; 8 readable f32 at `p`.
            unsafe { _mm256_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            // SAFETY: see `zero`; 8 writable f32 at `p`.
            unsafe { _mm256_storeu_ps(p, self) }
        }
        #[inline(always)]
        unsafe fn load_f16(p: *const u16) -> Self {
            // SAFETY: see `zero`; 8 readable u16 at `p`.
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
        }
        #[inline(always)]
        unsafe fn load_bf16(p: *const u16) -> Self {
            // SAFETY: see `zero`; 8 readable u16 at `p`.
            unsafe {
                let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(h))
            }
        }
        #[inline(always)]
        unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self {
            // SAFETY: see `zero`.
            unsafe { _mm256_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        unsafe fn add(a: Self, b: Self) -> Self {
            // SAFETY: see `zero`.
            unsafe { _mm256_add_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn hsum(self) -> f32 {
            // SAFETY: see `zero`.
            unsafe {
                let s = _mm_add_ps(
                    _mm256_castps256_ps128(self),
                    _mm256_extractf128_ps::<1>(self),
                );
                let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                let s = _mm_add_ss(s, _mm_movehdup_ps(s));
                _mm_cvtss_f32(s)
            }
        }
    }

    /// AVX-512 F (+ the AVX2 level): 16 lanes.
    impl F32Vec for __m512 {
        const LANES: usize = 16;
        #[inline(always)]
        unsafe fn zero() -> Self {
            // SAFETY (all methods of this impl): the caller runs inside a function compiled with
            // avx512f (and the AVX2 level) after checking them at run time, with valid pointers.
            unsafe { _mm512_setzero_ps() }
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> Self {
            // SAFETY: see `zero`.
            unsafe { _mm512_set1_ps(x) }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            // SAFETY: see `zero`; 16 readable f32 at `p`.
            unsafe { _mm512_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            // SAFETY: see `zero`; 16 writable f32 at `p`.
            unsafe { _mm512_storeu_ps(p, self) }
        }
        #[inline(always)]
        unsafe fn load_f16(p: *const u16) -> Self {
            // SAFETY: see `zero`; 16 readable u16 at `p`.
            unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
        }
        #[inline(always)]
        unsafe fn load_bf16(p: *const u16) -> Self {
            // SAFETY: see `zero`; 16 readable u16 at `p`.
            unsafe {
                let h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p as *const __m256i));
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(h))
            }
        }
        #[inline(always)]
        unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self {
            // SAFETY: see `zero`.
            unsafe { _mm512_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        unsafe fn add(a: Self, b: Self) -> Self {
            // SAFETY: see `zero`.
            unsafe { _mm512_add_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn hsum(self) -> f32 {
            // SAFETY: see `zero`.
            unsafe { _mm512_reduce_add_ps(self) }
        }
    }
}

#[cfg(target_arch = "aarch64")]
pub(crate) use neon::Neon8;

#[cfg(target_arch = "aarch64")]
mod neon {
    use super::F32Vec;
    use std::arch::aarch64::*;

    /// NEON: 8 lanes in two quad registers.
    #[derive(Clone, Copy)]
    pub(crate) struct Neon8(float32x4_t, float32x4_t);

    impl F32Vec for Neon8 {
        const LANES: usize = 8;
        #[inline(always)]
        unsafe fn zero() -> Self {
            // SAFETY (all methods of this impl): NEON is enabled in the caller (checked at run
            // time; it is part of the aarch64 base ISA), and pointers are valid for 8 elements.
            unsafe { Neon8(vdupq_n_f32(0.0), vdupq_n_f32(0.0)) }
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> Self {
            // SAFETY: see `zero`.
            unsafe { Neon8(vdupq_n_f32(x), vdupq_n_f32(x)) }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            // SAFETY: see `zero`; 8 readable f32 at `p`.
            unsafe { Neon8(vld1q_f32(p), vld1q_f32(p.add(4))) }
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            // SAFETY: see `zero`; 8 writable f32 at `p`.
            unsafe {
                vst1q_f32(p, self.0);
                vst1q_f32(p.add(4), self.1);
            }
        }
        #[inline(always)]
        unsafe fn load_f16(p: *const u16) -> Self {
            // Portable widening (the f16 vector types of std::arch are not stable).
            // SAFETY: see `zero`; 8 readable u16 at `p`.
            let h = unsafe { (p as *const [u16; 8]).read_unaligned() };
            let f = h.map(ggml_core::quant::f16_bits_to_f32);
            // SAFETY: `f` holds 8 f32.
            unsafe { Self::load(f.as_ptr()) }
        }
        #[inline(always)]
        unsafe fn load_bf16(p: *const u16) -> Self {
            // SAFETY: see `zero`; 8 readable u16 at `p`.
            unsafe {
                let h = vld1q_u16(p);
                Neon8(
                    vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(h))),
                    vreinterpretq_f32_u32(vshll_high_n_u16::<16>(h)),
                )
            }
        }
        #[inline(always)]
        unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self {
            // SAFETY: see `zero`.
            unsafe { Neon8(vfmaq_f32(c.0, a.0, b.0), vfmaq_f32(c.1, a.1, b.1)) }
        }
        #[inline(always)]
        unsafe fn add(a: Self, b: Self) -> Self {
            // SAFETY: see `zero`.
            unsafe { Neon8(vaddq_f32(a.0, b.0), vaddq_f32(a.1, b.1)) }
        }
        #[inline(always)]
        unsafe fn hsum(self) -> f32 {
            // SAFETY: see `zero`.
            unsafe { vaddvq_f32(vaddq_f32(self.0, self.1)) }
        }
    }
}
