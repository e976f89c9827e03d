//! MXFP4 (OCP microscaling FP4): 32 E2M1 values sharing an E8M0 exponent. Dequantization is
//! `e8m0_to_f32_half(e) * MXFP4_VALUES[nibble]` (one f32 multiply, as gguf-py), quantization is
//! ggml's `quantize_row_mxfp4_ref` (exponent from `floor(log2(amax)) - 2`, nearest table value).

use super::blocks::{e8m0_to_f32_half, BlockMxfp4, MXFP4_VALUES, QK};
use super::legacy::{pack_nibbles, unpack_nibbles};
use super::QuantBlock;
use crate::dtype::DType;

impl BlockMxfp4 {
    /// The doubled E2M1 values (-12..=12, see [`MXFP4_VALUES`]); element = `e8m0_to_f32_half(e) * q`.
    pub fn unpack(&self) -> [i8; QK] {
        unpack_nibbles(&self.qs).map(|n| MXFP4_VALUES[usize::from(n)])
    }
}

/// Index of the table value nearest to `x / d`: the first index of least `|v * d - x|`.
fn best_index(x: f32, d: f32) -> u8 {
    let mut best = 0u8;
    let mut best_err = (f32::from(MXFP4_VALUES[0]) * d - x).abs();
    for (i, &v) in MXFP4_VALUES.iter().enumerate().skip(1) {
        let err = (f32::from(v) * d - x).abs();
        if err < best_err {
            best = i as u8;
            best_err = err;
        }
    }
    best
}

impl QuantBlock for BlockMxfp4 {
    const DTYPE: DType = DType::MXFP4;
    fn dequantize(&self, out: &mut [f32]) {
        let d = e8m0_to_f32_half(self.e);
        for (o, v) in out.iter_mut().zip(self.unpack()) {
            *o = d * f32::from(v);
        }
    }
    fn quantize(x: &[f32]) -> Self {
        let amax = x
            .iter()
            .fold(0.0f32, |a, v| if a < v.abs() { v.abs() } else { a });
        // `as u8` saturates, so amax below 2^-125 gives e = 0 and amax of inf gives 255.
        let e = if amax > 0.0 {
            (amax.log2().floor() - 2.0 + 127.0) as u8
        } else {
            0
        };
        let d = e8m0_to_f32_half(e);
        let mut q = [0u8; QK];
        for (qi, &v) in q.iter_mut().zip(x) {
            *qi = best_index(v, d);
        }
        BlockMxfp4 {
            e,
            qs: pack_nibbles(&q),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactly_representable_values_survive() {
        // With amax = 6 * 2^k the exponent is chosen so that every table value times 2^k is exact.
        let x: Vec<f32> = (0..QK)
            .map(|i| f32::from(MXFP4_VALUES[i % 16]) * 0.25)
            .collect();
        let b = BlockMxfp4::quantize(&x);
        let mut y = [0f32; QK];
        b.dequantize(&mut y);
        assert_eq!(&y[..], &x[..]);
    }
}
