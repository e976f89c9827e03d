//! Quantization of the activation rows of the quantized products ([`quantize_act`]): Q8_0 and Q8_1
//! with AVX2 at the x86 levels, every other type (and every level elsewhere) through ggml-core's
//! reference quantizer. A decode step quantizes each product's single activation row on one
//! thread while the others wait, so the scalar quantizer's cost showed in the step (2% of a
//! SmolLM2 decode's samples at AVX2).
//!
//! The vector quantizer computes the reference's steps exactly: the block's largest magnitude,
//! `d = amax / 127`, `id = 1 / d` (0 for an all-zero block), each `x * id` clamped to ±2^23,
//! rounded half away from zero and truncated to 8 bits, and for Q8_1 `s = d * sum(q)`; `d` and
//! `s` are rounded to half precision to nearest even. Its bytes equal the reference's for every
//! input without NaN (the reference's maximum skips a NaN in an order-dependent way).

use super::SimdLevel;
use ggml_core::quant::quantize_row;
use ggml_core::{DType, Result};

/// Quantizes the f32 row `src` to `dtype` into `dst` (a whole row of blocks), with the vector
/// quantizer where `level` and `dtype` have one.
pub(crate) fn quantize_act(
    level: SimdLevel,
    dtype: DType,
    src: &[f32],
    dst: &mut [u8],
) -> Result<()> {
    #[cfg(target_arch = "x86_64")]
    if matches!(level, SimdLevel::Avx2 | SimdLevel::Avx512)
        && matches!(dtype, DType::Q8_0 | DType::Q8_1)
        && dtype.row_size(src.len()) == Some(dst.len())
    {
        let q8_1 = dtype == DType::Q8_1;
        // SAFETY: the level's features are available (its kernels run only then); `dst` holds a
        // whole row of blocks of `src`, checked above.
        unsafe { x86::quantize_q8(src, dst, q8_1) };
        return Ok(());
    }
    let _ = level;
    quantize_row(dtype, src, dst)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Elements per block.
    const QK: usize = 32;

    /// The half-precision bits of `x`, rounded to nearest even.
    #[inline(always)]
    unsafe fn half_bits(x: f32) -> u16 {
        // SAFETY: F16C enabled by the caller.
        unsafe {
            _mm_extract_epi16::<0>(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(x))) as u16
        }
    }

    /// `y` rounded half away from zero as the reference does (clamped to ±2^23, truncated, then
    /// one up or down where the dropped fraction is at least a half), as 32-bit integers.
    #[inline(always)]
    unsafe fn round_half_away(y: __m256) -> __m256i {
        // SAFETY: AVX2 enabled by the caller.
        unsafe {
            let lim = _mm256_set1_ps(8_388_608.0);
            // min/max return their second operand for a NaN: NaN stays NaN (and truncates to
            // 0x80000000, whose low byte is 0, as `NaN as i32` is 0).
            let c = _mm256_max_ps(
                _mm256_sub_ps(_mm256_setzero_ps(), lim),
                _mm256_min_ps(lim, y),
            );
            let i = _mm256_cvttps_epi32(c);
            let f = _mm256_sub_ps(c, _mm256_cvtepi32_ps(i));
            let up = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GE_OQ>(f, _mm256_set1_ps(0.5)));
            let down = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LE_OQ>(f, _mm256_set1_ps(-0.5)));
            _mm256_add_epi32(_mm256_sub_epi32(i, up), down)
        }
    }

    /// The low bytes of the eight 32-bit lanes of `v`, in order, in the low 8 bytes.
    #[inline(always)]
    unsafe fn low_bytes(v: __m256i) -> u64 {
        // SAFETY: AVX2 enabled by the caller.
        unsafe {
            let pick = _mm256_setr_epi8(
                0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, //
                0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
            );
            let b = _mm256_shuffle_epi8(v, pick);
            let lo = _mm_cvtsi128_si32(_mm256_castsi256_si128(b)) as u32;
            let hi = _mm_cvtsi128_si32(_mm256_extracti128_si256::<1>(b)) as u32;
            u64::from(lo) | (u64::from(hi) << 32)
        }
    }

    /// Quantizes `src` into Q8_0 (`q8_1` false: d, 32 quants) or Q8_1 (d, s, 32 quants) blocks.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; `dst` holds `src.len() / 32` blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn quantize_q8(src: &[f32], dst: &mut [u8], q8_1: bool) {
        let (qoff, bsize) = if q8_1 { (4, 36) } else { (2, 34) };
        let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
        for (b, x) in src.chunks_exact(QK).enumerate() {
            // SAFETY: `x` holds 32 floats; block `b` of `dst` holds `bsize` bytes (caller).
            unsafe {
                let p = x.as_ptr();
                let v = [0, 8, 16, 24].map(|o| _mm256_loadu_ps(p.add(o)));
                let mut m = _mm256_and_ps(v[0], abs_mask);
                for vi in &v[1..] {
                    m = _mm256_max_ps(m, _mm256_and_ps(*vi, abs_mask));
                }
                let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
                let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
                let m1 = _mm_max_ss(m2, _mm_shuffle_ps::<1>(m2, m2));
                let amax = _mm_cvtss_f32(m1).max(0.0);
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                let idv = _mm256_set1_ps(id);
                let out = dst.as_mut_ptr().add(b * bsize);
                let mut sum = _mm256_setzero_si256();
                for (j, vi) in v.iter().enumerate() {
                    let q = round_half_away(_mm256_mul_ps(*vi, idv));
                    // The sum of the 8-bit values (the lanes' low bytes, sign-extended).
                    sum =
                        _mm256_add_epi32(sum, _mm256_srai_epi32::<24>(_mm256_slli_epi32::<24>(q)));
                    (out.add(qoff + 8 * j) as *mut u64).write_unaligned(low_bytes(q));
                }
                (out as *mut u16).write_unaligned(half_bits(d));
                if q8_1 {
                    let s4 = _mm_add_epi32(
                        _mm256_castsi256_si128(sum),
                        _mm256_extracti128_si256::<1>(sum),
                    );
                    let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
                    let s1 = _mm_add_epi32(s2, _mm_shuffle_epi32::<1>(s2));
                    let total = _mm_cvtsi128_si32(s1);
                    (out.add(2) as *mut u16).write_unaligned(half_bits(total as f32 * d));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    /// Rows of every kind of block: fresh random values at several scales, all zeros, one nonzero
    /// element, ties at half steps, subnormals (an infinite inverse scale), huge values.
    fn rows() -> Vec<Vec<f32>> {
        let mut rng = rand::thread_rng();
        let mut out = Vec::new();
        for scale in [1e-3f32, 1.0, 37.0, 1e4] {
            out.push((0..320).map(|_| (rng.gen::<f32>() - 0.5) * scale).collect());
        }
        out.push(vec![0.0; 64]);
        let mut one = vec![0.0; 32];
        one[7] = -3.5;
        out.push(one);
        out.push((0..32).map(|i| (i as f32 - 16.0) * 0.5).collect());
        out.push(
            (0..32)
                .map(|i| (i as f32 - 16.0) * 127.0 / 16.0 + 0.5)
                .collect(),
        );
        out.push((0..32).map(|i| f32::from_bits(1 + i)).collect());
        out.push((0..32).map(|i| if i == 3 { 3e38 } else { -1e38 }).collect());
        out
    }

    #[test]
    fn vector_quantizer_equals_the_reference() {
        let levels: Vec<_> = SimdLevel::available();
        for (i, row) in rows().iter().enumerate() {
            for dtype in [DType::Q8_0, DType::Q8_1] {
                let size = dtype.row_size(row.len()).unwrap();
                let mut want = vec![0u8; size];
                quantize_row(dtype, row, &mut want).unwrap();
                for &level in &levels {
                    let mut got = vec![0xAAu8; size];
                    quantize_act(level, dtype, row, &mut got).unwrap();
                    assert_eq!(got, want, "row {i} {row:?}, {dtype}, {}", level.name());
                }
            }
        }
    }

    #[test]
    fn other_types_and_bad_lengths_go_to_the_reference() {
        let row: Vec<f32> = (0..256).map(|i| (i as f32).sin()).collect();
        for level in SimdLevel::available() {
            let mut got = vec![0u8; DType::Q8K.row_size(256).unwrap()];
            quantize_act(level, DType::Q8K, &row, &mut got).unwrap();
            let mut want = got.clone();
            quantize_row(DType::Q8K, &row, &mut want).unwrap();
            assert_eq!(got, want);
            let mut short = vec![0u8; 10];
            assert!(quantize_act(level, DType::Q8_0, &row, &mut short).is_err());
        }
    }
}
