//! GGUF v2/v3 writer.
//!
//! The header is serialized in memory; tensor data never is. `write_with`
//! sizes the output file, maps it writable and hands each tensor's exact
//! byte range to a caller-supplied `fill` in parallel, so multi-gigabyte
//! files stream straight from the generator into the page cache.

use std::fmt::Display;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};

use gemtune_kernels::quant::GgmlType;
use rayon::prelude::*;

use super::error::{GgufError, GgufErrorKind};
use super::reader::{
    align_up, alignment_from_value, GgufFile, TensorInfo, ALIGNMENT_KEY, DEFAULT_ALIGNMENT,
    GGUF_MAGIC, MAX_DIMS,
};
use super::value::{encode_str, GgufValue};

/// Label used as the path in errors from `write_to_vec` and from building
/// a writer.
const MEMORY_LABEL: &str = "<memory>";

/// Builds a GGUF file: metadata in insertion order, tensors laid out in
/// insertion order at aligned offsets.
#[derive(Clone, Debug)]
pub struct GgufWriter {
    version: u32,
    alignment: u64,
    metadata: Vec<(String, GgufValue)>,
    tensors: Vec<TensorInfo>,
    /// Exact length of the file `from_file` copied, kept so that a copy
    /// reproduces the source's trailing bytes; dropped by any change.
    source_len: Option<u64>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

/// Where everything goes in the output.
struct Layout {
    header: Vec<u8>,
    data_offset: u64,
    total: u64,
    /// Byte size of each tensor, by tensor index.
    sizes: Vec<u64>,
}

impl GgufWriter {
    /// An empty version-3 writer with the default alignment (32) and no
    /// `general.alignment` key.
    pub fn new() -> Self {
        GgufWriter {
            version: 3,
            alignment: DEFAULT_ALIGNMENT,
            metadata: Vec::new(),
            tensors: Vec::new(),
            source_len: None,
        }
    }

    /// Sets the alignment and records it as the `general.alignment` (u32)
    /// metadata entry. Tensors already added are laid out again. An
    /// alignment that is not a power of two fitting in u32 makes
    /// `add_tensor` and the writes fail.
    pub fn with_alignment(mut self, alignment: u64) -> Self {
        match u32::try_from(alignment) {
            Ok(a) => self.add_metadata(ALIGNMENT_KEY, GgufValue::U32(a)),
            Err(_) => {
                // Not representable: remember it so that writing reports it.
                self.alignment = alignment;
                self.source_len = None;
            }
        }
        self
    }

    /// Version written in the header: 2 or 3 (same layout; 3 is the
    /// default). Anything else makes the writes fail.
    pub fn set_version(&mut self, version: u32) {
        self.version = version;
        self.source_len = None;
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Adds a metadata entry at the end, or replaces the value of an
    /// existing key in place (keeping its position). Setting
    /// `general.alignment` to a u32 also changes the alignment and lays the
    /// tensors out again.
    pub fn add_metadata(&mut self, key: impl Into<String>, value: GgufValue) {
        let key = key.into();
        self.source_len = None;
        if key == ALIGNMENT_KEY {
            if let GgufValue::U32(a) = value {
                self.alignment = a.into();
                self.relayout();
            }
        }
        match self.metadata.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.metadata.push((key, value)),
        }
    }

    /// Removes a metadata entry; returns its value if it existed.
    pub fn remove_metadata(&mut self, key: &str) -> Option<GgufValue> {
        let i = self.metadata.iter().position(|(k, _)| k == key)?;
        self.source_len = None;
        Some(self.metadata.remove(i).1)
    }

    pub fn metadata(&self) -> &[(String, GgufValue)] {
        &self.metadata
    }

    /// Adds a tensor after the last one, at the next aligned offset.
    /// Fails on a duplicate name, more than 4 dims, a row that is not a
    /// whole number of blocks, a byte size overflowing u64, or an invalid
    /// alignment.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dims: Vec<u64>,
        ty: GgmlType,
    ) -> Result<(), GgufError> {
        let name = name.into();
        let item = format!("tensor '{name}'");
        let err = |kind| GgufError::new(MEMORY_LABEL, item.clone(), kind);
        let alignment = self.checked_alignment().map_err(err)?;
        if let Some(first) = self.tensors.iter().position(|t| t.name == name) {
            return Err(err(GgufErrorKind::DuplicateTensor { first }));
        }
        let mut info = TensorInfo {
            name,
            dims,
            ty,
            offset: 0,
        };
        info.validate_shape().map_err(err)?;
        let next_free = self.data_end().ok_or_else(|| {
            err(GgufErrorKind::InvalidWriter {
                reason: "tensor data size overflows u64".into(),
            })
        })?;
        info.offset = align_up(next_free, alignment).ok_or_else(|| {
            err(GgufErrorKind::InvalidWriter {
                reason: "tensor data size overflows u64".into(),
            })
        })?;
        self.tensors.push(info);
        self.source_len = None;
        Ok(())
    }

