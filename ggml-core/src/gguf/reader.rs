//! The GGUF reader: one bounds-checked parser over a `&[u8]`, used for memory-mapped files
//! ([`GgufFile::open`]) and owned buffers ([`GgufFile::from_bytes`]). See the module docs of
//! [`crate::gguf`] for what is validated.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use super::tensor::{layout, TensorInfo, MAX_DIMS};
use super::value::{Array, Value, ValueType};
use super::{align_up, alignment_of, GgufError, Result, MAGIC, MAX_ARRAY_DEPTH};
use crate::dtype::DType;

/// Smallest encoding of one metadata pair: key length, value type, a one-byte value.
const MIN_KV_SIZE: usize = 8 + 4 + 1;
/// Smallest encoding of one tensor info: name length, n_dims, type id, offset.
const MIN_TENSOR_INFO_SIZE: usize = 8 + 4 + 4 + 8;

/// A bounds-checked little-endian reader over a byte slice.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    /// The next `n` bytes.
    fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8]> {
        let truncated = GgufError::Truncated {
            offset: self.pos,
            what,
            needed: n,
            available: self.remaining(),
        };
        let Some(end) = usize::try_from(n)
            .ok()
            .and_then(|n| self.pos.checked_add(n))
        else {
            return Err(truncated);
        };
        let bytes = self.buf.get(self.pos..end).ok_or(truncated)?;
        self.pos = end;
        Ok(bytes)
    }

    fn bytes<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64, what)?);
        Ok(out)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32> {
        self.bytes(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &'static str) -> Result<u64> {
        self.bytes(what).map(u64::from_le_bytes)
    }

    /// A `u64` count of items of at least `min_size` bytes each, checked against the bytes left so
    /// that allocating `count` items is bounded by the file size.
    fn count(&mut self, what: &'static str, min_size: usize) -> Result<usize> {
        let offset = self.pos;
        let count = self.u64(what)?;
        let available = self.remaining();
        usize::try_from(count)
            .ok()
            .filter(|&c| c.checked_mul(min_size).is_some_and(|n| n <= available))
            .ok_or(GgufError::CountTooLarge {
                offset,
                what,
                count,
                available,
            })
    }

    /// A length-prefixed UTF-8 string.
    fn string(&mut self, what: &'static str) -> Result<String> {
        let len = self.u64(what)?;
        let offset = self.pos;
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(GgufError::InvalidUtf8 { offset, what }),
        }
    }

    fn value_type(&mut self, what: &'static str) -> Result<ValueType> {
        let offset = self.pos;
        let type_id = self.u32(what)?;
        ValueType::from_id(type_id).ok_or(GgufError::UnknownValueType { offset, type_id })
    }

    /// `n` fixed-size little-endian values; `n` was checked by [`Cursor::count`].
    fn le_vec<const N: usize, T>(&mut self, n: usize, decode: fn([u8; N]) -> T) -> Result<Vec<T>> {
        let len = n
            .checked_mul(N)
            .and_then(|l| u64::try_from(l).ok())
            .unwrap_or(u64::MAX);
        let bytes = self.take(len, "array data")?;
        Ok(bytes
            .chunks_exact(N)
            .map(|chunk| {
                let mut b = [0u8; N];
                b.copy_from_slice(chunk);
                decode(b)
            })
            .collect())
    }

    fn bool_from(offset: usize, value: u8) -> Result<bool> {
        match value {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(GgufError::InvalidBool { offset, value }),
        }
    }

    /// One value of type `ty`; arrays nest `depth` levels deep so far.
    fn value(&mut self, ty: ValueType, depth: usize) -> Result<Value> {
        const W: &str = "metadata value";
        Ok(match ty {
            ValueType::U8 => Value::U8(u8::from_le_bytes(self.bytes(W)?)),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.bytes(W)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.bytes(W)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.bytes(W)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.bytes(W)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.bytes(W)?)),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.bytes(W)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.bytes(W)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.bytes(W)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.bytes(W)?)),
            ValueType::Bool => {
                let offset = self.pos;
                let [b] = self.bytes(W)?;
                Value::Bool(Self::bool_from(offset, b)?)
            }
            ValueType::String => Value::String(self.string("string value")?),
            ValueType::Array => Value::Array(self.array(depth + 1)?),
        })
    }

    /// An array (element type, count, elements) at nesting level `depth` (1 for a top-level array).
    fn array(&mut self, depth: usize) -> Result<Array> {
        if depth > MAX_ARRAY_DEPTH {
            return Err(GgufError::NestingTooDeep {
                offset: self.pos,
                max: MAX_ARRAY_DEPTH,
            });
        }
        let ty = self.value_type("array element type")?;
        let n = self.count("array element", ty.min_size())?;
        Ok(match ty {
            ValueType::U8 => Array::U8(self.le_vec(n, u8::from_le_bytes)?),
            ValueType::I8 => Array::I8(self.le_vec(n, i8::from_le_bytes)?),
            ValueType::U16 => Array::U16(self.le_vec(n, u16::from_le_bytes)?),
            ValueType::I16 => Array::I16(self.le_vec(n, i16::from_le_bytes)?),
            ValueType::U32 => Array::U32(self.le_vec(n, u32::from_le_bytes)?),
            ValueType::I32 => Array::I32(self.le_vec(n, i32::from_le_bytes)?),
            ValueType::U64 => Array::U64(self.le_vec(n, u64::from_le_bytes)?),
            ValueType::I64 => Array::I64(self.le_vec(n, i64::from_le_bytes)?),
            ValueType::F32 => Array::F32(self.le_vec(n, f32::from_le_bytes)?),
            ValueType::F64 => Array::F64(self.le_vec(n, f64::from_le_bytes)?),
            ValueType::Bool => {
                let offset = self.pos;
                let bytes = self.le_vec(n, u8::from_le_bytes)?;
                let bools = bytes
                    .iter()
                    .enumerate()
                    .map(|(i, &b)| Self::bool_from(offset + i, b));
                Array::Bool(bools.collect::<Result<_>>()?)
            }
            ValueType::String => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.string("string array element")?);
                }
                Array::String(v)
            }
            ValueType::Array => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.array(depth + 1)?);
                }
                Array::Array(v)
            }
        })
    }

    /// One tensor info (name, dims, type id, offset), with its shape checked.
    fn tensor_info(&mut self) -> Result<TensorInfo> {
        let name = self.string("tensor name")?;
        let n_dims = self.u32("tensor n_dims")?;
        let n_dims = usize::try_from(n_dims)
            .ok()
            .filter(|&n| n <= MAX_DIMS)
            .ok_or_else(|| GgufError::BadDims {
                name: name.clone(),
                msg: format!("{n_dims} dims, at most {MAX_DIMS} allowed"),
            })?;
        let mut dims = [0u64; MAX_DIMS];
        for d in dims.iter_mut().take(n_dims) {
            *d = self.u64("tensor dim")?;
        }
        let type_id = self.u32("tensor type")?;
        let dtype = DType::from_gguf_id(type_id).ok_or_else(|| GgufError::UnknownTensorType {
            name: name.clone(),
            type_id,
        })?;
        let offset = self.u64("tensor offset")?;
        let (shape, size_bytes) = layout(&name, dtype, dims.get(..n_dims).unwrap_or(&dims))?;
        Ok(TensorInfo {
            name,
            dtype,
            shape,
            n_dims,
            offset,
            size_bytes,
        })
    }
}

