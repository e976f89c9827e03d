//! Inputs found by `cargo fuzz run gguf_reader` that broke an invariant of the fuzz target, kept as
//! regression tests.

use ggml_core::gguf::{GgufError, GgufFile, GgufWriter};

/// Base64 decoding (standard alphabet, `=` padding) of the inputs as libFuzzer prints them.
fn base64(s: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0);
    for c in s.bytes().filter(|&c| c != b'=') {
        let v = ALPHABET.iter().position(|&a| a == c).expect("base64 digit") as u32;
        acc = acc << 6 | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

/// OOM found after ~2.6M executions: a tensor-less file with `general.alignment` = 2^30 (as i64)
/// parsed fine, but rewriting it padded the header to 1 GiB. The writer now pads only when the file
/// has tensors; the rewritten file stays small and keeps the alignment.
#[test]
fn huge_alignment_without_tensors_rewrites_small() {
    let input = base64(
        "R0dVRgMAAAAAAAAAAAAAAAQAAAAAAAAAFAAAAAAAAABnR0c6RgMAAAMBAAAAAAAAAAAAAAQAAAAA8AAAFAAAAAAAAABnR0c6RgMAAAAGAAAAAAAAAB0AAAAAAAAAFAAAAAAAAABnZW5lcmFsLmFyY2hpdGVjdHVyZQgAAAAFAAAAAAAAAGxsYW1hEQAAAAAAAABnZW5lcmFsLmFsaWdubWVudAsAAAAAAABAAAAAAAAAAAAEAAAAAAAAABRhCAAAAAUAAAAAAAAAAAAFcggAAABzAAAAAAA=",
    );
    assert_eq!(input.len(), 215);
    let file = GgufFile::from_bytes(input.clone()).unwrap();
    assert_eq!(file.alignment(), 1 << 30);
    assert!(file.tensors().is_empty());
    let rewritten = GgufWriter::from_file(&file).unwrap().to_bytes().unwrap();
    // The header and nothing else (the input has a few trailing bytes the writer drops).
    assert_eq!(&rewritten[..], &input[..rewritten.len()]);
    assert!(rewritten.len() < input.len());
    let again = GgufFile::from_bytes(rewritten.clone()).unwrap();
    assert_eq!(again.alignment(), 1 << 30);
    assert_eq!(again.metadata(), file.metadata());
    assert_eq!(
        GgufWriter::from_file(&again).unwrap().to_bytes().unwrap(),
        rewritten
    );
}

/// The same alignment in a file that has a tensor: its data section would start 1 GiB in, past the
/// end of the file, which is refused.
#[test]
fn huge_alignment_with_tensors_is_refused() {
    let mut w = GgufWriter::new();
    w.set_alignment(1 << 12).unwrap();
    w.add_tensor("t", ggml_core::DType::F32, &[0], Vec::new())
        .unwrap();
    let mut bytes = w.to_bytes().unwrap();
    assert_eq!(bytes.len(), 1 << 12);
    assert!(GgufFile::from_bytes(bytes.clone()).is_ok());
    bytes.truncate(100);
    assert!(matches!(
        GgufFile::from_bytes(bytes),
        Err(GgufError::DataSectionOutOfBounds {
            data_offset: 4096,
            file_len: 100
        })
    ));
}
