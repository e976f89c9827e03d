//! x86-64 kernels of the quantized matmul (AVX2 and AVX-512 VNNI levels). The block formats and
//! their scale handling are shared with the portable kernels (`quant.rs`: [`Legacy::dm`],
//! [`KQuant::unpack`]); this file holds what the intrinsics force: unpacking legacy blocks into one
//! `__m256i` of 32 quants and the 8-bit integer dot products, which differ per level only in
//! [`DotI8`] (AVX2 `maddubs`+`madd` versus AVX-512 VNNI `vpdpbusd`) and in its prompt kernels
//! (two weight rows x four columns, at AVX-512 the 512-bit ones of `quant_avx512.rs`). Q4_0 / Q5_0
//! and the K-quants take the eight-row kernels of `quant_rows8_x86.rs` / `quant_rows8_k_x86.rs`
//! at both levels (prompt and decode), Q4_1 / Q5_1 those of `quant_prompt_x86.rs` and
//! `quant_offset_x86.rs`.

use super::quant::{
    act_layout, rd, rd16, rows_with, HalfCvt, KBlock, KQuant, Legacy, Mxfp4, RowKernel, Q4K, Q4_0,
    Q4_1, Q5K, Q5_0, Q5_1, Q6K, Q8_0,
};
use super::quant_offset_x86::min_rows;
use super::quant_prompt_x86::min_prompt_rows;
use super::quant_rows8_k_x86::kquant_rows8;
use super::quant_rows8_x86::{legacy_rows8, Level8};
use super::vec::F32Vec;
use super::{Job, SimdLevel};
use ggml_core::quant::MXFP4_VALUES;
use ggml_core::DType;
use std::arch::x86_64::*;
use std::marker::PhantomData;
use std::ops::Range;

/// f16 bits to f32 by table lookup (as ggml's `ggml_table_f32_f16`). The table is used instead of
/// F16C for scalar scales: LLVM lowers the scalar `vcvtph2ps` input to a `vpinsrw` that merges into
/// a stale register, which chained every block of a row into one dependency chain (3x slower Q8_0
/// GEMV at the AVX-512 level).
pub(super) struct F16c;

impl HalfCvt for F16c {
    #[inline(always)]
    unsafe fn cvt(h: u16) -> f32 {
        F16_TABLE[usize::from(h)]
    }
}

use ggml_core::quant::F16_TO_F32 as F16_TABLE;

/// How far ahead of the block in hand the one-column (decode) kernels prefetch weights. A decode
/// product streams every weight once from memory and does little work per byte, so the hardware
/// prefetcher alone leaves the loads waiting (SmolLM2 Q4_1 decode: a third of the row kernel's
/// samples on the weight loads); 1280-2048 bytes measured best at AVX2 on a 2-core EPYC guest.
const PREFETCH_AHEAD: usize = 1536;

/// Prefetches the cache lines of the `len` weight bytes [`PREFETCH_AHEAD`] bytes after `p` (a hint:
/// addresses past the weights are harmless).
#[inline(always)]
pub(super) unsafe fn prefetch_ahead(p: *const u8, len: usize) {
    let mut off = 0;
    while off < len {
        // SAFETY: SSE is part of x86-64; a prefetch never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD + off) as *const i8) };
        off += 64;
    }
}

/// 8-bit integer dot products of 32-byte vectors into eight i32 partial sums.
pub(crate) trait DotI8 {
    /// Signed `x` times signed `y` (`y` never -128).
    unsafe fn dot_ss(x: __m256i, y: __m256i) -> __m256i;
    /// Unsigned `x` times signed `y`.
    unsafe fn dot_us(x: __m256i, y: __m256i) -> __m256i;
    /// The legacy prompt kernel of this level (two weight rows against four columns).
    #[inline(always)]
    unsafe fn prompt_2x4<T: LegacyX86>(
        w: &[*const u8; 2],
        acts: &[*const u8; 4],
        nb: usize,
    ) -> [[f32; 4]; 2]
    where
        Self: Sized,
    {
        // SAFETY: forwarded from the caller.
        unsafe {
            if T::PAIR_ROWS {
                legacy_2x4::<T, Self>(w, acts, nb)
            } else {
                [
                    legacy::<T, Self, 4>(w[0], acts, nb),
                    legacy::<T, Self, 4>(w[1], acts, nb),
                ]
            }
        }
    }
}

