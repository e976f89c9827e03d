//! The reader against hand-encoded files: a small valid file is read correctly (and equals the
//! writer's output), and a table of corruptions of it (truncations at every offset, huge counts, bad
//! magic/version/type ids, misaligned, overlapping or out-of-bounds data, duplicate names, bad UTF-8,
//! too deep nesting, bad alignment) each gives the expected error, never a panic.

mod gguf_common;

use ggml_core::gguf::{Array, GgufError, GgufFile, GgufWriter, Value, ALIGNMENT_KEY};
use ggml_core::DType;
use gguf_common::{pseudo_random_bytes, Enc};

/// A small valid file and the offsets of the fields the corruptions patch.
struct Small {
    bytes: Vec<u8>,
    key_flag: usize,
    key_nest: usize,
    str_value: usize,
    arr_type: usize,
    arr_count: usize,
    toks_count: usize,
    tok0_len: usize,
    flag_value: usize,
    nest_inner_type: usize,
    kv_type_arch: usize,
    t0_ndims: usize,
    t0_type: usize,
    t0_dim0: usize,
    t1_name: usize,
    t1_off: usize,
    data_start: usize,
}

const W0: [f32; 8] = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];

fn small() -> Small {
    let mut e = Enc::default();
    e.header(3, 2, 5);
    e.str("general.architecture");
    let kv_type_arch = e.u32(8);
    let str_value = e.str("llama") + 8;
    e.str("a.arr");
    e.u32(9);
    let arr_type = e.u32(4);
    let arr_count = e.u64(3);
    for v in [1u32, 2, 3] {
        e.u32(v);
    }
    e.str("a.toks");
    e.u32(9);
    e.u32(8);
    let toks_count = e.u64(2);
    let tok0_len = e.str("x");
    e.str("yz");
    let key_flag = e.str("a.flag") + 8;
    e.u32(7);
    let flag_value = e.raw(&[1]);
    let key_nest = e.str("a.nest") + 8;
    e.u32(9);
    e.u32(9);
    e.u64(1);
    let nest_inner_type = e.u32(0);
    e.u64(1);
    e.raw(&[5]);
    let (t0_ndims, t0_type, _) = e.tensor("w0", &[4, 2], 0, 0);
    let t0_dim0 = t0_ndims + 4;
    let t1_name = e.str("w1") + 8;
    e.u32(1);
    e.u64(8);
    e.u32(1);
    let t1_off = e.u64(32);
    e.pad(32);
    let data_start = e.buf.len();
    for v in W0 {
        e.raw(&v.to_le_bytes());
    }
    for i in 0..8u16 {
        e.raw(&(i * 1000).to_le_bytes());
    }
    e.pad(32);
    Small {
        bytes: e.buf,
        key_flag,
        key_nest,
        str_value,
        arr_type,
        arr_count,
        toks_count,
        tok0_len,
        flag_value,
        nest_inner_type,
        kv_type_arch,
        t0_ndims,
        t0_type,
        t0_dim0,
        t1_name,
        t1_off,
        data_start,
    }
}

fn parse(bytes: &[u8]) -> Result<GgufFile, GgufError> {
    GgufFile::from_bytes(bytes.to_vec())
}

#[test]
fn hand_encoded_file_is_read_and_matches_the_writer() {
    let s = small();
    let f = parse(&s.bytes).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.data_offset(), s.data_start);
    assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(
        f.get("a.arr"),
        Some(&Value::Array(Array::U32(vec![1, 2, 3])))
    );
    assert_eq!(f.get_str_array("a.toks").unwrap(), ["x", "yz"]);
    assert!(f.get_bool("a.flag").unwrap());
    assert_eq!(
        f.get("a.nest"),
        Some(&Value::Array(Array::Array(vec![Array::U8(vec![5])])))
    );
    let w0 = f.tensor("w0").unwrap();
    assert_eq!(
        (w0.dtype, w0.shape, w0.n_dims, w0.offset, w0.size_bytes),
        (DType::F32, [4, 2, 1, 1], 2, 0, 32)
    );
    let floats: Vec<f32> = f
        .tensor_data(w0)
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(floats, W0);
    let w1 = f.tensor("w1").unwrap();
    assert_eq!(
        (w1.dtype, w1.shape, w1.offset, w1.size_bytes),
        (DType::F16, [8, 1, 1, 1], 32, 16)
    );
    assert_eq!(&f.tensor_data(w1)[2..4], &1000u16.to_le_bytes());

    let mut w = GgufWriter::new();
    for (k, v) in f.metadata() {
        w.set(k.clone(), v.clone());
    }
    for t in f.tensors() {
        w.add_tensor(t.name.clone(), t.dtype, t.dims(), f.tensor_data(t))
            .unwrap();
    }
    assert_eq!(w.to_bytes().unwrap(), s.bytes);
}

