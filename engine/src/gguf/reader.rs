//! GGUF v2/v3 reader.
//!
//! The whole header (metadata and tensor infos) is decoded and validated
//! when the file is opened: every length is checked against the bytes left
//! before anything proportional to it is allocated, every tensor's byte
//! range is checked to lie inside the file, be aligned, and not overlap
//! another. After a successful open, `tensor_data` is a plain slice of the
//! mapping and cannot fail.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use gemtune_kernels::quant::GgmlType;

use super::error::{GgufError, GgufErrorKind};
use super::value::{GgufArray, GgufValue, GgufValueType, MAX_ARRAY_DEPTH};

/// The four magic bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the data section and tensor offsets when the file has no
/// `general.alignment` key.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Key that overrides the default alignment (a u32 power of two).
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// Most dimensions a tensor may have (ggml's GGML_MAX_DIMS).
pub const MAX_DIMS: usize = 4;

/// Fewest bytes one metadata entry can take: u64 key length, u32 type id,
/// one byte of value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// Fewest bytes one tensor info can take: u64 name length, u32 n_dims,
/// u32 type id, u64 offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;

/// One tensor's description from the header.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorInfo {
    pub name: String,
    /// ggml `ne` order: `dims[0]` is the fastest-varying (row length).
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Byte offset from the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    /// Element count, or `None` if the product of dims overflows u64.
    pub fn checked_n_elements(&self) -> Option<u64> {
        self.dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
    }

    /// Byte size, or `None` if `dims[0]` is not a whole number of blocks
    /// or the size overflows u64. A tensor with no dims is one element.
    pub fn checked_n_bytes(&self) -> Option<u64> {
        let ne0 = self.dims.first().copied().unwrap_or(1);
        let rows = self
            .dims
            .iter()
            .skip(1)
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))?;
        self.ty.row_bytes(ne0)?.checked_mul(rows)
    }

    /// Element count. Exact for every info a `GgufFile` or `GgufWriter`
    /// hands out (they are validated); saturates at u64::MAX otherwise.
    pub fn n_elements(&self) -> u64 {
        self.checked_n_elements().unwrap_or(u64::MAX)
    }

    /// Byte size of the data. Exact for every info a `GgufFile` or
    /// `GgufWriter` hands out; u64::MAX for an invalid hand-built one.
    pub fn n_bytes(&self) -> u64 {
        self.checked_n_bytes().unwrap_or(u64::MAX)
    }

    /// Checks dims and computes the byte size, as errors naming nothing
    /// (the caller adds the path and item).
    pub(crate) fn validate_shape(&self) -> Result<u64, GgufErrorKind> {
        if self.dims.len() > MAX_DIMS {
            return Err(GgufErrorKind::TooManyDims {
                n_dims: self.dims.len() as u64,
            });
        }
        if self.checked_n_elements().is_none() {
            return Err(GgufErrorKind::DimsOverflow {
                dims: self.dims.clone(),
            });
        }
        let ne0 = self.dims.first().copied().unwrap_or(1);
        let block_size = self.ty.block_size() as u64;
        if ne0 % block_size != 0 {
            return Err(GgufErrorKind::NotBlockMultiple {
                ne0,
                ty: self.ty,
                block_size,
            });
        }
        self.checked_n_bytes()
            .ok_or_else(|| GgufErrorKind::SizeOverflow {
                dims: self.dims.clone(),
                ty: self.ty,
            })
    }
}

/// `v` rounded up to a multiple of `align` (a power of two), or `None` on
/// overflow.
pub(crate) fn align_up(v: u64, align: u64) -> Option<u64> {
    debug_assert!(align.is_power_of_two());
    Some(v.checked_add(align - 1)? & !(align - 1))
}

/// Checks a `general.alignment` value: a u32 holding a nonzero power of two.
pub(crate) fn alignment_from_value(v: &GgufValue) -> Result<u64, GgufErrorKind> {
    match *v {
        GgufValue::U32(a) if a.is_power_of_two() => Ok(a.into()),
        GgufValue::U32(a) => Err(GgufErrorKind::BadAlignment { value: a.into() }),
        ref other => Err(GgufErrorKind::AlignmentType {
            found: other.type_name(),
        }),
    }
}

enum Backing {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
    Empty,
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mmap(m) => m,
            Backing::Owned(v) => v,
            Backing::Empty => &[],
        }
    }
}