pub(crate) struct Avx2Dot;
pub(crate) struct VnniDot;

impl DotI8 for Avx2Dot {
    #[inline(always)]
    unsafe fn dot_ss(x: __m256i, y: __m256i) -> __m256i {
        // SAFETY: AVX2 is enabled in every caller.
        unsafe { Self::dot_us(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)) }
    }
    #[inline(always)]
    unsafe fn dot_us(x: __m256i, y: __m256i) -> __m256i {
        // SAFETY: AVX2 is enabled in every caller. Pair sums stay below 2 * 128 * 127 < 2^15.
        unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1)) }
    }
}

impl DotI8 for VnniDot {
    #[inline(always)]
    unsafe fn dot_ss(x: __m256i, y: __m256i) -> __m256i {
        // SAFETY: AVX2 is enabled in every caller.
        unsafe { Self::dot_us(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)) }
    }
    #[inline(always)]
    unsafe fn dot_us(x: __m256i, y: __m256i) -> __m256i {
        // SAFETY: AVX-512 VNNI and VL are enabled in every caller of this implementation.
        unsafe { _mm256_dpbusd_epi32(_mm256_setzero_si256(), x, y) }
    }
    #[inline(always)]
    unsafe fn prompt_2x4<T: LegacyX86>(
        w: &[*const u8; 2],
        acts: &[*const u8; 4],
        nb: usize,
    ) -> [[f32; 4]; 2] {
        // SAFETY: AVX-512 F/BW/VL/VNNI are enabled in every caller of this implementation.
        unsafe { super::quant_avx512::legacy_2x4::<T>(w, acts, nb) }
    }
}

/// Unpacking of legacy blocks into 32 quants in one vector.
pub(crate) trait LegacyX86: Legacy {
    /// Added (mod 256) to the quants by [`LegacyX86::unpack_u`] to make them unsigned: 0 for the
    /// `MIN` formats, else at least minus the smallest quant.
    const OFFSET: u8;
    /// Whether the AVX2 prompt kernel takes two weight rows at once ([`legacy_2x4`]: activations
    /// loaded once per row pair, but its sixteen accumulators fill every register and spill) or
    /// one row at a time ([`legacy`] with four columns). One row measured faster for Q8_0 (+15% on
    /// a 2-core EPYC guest). (Q4_0 and Q5_0 take neither: see `quant_rows8_x86`.)
    const PAIR_ROWS: bool = true;
    unsafe fn unpack_x86(p: *const u8) -> __m256i;
    /// The 32 quants plus [`LegacyX86::OFFSET`], as unsigned bytes.
    #[inline(always)]
    unsafe fn unpack_u(p: *const u8) -> __m256i {
        // SAFETY: AVX2 enabled by the caller, who passes a whole block.
        unsafe { _mm256_add_epi8(Self::unpack_x86(p), _mm256_set1_epi8(Self::OFFSET as i8)) }
    }
}

/// Low nibbles of 16 bytes in the low lane, high nibbles in the high lane: one broadcast load,
/// the high lane shifted right by 4 (`vpsrlvd`; bits shifted in from the next byte are masked).
#[inline(always)]
unsafe fn nibbles_x86(qs: *const u8) -> __m256i {
    // SAFETY: AVX2 enabled by the caller; 16 readable bytes.
    unsafe {
        let v = _mm256_broadcastsi128_si256(_mm_loadu_si128(qs as *const __m128i));
        let shift = _mm256_set_epi32(4, 4, 4, 4, 0, 0, 0, 0);
        _mm256_and_si256(_mm256_srlv_epi32(v, shift), _mm256_set1_epi8(15))
    }
}