/// Everything parsed from a file, apart from the bytes.
struct Header {
    version: u32,
    metadata: Vec<(String, Value)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_offset: usize,
}

/// Parses and validates the header of a GGUF file held in `buf`.
fn parse(buf: &[u8]) -> Result<Header> {
    let mut cur = Cursor { buf, pos: 0 };
    let magic: [u8; 4] = cur.bytes("magic")?;
    if magic != MAGIC {
        return Err(GgufError::BadMagic { found: magic });
    }
    let version = cur.u32("version")?;
    if version & 0xffff == 0 && matches!(version.swap_bytes(), 1..=3) {
        return Err(GgufError::BigEndian);
    }
    if !matches!(version, 2 | 3) {
        return Err(GgufError::UnsupportedVersion(version));
    }
    let n_tensors = cur.count("tensor", MIN_TENSOR_INFO_SIZE)?;
    let n_kv = cur.count("metadata", MIN_KV_SIZE)?;

    let mut metadata = Vec::with_capacity(n_kv);
    let mut key_index = HashMap::with_capacity(n_kv);
    for _ in 0..n_kv {
        let key = cur.string("metadata key")?;
        let ty = cur.value_type("metadata value type")?;
        let value = cur.value(ty, 0)?;
        if key_index.insert(key.clone(), metadata.len()).is_some() {
            return Err(GgufError::DuplicateKey(key));
        }
        metadata.push((key, value));
    }

    let capacity = n_tensors.min(cur.remaining() / MIN_TENSOR_INFO_SIZE);
    let mut tensors = Vec::with_capacity(capacity);
    let mut tensor_index = HashMap::with_capacity(capacity);
    for _ in 0..n_tensors {
        let info = cur.tensor_info()?;
        if tensor_index
            .insert(info.name.clone(), tensors.len())
            .is_some()
        {
            return Err(GgufError::DuplicateTensor(info.name));
        }
        tensors.push(info);
    }

    let alignment = alignment_of(&metadata)?;
    let header_end = u64::try_from(cur.pos).unwrap_or(u64::MAX);
    let data_offset = align_up(header_end, alignment)
        .and_then(|o| usize::try_from(o).ok())
        .ok_or_else(|| {
            GgufError::BadAlignment(format!("{alignment} (data section offset overflows)"))
        })?;
    // A file without tensors may end before the (padded) data section; one with tensors may not, which
    // also bounds the alignment of such files by their size.
    if !tensors.is_empty() && data_offset > buf.len() {
        return Err(GgufError::DataSectionOutOfBounds {
            data_offset: u64::try_from(data_offset).unwrap_or(u64::MAX),
            file_len: u64::try_from(buf.len()).unwrap_or(u64::MAX),
        });
    }
    let data_len = u64::try_from(buf.len().saturating_sub(data_offset)).unwrap_or(u64::MAX);
    check_placement(&tensors, alignment, data_len)?;

    Ok(Header {
        version,
        metadata,
        key_index,
        tensors,
        tensor_index,
        alignment,
        data_offset,
    })
}

