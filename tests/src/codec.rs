//! Bytes <-> values for every element type, row by row through ggml-core's quant module (the same
//! conversions the backends are specified against); I32 is handled here. Large tensors (the
//! model-size expert weights of the GPU cases) are converted on several threads, rows split evenly.

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

/// Tensors of at least this many values are converted on several threads.
const PARALLEL_VALUES: usize = 1 << 22;

/// `convert(src rows, dst rows)` over the rows of `src` (`src.1` items each) and of `dst` (`dst.1`
/// items each), in one call for small tensors, else in chunks of whole rows on scoped threads (one
/// per available core); the first error wins.
fn by_rows<S: Sync, D: Send>(
    src: (&[S], usize),
    dst: (&mut [D], usize),
    convert: impl Fn(&[S], &mut [D]) -> Result<()> + Sync,
) -> Result<()> {
    let ((src, src_row), (dst, dst_row)) = (src, dst);
    let rows = dst.len() / dst_row.max(1);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if (dst.len() < PARALLEL_VALUES && src.len() < PARALLEL_VALUES) || cores < 2 || rows < 2 {
        return convert(src, dst);
    }
    let per = rows.div_ceil(cores.min(rows));
    std::thread::scope(|s| {
        let threads: Vec<_> = src
            .chunks(per * src_row)
            .zip(dst.chunks_mut(per * dst_row))
            .map(|(a, b)| s.spawn(|| convert(a, b)))
            .collect();
        threads
            .into_iter()
            .try_for_each(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
    })
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
    by_rows(
        (&row_f32[..], ne[0]),
        (&mut out[..], row_bytes),
        |src, dst| {
            for (s, d) in src.chunks_exact(ne[0]).zip(dst.chunks_exact_mut(row_bytes)) {
                quant::quantize_row(dtype, s, d)?;
            }
            Ok(())
        },
    )?;
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
    let mut data = vec![0f64; layout.nelements()];
    by_rows(
        (bytes, layout.row_bytes()),
        (&mut data[..], ne[0]),
        |src, dst| {
            let mut row = vec![0f32; ne[0]];
            for (s, d) in src
                .chunks_exact(layout.row_bytes())
                .zip(dst.chunks_exact_mut(ne[0]))
            {
                quant::dequantize_row(dtype, s, &mut row)?;
                d.iter_mut().zip(&row).for_each(|(x, &v)| *x = v as f64);
            }
            Ok(())
        },
    )?;
    Ok(Dense::from_vec(ne, data))
}

/// The values a tensor of type `dtype` holds after storing `x` (rounding / quantization round trip).
pub fn round_trip(dtype: DType, x: &Dense) -> Result<Dense> {
    decode(dtype, x.ne, &encode(dtype, x.ne, &x.data)?)
}

mod quant {
    pub use ggml_core::quant::{dequantize_row, quantize_row};
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tensor large enough for the threads gives the bytes and values of row-by-row conversion.
    #[test]
    fn threaded_conversion_matches_row_by_row() {
        let ne = [256, (PARALLEL_VALUES / 256) + 3, 1, 1];
        let values: Vec<f64> = (0..ne[0] * ne[1])
            .map(|i| ((i * 7919 % 1000) as f64 - 500.0) / 97.0)
            .collect();
        for dtype in [DType::Q4K, DType::Q8_0, DType::F16] {
            let bytes = encode(dtype, ne, &values).unwrap();
            let layout = Layout::contiguous(dtype, ne);
            let mut row = vec![0u8; layout.row_bytes()];
            let mut back = vec![0f32; ne[0]];
            let seen = decode(dtype, ne, &bytes).unwrap();
            for r in [0, 1, ne[1] / 2, ne[1] - 1] {
                let src: Vec<f32> = values[r * ne[0]..(r + 1) * ne[0]]
                    .iter()
                    .map(|&v| v as f32)
                    .collect();
                quant::quantize_row(dtype, &src, &mut row).unwrap();
                assert_eq!(
                    row,
                    bytes[r * row.len()..(r + 1) * row.len()],
                    "{dtype} row {r}"
                );
                quant::dequantize_row(dtype, &row, &mut back).unwrap();
                let got = &seen.data[r * ne[0]..(r + 1) * ne[0]];
                assert!(
                    got.iter().zip(&back).all(|(&g, &b)| g == b as f64),
                    "{dtype} row {r}"
                );
            }
        }
    }
}