/// 0xFF in byte `i` where bit `i` of the little-endian u32 at `qh` is set (ggml's `bytes_from_bits_32`).
#[inline(always)]
unsafe fn bits_x86(qh: *const u8) -> __m256i {
    // SAFETY: AVX2 enabled by the caller; 4 readable bytes.
    unsafe {
        let x = (qh as *const i32).read_unaligned();
        let shuf = _mm256_set_epi64x(
            0x0303030303030303,
            0x0202020202020202,
            0x0101010101010101,
            0,
        );
        let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x), shuf);
        let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
        _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
    }
}

// SAFETY (every `unsafe` block of these impls): AVX2 is enabled by the caller, who passes a whole block.
impl LegacyX86 for Q4_0 {
    const OFFSET: u8 = 8;
    #[inline(always)]
    unsafe fn unpack_x86(p: *const u8) -> __m256i {
        unsafe { _mm256_sub_epi8(nibbles_x86(p.add(2)), _mm256_set1_epi8(8)) }
    }
    #[inline(always)]
    unsafe fn unpack_u(p: *const u8) -> __m256i {
        unsafe { nibbles_x86(p.add(2)) }
    }
}
impl LegacyX86 for Q4_1 {
    const OFFSET: u8 = 0;
    #[inline(always)]
    unsafe fn unpack_x86(p: *const u8) -> __m256i {
        // SAFETY: AVX2 enabled by the caller; `p` points to a whole block.
        unsafe { nibbles_x86(p.add(4)) }
    }
}
impl LegacyX86 for Q5_0 {
    const OFFSET: u8 = 16;
    #[inline(always)]
    unsafe fn unpack_x86(p: *const u8) -> __m256i {
        // q - 16: the nibble where bit 4 is set, else the nibble with the high bits set (nibble - 16).
        // SAFETY: AVX2 enabled by the caller; `p` points to a whole block.
        unsafe {
            _mm256_or_si256(
                nibbles_x86(p.add(6)),
                _mm256_andnot_si256(bits_x86(p.add(2)), _mm256_set1_epi8(-16)),
            )
        }
    }
    #[inline(always)]
    unsafe fn unpack_u(p: *const u8) -> __m256i {
        // q + 16: the nibble plus 16 where bit 4 is set.
        // SAFETY: AVX2 enabled by the caller; `p` points to a whole block.
        unsafe {
            _mm256_or_si256(
                nibbles_x86(p.add(6)),
                _mm256_and_si256(bits_x86(p.add(2)), _mm256_set1_epi8(16)),
            )
        }
    }
}
impl LegacyX86 for Q5_1 {
    const OFFSET: u8 = 0;
    #[inline(always)]
    unsafe fn unpack_x86(p: *const u8) -> __m256i {
        // SAFETY: AVX2 enabled by the caller; `p` points to a whole block.
        unsafe {
            _mm256_or_si256(
                nibbles_x86(p.add(8)),
                _mm256_and_si256(bits_x86(p.add(4)), _mm256_set1_epi8(16)),
            )
        }
    }
}
impl LegacyX86 for Q8_0 {
    const OFFSET: u8 = 128;
    const PAIR_ROWS: bool = false;
    #[inline(always)]
    unsafe fn unpack_x86(p: *const u8) -> __m256i {
        // SAFETY: AVX2 enabled by the caller; `p` points to a whole block.
        unsafe { _mm256_loadu_si256(p.add(2) as *const __m256i) }
    }
}
impl LegacyX86 for Mxfp4 {
    const OFFSET: u8 = 128;
    #[inline(always)]
    unsafe fn unpack_x86(p: *const u8) -> __m256i {
        // SAFETY: AVX2 enabled by the caller; `p` points to a whole block.
        unsafe {
            let t = _mm_loadu_si128(MXFP4_VALUES.as_ptr() as *const __m128i);
            _mm256_shuffle_epi8(_mm256_set_m128i(t, t), nibbles_x86(p.add(1)))
        }
    }
}

