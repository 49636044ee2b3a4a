//! The one error type of the GGUF reader and writer.

use std::fmt;
use std::path::{Path, PathBuf};

use gemtune_kernels::quant::GgmlType;

/// A GGUF read or write failure. Displays as `<path>: <item>: <reason>`,
/// where the path is the file (or the label given to `from_bytes`, or
/// `<memory>` for `write_to_vec`) and the item names the header field,
/// metadata key or tensor concerned.
#[derive(Debug)]
pub struct GgufError {
    path: PathBuf,
    item: String,
    kind: GgufErrorKind,
}

impl GgufError {
    pub fn new(path: impl Into<PathBuf>, item: impl Into<String>, kind: GgufErrorKind) -> Self {
        GgufError {
            path: path.into(),
            item: item.into(),
            kind,
        }
    }

    /// The file (or label) the error is about.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The item: "magic", "version", "metadata 'general.alignment'",
    /// "tensor 'blk.0.attn_q.weight'", "tensor info #3", ...
    pub fn item(&self) -> &str {
        &self.item
    }

    pub fn kind(&self) -> &GgufErrorKind {
        &self.kind
    }
}

impl fmt::Display for GgufError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.path.display(), self.item, self.kind)
    }
}

/// No `source()`: the Display already includes the underlying reason
/// (including an I/O error's text), and `anyhow`'s `{:#}` would print it twice.
impl std::error::Error for GgufError {}

/// What went wrong. Offsets are absolute byte positions in the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufErrorKind {
    #[error("{0}")]
    Io(std::io::Error),
    #[error(
        "truncated: {what} needs {needed} bytes at byte {offset} but the file has {file_len} bytes"
    )]
    Truncated {
        what: String,
        offset: u64,
        needed: u64,
        file_len: u64,
    },
    #[error("bad magic {found:02x?}: not a GGUF file (expected \"GGUF\")")]
    BadMagic { found: Vec<u8> },
    #[error("unsupported GGUF version {version} (only versions 2 and 3 are supported)")]
    UnsupportedVersion { version: u32 },
    #[error(
        "the version field reads {version} little-endian ({swapped} byte-swapped): this is a \
         big-endian GGUF file, only little-endian files are supported"
    )]
    BigEndian { version: u32, swapped: u32 },
    #[error(
        "{what} count {count} cannot fit in the {remaining} bytes left in the file (each entry \
         takes at least {min_each} bytes): the count is corrupt or the file is truncated"
    )]
    CountTooLarge {
        what: &'static str,
        count: u64,
        min_each: u64,
        remaining: u64,
    },
    #[error(
        "array of {len} {elem_type} elements needs at least {min_bytes} bytes but only \
         {remaining} are left in the file"
    )]
    ArrayTooLong {
        len: u64,
        elem_type: &'static str,
        min_bytes: u128,
        remaining: u64,
    },
    #[error("arrays nest more than {max} deep")]
    NestingTooDeep { max: usize },
    #[error("unknown metadata value type id {id}")]
    UnknownValueType { id: u32 },
    #[error("string at byte {offset} is not valid UTF-8 ({reason})")]
    InvalidUtf8 { offset: u64, reason: String },
    #[error("bool at byte {offset} has byte value {value}, expected 0 or 1")]
    InvalidBool { offset: u64, value: u8 },
    #[error("duplicate metadata key (first at position {first})")]
    DuplicateKey { first: usize },
    #[error("duplicate tensor name (first at position {first})")]
    DuplicateTensor { first: usize },
    #[error("general.alignment must be a u32, found {found}")]
    AlignmentType { found: &'static str },
    #[error("alignment {value} is not a nonzero power of two that fits in u32")]
    BadAlignment { value: u64 },
    #[error("{n_dims} dimensions; at most 4 are allowed")]
    TooManyDims { n_dims: u64 },
    #[error("product of dimensions {dims:?} overflows u64")]
    DimsOverflow { dims: Vec<u64> },
    #[error("byte size of dimensions {dims:?} as {ty} overflows u64")]
    SizeOverflow { dims: Vec<u64>, ty: GgmlType },
    #[error("first dimension {ne0} is not a multiple of the {ty} block size {block_size}")]
    NotBlockMultiple {
        ne0: u64,
        ty: GgmlType,
        block_size: u64,
    },
    #[error("unknown tensor type id {id}")]
    UnknownTensorType { id: u32 },
    #[error("data offset {offset} is not a multiple of the alignment {alignment}")]
    MisalignedOffset { offset: u64, alignment: u64 },
    #[error("data offset {offset} plus the data section start {data_offset} overflows u64")]
    OffsetOverflow { offset: u64, data_offset: u64 },
    #[error("data ends at byte {end} past the end of the file ({file_len} bytes)")]
    DataPastEnd { start: u64, end: u64, file_len: u64 },
    #[error("data [{start}, {end}) overlaps tensor '{other}'")]
    Overlap { start: u64, end: u64, other: String },
    #[error("invalid value: {reason}")]
    InvalidValue { reason: String },
    #[error("{reason}")]
    InvalidWriter { reason: String },
    #[error("filling tensor data failed: {reason}")]
    Fill { reason: String },
}
