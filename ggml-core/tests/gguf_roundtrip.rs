//! Writer → reader round trips: every value type, nested arrays, tensors of several types, several
//! alignments, files on disk, and a vocabulary-sized string array. Also writes fuzz seeds on request.

mod gguf_common;

use std::time::Instant;

use ggml_core::gguf::{Array, GgufError, GgufFile, GgufWriter, Value, ALIGNMENT_KEY};
use ggml_core::DType;
use gguf_common::{all_values, sample_tensors, sample_writer};

fn read_back(w: &GgufWriter) -> GgufFile {
    GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
}

#[test]
fn every_value_type_round_trips_in_order() {
    let file = read_back(&sample_writer(None));
    assert_eq!(file.version(), 3);
    let mut expected = vec![("general.architecture".to_string(), Value::from("llama"))];
    expected.extend(all_values());
    assert_eq!(file.metadata(), expected.as_slice());
    for (k, v) in &expected {
        assert_eq!(file.get(k), Some(v), "{k}");
        assert_eq!(file.get(k).unwrap().value_type(), v.value_type());
    }
    assert_eq!(file.get("missing"), None);
}

#[test]
fn tensors_round_trip_with_every_alignment() {
    for alignment in [None, Some(1), Some(8), Some(64), Some(4096)] {
        let w = sample_writer(alignment);
        let bytes = w.to_bytes().unwrap();
        let file = GgufFile::from_bytes(bytes.clone()).unwrap();
        let a = u64::from(alignment.unwrap_or(32));
        assert_eq!(file.alignment(), a);
        assert_eq!(file.data_offset() as u64 % a, 0);
        // Every tensor is padded to the alignment, so the file ends on a multiple of it.
        assert_eq!(bytes.len() as u64 % a, 0);
        let tensors = sample_tensors();
        assert_eq!(file.tensors().len(), tensors.len());
        let mut prev_end = 0;
        for ((name, dtype, dims, data), info) in tensors.iter().zip(file.tensors()) {
            assert_eq!(&info.name, name);
            assert_eq!(info.dtype, *dtype);
            assert_eq!(info.dims(), dims.as_slice());
            assert_eq!(info.n_dims, dims.len());
            assert_eq!(&info.shape[..dims.len()], dims.as_slice());
            assert!(info.shape[dims.len()..].iter().all(|&d| d == 1));
            assert_eq!(info.n_elements(), dims.iter().product::<u64>());
            assert_eq!(info.size_bytes, data.len());
            assert_eq!(info.offset % a, 0);
            assert!(info.offset >= prev_end);
            prev_end = info.offset + data.len() as u64;
            assert_eq!(file.tensor_data(info), data.as_slice());
            assert_eq!(file.tensor(name), Some(info));
            // The slice is the file's own bytes at data_offset + offset.
            let start = file.data_offset() + info.offset as usize;
            assert_eq!(&bytes[start..start + data.len()], data.as_slice());
        }
    }
}

#[test]
fn version_2_files_are_read() {
    let mut bytes = sample_writer(None).to_bytes().unwrap();
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    let file = GgufFile::from_bytes(bytes).unwrap();
    assert_eq!(file.version(), 2);
    assert_eq!(file.tensors().len(), sample_tensors().len());
}

#[test]
fn open_maps_a_written_file() {
    let path = std::env::temp_dir().join(format!("ggml_tp_gguf_{}.gguf", std::process::id()));
    let w = sample_writer(Some(64));
    let n = w.write_to_path(&path).unwrap();
    let file = GgufFile::open(&path).unwrap();
    assert_eq!(file.as_bytes().len() as u64, n);
    assert_eq!(file.as_bytes(), w.to_bytes().unwrap().as_slice());
    for (name, _, _, data) in sample_tensors() {
        let info = file.tensor(&name).unwrap();
        let slice = file.tensor_data(info);
        assert_eq!(slice, data.as_slice());
        // Mapped data is at page-aligned base + aligned offset.
        assert_eq!(slice.as_ptr() as usize % 64, 0);
    }
    drop(file);
    std::fs::write(&path, b"").unwrap();
    assert!(matches!(
        GgufFile::open(&path),
        Err(GgufError::Truncated { offset: 0, .. })
    ));
    std::fs::remove_file(&path).unwrap();
    assert!(matches!(GgufFile::open(&path), Err(GgufError::Io(_))));
}

