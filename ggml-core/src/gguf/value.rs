//! GGUF metadata values: the thirteen value types of the format, scalar [`Value`]s and typed [`Array`]s
//! (arrays are stored compactly as one `Vec` of their element type; arrays of arrays nest), with
//! accessors that coerce between integer widths when the value fits.

use std::fmt;

/// The type id of a metadata value, as stored in a GGUF file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    /// Every value type, in id order.
    pub const ALL: [ValueType; 13] = [
        ValueType::U8,
        ValueType::I8,
        ValueType::U16,
        ValueType::I16,
        ValueType::U32,
        ValueType::I32,
        ValueType::F32,
        ValueType::Bool,
        ValueType::String,
        ValueType::Array,
        ValueType::U64,
        ValueType::I64,
        ValueType::F64,
    ];

    /// The type with this id, if it exists.
    pub fn from_id(id: u32) -> Option<ValueType> {
        ValueType::ALL.get(usize::try_from(id).ok()?).copied()
    }

    /// The id stored in the file.
    pub const fn id(self) -> u32 {
        self as u32
    }

    /// Bytes of one value of a fixed-size type; `None` for strings and arrays.
    pub const fn fixed_size(self) -> Option<usize> {
        match self {
            ValueType::U8 | ValueType::I8 | ValueType::Bool => Some(1),
            ValueType::U16 | ValueType::I16 => Some(2),
            ValueType::U32 | ValueType::I32 | ValueType::F32 => Some(4),
            ValueType::U64 | ValueType::I64 | ValueType::F64 => Some(8),
            ValueType::String | ValueType::Array => None,
        }
    }

    /// The smallest number of bytes one value of this type occupies in a file (the length prefix for a
    /// string; element type plus count for an array).
    pub const fn min_size(self) -> usize {
        match self.fixed_size() {
            Some(n) => n,
            None => match self {
                ValueType::String => 8,
                _ => 4 + 8,
            },
        }
    }

    /// Lower-case name (`u8`, `string`, `array`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            ValueType::U8 => "u8",
            ValueType::I8 => "i8",
            ValueType::U16 => "u16",
            ValueType::I16 => "i16",
            ValueType::U32 => "u32",
            ValueType::I32 => "i32",
            ValueType::F32 => "f32",
            ValueType::Bool => "bool",
            ValueType::String => "string",
            ValueType::Array => "array",
            ValueType::U64 => "u64",
            ValueType::I64 => "i64",
            ValueType::F64 => "f64",
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Array),
}

/// A metadata array: all elements have one type. Elements of an [`Array::Array`] are arrays
/// themselves, each with its own element type.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<Array>),
}

/// Converts a slice of integers element-wise; `None` if any element does not fit `T`.
fn convert_ints<S: Copy + Into<i128>, T: TryFrom<i128>>(items: &[S]) -> Option<Vec<T>> {
    items.iter().map(|&x| T::try_from(x.into()).ok()).collect()
}

impl Value {
    /// The type id of this value.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F32(_) => ValueType::F32,
            Value::F64(_) => ValueType::F64,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
        }
    }

    /// Any integer value as `i128` (every GGUF integer fits); `None` for other types.
    fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// An integer value of any width converted to `T`; `None` if this is not an integer or it does
    /// not fit `T` (e.g. a negative `i32` read as `u32`).
    pub fn as_int<T: TryFrom<i128>>(&self) -> Option<T> {
        T::try_from(self.as_i128()?).ok()
    }

    /// See [`Value::as_int`].
    pub fn as_u32(&self) -> Option<u32> {
        self.as_int()
    }

    /// See [`Value::as_int`].
    pub fn as_u64(&self) -> Option<u64> {
        self.as_int()
    }

    /// See [`Value::as_int`].
    pub fn as_i32(&self) -> Option<i32> {
        self.as_int()
    }

    /// See [`Value::as_int`].
    pub fn as_i64(&self) -> Option<i64> {
        self.as_int()
    }

    /// See [`Value::as_int`].
    pub fn as_usize(&self) -> Option<usize> {
        self.as_int()
    }

    /// An `f32` value, or an `f64` rounded to `f32`; `None` for other types.
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    /// An `f64` value, or an `f32` widened; `None` for other types.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => None,
        }
    }

    /// A bool value.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// A string value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// An array value.
    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// A short description for error messages: the type and, for scalars, the value
    /// (`"i32 -5"`, `"string"`, `"array of 3 u32"`).
    pub fn describe(&self) -> String {
        match self {
            Value::String(_) => "string".to_string(),
            Value::Array(a) => format!("array of {} {}", a.len(), a.element_type()),
            Value::U8(v) => format!("u8 {v}"),
            Value::I8(v) => format!("i8 {v}"),
            Value::U16(v) => format!("u16 {v}"),
            Value::I16(v) => format!("i16 {v}"),
            Value::U32(v) => format!("u32 {v}"),
            Value::I32(v) => format!("i32 {v}"),
            Value::U64(v) => format!("u64 {v}"),
            Value::I64(v) => format!("i64 {v}"),
            Value::F32(v) => format!("f32 {v}"),
            Value::F64(v) => format!("f64 {v}"),
            Value::Bool(v) => format!("bool {v}"),
        }
    }
}

