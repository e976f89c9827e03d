//! GGUF v2/v3 reader and writer.
//!
//! A GGUF file is: the magic `GGUF`, a `u32` version, `u64` tensor and metadata counts, the metadata
//! key/value pairs, the tensor infos (name, dims, type id, offset), padding to the alignment, and the
//! data section. All numbers are little-endian (big-endian files and v1 files are refused).
//!
//! * [`GgufFile`] reads a file: [`GgufFile::open`] memory-maps it, [`GgufFile::from_bytes`] parses an
//!   owned buffer; both run the same parser over a `&[u8]`. Tensor data is handed out as slices of the
//!   file, without copying.
//! * [`GgufWriter`] builds metadata and tensors and writes a v3 file to any [`std::io::Write`].
//!
//! # Validation
//!
//! A corrupt or hostile file gives a [`GgufError`], never a panic, an allocation larger than the file
//! warrants, or a read out of bounds:
//!
//! * every count is checked against the bytes left in the file before anything is allocated (an array
//!   of `n` `u32` needs `4n` bytes left, a string of length `n` needs `n` bytes left, ...);
//! * keys, tensor names and string values must be valid UTF-8; keys and tensor names must be unique
//!   (names of any length are accepted; ggml itself limits tensor names to 63 bytes);
//! * arrays nest at most [`MAX_ARRAY_DEPTH`] deep; bools must be 0 or 1;
//! * `general.alignment`, if present, must be an integer that is a non-zero power of two fitting `u32`
//!   (default [`DEFAULT_ALIGNMENT`]);
//! * tensors have at most 4 dims; a dim may be 0 (an empty tensor, as ggml allows) and must not exceed
//!   `i64::MAX`; the element count must fit `i64` and the byte size `usize`; `ne0` must be a whole
//!   number of blocks of the type;
//! * tensor offsets are multiples of the alignment, tensor data lies inside the data section, and no
//!   two tensors overlap (gaps are allowed);
//! * a file with tensors must reach the (aligned) start of its data section; a file without tensors
//!   (a vocab-only file) may end right after its metadata.

mod reader;
mod tensor;
mod value;
mod writer;

pub use reader::GgufFile;
pub use tensor::{TensorInfo, MAX_DIMS};
pub use value::{Array, Value, ValueType};
pub use writer::GgufWriter;

/// The four magic bytes at the start of every GGUF file.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// The alignment of tensor data when the file has no `general.alignment` key.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The metadata key that sets the alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// How deep arrays of arrays may nest (an array of scalars has depth 1).
pub const MAX_ARRAY_DEPTH: usize = 8;

/// Errors of GGUF parsing and writing.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("io error: {0}")]
    Io(#[from] std::io::Error),
    #[error("bad magic {found:02x?}: not a GGUF file")]
    BadMagic { found: [u8; 4] },
    #[error("unsupported GGUF version {0} (only v2 and v3 are supported)")]
    UnsupportedVersion(u32),
    #[error("big-endian GGUF files are not supported")]
    BigEndian,
    #[error(
        "file truncated at offset {offset}: reading {what} needs {needed} bytes, {available} left"
    )]
    Truncated {
        offset: usize,
        what: &'static str,
        needed: u64,
        available: usize,
    },
    #[error("{what} count {count} at offset {offset} is too large: only {available} bytes left")]
    CountTooLarge {
        offset: usize,
        what: &'static str,
        count: u64,
        available: usize,
    },
    #[error("invalid UTF-8 in {what} at offset {offset}")]
    InvalidUtf8 { offset: usize, what: &'static str },
    #[error("unknown metadata value type {type_id} at offset {offset}")]
    UnknownValueType { offset: usize, type_id: u32 },
    #[error("invalid bool byte {value} at offset {offset}")]
    InvalidBool { offset: usize, value: u8 },
    #[error("arrays nested deeper than {max} levels at offset {offset}")]
    NestingTooDeep { offset: usize, max: usize },
    #[error("duplicate metadata key {0:?}")]
    DuplicateKey(String),
    #[error("duplicate tensor name {0:?}")]
    DuplicateTensor(String),
    #[error("bad alignment {0}: must be a non-zero power of two that fits u32")]
    BadAlignment(String),
    #[error("tensor {name:?}: unknown tensor type id {type_id}")]
    UnknownTensorType { name: String, type_id: u32 },
    #[error("tensor {name:?}: bad dims: {msg}")]
    BadDims { name: String, msg: String },
    #[error("tensor {name:?}: offset {offset} is not a multiple of the alignment {alignment}")]
    MisalignedTensor {
        name: String,
        offset: u64,
        alignment: u64,
    },
    #[error("tensor {name:?}: data at offset {offset} of {size} bytes lies outside the data section of {data_len} bytes")]
    TensorOutOfBounds {
        name: String,
        offset: u64,
        size: u64,
        data_len: u64,
    },
    #[error("the data section starts at offset {data_offset}, past the end of the file ({file_len} bytes)")]
    DataSectionOutOfBounds { data_offset: u64, file_len: u64 },
    #[error("tensors {first:?} and {second:?} overlap")]
    OverlappingTensors { first: String, second: String },
    #[error("tensor {name:?}: {got} bytes of data given, its shape and type need {expected}")]
    TensorDataSize {
        name: String,
        got: usize,
        expected: usize,
    },
    #[error("metadata key {0:?} not found")]
    MissingKey(String),
    #[error("metadata key {key:?}: expected {expected}, found {found}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },
}

/// Result of GGUF operations.
pub type Result<T, E = GgufError> = std::result::Result<T, E>;

/// The alignment that metadata in file order sets: `general.alignment` if present (checked), else
/// [`DEFAULT_ALIGNMENT`]. Shared by the reader and the writer.
pub(crate) fn alignment_of(metadata: &[(String, Value)]) -> Result<u64> {
    let Some((_, value)) = metadata.iter().find(|(k, _)| k == ALIGNMENT_KEY) else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    match value.as_u32() {
        Some(a) if a.is_power_of_two() => Ok(a.into()),
        _ => Err(GgufError::BadAlignment(value.describe())),
    }
}

/// `offset` rounded up to a multiple of `alignment` (a power of two); `None` on overflow.
pub(crate) fn align_up(offset: u64, alignment: u64) -> Option<u64> {
    let mask = alignment.checked_sub(1)?;
    Some(offset.checked_add(mask)? & !mask)
}