#[test]
fn from_file_copies_everything() {
    let original = sample_writer(Some(16)).to_bytes().unwrap();
    let file = GgufFile::from_bytes(original.clone()).unwrap();
    assert_eq!(
        GgufWriter::from_file(&file).unwrap().to_bytes().unwrap(),
        original
    );
}

#[test]
fn set_replaces_in_place() {
    let mut w = GgufWriter::new();
    w.set("a", 1u32);
    w.set("b", 2u32);
    w.set("a", "x");
    let file = read_back(&w);
    let keys: Vec<_> = file.metadata().iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["a", "b"]);
    assert_eq!(file.get_str("a").unwrap(), "x");
}

#[test]
fn typed_accessors_coerce_and_name_the_key() {
    let mut w = GgufWriter::new();
    w.set("u8", 7u8);
    w.set("neg", -3i64);
    w.set("big", u64::MAX);
    w.set("f64", 0.5f64);
    w.set("flag", false);
    w.set("toks", vec!["a", "b"]);
    w.set("scores", vec![0.25f64, -1.0]);
    w.set("types", Array::U8(vec![1, 2, 3]));
    w.set("neg_arr", vec![-1i16]);
    let f = read_back(&w);
    assert_eq!(f.get_u32("u8").unwrap(), 7);
    assert_eq!(f.get_u64("u8").unwrap(), 7);
    assert_eq!(f.get_i32("neg").unwrap(), -3);
    assert_eq!(f.get_f32("f64").unwrap(), 0.5);
    assert!(!f.get_bool("flag").unwrap());
    assert_eq!(f.get_str_array("toks").unwrap(), ["a", "b"]);
    assert_eq!(f.get_f32_array("scores").unwrap(), [0.25, -1.0]);
    assert_eq!(f.get_i32_array("types").unwrap(), [1, 2, 3]);
    assert_eq!(f.get_u32_array("types").unwrap(), [1, 2, 3]);
    assert_eq!(f.get_i32_array("neg_arr").unwrap(), [-1]);

    assert!(matches!(f.get_u32("nope"), Err(GgufError::MissingKey(k)) if k == "nope"));
    let err = f.get_u32("neg").unwrap_err();
    assert!(matches!(&err, GgufError::WrongType { key, .. } if key == "neg"));
    assert!(err.to_string().contains("i64 -3"), "{err}");
    assert!(matches!(f.get_u32("big"), Err(GgufError::WrongType { .. })));
    assert!(matches!(f.get_str("u8"), Err(GgufError::WrongType { .. })));
    assert!(matches!(f.get_bool("u8"), Err(GgufError::WrongType { .. })));
    assert!(matches!(f.get_f32("u8"), Err(GgufError::WrongType { .. })));
    assert!(matches!(
        f.get_str_array("types"),
        Err(GgufError::WrongType { .. })
    ));
    assert!(matches!(
        f.get_u32_array("neg_arr"),
        Err(GgufError::WrongType { .. })
    ));
    assert!(matches!(
        f.get_f32_array("toks"),
        Err(GgufError::WrongType { .. })
    ));
}

#[test]
fn writer_rejects_bad_input() {
    let mut w = GgufWriter::new();
    let e = w
        .add_tensor("t", DType::F32, &[4], vec![0u8; 15])
        .unwrap_err();
    assert!(matches!(
        e,
        GgufError::TensorDataSize {
            got: 15,
            expected: 16,
            ..
        }
    ));
    assert!(matches!(
        w.add_tensor("t", DType::Q8_0, &[16], vec![0u8; 17]),
        Err(GgufError::BadDims { .. })
    ));
    assert!(matches!(
        w.add_tensor("t", DType::F32, &[1, 1, 1, 1, 1], vec![0u8; 4]),
        Err(GgufError::BadDims { .. })
    ));
    assert!(matches!(
        w.add_tensor("g", DType::Q4_0G, &[1024], vec![0u8; 576]),
        Err(GgufError::UnknownTensorType { .. })
    ));
    w.add_tensor("t", DType::F32, &[1], vec![0u8; 4]).unwrap();
    assert!(matches!(
        w.add_tensor("t", DType::F32, &[1], vec![0u8; 4]),
        Err(GgufError::DuplicateTensor(_))
    ));
    assert!(matches!(
        w.set_alignment(0),
        Err(GgufError::BadAlignment(_))
    ));
    assert!(matches!(
        w.set_alignment(48),
        Err(GgufError::BadAlignment(_))
    ));
    w.set(ALIGNMENT_KEY, -32i32);
    assert!(matches!(w.to_bytes(), Err(GgufError::BadAlignment(_))));
    w.set(ALIGNMENT_KEY, 64u64);
    assert_eq!(read_back(&w).alignment(), 64);

    let mut deep = Array::U8(vec![1]);
    for _ in 0..8 {
        deep = Array::Array(vec![deep]);
    }
    let mut w = GgufWriter::new();
    w.set("deep", deep);
    assert!(matches!(
        w.to_bytes(),
        Err(GgufError::NestingTooDeep { .. })
    ));
}

