//! GGML tensor element types and their block layouts.
//!
//! `GgmlType` names and sizes every type; the submodules convert rows:
//! [`dequantize_row`] (bytes to f32, bit-identical to ggml's reference),
//! [`quantize_row`] (f32 to bytes with ggml's reference rounding) and
//! [`dot_row_f32`] (fused dequantize-and-dot for the CPU engine).
//! [`blocks`] documents each byte layout; [`repack`] holds the lossless
//! k-quant plane repacks the matmul kernels read; [`widen_to_q8_0`] writes
//! Q4_0 / Q5_0 rows as Q8_0 with every value kept.

pub mod blocks;
mod dequant;
mod dot;
mod error;
mod quantize;
pub mod repack;
mod widen;

pub use dequant::{dequantize_row, dequantize_to_vec};
pub use dot::{dot_row_f32, dot_row_multi_f32};
pub use error::{QuantError, QuantOp};
pub use quantize::{quantize_row, quantize_to_vec};
pub use widen::{widen_to_q8_0, widens_exactly_to_q8_0};

use std::fmt;

/// A GGML tensor type as stored in GGUF tensor infos (the numeric ids are
/// ggml's `enum ggml_type`). Every id ggml defines is listed so that a file
/// using, say, IQ4_NL can still be parsed and sized; which types can be
/// dequantized on the CPU is a separate question (`GgmlType::can_dequantize`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2K = 10,
    Q3K = 11,
    Q4K = 12,
    Q5K = 13,
    Q6K = 14,
    Q8K = 15,
    Iq2Xxs = 16,
    Iq2Xs = 17,
    Iq3Xxs = 18,
    Iq1S = 19,
    Iq4Nl = 20,
    Iq3S = 21,
    Iq2S = 22,
    Iq4Xs = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    Iq1M = 29,
    Bf16 = 30,
    Tq1_0 = 34,
    Tq2_0 = 35,
    Mxfp4 = 39,
}

impl GgmlType {
    /// Every known type, in id order.
    pub const ALL: [GgmlType; 32] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2K,
        GgmlType::Q3K,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::Q8K,
        GgmlType::Iq2Xxs,
        GgmlType::Iq2Xs,
        GgmlType::Iq3Xxs,
        GgmlType::Iq1S,
        GgmlType::Iq4Nl,
        GgmlType::Iq3S,
        GgmlType::Iq2S,
        GgmlType::Iq4Xs,
        GgmlType::I8,
        GgmlType::I16,
        GgmlType::I32,
        GgmlType::I64,
        GgmlType::F64,
        GgmlType::Iq1M,
        GgmlType::Bf16,
        GgmlType::Tq1_0,
        GgmlType::Tq2_0,
        GgmlType::Mxfp4,
    ];

    /// The type with ggml id `id`, or `None` for an id ggml does not define.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        GgmlType::ALL.iter().copied().find(|t| *t as u32 == id)
    }

    pub fn id(self) -> u32 {
        self as u32
    }

    /// Elements per block (1 for plain scalar types).
    pub fn block_size(self) -> usize {
        use GgmlType::*;
        match self {
            F32 | F16 | Bf16 | I8 | I16 | I32 | I64 | F64 => 1,
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | Iq4Nl | Mxfp4 => 32,
            Q2K | Q3K | Q4K | Q5K | Q6K | Q8K | Iq2Xxs | Iq2Xs | Iq3Xxs | Iq1S | Iq3S | Iq2S
            | Iq4Xs | Iq1M | Tq1_0 | Tq2_0 => 256,
        }
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        use GgmlType::*;
        match self {
            F32 => 4,
            F16 | Bf16 => 2,
            I8 => 1,
            I16 => 2,
            I32 => 4,
            I64 | F64 => 8,
            Q4_0 => 18,
            Q4_1 => 20,
            Q5_0 => 22,
            Q5_1 => 24,
            Q8_0 => 34,
            Q8_1 => 36,
            Q2K => 84,
            Q3K => 110,
            Q4K => 144,
            Q5K => 176,
            Q6K => 210,
            Q8K => 292,
            Iq2Xxs => 66,
            Iq2Xs => 74,
            Iq3Xxs => 98,
            Iq1S => 50,
            Iq4Nl => 18,
            Iq3S => 110,
            Iq2S => 82,
            Iq4Xs => 136,
            Iq1M => 56,
            Tq1_0 => 54,
            Tq2_0 => 66,
            Mxfp4 => 17,
        }
    }

    /// Bytes for `n_elements` elements, or `None` if `n_elements` is not a
    /// whole number of blocks or the byte count overflows.
    pub fn row_bytes(self, n_elements: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if n_elements % bs != 0 {
            return None;
        }
        (n_elements / bs).checked_mul(self.type_size() as u64)
    }

    /// ggml's lower-case name ("q8_0", "q6_K", "bf16", ...).
    pub fn name(self) -> &'static str {
        use GgmlType::*;
        match self {
            F32 => "f32",
            F16 => "f16",
            Q4_0 => "q4_0",
            Q4_1 => "q4_1",
            Q5_0 => "q5_0",
            Q5_1 => "q5_1",
            Q8_0 => "q8_0",
            Q8_1 => "q8_1",
            Q2K => "q2_K",
            Q3K => "q3_K",
            Q4K => "q4_K",
            Q5K => "q5_K",
            Q6K => "q6_K",
            Q8K => "q8_K",
            Iq2Xxs => "iq2_xxs",
            Iq2Xs => "iq2_xs",
            Iq3Xxs => "iq3_xxs",
            Iq1S => "iq1_s",
            Iq4Nl => "iq4_nl",
            Iq3S => "iq3_s",
            Iq2S => "iq2_s",
            Iq4Xs => "iq4_xs",
            I8 => "i8",
            I16 => "i16",
            I32 => "i32",
            I64 => "i64",
            F64 => "f64",
            Iq1M => "iq1_m",
            Bf16 => "bf16",
            Tq1_0 => "tq1_0",
            Tq2_0 => "tq2_0",
            Mxfp4 => "mxfp4",
        }
    }

    /// Parse a name case-insensitively ("Q8_0", "q6_k", "BF16").
    pub fn from_name(name: &str) -> Option<GgmlType> {
        GgmlType::ALL
            .iter()
            .copied()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }
}

/// Checks that `bytes` holds exactly `rows` rows of `k` elements of `ty`
/// (each row a whole number of blocks).
pub fn check_row_bytes(
    ty: GgmlType,
    bytes: usize,
    rows: usize,
    k: usize,
) -> Result<(), QuantError> {
    if k % ty.block_size() != 0 {
        return Err(QuantError::PartialBlockElements {
            ty,
            elements: k,
            block_size: ty.block_size(),
        });
    }
    let want = rows * (k / ty.block_size()) * ty.type_size();
    if bytes != want {
        return Err(QuantError::SizeMismatch {
            ty,
            what: "matrix bytes",
            expected: want,
            actual: bytes,
        });
    }
    Ok(())
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
