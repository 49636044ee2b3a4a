//! GGUF v2/v3 container: reader (mmap) and writer.
//!
//! Layout (all little-endian): magic "GGUF", u32 version, u64 tensor count,
//! u64 metadata count, the metadata entries (string key, u32 value type,
//! value), the tensor infos (string name, u32 n_dims, u64 dims, u32 ggml
//! type, u64 offset), zero padding to the alignment, then the data section.
//! Strings are a u64 byte length plus UTF-8 bytes. Versions 2 and 3 share
//! this layout; version 1 (u32 counts and lengths) is not supported.

mod error;
mod reader;
mod value;
mod writer;

pub use error::{GgufError, GgufErrorKind};
pub use reader::{GgufFile, TensorInfo, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS};
pub use value::{GgufArray, GgufValue, GgufValueType, MAX_ARRAY_DEPTH};
pub use writer::{copy_file, GgufWriter};

#[cfg(test)]
mod tests;
