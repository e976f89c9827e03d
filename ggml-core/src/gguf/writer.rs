//! The GGUF writer: collects metadata and tensors, then writes a little-endian GGUF v3 file with the
//! alignment given by `general.alignment` (default 32), zero padding after the header and after every
//! tensor's data. A file without tensors ends right after its metadata (like llama.cpp's vocab-only
//! files), so a huge alignment costs nothing there.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::{BufWriter, Write};
use std::path::Path;

use super::tensor::{layout, MAX_DIMS};
use super::value::{Array, Value};
use super::{
    align_up, alignment_of, GgufError, GgufFile, Result, ALIGNMENT_KEY, MAGIC, MAX_ARRAY_DEPTH,
};
use crate::dtype::DType;

/// The version the writer produces.
const VERSION: u32 = 3;

/// A tensor waiting to be written.
#[derive(Clone, Debug)]
struct PendingTensor<'a> {
    name: String,
    dtype: DType,
    dims: Vec<u64>,
    data: Cow<'a, [u8]>,
}

/// Builds a GGUF v3 file. Tensor data may be borrowed (`&'a [u8]`) or owned (`Vec<u8>`).
///
/// ```
/// use ggml_core::gguf::{GgufFile, GgufWriter};
/// use ggml_core::DType;
///
/// let mut w = GgufWriter::new();
/// w.set("general.architecture", "llama");
/// w.set("llama.block_count", 2u32);
/// let data: Vec<u8> = [1.0f32, 2.0, 3.0].iter().flat_map(|x| x.to_le_bytes()).collect();
/// w.add_tensor("x", DType::F32, &[3], data).unwrap();
/// let file = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
/// assert_eq!(file.get_str("general.architecture").unwrap(), "llama");
/// assert_eq!(file.tensor_data(file.tensor("x").unwrap()).len(), 12);
/// ```
#[derive(Clone, Debug, Default)]
pub struct GgufWriter<'a> {
    metadata: Vec<(String, Value)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<PendingTensor<'a>>,
    tensor_index: HashMap<String, usize>,
}

impl<'a> GgufWriter<'a> {
    /// An empty writer (alignment 32).
    pub fn new() -> Self {
        Self::default()
    }

    /// A writer holding all metadata of `file` (in file order) and all its tensors, with their data
    /// borrowed from the file. Writing it produces an equivalent v3 file.
    pub fn from_file(file: &'a GgufFile) -> Result<Self> {
        let mut w = Self::new();
        for (key, value) in file.metadata() {
            w.set(key.clone(), value.clone());
        }
        for t in file.tensors() {
            w.add_tensor(t.name.clone(), t.dtype, t.dims(), file.tensor_data(t))?;
        }
        Ok(w)
    }

    /// Sets `key` to `value`. A new key goes to the end; an existing key keeps its position.
    pub fn set(&mut self, key: impl Into<String>, value: impl Into<Value>) {
        let key = key.into();
        let value = value.into();
        match self.key_index.get(&key) {
            Some(&i) => {
                if let Some(slot) = self.metadata.get_mut(i) {
                    slot.1 = value;
                }
            }
            None => {
                self.key_index.insert(key.clone(), self.metadata.len());
                self.metadata.push((key, value));
            }
        }
    }

    /// Sets the alignment of tensor data (the `general.alignment` key, as `u32`); it must be a
    /// non-zero power of two.
    pub fn set_alignment(&mut self, alignment: u32) -> Result<()> {
        if !alignment.is_power_of_two() {
            return Err(GgufError::BadAlignment(alignment.to_string()));
        }
        self.set(ALIGNMENT_KEY, alignment);
        Ok(())
    }

    /// The metadata set so far, in order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// Adds a tensor with dims in ggml order (`ne0` first, at most 4) and its raw data, whose length
    /// must match the shape and type. Names must be unique.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dtype: DType,
        dims: &[u64],
        data: impl Into<Cow<'a, [u8]>>,
    ) -> Result<()> {
        let name = name.into();
        let data = data.into();
        if DType::from_gguf_id(dtype.gguf_id()) != Some(dtype) {
            // A device layout of ggml-tp's own (the regrouped Q4_0 / Q8_0): no file type.
            return Err(GgufError::UnknownTensorType {
                name,
                type_id: dtype.gguf_id(),
            });
        }
        let (_, expected) = layout(&name, dtype, dims)?;
        if data.len() != expected {
            return Err(GgufError::TensorDataSize {
                name,
                got: data.len(),
                expected,
            });
        }
        if self.tensor_index.contains_key(&name) {
            return Err(GgufError::DuplicateTensor(name));
        }
        self.tensor_index.insert(name.clone(), self.tensors.len());
        self.tensors.push(PendingTensor {
            name,
            dtype,
            dims: dims.to_vec(),
            data,
        });
        Ok(())
    }

    /// Writes the file to `out`; returns the number of bytes written.
    pub fn write_to<W: Write>(&self, mut out: W) -> Result<u64> {
        let alignment = alignment_of(&self.metadata)?;
        let mut n = Counter {
            out: &mut out,
            written: 0,
        };
        n.put(&MAGIC)?;
        n.put(&VERSION.to_le_bytes())?;
        n.put(&len_u64(self.tensors.len()).to_le_bytes())?;
        n.put(&len_u64(self.metadata.len()).to_le_bytes())?;
        for (key, value) in &self.metadata {
            n.string(key)?;
            n.put(&value.value_type().id().to_le_bytes())?;
            n.value(value)?;
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            n.string(&t.name)?;
            debug_assert!(t.dims.len() <= MAX_DIMS);
            n.put(&len_u32(t.dims.len()).to_le_bytes())?;
            for d in &t.dims {
                n.put(&d.to_le_bytes())?;
            }
            n.put(&t.dtype.gguf_id().to_le_bytes())?;
            n.put(&offset.to_le_bytes())?;
            offset = padded_end(offset, t.data.len(), alignment)?;
        }
        if !self.tensors.is_empty() {
            n.pad(alignment)?;
        }
        for t in &self.tensors {
            n.put(&t.data)?;
            n.pad(alignment)?;
        }
        n.out.flush()?;
        Ok(n.written)
    }

    /// Writes the file to `path` (created or truncated); returns the number of bytes written.
    pub fn write_to_path(&self, path: impl AsRef<Path>) -> Result<u64> {
        let file = std::fs::File::create(path)?;
        let mut out = BufWriter::new(file);
        let n = self.write_to(&mut out)?;
        out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        Ok(n)
    }

    /// The file as bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.write_to(&mut out)?;
        Ok(out)
    }
}

