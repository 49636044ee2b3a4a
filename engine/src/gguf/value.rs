//! GGUF metadata values: the 13 value types, owned values, and their
//! little-endian encoding.

use std::fmt;

/// Deepest nesting of arrays inside arrays that the reader accepts and the
/// writer produces. Real files nest at most once; the limit keeps the
/// recursive decoder's stack bounded on hostile input.
pub const MAX_ARRAY_DEPTH: usize = 32;

/// A GGUF metadata value type (the numeric ids are `gguf_type` in the spec).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum GgufValueType {
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

impl GgufValueType {
    /// Every type, in id order.
    pub const ALL: [GgufValueType; 13] = [
        GgufValueType::U8,
        GgufValueType::I8,
        GgufValueType::U16,
        GgufValueType::I16,
        GgufValueType::U32,
        GgufValueType::I32,
        GgufValueType::F32,
        GgufValueType::Bool,
        GgufValueType::String,
        GgufValueType::Array,
        GgufValueType::U64,
        GgufValueType::I64,
        GgufValueType::F64,
    ];

    /// The type with id `id`, or `None` for an id the spec does not define.
    pub fn from_id(id: u32) -> Option<GgufValueType> {
        GgufValueType::ALL.get(id as usize).copied()
    }

    pub fn id(self) -> u32 {
        self as u32
    }

    /// Lower-case name used in error messages ("u32", "string", "array", ...).
    pub fn name(self) -> &'static str {
        match self {
            GgufValueType::U8 => "u8",
            GgufValueType::I8 => "i8",
            GgufValueType::U16 => "u16",
            GgufValueType::I16 => "i16",
            GgufValueType::U32 => "u32",
            GgufValueType::I32 => "i32",
            GgufValueType::F32 => "f32",
            GgufValueType::Bool => "bool",
            GgufValueType::String => "string",
            GgufValueType::Array => "array",
            GgufValueType::U64 => "u64",
            GgufValueType::I64 => "i64",
            GgufValueType::F64 => "f64",
        }
    }

    /// Encoded size of one value for fixed-size types; `None` for strings
    /// and arrays.
    pub fn fixed_size(self) -> Option<u64> {
        match self {
            GgufValueType::U8 | GgufValueType::I8 | GgufValueType::Bool => Some(1),
            GgufValueType::U16 | GgufValueType::I16 => Some(2),
            GgufValueType::U32 | GgufValueType::I32 | GgufValueType::F32 => Some(4),
            GgufValueType::U64 | GgufValueType::I64 | GgufValueType::F64 => Some(8),
            GgufValueType::String | GgufValueType::Array => None,
        }
    }

    /// Fewest bytes one encoded value of this type can occupy: a string is
    /// at least its u64 length, an array at least its u32 element type and
    /// u64 length. Used to reject counts that cannot fit in the bytes left.
    pub fn min_encoded_size(self) -> u64 {
        match self {
            GgufValueType::String => 8,
            GgufValueType::Array => 12,
            other => other.fixed_size().unwrap_or(1),
        }
    }
}

impl fmt::Display for GgufValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An array value. All elements have type `elem_type`; an element of an
/// `Array`-typed array is itself a `GgufValue::Array` with its own element
/// type (arrays of arrays need not be uniform inside).
#[derive(Clone, Debug, PartialEq)]
pub struct GgufArray {
    pub elem_type: GgufValueType,
    pub values: Vec<GgufValue>,
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(GgufArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl GgufValue {
    pub fn value_type(&self) -> GgufValueType {
        match self {
            GgufValue::U8(_) => GgufValueType::U8,
            GgufValue::I8(_) => GgufValueType::I8,
            GgufValue::U16(_) => GgufValueType::U16,
            GgufValue::I16(_) => GgufValueType::I16,
            GgufValue::U32(_) => GgufValueType::U32,
            GgufValue::I32(_) => GgufValueType::I32,
            GgufValue::F32(_) => GgufValueType::F32,
            GgufValue::Bool(_) => GgufValueType::Bool,
            GgufValue::String(_) => GgufValueType::String,
            GgufValue::Array(_) => GgufValueType::Array,
            GgufValue::U64(_) => GgufValueType::U64,
            GgufValue::I64(_) => GgufValueType::I64,
            GgufValue::F64(_) => GgufValueType::F64,
        }
    }

    /// Name of the value's type ("u32", "string", ...).
    pub fn type_name(&self) -> &'static str {
        self.value_type().name()
    }

    /// Any integer type holding a value >= 0. Not bools, not floats.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer type whose value fits in i64. Not bools, not floats.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::U64(v) => i64::try_from(v).ok(),
            GgufValue::I8(v) => Some(v.into()),
            GgufValue::I16(v) => Some(v.into()),
            GgufValue::I32(v) => Some(v.into()),
            GgufValue::I64(v) => Some(v),
            _ => None,
        }
    }

    /// An `F32`, or an `F64` rounded to f32. Integers are not converted.
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            GgufValue::F32(v) => Some(v),
            GgufValue::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    /// An `F64`, or an `F32` widened exactly. Integers are not converted.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v.into()),
            GgufValue::F64(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&GgufArray> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// Builds an array value from elements of type `elem_type`. The element
    /// types are checked when the value is written, not here.
    pub fn array<I, T>(elem_type: GgufValueType, values: I) -> GgufValue
    where
        I: IntoIterator<Item = T>,
        T: Into<GgufValue>,
    {
        GgufValue::Array(GgufArray::new(elem_type, values))
    }

    /// Number of bytes `encode_payload` writes (without the leading type id).
    pub fn encoded_len(&self) -> u64 {
        match self {
            GgufValue::String(s) => 8 + s.len() as u64,
            GgufValue::Array(a) => {
                12 + match a.elem_type.fixed_size() {
                    Some(sz) => sz * a.values.len() as u64,
                    None => a.values.iter().map(GgufValue::encoded_len).sum(),
                }
            }
            other => other.value_type().fixed_size().unwrap_or(0),
        }
    }

    /// Checks that every array element has its array's declared type and
    /// that arrays nest at most `MAX_ARRAY_DEPTH` deep. Returns a reason on
    /// failure.
    pub(crate) fn validate(&self) -> Result<(), String> {
        self.validate_at(0)
    }

    fn validate_at(&self, depth: usize) -> Result<(), String> {
        let GgufValue::Array(a) = self else {
            return Ok(());
        };
        if depth >= MAX_ARRAY_DEPTH {
            return Err(format!("arrays nest more than {MAX_ARRAY_DEPTH} deep"));
        }
        for (i, v) in a.values.iter().enumerate() {
            if v.value_type() != a.elem_type {
                return Err(format!(
                    "array element {i} is {} but the array holds {}",
                    v.type_name(),
                    a.elem_type
                ));
            }
            v.validate_at(depth + 1)
                .map_err(|e| format!("array element {i}: {e}"))?;
        }
        Ok(())
    }

    /// Appends the little-endian encoding of the value (without its type id).
    /// The value must have passed `validate`.
    pub(crate) fn encode_payload(&self, out: &mut Vec<u8>) {
        match self {
            GgufValue::U8(v) => out.push(*v),
            GgufValue::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
            GgufValue::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
            GgufValue::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
            GgufValue::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
            GgufValue::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
            GgufValue::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
            GgufValue::Bool(v) => out.push(u8::from(*v)),
            GgufValue::String(s) => encode_str(s, out),
            GgufValue::Array(a) => {
                out.extend_from_slice(&a.elem_type.id().to_le_bytes());
                out.extend_from_slice(&(a.values.len() as u64).to_le_bytes());
                for v in &a.values {
                    v.encode_payload(out);
                }
            }
            GgufValue::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
            GgufValue::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
            GgufValue::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        }
    }
}

