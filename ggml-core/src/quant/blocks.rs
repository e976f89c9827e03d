//! Block structs of the GGUF quantized formats, byte for byte as ggml lays them out, plus the small
//! decoding helpers they share: exact f16/bf16/E8M0 scale decoding, the K-quant 6-bit scale unpacking
//! and the MXFP4 (E2M1) value table.
//!
//! Every struct is `#[repr(C)]`, has no padding and derives [`bytemuck::Pod`], so a slice of GGUF
//! bytes can be viewed or read as blocks. Sizes are checked against [`DType::type_size`] at compile
//! time. All multi-byte fields are little-endian, as in GGUF (the crate targets little-endian hosts).

use bytemuck::{Pod, Zeroable};
use half::f16;

use crate::dtype::{DType, QK_K};

/// Elements per block of the legacy formats (Q4_0 ... Q8_1) and of MXFP4.
pub const QK: usize = 32;

/// Bytes of packed 6-bit scales and mins in a Q4_K / Q5_K super-block.
pub const K_SCALE_SIZE: usize = 12;

/// Q4_0: 32 weights `d * (q - 8)`, `q` in 0..16; low nibbles hold elements 0..16, high nibbles 16..32.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ4_0 {
    pub d: f16,
    pub qs: [u8; QK / 2],
}

/// Q4_1: 32 weights `d * q + m`, `q` in 0..16, nibble order as in Q4_0.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ4_1 {
    pub d: f16,
    pub m: f16,
    pub qs: [u8; QK / 2],
}

/// Q5_0: 32 weights `d * (q - 16)`, `q` in 0..32; bit 4 of element `j` is bit `j` of `qh` (LE u32).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ5_0 {
    pub d: f16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

/// Q5_1: 32 weights `d * q + m`, `q` in 0..32, bit layout as in Q5_0.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ5_1 {
    pub d: f16,
    pub m: f16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

/// Q8_0: 32 weights `d * q`, `q` in -128..128 (the reference quantizer uses -127..=127).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; QK],
}

/// Q8_1: Q8_0 plus `s = d * sum(qs)` (rounded to f16), used as the activation of Q4_1/Q5_1 dots.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ8_1 {
    pub d: f16,
    pub s: f16,
    pub qs: [i8; QK],
}

/// Q4_K: 8 sub-blocks of 32; element = `d * sc_j * q - dmin * m_j` with 6-bit `sc_j`, `m_j` packed
/// in `scales` (see [`get_scale_min_k4`]). `qs` holds 4 chunks of 64 elements: 32 bytes each, low
/// nibbles the first 32 elements, high nibbles the next 32.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ4K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; K_SCALE_SIZE],
    pub qs: [u8; QK_K / 2],
}

/// Q5_K: Q4_K plus a fifth bit per element: element `32*s + l` takes bit `s` of `qh[l]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ5K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; K_SCALE_SIZE],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}

/// Q6_K: 16 sub-blocks of 16; element = `d * scales_j * (q - 32)`, `q` 6 bits split into `ql`
/// (low 4) and `qh` (high 2). See `kquants.rs` for the bit order.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: f16,
}

/// Q8_K: activation format of K-quant dots: `d * q` with an f32 scale and the sums of each
/// 16 consecutive `qs` in `bsums`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}

/// MXFP4: 32 E2M1 values with a shared E8M0 exponent `e`; element = `e8m0_to_f32_half(e) *
/// MXFP4_VALUES[nibble]`, nibble order as in Q4_0.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockMxfp4 {
    pub e: u8,
    pub qs: [u8; QK / 2],
}

const _: () = {
    assert!(std::mem::size_of::<BlockQ4_0>() == DType::Q4_0.type_size());
    assert!(std::mem::size_of::<BlockQ4_1>() == DType::Q4_1.type_size());
    assert!(std::mem::size_of::<BlockQ5_0>() == DType::Q5_0.type_size());
    assert!(std::mem::size_of::<BlockQ5_1>() == DType::Q5_1.type_size());
    assert!(std::mem::size_of::<BlockQ8_0>() == DType::Q8_0.type_size());
    assert!(std::mem::size_of::<BlockQ8_1>() == DType::Q8_1.type_size());
    assert!(std::mem::size_of::<BlockQ4K>() == DType::Q4K.type_size());
    assert!(std::mem::size_of::<BlockQ5K>() == DType::Q5K.type_size());
    assert!(std::mem::size_of::<BlockQ6K>() == DType::Q6K.type_size());
    assert!(std::mem::size_of::<BlockQ8K>() == DType::Q8K.type_size());
    assert!(std::mem::size_of::<BlockMxfp4>() == DType::MXFP4.type_size());
    assert!(DType::Q4_0.block_size() == QK && DType::MXFP4.block_size() == QK);
    assert!(DType::Q8_1.block_size() == QK && DType::Q4K.block_size() == QK_K);
};