/// Legacy block `i` of `R` weight rows against `C` activation rows, accumulated into `acc`
/// (scaled integer dots) and `msum` (min terms). Each activation block is loaded once for all
/// `R` rows and each weight block unpacked once for all `C` columns.
#[inline(always)]
pub(super) unsafe fn legacy_step<T: LegacyX86, D: DotI8, const R: usize, const C: usize>(
    w: &[*const u8; R],
    acts: &[*const u8; C],
    i: usize,
    acc: &mut [[__m256; C]; R],
    msum: &mut [[f32; C]; R],
) {
    let (aq, asz) = act_layout(T::MIN);
    // SAFETY: AVX2/FMA/F16C enabled by the caller; block `i` exists in every row.
    unsafe {
        // Loops, not `array::from_fn`: a closure does not inherit the caller's target features,
        // so the intrinsics inside it would become calls.
        let mut q = [_mm256_setzero_si256(); R];
        let mut dm = [(0f32, 0f32); R];
        for r in 0..R {
            q[r] = T::unpack_x86(w[r].add(i * T::SIZE));
            dm[r] = T::dm::<F16c>(w[r].add(i * T::SIZE));
        }
        for c in 0..C {
            let a = acts[c].add(i * asz);
            let y = _mm256_loadu_si256(a.add(aq) as *const __m256i);
            let da = F16c::cvt(rd16(a));
            let sa = if T::MIN {
                F16c::cvt(rd16(a.add(2)))
            } else {
                0.0
            };
            for r in 0..R {
                let s = if T::MIN {
                    D::dot_us(q[r], y)
                } else {
                    D::dot_ss(q[r], y)
                };
                let scale = _mm256_set1_ps(dm[r].0 * da);
                acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale, acc[r][c]);
                if T::MIN {
                    msum[r][c] += dm[r].1 * sa;
                }
            }
        }
    }
}

/// The results of the legacy kernels: per (row, column) the even and odd accumulators summed,
/// then horizontally, plus the min terms.
#[inline(always)]
pub(super) unsafe fn finish<const R: usize, const C: usize>(
    acc0: &[[__m256; C]; R],
    acc1: &[[__m256; C]; R],
    msum: &[[f32; C]; R],
) -> [[f32; C]; R] {
    let mut out = [[0f32; C]; R];
    for r in 0..R {
        for c in 0..C {
            // SAFETY: AVX2 enabled by the caller.
            out[r][c] = unsafe { _mm256_add_ps(acc0[r][c], acc1[r][c]).hsum() } + msum[r][c];
        }
    }
    out
}

/// Legacy kernel: weight row of `nb` blocks against `C` Q8_0 / Q8_1 rows. Two accumulators per
/// column (even and odd blocks) hide the FMA latency. One column (decode) prefetches the weights
/// ahead; the columns of a prompt tile share each row, which is in cache after the first group.
#[inline(always)]
unsafe fn legacy<T: LegacyX86, D: DotI8, const C: usize>(
    w: *const u8,
    acts: &[*const u8; C],
    nb: usize,
) -> [f32; C] {
    // SAFETY: AVX2/FMA/F16C enabled by the caller; the rows hold `nb` blocks each.
    unsafe {
        let mut acc0 = [[_mm256_setzero_ps(); C]];
        let mut acc1 = [[_mm256_setzero_ps(); C]];
        let mut msum = [[0f32; C]];
        let mut i = 0;
        while i + 2 <= nb {
            if C == 1 {
                prefetch_ahead(w.add(i * T::SIZE), 2 * T::SIZE);
            }
            legacy_step::<T, D, 1, C>(&[w], acts, i, &mut acc0, &mut msum);
            legacy_step::<T, D, 1, C>(&[w], acts, i + 1, &mut acc1, &mut msum);
            i += 2;
        }
        if i < nb {
            legacy_step::<T, D, 1, C>(&[w], acts, i, &mut acc0, &mut msum);
        }
        let [out] = finish(&acc0, &acc1, &msum);
        out
    }
}

