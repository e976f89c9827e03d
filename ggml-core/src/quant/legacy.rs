//! The legacy 32-element formats Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and Q8_1: unpacking to integer
//! quants, dequantization (same f32 operations as gguf-py's numpy code: `d * q`, or `d * q + m`
//! rounded after each operation) and ggml's reference quantizers (`quantize_row_*_ref`).

use super::blocks::{
    f16_to_f32, f32_to_f16, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1, QK,
};
use super::QuantBlock;
use crate::dtype::DType;

/// Splits 16 bytes into 32 nibbles: low nibbles are elements 0..16, high nibbles 16..32.
#[inline]
pub(crate) fn unpack_nibbles(qs: &[u8; QK / 2]) -> [u8; QK] {
    let mut q = [0u8; QK];
    for j in 0..QK / 2 {
        q[j] = qs[j] & 0x0F;
        q[j + QK / 2] = qs[j] >> 4;
    }
    q
}

/// Packs 32 values (only their low 4 bits) as in [`unpack_nibbles`].
#[inline]
pub(crate) fn pack_nibbles(q: &[u8; QK]) -> [u8; QK / 2] {
    let mut qs = [0u8; QK / 2];
    for j in 0..QK / 2 {
        qs[j] = (q[j] & 0x0F) | ((q[j + QK / 2] & 0x0F) << 4);
    }
    qs
}

/// 5-bit values: nibbles plus bit `j` of the little-endian `qh` as bit 4 of element `j`.
#[inline]
fn unpack_q5(qs: &[u8; QK / 2], qh: &[u8; 4]) -> [u8; QK] {
    let mut q = unpack_nibbles(qs);
    let h = u32::from_le_bytes(*qh);
    for (j, v) in q.iter_mut().enumerate() {
        *v |= (((h >> j) & 1) as u8) << 4;
    }
    q
}

/// Inverse of [`unpack_q5`] (values must be below 32).
#[inline]
fn pack_q5(q: &[u8; QK]) -> ([u8; QK / 2], [u8; 4]) {
    let mut h = 0u32;
    for (j, &v) in q.iter().enumerate() {
        h |= u32::from((v >> 4) & 1) << j;
    }
    (pack_nibbles(q), h.to_le_bytes())
}

#[inline]
fn to_i8(q: [u8; QK], offset: i8) -> [i8; QK] {
    q.map(|v| v as i8 - offset)
}

/// Symmetric quantizer of Q4_0 (`n = 8`) and Q5_0 (`n = 16`): `d = max / -n` where `max` is the
/// signed value of largest magnitude, `q = min(2n - 1, trunc(x / d + n + 0.5))`.
fn quantize_symmetric(x: &[f32], n: i8) -> (f32, [u8; QK]) {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -f32::from(n);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let bias = f32::from(n) + 0.5;
    let mut q = [0u8; QK];
    for (qi, &v) in q.iter_mut().zip(x) {
        *qi = ((v * id + bias) as i8).min(2 * n - 1) as u8;
    }
    (d, q)
}

/// Min/max quantizer of Q4_1 (`nmax = 15`) and Q5_1 (`nmax = 31`): `d = (max - min) / nmax`,
/// `q = min(nmax, trunc((x - min) / d + 0.5))`.
fn quantize_min_max(x: &[f32], nmax: u8) -> (f32, f32, [u8; QK]) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    let d = (max - min) / f32::from(nmax);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut q = [0u8; QK];
    for (qi, &v) in q.iter_mut().zip(x) {
        *qi = (((v - min) * id + 0.5) as u8).min(nmax);
    }
    (d, min, q)
}

/// Q8 quantizer shared by Q8_0 and Q8_1: `d = amax / 127`, `q = round(x / d)` (half away from 0).
fn quantize_q8(x: &[f32]) -> (f32, [i8; QK]) {
    let amax = x
        .iter()
        .fold(0.0f32, |a, v| if a > v.abs() { a } else { v.abs() });
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut q = [0i8; QK];
    for (qi, &v) in q.iter_mut().zip(x) {
        *qi = round_half_away(v * id) as i8;
    }
    (d, q)
}

/// `x.round()` (half away from zero) without a libm call, for |x| < 2^23 (NaN gives 0 like
/// `round() as i8`): the fractional part below is exact in that range. Larger values (a block of
/// subnormals has an infinite inverse scale) saturate at ±2^23 instead of overflowing.
#[inline(always)]
fn round_half_away(x: f32) -> i32 {
    let x = x.clamp(-8_388_608.0, 8_388_608.0);
    let i = x as i32;
    let f = x - i as f32;
    if f >= 0.5 {
        i + 1
    } else if f <= -0.5 {
        i - 1
    } else {
        i
    }
}

#[cfg(test)]
#[test]
fn round_half_away_matches_round() {
    let mut x = -130.0f32;
    while x <= 130.0 {
        for v in [x, x.next_up(), x.next_down(), x + 0.5, x - 0.5] {
            assert_eq!(round_half_away(v), v.round() as i32, "{v}");
        }
        x += 0.25;
    }
    assert_eq!(round_half_away(f32::NAN) as i8, f32::NAN.round() as i8);
    for v in [f32::INFINITY, 1e30, f32::NEG_INFINITY, -1e30] {
        assert_eq!(round_half_away(v), 8_388_608 * v.signum() as i32, "{v}");
    }
}