/// Checks that tensor offsets are aligned, data lies inside the data section of `data_len` bytes,
/// and no two non-empty tensors overlap.
fn check_placement(tensors: &[TensorInfo], alignment: u64, data_len: u64) -> Result<()> {
    let mut ranges = Vec::with_capacity(tensors.len());
    for t in tensors {
        if !t.offset.is_multiple_of(alignment) {
            return Err(GgufError::MisalignedTensor {
                name: t.name.clone(),
                offset: t.offset,
                alignment,
            });
        }
        let size = u64::try_from(t.size_bytes).unwrap_or(u64::MAX);
        let end = t.offset.checked_add(size).filter(|&e| e <= data_len);
        let Some(end) = end else {
            return Err(GgufError::TensorOutOfBounds {
                name: t.name.clone(),
                offset: t.offset,
                size,
                data_len,
            });
        };
        if size > 0 {
            ranges.push((t.offset, end, t));
        }
    }
    ranges.sort_unstable_by_key(|&(start, end, _)| (start, end));
    for pair in ranges.windows(2) {
        if let [(_, end, first), (start, _, second)] = pair {
            if end > start {
                return Err(GgufError::OverlappingTensors {
                    first: first.name.clone(),
                    second: second.name.clone(),
                });
            }
        }
    }
    Ok(())
}

/// The bytes of a file: mapped or owned.
enum Bytes {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// A parsed GGUF file: its metadata in file order, its tensor infos, and its bytes (mapped or owned),
/// from which tensor data is sliced without copying.
pub struct GgufFile {
    bytes: Bytes,
    header: Header,
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.header.version)
            .field("len", &self.as_bytes().len())
            .field("alignment", &self.header.alignment)
            .field("metadata", &self.header.metadata.len())
            .field("tensors", &self.header.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Memory-maps and parses the file at `path`.
    ///
    /// The file must not be modified or truncated while the returned value lives (the usual
    /// condition of memory-mapped files); data is otherwise read lazily by the OS.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let file = std::fs::File::open(path)?;
        // SAFETY: the mapping is read-only; the caller keeps the file unchanged while it is mapped, as
        // documented above.
        let map = unsafe { memmap2::Mmap::map(&file)? };
        Self::from_backing(Bytes::Mapped(map))
    }