/// Legacy kernel of the prompt products: two weight rows of `nb` blocks against four Q8_0 / Q8_1
/// rows, with [`legacy`]'s even and odd accumulators per (row, column), so that every result is
/// bit-identical to the one-row kernels' (a token's logits must not depend on its batch).
#[inline(always)]
unsafe fn legacy_2x4<T: LegacyX86, D: DotI8>(
    w: &[*const u8; 2],
    acts: &[*const u8; 4],
    nb: usize,
) -> [[f32; 4]; 2] {
    // SAFETY: AVX2/FMA/F16C enabled by the caller; the rows hold `nb` blocks each.
    unsafe {
        let mut acc0 = [[_mm256_setzero_ps(); 4]; 2];
        let mut acc1 = [[_mm256_setzero_ps(); 4]; 2];
        let mut msum = [[0f32; 4]; 2];
        let mut i = 0;
        while i + 2 <= nb {
            legacy_step::<T, D, 2, 4>(w, acts, i, &mut acc0, &mut msum);
            legacy_step::<T, D, 2, 4>(w, acts, i + 1, &mut acc1, &mut msum);
            i += 2;
        }
        if i < nb {
            legacy_step::<T, D, 2, 4>(w, acts, i, &mut acc0, &mut msum);
        }
        finish(&acc0, &acc1, &msum)
    }
}

/// Vectorised unpacking of K-quant super-blocks into a [`KBlock`] (the portable `KQuant::unpack`
/// computes the same bytes element by element).
pub(crate) trait KQuantX86: KQuant {
    /// How many `vpmaddubsw` results (byte pairs of unsigned quants times 8-bit activations) sum in
    /// i16 without overflow: 4 for quants below 32 (`4 * 2 * 31 * 127 < 2^15`), 2 for Q6_K's.
    const I16_QUADS: usize;
    unsafe fn unpack_x86(p: *const u8, out: &mut KBlock);
}

/// Splits 32 bytes into their low and high nibbles.
#[inline(always)]
unsafe fn split_nibbles(v: __m256i) -> (__m256i, __m256i) {
    // SAFETY: AVX2 enabled by the caller.
    unsafe {
        let m = _mm256_set1_epi8(15);
        (
            _mm256_and_si256(v, m),
            _mm256_and_si256(_mm256_srli_epi16::<4>(v), m),
        )
    }
}

/// Stores 32 bytes at `out.q[off..off + 32]`.
#[inline(always)]
unsafe fn store_q(out: &mut KBlock, off: usize, v: __m256i) {
    debug_assert!(off + 32 <= out.q.len());
    // SAFETY: AVX2 enabled by the caller; `off + 32 <= QK_K`.
    unsafe { _mm256_storeu_si256(out.q.as_mut_ptr().add(off) as *mut __m256i, v) }
}

/// The 4-bit quants of a Q4_K / Q5_K block (`qs` at byte `qs_off`): chunk `c` of 32 bytes gives
/// elements `64 c ..` (low nibbles) and `64 c + 32 ..` (high nibbles).
#[inline(always)]
unsafe fn k4_quants_x86(p: *const u8, qs_off: usize, out: &mut KBlock) {
    // SAFETY: AVX2 enabled by the caller; `p` points to a whole block.
    unsafe {
        for c in 0..4 {
            let v = _mm256_loadu_si256(p.add(qs_off + 32 * c) as *const __m256i);
            let (lo, hi) = split_nibbles(v);
            store_q(out, 64 * c, lo);
            store_q(out, 64 * c + 32, hi);
        }
    }
}