#[test]
fn every_truncation_is_an_error_until_the_last_tensor_ends() {
    let s = small();
    let data_end = s.data_start + 32 + 16;
    for len in 0..s.bytes.len() {
        let r = parse(&s.bytes[..len]);
        if len < data_end {
            assert!(r.is_err(), "prefix of {len} bytes parsed");
        } else {
            // Only trailing padding is missing.
            assert!(r.is_ok(), "prefix of {len} bytes: {r:?}");
        }
    }
    assert!(matches!(
        parse(&s.bytes[..30]),
        Err(GgufError::CountTooLarge { .. })
    ));
    assert!(matches!(
        parse(&s.bytes[..s.t1_off + 4]),
        Err(GgufError::Truncated { .. })
    ));
    assert!(matches!(
        parse(&s.bytes[..s.data_start + 40]),
        Err(GgufError::TensorOutOfBounds { .. })
    ));
}

type Check = fn(&GgufError) -> bool;

fn patch(bytes: &[u8], at: usize, with: &[u8]) -> Vec<u8> {
    let mut b = bytes.to_vec();
    b[at..at + with.len()].copy_from_slice(with);
    b
}

/// Magic, version and counts of the header.
#[test]
fn header_corruption() {
    let s = small();
    let b = &s.bytes;
    let huge = u64::MAX.to_le_bytes();
    let big = (1u64 << 40).to_le_bytes();
    let cases: Vec<(&str, Vec<u8>, Check)> = vec![
        ("bad magic", patch(b, 0, b"GGUG"), |e| {
            matches!(e, GgufError::BadMagic { .. })
        }),
        ("version 1", patch(b, 4, &1u32.to_le_bytes()), |e| {
            matches!(e, GgufError::UnsupportedVersion(1))
        }),
        ("version 0", patch(b, 4, &0u32.to_le_bytes()), |e| {
            matches!(e, GgufError::UnsupportedVersion(0))
        }),
        ("version 4", patch(b, 4, &4u32.to_le_bytes()), |e| {
            matches!(e, GgufError::UnsupportedVersion(4))
        }),
        ("big-endian", patch(b, 4, &3u32.to_be_bytes()), |e| {
            matches!(e, GgufError::BigEndian)
        }),
        ("tensor count max", patch(b, 8, &huge), |e| {
            matches!(e, GgufError::CountTooLarge { .. })
        }),
        ("tensor count 2^40", patch(b, 8, &big), |e| {
            matches!(e, GgufError::CountTooLarge { .. })
        }),
        ("kv count max", patch(b, 16, &huge), |e| {
            matches!(e, GgufError::CountTooLarge { .. })
        }),
        ("kv count 2^40", patch(b, 16, &big), |e| {
            matches!(e, GgufError::CountTooLarge { .. })
        }),
    ];
    check_cases(cases);
}

/// Keys, value types and values of the metadata.
#[test]
fn metadata_corruption() {
    let s = small();
    let b = &s.bytes;
    let huge = u64::MAX.to_le_bytes();
    let big = (1u64 << 40).to_le_bytes();
    let cases: Vec<(&str, Vec<u8>, Check)> = vec![
        (
            "kv count too high",
            patch(b, 16, &6u64.to_le_bytes()),
            |e| {
                matches!(
                    e,
                    GgufError::UnknownValueType { .. }
                        | GgufError::Truncated { .. }
                        | GgufError::InvalidUtf8 { .. }
                )
            },
        ),
        ("key length huge", patch(b, 24, &huge), |e| {
            matches!(e, GgufError::Truncated { .. })
        }),
        ("string length huge", patch(b, s.str_value - 8, &big), |e| {
            matches!(e, GgufError::Truncated { .. })
        }),
        ("array count huge", patch(b, s.arr_count, &huge), |e| {
            matches!(e, GgufError::CountTooLarge { .. })
        }),
        ("array count 2^40", patch(b, s.arr_count, &big), |e| {
            matches!(e, GgufError::CountTooLarge { .. })
        }),
        (
            "string array count huge",
            patch(b, s.toks_count, &big),
            |e| matches!(e, GgufError::CountTooLarge { .. }),
        ),
        (
            "string element length huge",
            patch(b, s.tok0_len, &big),
            |e| matches!(e, GgufError::Truncated { .. }),
        ),
        (
            "value type 13",
            patch(b, s.kv_type_arch, &13u32.to_le_bytes()),
            |e| matches!(e, GgufError::UnknownValueType { type_id: 13, .. }),
        ),
        (
            "array element type 99",
            patch(b, s.arr_type, &99u32.to_le_bytes()),
            |e| matches!(e, GgufError::UnknownValueType { type_id: 99, .. }),
        ),
        (
            "nested element type max",
            patch(b, s.nest_inner_type, &u32::MAX.to_le_bytes()),
            |e| matches!(e, GgufError::UnknownValueType { .. }),
        ),
        ("bool 2", patch(b, s.flag_value, &[2]), |e| {
            matches!(e, GgufError::InvalidBool { value: 2, .. })
        }),
        ("utf-8 in key", patch(b, s.key_flag, &[0xff]), |e| {
            matches!(
                e,
                GgufError::InvalidUtf8 {
                    what: "metadata key",
                    ..
                }
            )
        }),
        (
            "utf-8 in string",
            patch(b, s.str_value, &[0xc3, 0x28]),
            |e| matches!(e, GgufError::InvalidUtf8 { .. }),
        ),
        (
            "duplicate key",
            patch(b, s.key_nest, b"a.flag"),
            |e| matches!(e, GgufError::DuplicateKey(k) if k == "a.flag"),
        ),
    ];
    check_cases(cases);
}