    /// Tensor infos with their assigned offsets (relative to the data
    /// section).
    pub fn tensor_infos(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// Size of the file the writes produce. Meaningful only for a writer
    /// whose writes would succeed (valid version, alignment and values).
    pub fn total_file_size(&self) -> u64 {
        let header_len = 4
            + 4
            + 8
            + 8
            + self
                .metadata
                .iter()
                .map(|(k, v)| 8 + k.len() as u64 + 4 + v.encoded_len())
                .sum::<u64>()
            + self
                .tensors
                .iter()
                .map(|t| 8 + t.name.len() as u64 + 4 + 8 * t.dims.len() as u64 + 4 + 8)
                .sum::<u64>();
        let alignment = self.checked_alignment().unwrap_or(DEFAULT_ALIGNMENT);
        self.total_len(header_len, alignment).unwrap_or(u64::MAX)
    }

    /// A writer holding `f`'s version, alignment, metadata (same order) and
    /// tensor infos (same order and offsets). Writing it with a `fill` that
    /// copies `f.tensor_data` reproduces `f` byte for byte, provided `f`'s
    /// padding bytes are zero.
    pub fn from_file(f: &GgufFile) -> GgufWriter {
        GgufWriter {
            version: f.version(),
            alignment: f.alignment(),
            metadata: f.metadata().to_vec(),
            tensors: f.tensors().to_vec(),
            source_len: Some(f.file_len()),
        }
    }

    /// Writes the file at `path` (created or truncated): header, zeroed
    /// padding, and `fill(i, info, dst)` for every tensor `i`, run in
    /// parallel across tensors, where `dst` is exactly `info.n_bytes()`
    /// long. An invalid writer fails before `path` is touched; a failure
    /// after the file was created removes the partial file. A fill failure
    /// reports the lowest-indexed failing tensor.
    pub fn write_with<F, E>(self, path: impl AsRef<Path>, fill: F) -> Result<(), GgufError>
    where
        F: Fn(usize, &TensorInfo, &mut [u8]) -> Result<(), E> + Sync,
        E: Display,
    {
        let path = path.as_ref();
        // Validation failures leave any existing file at `path` untouched.
        let layout = self.layout(path)?;
        let result = self.write_file(path, &layout, fill);
        if result.is_err() {
            // The file was created or truncated by us and is incomplete.
            // Best effort: the error being returned matters more than a
            // failure to clean up.
            let _ = std::fs::remove_file(path);
        }
        result
    }

    fn write_file<F, E>(&self, path: &Path, layout: &Layout, fill: F) -> Result<(), GgufError>
    where
        F: Fn(usize, &TensorInfo, &mut [u8]) -> Result<(), E> + Sync,
        E: Display,
    {
        let io_err = |e| GgufError::new(path, "file", GgufErrorKind::Io(e));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(io_err)?;
        file.set_len(layout.total).map_err(io_err)?;
        if layout.total == 0 {
            return Ok(());
        }
        // SAFETY: we just created and sized this file and keep the handle
        // for the mapping's lifetime; nothing else in this process maps it.
        // Another process modifying it concurrently is outside the contract
        // (as for any file being written).
        let mut map = unsafe { memmap2::MmapMut::map_mut(&file) }.map_err(io_err)?;
        self.fill_buffer(path, layout, &mut map, fill)?;
        map.flush().map_err(io_err)?;
        Ok(())
    }

    /// The whole file in memory (same layout as `write_with`).
    pub fn write_to_vec<F, E>(self, fill: F) -> Result<Vec<u8>, GgufError>
    where
        F: Fn(usize, &TensorInfo, &mut [u8]) -> Result<(), E> + Sync,
        E: Display,
    {
        let path = Path::new(MEMORY_LABEL);
        let layout = self.layout(path)?;
        let len = usize::try_from(layout.total).map_err(|_| {
            GgufError::new(
                path,
                "file",
                GgufErrorKind::InvalidWriter {
                    reason: format!("{} bytes do not fit in memory", layout.total),
                },
            )
        })?;
        let mut buf = vec![0u8; len];
        self.fill_buffer(path, &layout, &mut buf, fill)?;
        Ok(buf)
    }

    /// Writes the header, zeroes every byte that is not tensor data, and
    /// fills the tensors in parallel. `buf` is exactly `layout.total` long.
    fn fill_buffer<F, E>(
        &self,
        path: &Path,
        layout: &Layout,
        buf: &mut [u8],
        fill: F,
    ) -> Result<(), GgufError>
    where
        F: Fn(usize, &TensorInfo, &mut [u8]) -> Result<(), E> + Sync,
        E: Display,
    {
        // layout() guarantees: header fits, every tensor range lies inside
        // the data section, ranges are disjoint. All offsets fit in usize
        // because buf.len() == total.
        let header_len = layout.header.len().min(buf.len());
        buf[..header_len].copy_from_slice(&layout.header[..header_len]);
        let data_offset = (layout.data_offset as usize).min(buf.len());
        let (head, mut rest) = buf.split_at_mut(data_offset);
        head[header_len..].fill(0);

        // Empty tensors get empty slices; they may sit at any offset.
        let mut regions: Vec<(usize, &mut [u8])> = Vec::with_capacity(self.tensors.len());
        let mut order = Vec::with_capacity(self.tensors.len());
        for (i, &n) in layout.sizes.iter().enumerate() {
            if n == 0 {
                regions.push((i, &mut []));
            } else {
                order.push(i);
            }
        }
        order.sort_by_key(|&i| self.tensors[i].offset);
        let mut cursor = 0u64;
        for i in order {
            let t = &self.tensors[i];
            let gap = (t.offset - cursor) as usize;
            let (pad, after) = rest.split_at_mut(gap);
            pad.fill(0);
            let (dst, after) = after.split_at_mut(layout.sizes[i] as usize);
            regions.push((i, dst));
            rest = after;
            cursor = t.offset + layout.sizes[i];
        }
        rest.fill(0);

        let mut failures: Vec<(usize, String)> = regions
            .into_par_iter()
            .filter_map(|(i, dst)| {
                fill(i, &self.tensors[i], dst)
                    .err()
                    .map(|e| (i, e.to_string()))
            })
            .collect();
        failures.sort_by_key(|(i, _)| *i);
        match failures.into_iter().next() {
            None => Ok(()),
            Some((i, reason)) => Err(GgufError::new(
                path,
                format!("tensor '{}'", self.tensors[i].name),
                GgufErrorKind::Fill { reason },
            )),
        }
    }

    fn checked_alignment(&self) -> Result<u64, GgufErrorKind> {
        if self.alignment.is_power_of_two() && self.alignment <= u64::from(u32::MAX) {
            Ok(self.alignment)
        } else {
            Err(GgufErrorKind::BadAlignment {
                value: self.alignment,
            })
        }
    }

    /// End of the last tensor's data (unaligned), relative to the data
    /// section.
    fn data_end(&self) -> Option<u64> {
        self.tensors.iter().try_fold(0u64, |acc, t| {
            Some(acc.max(t.offset.checked_add(t.checked_n_bytes()?)?))
        })
    }

    /// File length for a header of `header_len` bytes: the data section
    /// padded to the alignment after the last tensor, or the copied source
    /// length when it still holds everything.
    fn total_len(&self, header_len: u64, alignment: u64) -> Option<u64> {
        let data_offset = align_up(header_len, alignment)?;
        let end = self.data_end()?;
        let natural = data_offset.checked_add(align_up(end, alignment)?)?;
        let required = if self.tensors.is_empty() {
            header_len
        } else {
            data_offset.checked_add(end)?
        };
        Some(match self.source_len {
            Some(len) if len >= required => len,
            _ => natural,
        })
    }

    /// Lays the tensors out again in order from offset 0 (after an
    /// alignment change). Leaves them as they are if the alignment is
    /// invalid; the writes report that.
    fn relayout(&mut self) {
        let Ok(alignment) = self.checked_alignment() else {
            return;
        };
        let mut next = 0u64;
        for t in &mut self.tensors {
            t.offset = next;
            next = t
                .checked_n_bytes()
                .and_then(|n| next.checked_add(n))
                .and_then(|e| align_up(e, alignment))
                .unwrap_or(u64::MAX);
        }
    }

    /// Validates everything and serializes the header.
    fn layout(&self, path: &Path) -> Result<Layout, GgufError> {
        let err = |item: String, kind| GgufError::new(path, item, kind);
        if !matches!(self.version, 2 | 3) {
            return Err(err(
                "version".into(),
                GgufErrorKind::UnsupportedVersion {
                    version: self.version,
                },
            ));
        }
        let alignment_item = || format!("metadata '{ALIGNMENT_KEY}'");
        let alignment = self
            .checked_alignment()
            .map_err(|k| err(alignment_item(), k))?;
        match self.metadata.iter().find(|(k, _)| k == ALIGNMENT_KEY) {
            Some((_, v)) => {
                let declared = alignment_from_value(v).map_err(|k| err(alignment_item(), k))?;
                if declared != alignment {
                    return Err(err(
                        alignment_item(),
                        GgufErrorKind::InvalidWriter {
                            reason: format!(
                                "key says {declared} but the writer lays out with {alignment}"
                            ),
                        },
                    ));
                }
            }
            None if alignment != DEFAULT_ALIGNMENT => {
                return Err(err(
                    alignment_item(),
                    GgufErrorKind::InvalidWriter {
                        reason: format!(
                            "alignment {alignment} needs a '{ALIGNMENT_KEY}' u32 key (use with_alignment)"
                        ),
                    },
                ))
            }
            None => {}
        }

        let mut header = Vec::new();
        header.extend_from_slice(&GGUF_MAGIC);
        header.extend_from_slice(&self.version.to_le_bytes());
        header.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        header.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (i, (key, value)) in self.metadata.iter().enumerate() {
            let item = || format!("metadata '{key}'");
            if let Some(first) = self.metadata[..i].iter().position(|(k, _)| k == key) {
                return Err(err(item(), GgufErrorKind::DuplicateKey { first }));
            }
            value
                .validate()
                .map_err(|reason| err(item(), GgufErrorKind::InvalidValue { reason }))?;
            encode_str(key, &mut header);
            header.extend_from_slice(&value.value_type().id().to_le_bytes());
            value.encode_payload(&mut header);
        }

        let mut sizes = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            let item = || format!("tensor '{}'", t.name);
            let n = t.validate_shape().map_err(|k| err(item(), k))?;
            if t.offset % alignment != 0 {
                return Err(err(
                    item(),
                    GgufErrorKind::MisalignedOffset {
                        offset: t.offset,
                        alignment,
                    },
                ));
            }
            debug_assert!(t.dims.len() <= MAX_DIMS);
            encode_str(&t.name, &mut header);
            header.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                header.extend_from_slice(&d.to_le_bytes());
            }
            header.extend_from_slice(&t.ty.id().to_le_bytes());
            header.extend_from_slice(&t.offset.to_le_bytes());
            sizes.push(n);
        }