/// The super-block scales, mins and per-32 scales of a Q4_K / Q5_K block, as the portable
/// `unpack_k4_scales` gives them: the eight 6-bit scales and mins regrouped by 32-bit masks (as
/// ggml's `kmask` steps: bytes `sc0..sc7, m0..m7`), widened and each doubled (per 16) by vector
/// unpacks, instead of 16 `get_scale_min_k4` calls and 32 scalar stores.
#[inline(always)]
unsafe fn k4_scales_x86(p: *const u8, out: &mut KBlock) {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    // SAFETY: AVX2 enabled by the caller; `p` points to a whole Q4_K / Q5_K block.
    unsafe {
        out.d = F16c::cvt(rd16(p));
        out.dmin = F16c::cvt(rd16(p.add(2)));
        let w = rd::<12>(p.add(4));
        let u = |i: usize| u32::from_le_bytes([w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]]);
        let (u0, u1, u2) = (u(0), u(1), u(2));
        let sc = [
            u0 & LOW6,
            (u2 & LOW4) | (((u0 >> 6) & LOW2) << 4),
            u1 & LOW6,
            ((u2 >> 4) & LOW4) | (((u1 >> 6) & LOW2) << 4),
        ];
        // i16 lanes: sc0..sc7 (low half), m0..m7 (high half).
        let v = _mm256_cvtepu8_epi16(_mm_loadu_si128(sc.as_ptr() as *const __m128i));
        let (s, m) = (_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm256_set_m128i(_mm_unpackhi_epi16(s, s), _mm_unpacklo_epi16(s, s));
        let m = _mm256_set_m128i(_mm_unpackhi_epi16(m, m), _mm_unpacklo_epi16(m, m));
        _mm256_storeu_si256(out.sc.as_mut_ptr() as *mut __m256i, s);
        _mm256_storeu_si256(out.mn.as_mut_ptr() as *mut __m256i, m);
    }
}

// SAFETY (every `unsafe` block of these impls): AVX2 is enabled by the caller, who passes a whole block.
impl KQuantX86 for Q4K {
    const I16_QUADS: usize = 4;
    #[inline(always)]
    unsafe fn unpack_x86(p: *const u8, out: &mut KBlock) {
        unsafe {
            k4_scales_x86(p, out);
            k4_quants_x86(p, 16, out);
        }
    }
}
impl KQuantX86 for Q5K {
    const I16_QUADS: usize = 4;
    #[inline(always)]
    unsafe fn unpack_x86(p: *const u8, out: &mut KBlock) {
        unsafe {
            k4_scales_x86(p, out);
            k4_quants_x86(p, 48, out);
            // Bit `s` of qh[l] is bit 4 of element 32 s + l.
            let qh = _mm256_loadu_si256(p.add(16) as *const __m256i);
            let bit4 = _mm256_set1_epi8(16);
            for s in 0..8 {
                let off = 32 * s;
                let q = _mm256_loadu_si256(out.q.as_ptr().add(off) as *const __m256i);
                let h = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(s as i32));
                let h = _mm256_and_si256(_mm256_slli_epi16::<4>(h), bit4);
                store_q(out, off, _mm256_or_si256(q, h));
            }
        }
    }
}
impl KQuantX86 for Q6K {
    const I16_QUADS: usize = 2;
    #[inline(always)]
    unsafe fn unpack_x86(p: *const u8, out: &mut KBlock) {
        unsafe {
            out.d = F16c::cvt(rd16(p.add(208)));
            out.dmin = out.d;
            let sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(192) as *const __m128i));
            _mm256_storeu_si256(out.sc.as_mut_ptr() as *mut __m256i, sc);
            _mm256_storeu_si256(
                out.mn.as_mut_ptr() as *mut __m256i,
                _mm256_slli_epi16::<5>(sc),
            );
            // Element 128 h + 32 k + l: nibble k / 2 of ql[64 h + 32 (k % 2) + l], high bits 2 k
            // of qh[32 h + l] (16-bit shifts do not mix bytes once masked).
            let hi2 = _mm256_set1_epi8(0x30);
            for h in 0..2 {
                let (a_lo, a_hi) =
                    split_nibbles(_mm256_loadu_si256(p.add(64 * h) as *const __m256i));
                let (b_lo, b_hi) =
                    split_nibbles(_mm256_loadu_si256(p.add(64 * h + 32) as *const __m256i));
                let qh = _mm256_loadu_si256(p.add(128 + 32 * h) as *const __m256i);
                let q0 = _mm256_and_si256(_mm256_slli_epi16::<4>(qh), hi2);
                let q1 = _mm256_and_si256(_mm256_slli_epi16::<2>(qh), hi2);
                let q2 = _mm256_and_si256(qh, hi2);
                let q3 = _mm256_and_si256(_mm256_srli_epi16::<2>(qh), hi2);
                store_q(out, 128 * h, _mm256_or_si256(a_lo, q0));
                store_q(out, 128 * h + 32, _mm256_or_si256(b_lo, q1));
                store_q(out, 128 * h + 64, _mm256_or_si256(a_hi, q2));
                store_q(out, 128 * h + 96, _mm256_or_si256(b_hi, q3));
            }
        }
    }
}