/// E2M1 values of MXFP4, doubled so they are integers (ggml's `kvalues_mxfp4`); the halving is
/// folded into [`e8m0_to_f32_half`].
pub const MXFP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// `2^(e - 127) / 2` as f32, exactly as ggml's `GGML_E8M0_TO_FP32_HALF` and gguf-py's
/// `e8m0_to_fp32_half`: for `e < 2` the result is the subnormal `0x00200000 << e`, otherwise the bit
/// pattern `(e - 1) << 23`. Every `e` gives a finite value (255 gives 2^127).
#[inline]
pub fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        u32::from(e - 1) << 23
    };
    f32::from_bits(bits)
}

/// The 6-bit scale and min of sub-block `j` (0..8) of a Q4_K / Q5_K super-block, as ggml's
/// `get_scale_min_k4`. Bytes 0..4 hold scales 0..4 (low 6 bits), bytes 4..8 mins 0..4; for
/// `j >= 4` the low 4 bits come from byte `j + 4` and the high 2 bits from the top bits of bytes
/// `j - 4` (scale) and `j` (min).
#[inline]
pub fn get_scale_min_k4(j: usize, scales: &[u8; K_SCALE_SIZE]) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        (
            (scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4),
            (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
        )
    }
}

/// Packs eight 6-bit scales and mins (values above 63 are cut to 63) into the Q4_K / Q5_K
/// layout; the inverse of [`get_scale_min_k4`].
pub fn pack_scale_min_k4(sc: &[u8; 8], m: &[u8; 8]) -> [u8; K_SCALE_SIZE] {
    let mut out = [0u8; K_SCALE_SIZE];
    for j in 0..8 {
        let (ls, lm) = (sc[j].min(63), m[j].min(63));
        if j < 4 {
            out[j] |= ls;
            out[j + 4] |= lm;
        } else {
            out[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            out[j - 4] |= (ls >> 4) << 6;
            out[j] |= (lm >> 4) << 6;
        }
    }
    out
}

/// Exact f16 -> f32 from the bit pattern, keeping NaN payloads bit for bit (no quieting), which is
/// what numpy's `float16.astype(float32)` does.
#[inline]
pub const fn f16_bits_to_f32(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let exp = ((h >> 10) & 0x1F) as u32;
    let man = (h & 0x3FF) as u32;
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, _) => {
            // Subnormal: value = man * 2^-24; normalize into an f32 (exact).
            let shift = man.leading_zeros() - 21; // bring the top set bit to bit 10
            let man = (man << shift) & 0x3FF;
            let exp = 127 - 15 + 1 - shift;
            sign | (exp << 23) | (man << 13)
        }
        (0x1F, _) => sign | 0x7F80_0000 | (man << 13),
        _ => sign | ((exp + 127 - 15) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

/// The f32 value of every f16 bit pattern (as ggml's `ggml_table_f32_f16`), computed at compile
/// time with [`f16_bits_to_f32`], so a lookup equals the exact conversion bit for bit.
pub static F16_TO_F32: [f32; 65536] = {
    let mut t = [0f32; 65536];
    let mut i = 0;
    while i < 65536 {
        t[i] = f16_bits_to_f32(i as u16);
        i += 1;
    }
    t
};

/// Exact f16 -> f32 by table lookup (faster than converting when no F16C instruction is compiled in).
#[inline(always)]
pub fn f16_bits_to_f32_lut(h: u16) -> f32 {
    F16_TO_F32[h as usize]
}

/// Exact f16 -> f32 (see [`f16_bits_to_f32`]).
#[inline]
pub fn f16_to_f32(h: f16) -> f32 {
    f16_bits_to_f32(h.to_bits())
}

/// f32 -> f16 with round-to-nearest-even (as ggml's `GGML_FP32_TO_FP16` and numpy).
#[inline]
pub fn f32_to_f16(x: f32) -> f16 {
    f16::from_f32(x)
}

/// bf16 -> f32: the bits shifted up by 16 (exact, NaN payloads kept).
#[inline]
pub fn bf16_bits_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// f32 -> bf16 bits as ggml's `ggml_compute_fp32_to_bf16`: NaNs are made quiet keeping the sign and
/// top bits, everything else rounds to nearest even.
#[inline]
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7FFF_FFFF) > 0x7F80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u64::from(u) + 0x7FFF + u64::from((u >> 16) & 1)) >> 16) as u16
}

