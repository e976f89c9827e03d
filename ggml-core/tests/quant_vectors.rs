//! Checks `quant::dequantize_row` and `quant::quantize_row` bit for bit against the vectors made
//! by `scripts/gen_quant_vectors.py` with the `gguf` Python package (see that script for the file
//! format and how to regenerate them).

use std::path::PathBuf;

use ggml_core::quant::{dequantize_row, quantize_row};
use ggml_core::DType;

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/quant")
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Reads `<name>.<kind>.bin`: checks the magic and returns (type, count, payload).
fn load(name: &str, kind: &str, magic: &[u8; 4]) -> (DType, usize, Vec<u8>) {
    let path = data_dir().join(format!("{name}.{kind}.bin"));
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&bytes[..4], magic, "{}", path.display());
    let dtype = DType::from_gguf_id(u32_at(&bytes, 4)).expect("known gguf type id");
    assert_eq!(dtype.name(), name, "file name and type id disagree");
    (dtype, u32_at(&bytes, 8) as usize, bytes[12..].to_vec())
}

fn assert_bits_eq(name: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    let bad: Vec<usize> = (0..got.len())
        .filter(|&i| got[i].to_bits() != want[i].to_bits())
        .collect();
    if let Some(&i) = bad.first() {
        panic!(
            "{name}: {} of {} values differ; first at {i} (block {}): got {:e} ({:#010x}), want {:e} ({:#010x})",
            bad.len(),
            got.len(),
            i / 32,
            got[i],
            got[i].to_bits(),
            want[i],
            want[i].to_bits()
        );
    }
}

fn check_dequant(name: &str) {
    let (dtype, n_blocks, payload) = load(name, "dequant", b"GQDQ");
    let nbytes = n_blocks * dtype.type_size();
    let n = n_blocks * dtype.block_size();
    assert_eq!(payload.len(), nbytes + 4 * n, "{name}: file size");
    let (blocks, expected) = payload.split_at(nbytes);
    let expected = f32s(expected);

    let mut got = vec![0f32; n];
    dequantize_row(dtype, blocks, &mut got).unwrap();
    assert_bits_eq(name, &got, &expected);

    // The same data at an odd address, decoded one block per call.
    let mut shifted = vec![0u8; nbytes + 1];
    shifted[1..].copy_from_slice(blocks);
    let mut got = vec![0f32; n];
    let (bs, ts) = (dtype.block_size(), dtype.type_size());
    for (src, dst) in shifted[1..].chunks_exact(ts).zip(got.chunks_exact_mut(bs)) {
        dequantize_row(dtype, src, dst).unwrap();
    }
    assert_bits_eq(name, &got, &expected);
}

fn check_quant(name: &str) {
    let (dtype, n, payload) = load(name, "quant", b"GQQT");
    let size = dtype.row_size(n).unwrap();
    assert_eq!(payload.len(), 4 * n + size, "{name}: file size");
    let (x, expected) = payload.split_at(4 * n);
    let x = f32s(x);
    let mut got = vec![0u8; size];
    quantize_row(dtype, &x, &mut got).unwrap();
    if let Some(i) = (0..size).find(|&i| got[i] != expected[i]) {
        let block = i / dtype.type_size();
        panic!(
            "{name}: first differing byte {i} (block {block}): got {:02x?}, want {:02x?}",
            &got[block * dtype.type_size()..(block + 1) * dtype.type_size()],
            &expected[block * dtype.type_size()..(block + 1) * dtype.type_size()],
        );
    }
}

#[test]
fn every_type_has_dequant_vectors() {
    for t in DType::ALL.into_iter().filter(|&t| t != DType::I32) {
        assert!(
            data_dir()
                .join(format!("{}.dequant.bin", t.name()))
                .exists(),
            "no vectors for {t}"
        );
    }
}

macro_rules! dequant_tests {
    ($($test:ident => $name:literal),* $(,)?) => {$(
        #[test]
        fn $test() {
            check_dequant($name);
        }
    )*};
}

dequant_tests! {
    dequant_f32 => "f32",
    dequant_f16 => "f16",
    dequant_bf16 => "bf16",
    dequant_q4_0 => "q4_0",
    dequant_q4_1 => "q4_1",
    dequant_q5_0 => "q5_0",
    dequant_q5_1 => "q5_1",
    dequant_q8_0 => "q8_0",
    dequant_q8_1 => "q8_1",
    dequant_q4_k => "q4_K",
    dequant_q5_k => "q5_K",
    dequant_q6_k => "q6_K",
    dequant_q8_k => "q8_K",
    dequant_mxfp4 => "mxfp4",
}

macro_rules! quant_tests {
    ($($test:ident => $name:literal),* $(,)?) => {$(
        #[test]
        fn $test() {
            check_quant($name);
        }
    )*};
}

quant_tests! {
    quant_f16 => "f16",
    quant_bf16 => "bf16",
    quant_q4_0 => "q4_0",
    quant_q4_1 => "q4_1",
    quant_q5_0 => "q5_0",
    quant_q5_1 => "q5_1",
    quant_q8_0 => "q8_0",
    quant_mxfp4 => "mxfp4",
}