struct LegacyK<T, D>(usize, PhantomData<(T, D)>);

impl<T: LegacyX86, D: DotI8> RowKernel for LegacyK<T, D> {
    #[inline(always)]
    unsafe fn dot4(&self, w: *const u8, acts: &[*const u8; 4]) -> [f32; 4] {
        // SAFETY: forwarded from the caller.
        unsafe { legacy::<T, D, 4>(w, acts, self.0) }
    }
    #[inline(always)]
    unsafe fn dot2x4(&self, w: &[*const u8; 2], acts: &[*const u8; 4]) -> [[f32; 4]; 2] {
        // SAFETY: forwarded from the caller.
        unsafe { D::prompt_2x4::<T>(w, acts, self.0) }
    }
    #[inline(always)]
    unsafe fn dot1(&self, w: *const u8, act: *const u8) -> f32 {
        // SAFETY: forwarded from the caller.
        unsafe { legacy::<T, D, 1>(w, &[act], self.0)[0] }
    }
}

/// Q4_1 / Q5_1: groups of four columns through the prompt kernel of `quant_prompt_x86`, the
/// remaining columns through the one-column kernel of `quant_offset_x86`.
#[inline(always)]
unsafe fn rows_min<T: LegacyX86, D: DotI8>(
    job: &Job,
    nb: usize,
    rows: Range<usize>,
    cols: Range<usize>,
) {
    let grouped = cols.start + cols.len() / 4 * 4;
    // SAFETY: forwarded from the caller.
    unsafe {
        if grouped > cols.start {
            min_prompt_rows::<T, D>(job, nb, rows.clone(), cols.start..grouped);
        }
        min_rows::<T, D>(job, nb, rows, grouped..cols.end);
    }
}

