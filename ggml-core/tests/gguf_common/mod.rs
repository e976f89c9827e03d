//! Helpers shared by the GGUF integration tests: an independent hand encoder of the GGUF byte format
//! (so that reader and writer are checked against something other than each other), a sample file
//! that uses every value type, and deterministic pseudo-random bytes.

#![allow(dead_code)]

use ggml_core::gguf::{Array, GgufWriter, Value};
use ggml_core::DType;

/// Deterministic pseudo-random bytes (xorshift64*).
pub fn pseudo_random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            (s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
        })
        .collect()
}

/// Appends little-endian GGUF fields to a buffer; each method returns the offset it wrote at.
#[derive(Default)]
pub struct Enc {
    pub buf: Vec<u8>,
}

impl Enc {
    pub fn raw(&mut self, b: &[u8]) -> usize {
        let at = self.buf.len();
        self.buf.extend_from_slice(b);
        at
    }
    pub fn u32(&mut self, v: u32) -> usize {
        self.raw(&v.to_le_bytes())
    }
    pub fn u64(&mut self, v: u64) -> usize {
        self.raw(&v.to_le_bytes())
    }
    /// A string: u64 length then bytes; returns the offset of the length.
    pub fn str(&mut self, s: &str) -> usize {
        let at = self.u64(s.len() as u64);
        self.raw(s.as_bytes());
        at
    }
    /// Magic, version, tensor count, kv count.
    pub fn header(&mut self, version: u32, n_tensors: u64, n_kv: u64) {
        self.raw(b"GGUF");
        self.u32(version);
        self.u64(n_tensors);
        self.u64(n_kv);
    }
    /// A tensor info; returns the offsets of (n_dims, type id, data offset).
    pub fn tensor(
        &mut self,
        name: &str,
        dims: &[u64],
        type_id: u32,
        offset: u64,
    ) -> (usize, usize, usize) {
        self.str(name);
        let nd = self.u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        let ty = self.u32(type_id);
        let off = self.u64(offset);
        (nd, ty, off)
    }
    /// Zero bytes up to a multiple of `alignment`.
    pub fn pad(&mut self, alignment: usize) {
        while !self.buf.len().is_multiple_of(alignment) {
            self.buf.push(0);
        }
    }
}

/// One value of every scalar type, every array type, and nested arrays, under distinct keys.
pub fn all_values() -> Vec<(String, Value)> {
    let v: Vec<(&str, Value)> = vec![
        ("t.u8", Value::U8(200)),
        ("t.i8", Value::I8(-100)),
        ("t.u16", Value::U16(60000)),
        ("t.i16", Value::I16(-30000)),
        ("t.u32", Value::U32(4_000_000_000)),
        ("t.i32", Value::I32(-2_000_000_000)),
        ("t.u64", Value::U64(u64::MAX - 1)),
        ("t.i64", Value::I64(i64::MIN + 1)),
        ("t.f32", Value::F32(-1.5e-3)),
        ("t.f64", Value::F64(std::f64::consts::PI)),
        ("t.bool", Value::Bool(true)),
        ("t.string", Value::String("héllo ☃ wörld".into())),
        ("t.empty_string", Value::String(String::new())),
        ("a.u8", Array::U8(vec![0, 1, 255]).into()),
        ("a.i8", Array::I8(vec![-128, 0, 127]).into()),
        ("a.u16", Array::U16(vec![1, 65535]).into()),
        ("a.i16", Array::I16(vec![-32768, 5]).into()),
        ("a.u32", Array::U32(vec![7, u32::MAX]).into()),
        ("a.i32", Array::I32(vec![-7, 0, i32::MAX]).into()),
        ("a.u64", Array::U64(vec![u64::MAX]).into()),
        ("a.i64", Array::I64(vec![i64::MIN, 3]).into()),
        ("a.f32", Array::F32(vec![0.5, -0.25, f32::INFINITY]).into()),
        ("a.f64", Array::F64(vec![1e300, -2.0]).into()),
        ("a.bool", Array::Bool(vec![true, false, true]).into()),
        (
            "a.string",
            Array::String(vec!["a".into(), "".into(), "ß字".into()]).into(),
        ),
        ("a.empty", Array::U32(vec![]).into()),
        (
            "a.nested",
            Array::Array(vec![
                Array::I32(vec![1, 2]),
                Array::String(vec!["x".into()]),
                Array::Array(vec![Array::Bool(vec![false]), Array::F64(vec![])]),
                Array::Array(vec![]),
            ])
            .into(),
        ),
    ];
    v.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// A tensor of the sample file: name, type, dims, data.
pub type SampleTensor = (String, DType, Vec<u64>, Vec<u8>);

/// Tensors of several types and ranks with pseudo-random data.
pub fn sample_tensors() -> Vec<SampleTensor> {
    let specs: [(&str, DType, &[u64]); 6] = [
        ("token_embd.weight", DType::F32, &[3, 5]),
        ("blk.0.attn_q.weight", DType::Q8_0, &[64, 2]),
        ("blk.0.ffn.weight", DType::Q4_0, &[32, 1, 3]),
        ("norm.bias", DType::F16, &[7]),
        ("ids", DType::I32, &[2, 1, 1, 2]),
        ("k", DType::Q4K, &[256, 2]),
    ];
    specs
        .iter()
        .enumerate()
        .map(|(i, &(name, dtype, dims))| {
            let n: u64 = dims.iter().product();
            let rows = n / dims[0];
            let size = dtype.row_size(dims[0] as usize).unwrap() * rows as usize;
            (
                name.to_string(),
                dtype,
                dims.to_vec(),
                pseudo_random_bytes(size, i as u64 + 1),
            )
        })
        .collect()
}

/// A writer with [`all_values`], an architecture key and [`sample_tensors`].
pub fn sample_writer(alignment: Option<u32>) -> GgufWriter<'static> {
    let mut w = GgufWriter::new();
    w.set("general.architecture", "llama");
    if let Some(a) = alignment {
        w.set_alignment(a).unwrap();
    }
    for (k, v) in all_values() {
        w.set(k, v);
    }
    for (name, dtype, dims, data) in sample_tensors() {
        w.add_tensor(name, dtype, &dims, data).unwrap();
    }
    w
}