        // Names unique, ranges disjoint and representable.
        // Empty tensors take no bytes and cannot overlap anything.
        let mut order: Vec<usize> = (0..self.tensors.len()).filter(|&i| sizes[i] > 0).collect();
        order.sort_by_key(|&i| self.tensors[i].offset);
        let mut seen = std::collections::HashMap::with_capacity(self.tensors.len());
        for (i, t) in self.tensors.iter().enumerate() {
            if let Some(&first) = seen.get(t.name.as_str()) {
                return Err(err(
                    format!("tensor '{}'", t.name),
                    GgufErrorKind::DuplicateTensor { first },
                ));
            }
            seen.insert(t.name.as_str(), i);
        }
        let mut prev: Option<usize> = None;
        for &i in &order {
            let t = &self.tensors[i];
            let end = t.offset.checked_add(sizes[i]).ok_or_else(|| {
                err(
                    format!("tensor '{}'", t.name),
                    GgufErrorKind::OffsetOverflow {
                        offset: t.offset,
                        data_offset: 0,
                    },
                )
            })?;
            if let Some(p) = prev {
                let pt = &self.tensors[p];
                if pt.offset + sizes[p] > t.offset {
                    return Err(err(
                        format!("tensor '{}'", t.name),
                        GgufErrorKind::Overlap {
                            start: t.offset,
                            end,
                            other: pt.name.clone(),
                        },
                    ));
                }
            }
            prev = Some(i);
        }

        let header_len = header.len() as u64;
        let overflow = || {
            err(
                "file".into(),
                GgufErrorKind::InvalidWriter {
                    reason: "file size overflows u64".into(),
                },
            )
        };
        let data_offset = align_up(header_len, alignment).ok_or_else(overflow)?;
        let total = self.total_len(header_len, alignment).ok_or_else(overflow)?;
        Ok(Layout {
            header,
            data_offset,
            total,
            sizes,
        })
    }
}

/// Copies `src` to `dst` through a writer built by `GgufWriter::from_file`.
/// The result is byte-identical to `src` when its padding is zero.
pub fn copy_file(src: &GgufFile, dst: impl Into<PathBuf>) -> Result<(), GgufError> {
    let dst = dst.into();
    GgufWriter::from_file(src).write_with(&dst, |i, _info, out| {
        let data = src.tensor_data(&src.tensors()[i]);
        if data.len() != out.len() {
            return Err(format!(
                "source holds {} bytes, destination expects {}",
                data.len(),
                out.len()
            ));
        }
        out.copy_from_slice(data);
        Ok(())
    })
}