#[test]
fn max_depth_nesting_round_trips() {
    let mut deep = Array::U8(vec![1]);
    for _ in 0..7 {
        deep = Array::Array(vec![deep]);
    }
    let mut w = GgufWriter::new();
    w.set("deep", deep.clone());
    assert_eq!(read_back(&w).get("deep"), Some(&Value::Array(deep)));
}

#[test]
fn a_vocabulary_of_262144_tokens_loads_quickly() {
    let n = 262_144usize;
    let tokens: Vec<String> = (0..n).map(|i| format!("tok{i}▁")).collect();
    let scores: Vec<f32> = (0..n).map(|i| -(i as f32)).collect();
    let types: Vec<i32> = (0..n).map(|i| (i % 6) as i32).collect();
    let mut w = GgufWriter::new();
    w.set("tokenizer.ggml.tokens", Array::String(tokens.clone()));
    w.set("tokenizer.ggml.scores", scores.clone());
    w.set("tokenizer.ggml.token_type", types.clone());
    let bytes = w.to_bytes().unwrap();
    let t = Instant::now();
    let file = GgufFile::from_bytes(bytes).unwrap();
    let elapsed = t.elapsed();
    assert_eq!(
        file.get_str_array("tokenizer.ggml.tokens").unwrap(),
        tokens.as_slice()
    );
    assert_eq!(file.get_f32_array("tokenizer.ggml.scores").unwrap(), scores);
    assert_eq!(
        file.get_i32_array("tokenizer.ggml.token_type").unwrap(),
        types
    );
    // Linear work takes milliseconds; this bound only catches quadratic behaviour.
    assert!(elapsed.as_secs_f64() < 2.0, "parsing took {elapsed:?}");
}

/// Small valid files for the fuzz corpus. Checked to parse here; written to the directory named by
/// `GGUF_WRITE_SEEDS` when that variable is set.
#[test]
fn fuzz_seeds_are_valid() {
    let mut seeds: Vec<(&str, Vec<u8>)> = vec![
        ("sample_a32", sample_writer(None).to_bytes().unwrap()),
        ("sample_a8", sample_writer(Some(8)).to_bytes().unwrap()),
        ("empty", GgufWriter::new().to_bytes().unwrap()),
    ];
    let mut vocab = GgufWriter::new();
    vocab.set("general.architecture", "llama");
    vocab.set("tokenizer.ggml.tokens", vec!["<s>", "</s>", "a", "b"]);
    vocab.set("tokenizer.ggml.scores", vec![0.0f32, 0.0, -1.0, -2.0]);
    vocab.set("tokenizer.ggml.token_type", vec![3i32, 3, 1, 1]);
    seeds.push(("vocab", vocab.to_bytes().unwrap()));
    let mut tensors_only = GgufWriter::new();
    tensors_only
        .add_tensor("e", DType::BF16, &[0, 3], Vec::new())
        .unwrap();
    tensors_only
        .add_tensor("s", DType::F32, &[], vec![0, 0, 128, 63])
        .unwrap();
    tensors_only
        .add_tensor("m", DType::MXFP4, &[32], vec![7u8; 17])
        .unwrap();
    seeds.push(("tensors", tensors_only.to_bytes().unwrap()));
    for (_, bytes) in &seeds {
        let file = GgufFile::from_bytes(bytes.clone()).unwrap();
        assert_eq!(
            &GgufWriter::from_file(&file).unwrap().to_bytes().unwrap(),
            bytes
        );
    }
    if let Some(dir) = std::env::var_os("GGUF_WRITE_SEEDS") {
        for (name, bytes) in &seeds {
            std::fs::write(
                std::path::Path::new(&dir).join(format!("{name}.gguf")),
                bytes,
            )
            .unwrap();
        }
    }
}