/// Names, dimensions, types and offsets of the tensor infos.
#[test]
fn tensor_info_corruption() {
    let s = small();
    let b = &s.bytes;
    let huge = u64::MAX.to_le_bytes();
    let big = (1u64 << 40).to_le_bytes();
    let cases: Vec<(&str, Vec<u8>, Check)> = vec![
        ("5 dims", patch(b, s.t0_ndims, &5u32.to_le_bytes()), |e| {
            matches!(e, GgufError::BadDims { .. })
        }),
        (
            "n_dims max",
            patch(b, s.t0_ndims, &u32::MAX.to_le_bytes()),
            |e| matches!(e, GgufError::BadDims { .. }),
        ),
        ("dim max", patch(b, s.t0_dim0, &huge), |e| {
            matches!(e, GgufError::BadDims { .. })
        }),
        ("dim 2^40", patch(b, s.t0_dim0, &big), |e| {
            matches!(e, GgufError::TensorOutOfBounds { .. })
        }),
        (
            "dim 2^62",
            patch(b, s.t0_dim0, &(1u64 << 62).to_le_bytes()),
            |e| matches!(e, GgufError::BadDims { .. }),
        ),
        (
            "tensor type 4",
            patch(b, s.t0_type, &4u32.to_le_bytes()),
            |e| matches!(e, GgufError::UnknownTensorType { type_id: 4, .. }),
        ),
        (
            "tensor type 1000",
            patch(b, s.t0_type, &1000u32.to_le_bytes()),
            |e| matches!(e, GgufError::UnknownTensorType { .. }),
        ),
        (
            "q8_0 with ne0 4",
            patch(b, s.t0_type, &8u32.to_le_bytes()),
            |e| matches!(e, GgufError::BadDims { .. }),
        ),
        (
            "misaligned 16",
            patch(b, s.t1_off, &16u64.to_le_bytes()),
            |e| {
                matches!(
                    e,
                    GgufError::MisalignedTensor {
                        offset: 16,
                        alignment: 32,
                        ..
                    }
                )
            },
        ),
        (
            "misaligned 33",
            patch(b, s.t1_off, &33u64.to_le_bytes()),
            |e| matches!(e, GgufError::MisalignedTensor { .. }),
        ),
        ("overlap", patch(b, s.t1_off, &0u64.to_le_bytes()), |e| {
            matches!(e, GgufError::OverlappingTensors { .. })
        }),
        (
            "out of bounds",
            patch(b, s.t1_off, &64u64.to_le_bytes()),
            |e| matches!(e, GgufError::TensorOutOfBounds { .. }),
        ),
        (
            "offset max",
            patch(b, s.t1_off, &(u64::MAX - 31).to_le_bytes()),
            |e| matches!(e, GgufError::TensorOutOfBounds { .. }),
        ),
        ("utf-8 in tensor name", patch(b, s.t1_name, &[0x80]), |e| {
            matches!(
                e,
                GgufError::InvalidUtf8 {
                    what: "tensor name",
                    ..
                }
            )
        }),
        (
            "duplicate tensor",
            patch(b, s.t1_name, b"w0"),
            |e| matches!(e, GgufError::DuplicateTensor(n) if n == "w0"),
        ),
    ];
    check_cases(cases);
}