/// The end of `len` bytes of data at `offset`, rounded up to `alignment`.
fn padded_end(offset: u64, len: usize, alignment: u64) -> Result<u64> {
    offset
        .checked_add(len_u64(len))
        .and_then(|end| align_up(end, alignment))
        .ok_or_else(|| GgufError::BadAlignment(format!("{alignment} (data section overflows u64)")))
}

fn len_u64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

fn len_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// A writer that counts the bytes written.
struct Counter<'w, W: Write> {
    out: &'w mut W,
    written: u64,
}

impl<W: Write> Counter<'_, W> {
    fn put(&mut self, bytes: &[u8]) -> Result<()> {
        self.out.write_all(bytes)?;
        self.written = self.written.saturating_add(len_u64(bytes.len()));
        Ok(())
    }

    fn pad(&mut self, alignment: u64) -> Result<()> {
        let end = padded_end(self.written, 0, alignment)?;
        const ZEROS: [u8; 64] = [0; 64];
        let mut left = end - self.written;
        while left > 0 {
            let chunk = left.min(ZEROS.len() as u64);
            self.put(ZEROS.get(..chunk as usize).unwrap_or(&ZEROS))?;
            left -= chunk;
        }
        Ok(())
    }

    fn string(&mut self, s: &str) -> Result<()> {
        self.put(&len_u64(s.len()).to_le_bytes())?;
        self.put(s.as_bytes())
    }

    fn value(&mut self, value: &Value) -> Result<()> {
        match value {
            Value::U8(v) => self.put(&v.to_le_bytes()),
            Value::I8(v) => self.put(&v.to_le_bytes()),
            Value::U16(v) => self.put(&v.to_le_bytes()),
            Value::I16(v) => self.put(&v.to_le_bytes()),
            Value::U32(v) => self.put(&v.to_le_bytes()),
            Value::I32(v) => self.put(&v.to_le_bytes()),
            Value::U64(v) => self.put(&v.to_le_bytes()),
            Value::I64(v) => self.put(&v.to_le_bytes()),
            Value::F32(v) => self.put(&v.to_le_bytes()),
            Value::F64(v) => self.put(&v.to_le_bytes()),
            Value::Bool(v) => self.put(&[u8::from(*v)]),
            Value::String(s) => self.string(s),
            Value::Array(a) => self.array(a, 1),
        }
    }

    /// Element type, count and elements of an array at nesting level `depth` (1 at the top).
    fn array(&mut self, array: &Array, depth: usize) -> Result<()> {
        if depth > MAX_ARRAY_DEPTH {
            return Err(GgufError::NestingTooDeep {
                offset: usize::try_from(self.written).unwrap_or(usize::MAX),
                max: MAX_ARRAY_DEPTH,
            });
        }
        self.put(&array.element_type().id().to_le_bytes())?;
        self.put(&len_u64(array.len()).to_le_bytes())?;
        fn each<T, W: Write>(
            c: &mut Counter<'_, W>,
            items: &[T],
            mut f: impl FnMut(&mut Counter<'_, W>, &T) -> Result<()>,
        ) -> Result<()> {
            items.iter().try_for_each(|x| f(c, x))
        }
        match array {
            Array::U8(v) => self.put(v),
            Array::I8(v) => each(self, v, |c, x| c.put(&x.to_le_bytes())),
            Array::U16(v) => each(self, v, |c, x| c.put(&x.to_le_bytes())),
            Array::I16(v) => each(self, v, |c, x| c.put(&x.to_le_bytes())),
            Array::U32(v) => each(self, v, |c, x| c.put(&x.to_le_bytes())),
            Array::I32(v) => each(self, v, |c, x| c.put(&x.to_le_bytes())),
            Array::U64(v) => each(self, v, |c, x| c.put(&x.to_le_bytes())),
            Array::I64(v) => each(self, v, |c, x| c.put(&x.to_le_bytes())),
            Array::F32(v) => each(self, v, |c, x| c.put(&x.to_le_bytes())),
            Array::F64(v) => each(self, v, |c, x| c.put(&x.to_le_bytes())),
            Array::Bool(v) => each(self, v, |c, x| c.put(&[u8::from(*x)])),
            Array::String(v) => each(self, v, |c, x| c.string(x)),
            Array::Array(v) => each(self, v, |c, x| c.array(x, depth + 1)),
        }
    }
}