impl Array {
    /// The type of the elements.
    pub fn element_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F32(_) => ValueType::F32,
            Array::F64(_) => ValueType::F64,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::F64(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
        }
    }

    /// True if the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements of an integer array of any width converted to `T`; `None` if this is not an
    /// integer array or an element does not fit `T`.
    pub fn to_ints<T: TryFrom<i128>>(&self) -> Option<Vec<T>> {
        match self {
            Array::U8(v) => convert_ints(v),
            Array::I8(v) => convert_ints(v),
            Array::U16(v) => convert_ints(v),
            Array::I16(v) => convert_ints(v),
            Array::U32(v) => convert_ints(v),
            Array::I32(v) => convert_ints(v),
            Array::U64(v) => convert_ints(v),
            Array::I64(v) => convert_ints(v),
            _ => None,
        }
    }

    /// The elements of an `f32` array, or of an `f64` array rounded to `f32`.
    pub fn to_f32s(&self) -> Option<Vec<f32>> {
        match self {
            Array::F32(v) => Some(v.clone()),
            Array::F64(v) => Some(v.iter().map(|&x| x as f32).collect()),
            _ => None,
        }
    }

    /// The elements of a string array.
    pub fn as_strs(&self) -> Option<&[String]> {
        match self {
            Array::String(v) => Some(v),
            _ => None,
        }
    }
}

macro_rules! impl_from {
    ($($t:ty => $variant:ident),* $(,)?) => {$(
        impl From<$t> for Value {
            fn from(v: $t) -> Value {
                Value::$variant(v)
            }
        }
        impl From<Vec<$t>> for Array {
            fn from(v: Vec<$t>) -> Array {
                Array::$variant(v)
            }
        }
        impl From<Vec<$t>> for Value {
            fn from(v: Vec<$t>) -> Value {
                Value::Array(Array::$variant(v))
            }
        }
    )*};
}

impl_from!(
    u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32,
    u64 => U64, i64 => I64, f32 => F32, f64 => F64, bool => Bool, String => String,
);

impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::String(v.to_string())
    }
}

impl From<Array> for Value {
    fn from(v: Array) -> Value {
        Value::Array(v)
    }
}

impl From<Vec<Array>> for Array {
    fn from(v: Vec<Array>) -> Array {
        Array::Array(v)
    }
}

impl From<Vec<&str>> for Array {
    fn from(v: Vec<&str>) -> Array {
        Array::String(v.into_iter().map(str::to_string).collect())
    }
}

impl From<Vec<&str>> for Value {
    fn from(v: Vec<&str>) -> Value {
        Value::Array(v.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_coercion_checks_range() {
        assert_eq!(Value::U8(7).as_u64(), Some(7));
        assert_eq!(Value::I32(-1).as_u32(), None);
        assert_eq!(Value::I64(-1).as_i32(), Some(-1));
        assert_eq!(Value::U64(u64::MAX).as_i64(), None);
        assert_eq!(Value::U64(1 << 32).as_u32(), None);
        assert_eq!(Value::F32(1.0).as_u32(), None);
        assert_eq!(Array::I16(vec![-3, 4]).to_ints::<i32>(), Some(vec![-3, 4]));
        assert_eq!(Array::I16(vec![-3, 4]).to_ints::<u32>(), None);
    }

    #[test]
    fn type_ids_round_trip() {
        for t in ValueType::ALL {
            assert_eq!(ValueType::from_id(t.id()), Some(t));
        }
        assert_eq!(ValueType::from_id(13), None);
        assert_eq!(ValueType::from_id(u32::MAX), None);
    }
}
