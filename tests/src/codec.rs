//! Bytes <-> values for every element type, row by row through ggml-core's quant module (the same
//! conversions the backends are specified against); I32 is handled here.

use crate::dense::Dense;
use ggml_core::{DType, Error, Layout, Result};

fn check_blocks(dtype: DType, ne: [usize; 4]) -> Result<Layout> {
    if !ne[0].is_multiple_of(dtype.block_size()) {
        return Err(Error::Other(format!(
            "rows of {} are not whole {dtype} blocks",
            ne[0]
        )));
    }
    Ok(Layout::contiguous(dtype, ne))
}

/// Encodes the values of a contiguous tensor of type `dtype` and shape `ne` (f64 rounded to f32 first).
pub fn encode(dtype: DType, ne: [usize; 4], values: &[f64]) -> Result<Vec<u8>> {
    let layout = check_blocks(dtype, ne)?;
    if dtype == DType::I32 {
        return Ok(values
            .iter()
            .flat_map(|&v| (v as i32).to_le_bytes())
            .collect());
    }
    let row_bytes = layout.row_bytes();
    let mut out = vec![0u8; layout.nbytes()];
    let row_f32: Vec<f32> = values.iter().map(|&v| v as f32).collect();
    for (src, dst) in row_f32
        .chunks_exact(ne[0])
        .zip(out.chunks_exact_mut(row_bytes))
    {
        quant::quantize_row(dtype, src, dst)?;
    }
    Ok(out)
}

/// Decodes the bytes of a contiguous tensor of type `dtype` and shape `ne`.
pub fn decode(dtype: DType, ne: [usize; 4], bytes: &[u8]) -> Result<Dense> {
    let layout = check_blocks(dtype, ne)?;
    if bytes.len() != layout.nbytes() {
        return Err(Error::Other(format!(
            "{} bytes for a {dtype} tensor {ne:?}",
            bytes.len()
        )));
    }
    if dtype == DType::I32 {
        let data = bytes
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
            .collect();
        return Ok(Dense::from_vec(ne, data));
    }
    let mut data = Vec::with_capacity(layout.nelements());
    let mut row = vec![0f32; ne[0]];
    for src in bytes.chunks_exact(layout.row_bytes()) {
        quant::dequantize_row(dtype, src, &mut row)?;
        data.extend(row.iter().map(|&v| v as f64));
    }
    Ok(Dense::from_vec(ne, data))
}

/// The values a tensor of type `dtype` holds after storing `x` (rounding / quantization round trip).
pub fn round_trip(dtype: DType, x: &Dense) -> Result<Dense> {
    decode(dtype, x.ne, &encode(dtype, x.ne, &x.data)?)
}

mod quant {
    pub use ggml_core::quant::{dequantize_row, quantize_row};
}