/// Rounds to the nearest integer with ties to even, as ggml's `nearest_int` (the `+ 12582912.f`
/// trick) for every input it is defined on (`|x| <= 4194303`). That trick is used there (a call
/// of `round_ties_even` is a libm `rintf` call on baseline x86-64, a tenth of a prompt's time in
/// the activations' Q8_K quantization); other inputs (and NaN) are rounded by `round_ties_even`.
#[inline]
pub(crate) fn nearest_int(x: f32) -> i32 {
    if x.abs() <= 4_194_303.0 {
        // 1.5 * 2^23: the sum's mantissa holds x rounded to an integer (ties to even) plus 2^22.
        ((x + 12_582_912.0).to_bits() & 0x007F_FFFF) as i32 - 0x0040_0000
    } else {
        x.round_ties_even() as i32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_table_equals_the_conversion() {
        for h in 0..=u16::MAX {
            assert_eq!(
                F16_TO_F32[usize::from(h)].to_bits(),
                f16_bits_to_f32(h).to_bits(),
                "{h:#x}"
            );
        }
    }

    #[test]
    fn f16_decoding_is_exact_for_every_non_nan_pattern() {
        for h in 0..=u16::MAX {
            let v = f16_bits_to_f32(h);
            let r = f16::from_bits(h).to_f32();
            if r.is_nan() {
                assert!(v.is_nan());
                assert_eq!(
                    v.to_bits() & 0x1FFF,
                    0,
                    "payload sits in the top mantissa bits"
                );
            } else {
                assert_eq!(v.to_bits(), r.to_bits(), "{h:#06x}");
            }
        }
    }

    #[test]
    fn scale_min_k4_round_trips() {
        let sc = [0, 1, 17, 63, 32, 5, 48, 63];
        let m = [63, 2, 0, 40, 31, 16, 7, 62];
        let packed = pack_scale_min_k4(&sc, &m);
        for j in 0..8 {
            assert_eq!(get_scale_min_k4(j, &packed), (sc[j], m[j]));
        }
    }

    #[test]
    fn e8m0_half_matches_powers_of_two() {
        for e in 2..=255u8 {
            assert_eq!(e8m0_to_f32_half(e), 2f32.powi(i32::from(e) - 128));
        }
        assert_eq!(e8m0_to_f32_half(1), 2f32.powi(-127));
        assert_eq!(e8m0_to_f32_half(0), 2f32.powi(-128));
    }

    #[test]
    fn bf16_conversion_rounds_to_nearest_even_and_quiets_nan() {
        assert_eq!(f32_to_bf16_bits(1.0), 0x3F80);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3F80_8000)), 0x3F80); // tie, even stays
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3F81_8000)), 0x3F82); // tie, odd rounds up
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x7F80_0001)), 0x7FC0);
        assert_eq!(bf16_bits_to_f32(0xC000), -2.0);
    }

    #[test]
    fn nearest_int_ties_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(-2.5), -2);
        assert_eq!(nearest_int(-2.6), -3);
        for x in [
            0.49999997,
            -0.5,
            3.5,
            -3.5,
            126.5,
            -127.49,
            4_194_302.5,
            -4_194_303.0,
            4_194_304.0,
            -9.0e9,
        ] {
            assert_eq!(nearest_int(x), x.round_ties_even() as i32, "{x}");
        }
        let mut x = -300.0f32;
        while x < 300.0 {
            assert_eq!(nearest_int(x), x.round_ties_even() as i32, "{x}");
            x += 0.125;
        }
    }
}