/// Each corrupted file fails to parse with the error its check expects.
fn check_cases(cases: Vec<(&str, Vec<u8>, Check)>) {
    for (what, bytes, check) in cases {
        match parse(&bytes) {
            Ok(_) => panic!("{what}: parsed"),
            Err(e) => assert!(check(&e), "{what}: unexpected error {e}"),
        }
    }
}

/// A file with one metadata pair and no tensors.
fn one_kv(key: &str, type_id: u32, payload: &[u8]) -> Vec<u8> {
    let mut e = Enc::default();
    e.header(3, 0, 1);
    e.str(key);
    e.u32(type_id);
    e.raw(payload);
    e.buf
}

#[test]
fn bad_alignment_values_are_refused() {
    let cases: [(u32, Vec<u8>); 5] = [
        (4, 0u32.to_le_bytes().to_vec()),
        (4, 3u32.to_le_bytes().to_vec()),
        (4, 48u32.to_le_bytes().to_vec()),
        (5, (-32i32).to_le_bytes().to_vec()),
        (10, (1u64 << 32).to_le_bytes().to_vec()),
    ];
    for (ty, payload) in cases {
        let r = parse(&one_kv(ALIGNMENT_KEY, ty, &payload));
        assert!(
            matches!(r, Err(GgufError::BadAlignment(_))),
            "{payload:?}: {r:?}"
        );
    }
    let mut s = Enc::default();
    s.str("x");
    let r = parse(&one_kv(ALIGNMENT_KEY, 8, &s.buf));
    assert!(matches!(r, Err(GgufError::BadAlignment(_))));
    let f = parse(&one_kv(ALIGNMENT_KEY, 4, &8u32.to_le_bytes())).unwrap();
    assert_eq!(f.alignment(), 8);
}

/// `levels` arrays nested in each other around an empty u8 array.
fn nested(levels: usize) -> Vec<u8> {
    let mut e = Enc::default();
    for _ in 1..levels {
        e.u32(9);
        e.u64(1);
    }
    e.u32(0);
    e.u64(0);
    one_kv("deep", 9, &e.buf)
}

#[test]
fn nesting_depth_is_limited() {
    assert!(parse(&nested(8)).is_ok());
    assert!(matches!(
        parse(&nested(9)),
        Err(GgufError::NestingTooDeep { max: 8, .. })
    ));
    assert!(matches!(
        parse(&nested(100_000)),
        Err(GgufError::NestingTooDeep { .. })
    ));
}

#[test]
fn vocab_only_file_may_end_before_its_data_section() {
    let bytes = one_kv("general.architecture", 8, &[1, 0, 0, 0, 0, 0, 0, 0, b'x']);
    // 24 header + 28 key + 4 type + 9 value bytes: the data section would start at 96.
    assert_eq!(bytes.len(), 65);
    let f = parse(&bytes).unwrap();
    assert_eq!(f.data_offset(), 96);
    assert!(f.tensors().is_empty());
}

#[test]
fn empty_tensors_need_no_data_and_do_not_overlap() {
    let mut e = Enc::default();
    e.header(3, 3, 0);
    e.tensor("a", &[4], 0, 0);
    e.tensor("empty", &[0, 7], 0, 0);
    e.tensor("scalar", &[], 0, 32);
    e.pad(32);
    e.raw(&[0; 36]);
    let f = parse(&e.buf).unwrap();
    let empty = f.tensor("empty").unwrap();
    assert_eq!(
        (empty.size_bytes, empty.shape, empty.n_elements()),
        (0, [0, 7, 1, 1], 0)
    );
    assert!(f.tensor_data(empty).is_empty());
    let scalar = f.tensor("scalar").unwrap();
    assert_eq!(
        (scalar.n_dims, scalar.size_bytes, scalar.shape),
        (0, 4, [1; 4])
    );
}

#[test]
fn random_mutations_never_panic() {
    let valid = gguf_common::sample_writer(Some(16)).to_bytes().unwrap();
    let noise = pseudo_random_bytes(20_000 * 3, 99);
    let mut ok = 0;
    for chunk in noise.chunks(3) {
        let mut b = valid.clone();
        let at = (usize::from(chunk[0]) << 8 | usize::from(chunk[1])) % b.len();
        b[at] ^= chunk[2] | 1;
        if let Ok(f) = GgufFile::from_bytes(b) {
            ok += 1;
            for t in f.tensors() {
                assert_eq!(f.tensor_data(t).len(), t.size_bytes);
            }
        }
    }
    // Flips inside tensor data and padding keep the file valid.
    assert!(ok > 0);
}