/// A parsed GGUF file, memory-mapped (`open`) or holding its bytes
/// (`from_bytes`).
pub struct GgufFile {
    path: PathBuf,
    backing: Backing,
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: Vec<(String, GgufValue)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("file_len", &self.file_len())
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Memory-maps and parses `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let io_err = |e| GgufError::new(path, "file", GgufErrorKind::Io(e));
        let file = File::open(path).map_err(io_err)?;
        let len = file.metadata().map_err(io_err)?.len();
        let backing = if len == 0 {
            Backing::Empty
        } else {
            // SAFETY: the mapping is read-only and lives inside the
            // GgufFile. Another process truncating or rewriting the file
            // while it is mapped would change the bytes under us (or fault);
            // like every mmap-based model loader, we require that model files
            // are not modified while open.
            let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io_err)?;
            Backing::Mmap(map)
        };
        Self::parse(path.to_path_buf(), backing)
    }

    /// Parses `bytes`; `label` takes the place of the path in errors and in
    /// `path()`.
    pub fn from_bytes(bytes: Vec<u8>, label: &str) -> Result<GgufFile, GgufError> {
        Self::parse(PathBuf::from(label), Backing::Owned(bytes))
    }

    fn parse(path: PathBuf, backing: Backing) -> Result<GgufFile, GgufError> {
        let header = match parse_header(backing.bytes()) {
            Ok(h) => h,
            Err((item, kind)) => return Err(GgufError::new(path, item, kind)),
        };
        Ok(GgufFile {
            path,
            backing,
            version: header.version,
            alignment: header.alignment,
            data_offset: header.data_offset,
            metadata: header.metadata,
            key_index: header.key_index,
            tensors: header.tensors,
            tensor_index: header.tensor_index,
        })
    }

    /// The path given to `open`, or the label given to `from_bytes`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// 2 or 3.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// `general.alignment`, or 32 when absent.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute byte offset of the data section (the header end rounded up
    /// to the alignment). May exceed `file_len()` for a file with no tensors
    /// whose header padding was left out.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Size of the whole file in bytes.
    pub fn file_len(&self) -> u64 {
        self.backing.bytes().len() as u64
    }

    /// The raw bytes of the whole file.
    pub fn as_bytes(&self) -> &[u8] {
        self.backing.bytes()
    }

    /// Every metadata entry in file order.
    pub fn metadata(&self) -> &[(String, GgufValue)] {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// `key` as a non-negative integer of any integer type.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_u64()
    }

    /// `key` as a u32, from any integer type whose value fits.
    pub fn get_u32(&self, key: &str) -> Option<u32> {
        u32::try_from(self.get_u64(key)?).ok()
    }

    /// `key` as an integer of any integer type that fits in i64.
    pub fn get_i64(&self, key: &str) -> Option<i64> {
        self.get(key)?.as_i64()
    }

    /// `key` as an f32 (an F32, or an F64 rounded).
    pub fn get_f32(&self, key: &str) -> Option<f32> {
        self.get(key)?.as_f32()
    }

    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key)?.as_bool()
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key)?.as_str()
    }

    pub fn get_array(&self, key: &str) -> Option<&GgufArray> {
        self.get(key)?.as_array()
    }

    /// Every tensor info in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor's bytes, borrowed from the mapping (no copy). For an info
    /// from this file's `tensors()` the bounds were checked at open and the
    /// slice is exactly `t.n_bytes()` long; for an info that does not
    /// describe a range inside this file, the result is empty.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let range = t.checked_n_bytes().and_then(|n| {
            let start = self.data_offset.checked_add(t.offset)?;
            let end = start.checked_add(n)?;
            Some(usize::try_from(start).ok()?..usize::try_from(end).ok()?)
        });
        range
            .and_then(|r| self.backing.bytes().get(r))
            .unwrap_or(&[])
    }

    /// The bytes of tensor `name`, if it exists.
    pub fn tensor_data_by_name(&self, name: &str) -> Option<&[u8]> {
        self.tensor(name).map(|t| self.tensor_data(t))
    }
}

/// A decoded and validated header.
struct Header {
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: Vec<(String, GgufValue)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

/// An error before the path is attached: (item, kind).
type ItemError = (String, GgufErrorKind);

fn at(item: impl Into<String>) -> impl FnOnce(GgufErrorKind) -> ItemError {
    let item = item.into();
    move |kind| (item, kind)
}

fn parse_header(bytes: &[u8]) -> Result<Header, ItemError> {
    let mut c = Cursor { buf: bytes, pos: 0 };
    let file_len = c.file_len();

    let magic = c.take(4, "magic").map_err(at("magic"))?;
    if magic != GGUF_MAGIC {
        return Err(at("magic")(GgufErrorKind::BadMagic {
            found: magic.to_vec(),
        }));
    }
    let version = c.u32("version").map_err(at("version"))?;
    match version {
        2 | 3 => {}
        v if matches!(v.swap_bytes(), 1..=3) => {
            return Err(at("version")(GgufErrorKind::BigEndian {
                version: v,
                swapped: v.swap_bytes(),
            }))
        }
        v => {
            return Err(at("version")(GgufErrorKind::UnsupportedVersion {
                version: v,
            }))
        }
    }

    let n_tensors = c.u64("tensor count").map_err(at("tensor count"))?;
    let n_kv = c.u64("metadata count").map_err(at("metadata count"))?;
    let remaining = c.remaining();
    // Both counts together must fit: the tensor infos and the metadata
    // entries each take a minimum number of bytes.
    let need = u128::from(n_kv) * u128::from(MIN_KV_BYTES)
        + u128::from(n_tensors) * u128::from(MIN_TENSOR_INFO_BYTES);
    if u128::from(n_kv) * u128::from(MIN_KV_BYTES) > u128::from(remaining) {
        return Err(at("metadata count")(GgufErrorKind::CountTooLarge {
            what: "metadata",
            count: n_kv,
            min_each: MIN_KV_BYTES,
            remaining,
        }));
    }
    if need > u128::from(remaining) {
        return Err(at("tensor count")(GgufErrorKind::CountTooLarge {
            what: "tensor",
            count: n_tensors,
            min_each: MIN_TENSOR_INFO_BYTES,
            remaining,
        }));
    }
    // Both counts are now bounded by file_len / 13, so they fit in usize.
    let n_kv = n_kv as usize;
    let n_tensors = n_tensors as usize;

    let mut metadata = Vec::with_capacity(n_kv);
    let mut key_index = HashMap::with_capacity(n_kv);
    for i in 0..n_kv {
        let key_item = format!("metadata key #{i}");
        let key = c.string("key").map_err(at(&key_item))?;
        let item = format!("metadata '{key}'");
        if let Some(&first) = key_index.get(&key) {
            return Err(at(item)(GgufErrorKind::DuplicateKey { first }));
        }
        let ty = c.value_type().map_err(at(&item))?;
        let value = c.value(ty, 0).map_err(at(&item))?;
        key_index.insert(key.clone(), i);
        metadata.push((key, value));
    }

    let alignment = match key_index.get(ALIGNMENT_KEY) {
        Some(&i) => alignment_from_value(&metadata[i].1)
            .map_err(at(format!("metadata '{ALIGNMENT_KEY}'")))?,
        None => DEFAULT_ALIGNMENT,
    };

    let mut tensors = Vec::with_capacity(n_tensors);
    let mut tensor_index = HashMap::with_capacity(n_tensors);
    let mut sizes = Vec::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let name = c
            .string("tensor name")
            .map_err(at(format!("tensor info #{i}")))?;
        let item = format!("tensor '{name}'");
        if let Some(&first) = tensor_index.get(&name) {
            return Err(at(item)(GgufErrorKind::DuplicateTensor { first }));
        }
        let n_dims = c.u32("n_dims").map_err(at(&item))?;
        if n_dims as usize > MAX_DIMS {
            return Err(at(item)(GgufErrorKind::TooManyDims {
                n_dims: n_dims.into(),
            }));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(c.u64("dimension").map_err(at(&item))?);
        }
        let type_id = c.u32("tensor type").map_err(at(&item))?;
        let ty = GgmlType::from_id(type_id)
            .ok_or_else(|| at(&item)(GgufErrorKind::UnknownTensorType { id: type_id }))?;
        let offset = c.u64("data offset").map_err(at(&item))?;
        let info = TensorInfo {
            name,
            dims,
            ty,
            offset,
        };
        let n_bytes = info.validate_shape().map_err(at(&item))?;
        if offset % alignment != 0 {
            return Err(at(item)(GgufErrorKind::MisalignedOffset {
                offset,
                alignment,
            }));
        }
        tensor_index.insert(info.name.clone(), i);
        tensors.push(info);
        sizes.push(n_bytes);
    }

    let header_end = c.pos as u64;
    // header_end <= file_len and alignment <= 2^31, so this cannot overflow.
    let data_offset = align_up(header_end, alignment).unwrap_or(u64::MAX);

    for (t, &n) in tensors.iter().zip(&sizes) {
        let item = || format!("tensor '{}'", t.name);
        let start = data_offset.checked_add(t.offset).ok_or_else(|| {
            (
                item(),
                GgufErrorKind::OffsetOverflow {
                    offset: t.offset,
                    data_offset,
                },
            )
        })?;
        let end = start.saturating_add(n);
        if end > file_len {
            return Err((
                item(),
                GgufErrorKind::DataPastEnd {
                    start,
                    end,
                    file_len,
                },
            ));
        }
    }

    // No two non-empty tensors may share bytes.
    let mut order: Vec<usize> = (0..tensors.len()).filter(|&i| sizes[i] > 0).collect();
    order.sort_by_key(|&i| tensors[i].offset);
    for w in order.windows(2) {
        let (a, b) = (w[0], w[1]);
        let a_end = tensors[a].offset + sizes[a];
        if a_end > tensors[b].offset {
            return Err((
                format!("tensor '{}'", tensors[b].name),
                GgufErrorKind::Overlap {
                    start: tensors[b].offset,
                    end: tensors[b].offset + sizes[b],
                    other: tensors[a].name.clone(),
                },
            ));
        }
    }

    Ok(Header {
        version,
        alignment,
        data_offset,
        metadata,
        key_index,
        tensors,
        tensor_index,
    })
}

/// A bounds-checked little-endian reader over the file bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn file_len(&self) -> u64 {
        self.buf.len() as u64
    }

    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn truncated(&self, what: String, needed: u64) -> GgufErrorKind {
        GgufErrorKind::Truncated {
            what,
            offset: self.pos as u64,
            needed,
            file_len: self.file_len(),
        }
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], GgufErrorKind> {
        if n > self.remaining() {
            return Err(self.truncated(what.to_owned(), n));
        }
        // n <= remaining, so it fits in usize and the slice is in bounds.
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufErrorKind> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufErrorKind> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufErrorKind> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A u64 length plus that many UTF-8 bytes. `what` names the string in
    /// errors; messages are only formatted on failure (this runs once per
    /// vocabulary token).
    fn string(&mut self, what: &str) -> Result<String, GgufErrorKind> {
        if self.remaining() < 8 {
            return Err(self.truncated(format!("{what} length"), 8));
        }
        let len = self.u64(what)?;
        if len > self.remaining() {
            return Err(self.truncated(format!("{what} of {len} bytes"), len));
        }
        let offset = self.pos as u64;
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(GgufErrorKind::InvalidUtf8 {
                offset,
                reason: e.to_string(),
            }),
        }
    }

    fn value_type(&mut self) -> Result<GgufValueType, GgufErrorKind> {
        let id = self.u32("value type")?;
        GgufValueType::from_id(id).ok_or(GgufErrorKind::UnknownValueType { id })
    }

    fn value(&mut self, ty: GgufValueType, depth: usize) -> Result<GgufValue, GgufErrorKind> {
        Ok(match ty {
            GgufValueType::U8 => GgufValue::U8(u8::from_le_bytes(self.array("u8")?)),
            GgufValueType::I8 => GgufValue::I8(i8::from_le_bytes(self.array("i8")?)),
            GgufValueType::U16 => GgufValue::U16(u16::from_le_bytes(self.array("u16")?)),
            GgufValueType::I16 => GgufValue::I16(i16::from_le_bytes(self.array("i16")?)),
            GgufValueType::U32 => GgufValue::U32(u32::from_le_bytes(self.array("u32")?)),
            GgufValueType::I32 => GgufValue::I32(i32::from_le_bytes(self.array("i32")?)),
            GgufValueType::F32 => GgufValue::F32(f32::from_le_bytes(self.array("f32")?)),
            GgufValueType::U64 => GgufValue::U64(u64::from_le_bytes(self.array("u64")?)),
            GgufValueType::I64 => GgufValue::I64(i64::from_le_bytes(self.array("i64")?)),
            GgufValueType::F64 => GgufValue::F64(f64::from_le_bytes(self.array("f64")?)),
            GgufValueType::Bool => {
                let offset = self.pos as u64;
                match self.array::<1>("bool")?[0] {
                    0 => GgufValue::Bool(false),
                    1 => GgufValue::Bool(true),
                    value => return Err(GgufErrorKind::InvalidBool { offset, value }),
                }
            }
            GgufValueType::String => GgufValue::String(self.string("string")?),
            GgufValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufErrorKind::NestingTooDeep {
                        max: MAX_ARRAY_DEPTH,
                    });
                }
                let elem_type = self.value_type()?;
                let len = self.u64("array length")?;
                let min_bytes = u128::from(len) * u128::from(elem_type.min_encoded_size());
                let remaining = self.remaining();
                if min_bytes > u128::from(remaining) {
                    return Err(GgufErrorKind::ArrayTooLong {
                        len,
                        elem_type: elem_type.name(),
                        min_bytes,
                        remaining,
                    });
                }
                // len <= remaining bytes, so the allocation is bounded by
                // the file size.
                let mut values = Vec::with_capacity(len as usize);
                for _ in 0..len {
                    values.push(self.value(elem_type, depth + 1)?);
                }
                GgufValue::Array(GgufArray { elem_type, values })
            }
        })
    }
}