    /// Parses a GGUF file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile> {
        Self::from_backing(Bytes::Owned(bytes))
    }

    /// The file's bytes, owned (copied out of the mapping when memory-mapped): for editing the data
    /// of a file built in memory, then parsing it again with [`GgufFile::from_bytes`].
    pub fn into_bytes(self) -> Vec<u8> {
        match self.bytes {
            Bytes::Owned(v) => v,
            Bytes::Mapped(m) => m.to_vec(),
        }
    }

    fn from_backing(bytes: Bytes) -> Result<GgufFile> {
        let header = parse(bytes.as_slice())?;
        Ok(GgufFile { bytes, header })
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.header.version
    }

    /// The alignment of tensor data (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.header.alignment
    }

    /// The file offset of the data section: the end of the header rounded up to the alignment. It may
    /// lie past the end of a file without tensors.
    pub fn data_offset(&self) -> usize {
        self.header.data_offset
    }

    /// The whole file.
    pub fn as_bytes(&self) -> &[u8] {
        self.bytes.as_slice()
    }

    /// The metadata pairs in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.header.metadata
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        let &i = self.header.key_index.get(key)?;
        self.header.metadata.get(i).map(|(_, v)| v)
    }

    /// The value of `key` converted by `convert`; an error names the key if it is missing or
    /// `convert` refuses its value.
    fn typed<'s, T>(
        &'s self,
        key: &str,
        expected: &'static str,
        convert: impl FnOnce(&'s Value) -> Option<T>,
    ) -> Result<T> {
        let value = self
            .get(key)
            .ok_or_else(|| GgufError::MissingKey(key.to_string()))?;
        convert(value).ok_or_else(|| GgufError::WrongType {
            key: key.to_string(),
            expected,
            found: value.describe(),
        })
    }

    /// A string value.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        self.typed(key, "string", Value::as_str)
    }

    /// An integer value of any width that fits `u32`.
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        self.typed(key, "integer fitting u32", Value::as_u32)
    }

    /// An integer value of any width that fits `u64`.
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.typed(key, "integer fitting u64", Value::as_u64)
    }

    /// An integer value of any width that fits `i32`.
    pub fn get_i32(&self, key: &str) -> Result<i32> {
        self.typed(key, "integer fitting i32", Value::as_i32)
    }

    /// An `f32` value (or an `f64` rounded to `f32`).
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        self.typed(key, "f32", Value::as_f32)
    }

    /// A bool value.
    pub fn get_bool(&self, key: &str) -> Result<bool> {
        self.typed(key, "bool", Value::as_bool)
    }

    /// An array of strings.
    pub fn get_str_array(&self, key: &str) -> Result<&[String]> {
        self.typed(key, "array of strings", |v| v.as_array()?.as_strs())
    }

    /// An array of `f32` (or of `f64`, rounded).
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>> {
        self.typed(key, "array of f32", |v| v.as_array()?.to_f32s())
    }

    /// An array of integers of any width, each fitting `i32`.
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>> {
        self.typed(key, "array of integers fitting i32", |v| {
            v.as_array()?.to_ints()
        })
    }

    /// An array of integers of any width, each fitting `u32`.
    pub fn get_u32_array(&self, key: &str) -> Result<Vec<u32>> {
        self.typed(key, "array of integers fitting u32", |v| {
            v.as_array()?.to_ints()
        })
    }

    /// The tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    /// The tensor named `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        let &i = self.header.tensor_index.get(name)?;
        self.header.tensors.get(i)
    }

    /// The data of a tensor of this file: `info.size_bytes` bytes of the file, not copied. (For a
    /// `TensorInfo` that does not come from this file and does not fit in it, the slice is empty.)
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        usize::try_from(info.offset)
            .ok()
            .and_then(|o| o.checked_add(self.header.data_offset))
            .and_then(|start| Some(start..start.checked_add(info.size_bytes)?))
            .and_then(|range| self.as_bytes().get(range))
            .unwrap_or_default()
    }
}