#[inline]
fn dequant_scaled(q: &[i8; QK], d: f32, out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(q) {
        *o = d * f32::from(v);
    }
}

#[inline]
fn dequant_scaled_offset(q: &[i8; QK], d: f32, m: f32, out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(q) {
        *o = d * f32::from(v) + m;
    }
}

impl BlockQ4_0 {
    /// The signed quants `q - 8` (-8..8); element = `d * q`.
    pub fn unpack(&self) -> [i8; QK] {
        to_i8(unpack_nibbles(&self.qs), 8)
    }
}

impl BlockQ4_1 {
    /// The quants 0..16; element = `d * q + m`.
    pub fn unpack(&self) -> [i8; QK] {
        to_i8(unpack_nibbles(&self.qs), 0)
    }
}

impl BlockQ5_0 {
    /// The signed quants `q - 16` (-16..16); element = `d * q`.
    pub fn unpack(&self) -> [i8; QK] {
        to_i8(unpack_q5(&self.qs, &self.qh), 16)
    }
}

impl BlockQ5_1 {
    /// The quants 0..32; element = `d * q + m`.
    pub fn unpack(&self) -> [i8; QK] {
        to_i8(unpack_q5(&self.qs, &self.qh), 0)
    }
}

impl QuantBlock for BlockQ4_0 {
    const DTYPE: DType = DType::Q4_0;
    fn dequantize(&self, out: &mut [f32]) {
        dequant_scaled(&self.unpack(), f16_to_f32(self.d), out);
    }
    fn quantize(x: &[f32]) -> Self {
        let (d, q) = quantize_symmetric(x, 8);
        BlockQ4_0 {
            d: f32_to_f16(d),
            qs: pack_nibbles(&q),
        }
    }
}

impl QuantBlock for BlockQ4_1 {
    const DTYPE: DType = DType::Q4_1;
    fn dequantize(&self, out: &mut [f32]) {
        dequant_scaled_offset(&self.unpack(), f16_to_f32(self.d), f16_to_f32(self.m), out);
    }
    fn quantize(x: &[f32]) -> Self {
        let (d, m, q) = quantize_min_max(x, 15);
        BlockQ4_1 {
            d: f32_to_f16(d),
            m: f32_to_f16(m),
            qs: pack_nibbles(&q),
        }
    }
}

impl QuantBlock for BlockQ5_0 {
    const DTYPE: DType = DType::Q5_0;
    fn dequantize(&self, out: &mut [f32]) {
        dequant_scaled(&self.unpack(), f16_to_f32(self.d), out);
    }
    fn quantize(x: &[f32]) -> Self {
        let (d, q) = quantize_symmetric(x, 16);
        let (qs, qh) = pack_q5(&q);
        BlockQ5_0 {
            d: f32_to_f16(d),
            qh,
            qs,
        }
    }
}

impl QuantBlock for BlockQ5_1 {
    const DTYPE: DType = DType::Q5_1;
    fn dequantize(&self, out: &mut [f32]) {
        dequant_scaled_offset(&self.unpack(), f16_to_f32(self.d), f16_to_f32(self.m), out);
    }
    fn quantize(x: &[f32]) -> Self {
        let (d, m, q) = quantize_min_max(x, 31);
        let (qs, qh) = pack_q5(&q);
        BlockQ5_1 {
            d: f32_to_f16(d),
            m: f32_to_f16(m),
            qh,
            qs,
        }
    }
}

impl QuantBlock for BlockQ8_0 {
    const DTYPE: DType = DType::Q8_0;
    fn dequantize(&self, out: &mut [f32]) {
        dequant_scaled(&self.qs, f16_to_f32(self.d), out);
    }
    fn quantize(x: &[f32]) -> Self {
        let (d, qs) = quantize_q8(x);
        BlockQ8_0 {
            d: f32_to_f16(d),
            qs,
        }
    }
}

impl QuantBlock for BlockQ8_1 {
    const DTYPE: DType = DType::Q8_1;
    fn dequantize(&self, out: &mut [f32]) {
        dequant_scaled(&self.qs, f16_to_f32(self.d), out);
    }
    fn quantize(x: &[f32]) -> Self {
        let (d, qs) = quantize_q8(x);
        let sum: i32 = qs.iter().map(|&v| i32::from(v)).sum();
        BlockQ8_1 {
            d: f32_to_f16(d),
            s: f32_to_f16(sum as f32 * d),
            qs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q5_bits_round_trip() {
        let mut q = [0u8; QK];
        for (j, v) in q.iter_mut().enumerate() {
            *v = ((j * 7 + 3) % 32) as u8;
        }
        let (qs, qh) = pack_q5(&q);
        assert_eq!(unpack_q5(&qs, &qh), q);
    }

    #[test]
    fn q8_1_sum_is_d_times_sum_of_quants() {
        let x: Vec<f32> = (0..QK).map(|i| (i as f32 - 10.0) * 0.37).collect();
        let b = BlockQ8_1::quantize(&x);
        let sum: i32 = b.qs.iter().map(|&v| i32::from(v)).sum();
        let d = (x.iter().fold(0.0f32, |a, v| a.max(v.abs()))) / 127.0;
        assert_eq!(b.s, f32_to_f16(sum as f32 * d));
        assert_eq!(b.qs[QK - 1], 127);
    }
}