#[inline(always)]
unsafe fn rows_any<D: Level8>(
    wt: DType,
    job: &Job,
    nb: usize,
    rows: Range<usize>,
    cols: Range<usize>,
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        match wt {
            DType::Q4_0 => legacy_rows8::<Q4_0, D>(job, nb, rows, cols),
            DType::Q4_1 => rows_min::<Q4_1, D>(job, nb, rows, cols),
            DType::Q5_0 => legacy_rows8::<Q5_0, D>(job, nb, rows, cols),
            DType::Q5_1 => rows_min::<Q5_1, D>(job, nb, rows, cols),
            DType::Q8_0 => rows_with(&LegacyK::<Q8_0, D>(nb, PhantomData), job, rows, cols),
            DType::MXFP4 => rows_with(&LegacyK::<Mxfp4, D>(nb, PhantomData), job, rows, cols),
            DType::Q4K => kquant_rows8::<Q4K, D>(job, nb, rows, cols),
            DType::Q5K => kquant_rows8::<Q5K, D>(job, nb, rows, cols),
            DType::Q6K => kquant_rows8::<Q6K, D>(job, nb, rows, cols),
            _ => {}
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_avx2(wt: DType, job: &Job, nb: usize, rows: Range<usize>, cols: Range<usize>) {
    // SAFETY: features checked by the dispatcher; the rest forwarded from the caller.
    unsafe { rows_any::<Avx2Dot>(wt, job, nb, rows, cols) }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_avx512(wt: DType, job: &Job, nb: usize, rows: Range<usize>, cols: Range<usize>) {
    // SAFETY: features checked by the dispatcher; the rest forwarded from the caller.
    unsafe { rows_any::<VnniDot>(wt, job, nb, rows, cols) }
}

/// Quantized row kernel at an x86 level (see `quant::rows`).
///
/// # Safety
/// As for `quant::rows`; `level` is `Avx2` or `Avx512` and available.
pub(crate) unsafe fn rows(
    level: SimdLevel,
    wt: DType,
    job: &Job,
    nb: usize,
    rows: Range<usize>,
    cols: Range<usize>,
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        if level == SimdLevel::Avx512 {
            rows_avx512(wt, job, nb, rows, cols)
        } else {
            rows_avx2(wt, job, nb, rows, cols)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ggml_core::quant::quantize_row;
    use ggml_core::QK_K;
    use rand::Rng;

    /// The vectorised K-quant unpacking gives the portable unpacking's bytes, scales and mins:
    /// of quantized random rows, and of random bytes (every scale and min bit pattern) with finite
    /// half-precision super-block scales.
    #[test]
    fn kquant_unpack_x86_matches_portable() {
        if !SimdLevel::Avx2.is_available() {
            return;
        }
        let mut rng = rand::thread_rng();
        for (wt, check, halves) in [
            (DType::Q4K, check_unpack::<Q4K> as fn(&[u8]), [0, 2]),
            (DType::Q5K, check_unpack::<Q5K>, [0, 2]),
            (DType::Q6K, check_unpack::<Q6K>, [208, 208]),
        ] {
            for _ in 0..16 {
                let x: Vec<f32> = (0..QK_K).map(|_| rng.gen_range(-3.0f32..3.0)).collect();
                let mut block = vec![0u8; wt.row_size(QK_K).unwrap()];
                quantize_row(wt, &x, &mut block).unwrap();
                check(&block);
                rng.fill(&mut block[..]);
                for at in halves {
                    let h = half::f16::from_f32(rng.gen_range(-2.0f32..2.0)).to_bits();
                    block[at..at + 2].copy_from_slice(&h.to_le_bytes());
                }
                check(&block);
            }
        }
    }

    fn check_unpack<T: KQuantX86>(block: &[u8]) {
        assert_eq!(block.len(), T::SIZE);
        let (mut want, mut got) = (KBlock::new(), KBlock::new());
        // SAFETY: `block` is one whole super-block; AVX2 was checked by the caller.
        unsafe {
            T::unpack::<super::super::quant::ScalarHalf>(block.as_ptr(), &mut want);
            unpack_avx2::<T>(block.as_ptr(), &mut got);
        }
        assert_eq!(want.q, got.q);
        assert_eq!(want.sc, got.sc);
        assert_eq!(want.mn, got.mn);
        assert_eq!((want.d, want.dmin), (got.d, got.dmin));
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack_avx2<T: KQuantX86>(p: *const u8, out: &mut KBlock) {
        // SAFETY: forwarded from the caller.
        unsafe { T::unpack_x86(p, out) }
    }
}
