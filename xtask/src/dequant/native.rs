//! The side under test: ggml-core's GGUF reader and `quant::dequantize_row`, row by row, hashed like the
//! reference (sha256 of the little-endian f32 values, ggml element order).

use std::path::Path;

use anyhow::{bail, Context, Result};
use ggml_core::gguf::{GgufFile, TensorInfo};
use ggml_core::{quant, DType};
use sha2::{Digest, Sha256};

use model_cache::hashing::hex;

/// One tensor as ggml-core sees it, with its hash or the reason it could not be dequantized.
pub struct NativeTensor {
    pub name: String,
    pub dtype: DType,
    pub n_elements: u64,
    pub sha256: Result<String, String>,
}

fn open(path: &Path) -> Result<GgufFile> {
    GgufFile::open(path)
        .with_context(|| format!("opening {} with ggml-core's GGUF reader", path.display()))
}

/// Calls `f` with each row of `info` dequantized to f32, in order.
fn for_each_row(file: &GgufFile, info: &TensorInfo, mut f: impl FnMut(&[f32])) -> Result<()> {
    let ne0 = info.shape[0] as usize;
    let n_rows = info.n_elements() / info.shape[0].max(1);
    let Some(row_bytes) = info.dtype.row_size(ne0) else {
        bail!(
            "row of {ne0} elements is not a whole number of {} blocks",
            info.dtype
        );
    };
    let data = file.tensor_data(info);
    let Some(needed) = row_bytes
        .checked_mul(n_rows as usize)
        .filter(|&n| n <= data.len())
    else {
        bail!(
            "tensor data is {} bytes, {n_rows} rows of {row_bytes} bytes do not fit",
            data.len()
        );
    };
    let mut row = vec![0f32; ne0];
    for src in data[..needed].chunks_exact(row_bytes.max(1)) {
        quant::dequantize_row(info.dtype, src, &mut row)?;
        f(&row);
    }
    Ok(())
}

fn tensor_sha256(file: &GgufFile, info: &TensorInfo) -> Result<String> {
    let mut hasher = Sha256::new();
    let mut bytes = Vec::new();
    for_each_row(file, info, |row| {
        bytes.clear();
        bytes.extend(row.iter().flat_map(|v| v.to_le_bytes()));
        hasher.update(&bytes);
    })?;
    Ok(hex(&hasher.finalize()))
}

/// Every tensor of the file with the hash of its dequantized values.
pub fn tensor_hashes(path: &Path) -> Result<Vec<NativeTensor>> {
    let file = open(path)?;
    Ok(file
        .tensors()
        .iter()
        .map(|info| NativeTensor {
            name: info.name.clone(),
            dtype: info.dtype,
            n_elements: info.n_elements(),
            sha256: tensor_sha256(&file, info).map_err(|e| format!("{e:#}")),
        })
        .collect())
}

/// Tensor `name` dequantized by ggml-core, with its row length (`ne0`).
pub fn tensor_values(path: &Path, name: &str) -> Result<(Vec<f32>, usize)> {
    let file = open(path)?;
    let info = file
        .tensors()
        .iter()
        .find(|t| t.name == name)
        .with_context(|| format!("no tensor `{name}` in {}", path.display()))?;
    let mut values = Vec::with_capacity(info.n_elements() as usize);
    for_each_row(&file, info, |row| values.extend_from_slice(row))?;
    Ok((values, info.shape[0] as usize))
}
