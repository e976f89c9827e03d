//! Rows of the scalar float types F32, F16 and BF16 as little-endian bytes: exact widening to f32
//! (NaN payloads kept, as numpy does) and narrowing with round-to-nearest-even (ggml's rules).

use super::blocks::{bf16_bits_to_f32, f16_bits_to_f32_lut, f32_to_bf16_bits, f32_to_f16};
use crate::dtype::DType;
use crate::error::{Error, Result};

fn unsupported(dtype: DType, what: &str) -> Error {
    Error::UnsupportedType {
        dtype,
        what: what.to_string(),
    }
}

/// Widens a row of `dtype` (F32, F16 or BF16) into `dst`; lengths are checked by the caller.
pub(crate) fn dequantize(dtype: DType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    match dtype {
        DType::F32 => {
            for (o, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        DType::F16 => {
            for (o, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *o = f16_bits_to_f32_lut(u16::from_le_bytes([c[0], c[1]]));
            }
        }
        DType::BF16 => {
            for (o, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *o = bf16_bits_to_f32(u16::from_le_bytes([c[0], c[1]]));
            }
        }
        _ => return Err(unsupported(dtype, "float row dequantization")),
    }
    Ok(())
}

/// Narrows `src` into a row of `dtype` (F32, F16 or BF16); lengths are checked by the caller.
pub(crate) fn quantize(dtype: DType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    match dtype {
        DType::F32 => {
            for (c, v) in dst.chunks_exact_mut(4).zip(src) {
                c.copy_from_slice(&v.to_le_bytes());
            }
        }
        DType::F16 => {
            for (c, v) in dst.chunks_exact_mut(2).zip(src) {
                c.copy_from_slice(&f32_to_f16(*v).to_bits().to_le_bytes());
            }
        }
        DType::BF16 => {
            for (c, v) in dst.chunks_exact_mut(2).zip(src) {
                c.copy_from_slice(&f32_to_bf16_bits(*v).to_le_bytes());
            }
        }
        _ => return Err(unsupported(dtype, "float row quantization")),
    }
    Ok(())
}