/// Appends a GGUF string: u64 byte length, then the UTF-8 bytes.
pub(crate) fn encode_str(s: &str, out: &mut Vec<u8>) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

impl GgufArray {
    pub fn new<I, T>(elem_type: GgufValueType, values: I) -> GgufArray
    where
        I: IntoIterator<Item = T>,
        T: Into<GgufValue>,
    {
        GgufArray {
            elem_type,
            values: values.into_iter().map(Into::into).collect(),
        }
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Every element via `GgufValue::as_u64`, or `None` if any is not a
    /// non-negative integer.
    pub fn to_u64_vec(&self) -> Option<Vec<u64>> {
        self.values.iter().map(GgufValue::as_u64).collect()
    }

    /// Every element via `GgufValue::as_i64`.
    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        self.values.iter().map(GgufValue::as_i64).collect()
    }

    /// Every element via `GgufValue::as_f32`.
    pub fn to_f32_vec(&self) -> Option<Vec<f32>> {
        self.values.iter().map(GgufValue::as_f32).collect()
    }

    /// Every element via `GgufValue::as_bool`.
    pub fn to_bool_vec(&self) -> Option<Vec<bool>> {
        self.values.iter().map(GgufValue::as_bool).collect()
    }

    /// Every element as a string slice, or `None` if any is not a string.
    pub fn to_str_vec(&self) -> Option<Vec<&str>> {
        self.values.iter().map(GgufValue::as_str).collect()
    }
}

macro_rules! impl_from {
    ($($t:ty => $variant:ident),* $(,)?) => {
        $(impl From<$t> for GgufValue {
            fn from(v: $t) -> GgufValue {
                GgufValue::$variant(v)
            }
        })*
    };
}

impl_from!(
    u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, f32 => F32,
    bool => Bool, String => String, GgufArray => Array, u64 => U64, i64 => I64, f64 => F64,
);

impl From<&str> for GgufValue {
    fn from(v: &str) -> GgufValue {
        GgufValue::String(v.to_owned())
    }
}

impl From<&String> for GgufValue {
    fn from(v: &String) -> GgufValue {
        GgufValue::String(v.clone())
    }
}

impl fmt::Display for GgufValue {
    /// A short human-readable rendering: scalars as themselves, strings
    /// quoted, arrays as their type and length.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GgufValue::U8(v) => write!(f, "{v}"),
            GgufValue::I8(v) => write!(f, "{v}"),
            GgufValue::U16(v) => write!(f, "{v}"),
            GgufValue::I16(v) => write!(f, "{v}"),
            GgufValue::U32(v) => write!(f, "{v}"),
            GgufValue::I32(v) => write!(f, "{v}"),
            GgufValue::F32(v) => write!(f, "{v}"),
            GgufValue::Bool(v) => write!(f, "{v}"),
            GgufValue::String(s) => write!(f, "{s:?}"),
            GgufValue::Array(a) => write!(f, "[{}; {}]", a.elem_type, a.values.len()),
            GgufValue::U64(v) => write!(f, "{v}"),
            GgufValue::I64(v) => write!(f, "{v}"),
            GgufValue::F64(v) => write!(f, "{v}"),
        }
    }
}
