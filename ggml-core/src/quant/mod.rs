//! Quantization and dequantization of the GGUF block formats, and scalar reference dot products.
//!
//! Byte layouts are exactly GGUF's / ggml's (see [`blocks`]). The entry points work on one row of
//! `n` elements stored in `dtype.row_size(n)` bytes:
//!
//! - [`dequantize_row`]: any float or quantized type to f32. The result equals, bit for bit, the
//!   `gguf` Python package's numpy dequantizer (`gguf.quants.dequantize`, version 0.19): the same
//!   f32 operations in the same order (for example `(d * sc) * q - (dmin * m)` for Q4_K), f16
//!   scales widened exactly, MXFP4's E8M0 scale decoded as `GGML_E8M0_TO_FP32_HALF`. gguf-py has no
//!   Q8_1 / Q8_K dequantizer; those follow ggml (`d * q`). (gguf-py's size table still lists Q8_1
//!   as 40 bytes; ggml and this crate use 36: f16 `d`, f16 `s`, 32 quants.)
//! - [`quantize_row`]: f32 to any supported type with ggml's reference quantizers
//!   (`quantize_row_*_ref`), the way llama.cpp quantizes activations (Q8_0, Q8_1, Q8_K).
//! - [`vec_dot_type`] / [`vec_dot_ref`]: which activation type a weight type is multiplied
//!   against, and a scalar reference dot product computed block by block in integer arithmetic
//!   (as ggml's generic `ggml_vec_dot_*`), for testing the SIMD kernels of the CPU backend.
//!
//! - [`regroup`] / [`ungroup`]: Q4_0 / Q8_0 rows to and from the regrouped layouts GPUs keep
//!   weights in ([`DType::Q4_0G`], [`DType::Q8_0G`]); the row functions above take those too.
//!
//! Files: `blocks.rs` (block structs and decoding helpers), `float.rs` (F32/F16/BF16 rows),
//! `legacy.rs` (Q4_0 ... Q8_1), `kquants.rs` (Q4_K, Q5_K, Q6_K, Q8_K), `mxfp4.rs`, `dot.rs`,
//! `grouped.rs`.

pub mod blocks;
mod dot;
mod float;
mod grouped;
mod kquants;
mod legacy;
mod mxfp4;

pub use blocks::*;
pub use dot::{vec_dot_ref, vec_dot_type};
pub use grouped::{regroup, regroup_into, ungroup};

use bytemuck::Pod;

use crate::dtype::DType;
use crate::error::{Error, Result};

/// A block of a quantized format: decodes to / encodes from `DTYPE.block_size()` f32 values.
pub(crate) trait QuantBlock: Pod {
    const DTYPE: DType;
    /// Writes the block's values to `out` (`out.len() == DTYPE.block_size()`).
    fn dequantize(&self, out: &mut [f32]);
    /// ggml's reference quantizer for one block (`x.len() == DTYPE.block_size()`).
    fn quantize(x: &[f32]) -> Self;
}

/// Reads the blocks of a byte slice (whose alignment is arbitrary) one by one.
pub(crate) fn read_blocks<B: Pod>(bytes: &[u8]) -> impl Iterator<Item = B> + '_ {
    bytes
        .chunks_exact(std::mem::size_of::<B>())
        .map(bytemuck::pod_read_unaligned)
}

fn dequantize_blocks<B: QuantBlock>(src: &[u8], dst: &mut [f32]) {
    for (b, out) in read_blocks::<B>(src).zip(dst.chunks_exact_mut(B::DTYPE.block_size())) {
        b.dequantize(out);
    }
}

fn quantize_blocks<B: QuantBlock>(src: &[f32], dst: &mut [u8]) {
    let chunks = src.chunks_exact(B::DTYPE.block_size());
    for (x, out) in chunks.zip(dst.chunks_exact_mut(B::DTYPE.type_size())) {
        out.copy_from_slice(bytemuck::bytes_of(&B::quantize(x)));
    }
}

/// Checks that `bytes` is the size of a row of `n` elements of `dtype`.
pub(crate) fn check_row(op: &'static str, dtype: DType, n: usize, bytes: usize) -> Result<()> {
    match dtype.row_size(n) {
        None => Err(Error::Shape {
            op,
            msg: format!(
                "{n} elements are not a whole number of {dtype} blocks of {}",
                dtype.block_size()
            ),
        }),
        Some(size) if size != bytes => Err(Error::Shape {
            op,
            msg: format!("a {dtype} row of {n} elements takes {size} bytes, got {bytes}"),
        }),
        Some(_) => Ok(()),
    }
}

fn unsupported(dtype: DType, what: &str) -> Error {
    Error::UnsupportedType {
        dtype,
        what: what.to_string(),
    }
}

/// Decodes one row: `dst.len()` elements from `src`, which must hold exactly
/// `dtype.row_size(dst.len())` bytes. Supports F32, F16, BF16 and every quantized type (I32 is
/// refused). Bit-exact with gguf-py's numpy dequantizer (see the module docs).
pub fn dequantize_row(dtype: DType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    if dtype == DType::I32 {
        return Err(unsupported(dtype, "dequantize_row"));
    }
    check_row("dequantize_row", dtype, dst.len(), src.len())?;
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 | DType::I32 => float::dequantize(dtype, src, dst)?,
        DType::Q4_0 => dequantize_blocks::<BlockQ4_0>(src, dst),
        DType::Q4_1 => dequantize_blocks::<BlockQ4_1>(src, dst),
        DType::Q5_0 => dequantize_blocks::<BlockQ5_0>(src, dst),
        DType::Q5_1 => dequantize_blocks::<BlockQ5_1>(src, dst),
        DType::Q8_0 => dequantize_blocks::<BlockQ8_0>(src, dst),
        DType::Q8_1 => dequantize_blocks::<BlockQ8_1>(src, dst),
        DType::Q4K => dequantize_blocks::<BlockQ4K>(src, dst),
        DType::Q5K => dequantize_blocks::<BlockQ5K>(src, dst),
        DType::Q6K => dequantize_blocks::<BlockQ6K>(src, dst),
        DType::Q8K => dequantize_blocks::<BlockQ8K>(src, dst),
        DType::MXFP4 => dequantize_blocks::<BlockMxfp4>(src, dst),
        DType::Q4_0G | DType::Q8_0G => dequantize_row(dtype.base(), &ungroup(dtype, src)?, dst)?,
    }
    Ok(())
}

/// Encodes one row: `src.len()` elements into `dst`, which must hold exactly
/// `dtype.row_size(src.len())` bytes. Supports F32, F16, BF16 and every quantized type (I32 is
/// refused), with ggml's reference quantizers.
pub fn quantize_row(dtype: DType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    if dtype == DType::I32 {
        return Err(unsupported(dtype, "quantize_row"));
    }
    check_row("quantize_row", dtype, src.len(), dst.len())?;
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 | DType::I32 => float::quantize(dtype, src, dst)?,
        DType::Q4_0 => quantize_blocks::<BlockQ4_0>(src, dst),
        DType::Q4_1 => quantize_blocks::<BlockQ4_1>(src, dst),
        DType::Q5_0 => quantize_blocks::<BlockQ5_0>(src, dst),
        DType::Q5_1 => quantize_blocks::<BlockQ5_1>(src, dst),
        DType::Q8_0 => quantize_blocks::<BlockQ8_0>(src, dst),
        DType::Q8_1 => quantize_blocks::<BlockQ8_1>(src, dst),
        DType::Q4K => quantize_blocks::<BlockQ4K>(src, dst),
        DType::Q5K => quantize_blocks::<BlockQ5K>(src, dst),
        DType::Q6K => quantize_blocks::<BlockQ6K>(src, dst),
        DType::Q8K => quantize_blocks::<BlockQ8K>(src, dst),
        DType::MXFP4 => quantize_blocks::<BlockMxfp4>(src, dst),
        DType::Q4_0G | DType::Q8_0G => {
            let mut base = vec![0u8; dst.len()];
            quantize_row(dtype.base(), src, &mut base)?;
            regroup_into(dtype.base(), &base, dst)?;
        }
    }
    Ok(())
}

/// Decodes a whole buffer of `dtype` data (any number of rows) into a new vector. The byte count
/// must be a whole number of blocks.
pub fn dequantize_to_vec(dtype: DType, src: &[u8]) -> Result<Vec<f32>> {
    if !src.len().is_multiple_of(dtype.type_size()) {
        return Err(Error::Shape {
            op: "dequantize_to_vec",
            msg: format!(
                "{} bytes are not a whole number of {dtype} blocks of {} bytes",
                src.len(),
                dtype.type_size()
            ),
        });
    }
    let mut out = vec![0f32; src.len() / dtype.type_size() * dtype.block_size()];
    dequantize_row(dtype, src, &mut out)?;
    Ok(out)
}

/// Encodes `src` (a whole number of blocks) into a new byte vector.
pub fn quantize_to_vec(dtype: DType, src: &[f32]) -> Result<Vec<u8>> {
    let size = dtype.row_size(src.len()).ok_or_else(|| Error::Shape {
        op: "quantize_to_vec",
        msg: format!(
            "{} elements are not a whole number of {dtype} blocks",
            src.len()
        ),
    })?;
    let mut out = vec![0u8; size];
    quantize_row(dtype, src, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests;
