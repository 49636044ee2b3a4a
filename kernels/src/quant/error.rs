//! Errors of the block-format routines.

use super::GgmlType;
use thiserror::Error;

/// Which operation was asked of a type that does not support it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantOp {
    Dequantize,
    Quantize,
    Dot,
    /// Exact widening to Q8_0 (`widen_to_q8_0`).
    Widen,
}

impl std::fmt::Display for QuantOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            QuantOp::Dequantize => "dequantization",
            QuantOp::Quantize => "quantization",
            QuantOp::Dot => "dot product",
            QuantOp::Widen => "exact widening to Q8_0",
        })
    }
}

/// Everything that can go wrong when converting rows between f32 and a
/// GGML block format. Lengths are checked before anything is written, so on
/// error the destination is untouched.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum QuantError {
    /// The encoded row is not a whole number of blocks.
    #[error("{ty}: {bytes} bytes is not a whole number of {type_size}-byte blocks")]
    PartialBlockBytes {
        ty: GgmlType,
        bytes: usize,
        type_size: usize,
    },
    /// The f32 row is not a whole number of blocks.
    #[error("{ty}: {elements} elements is not a whole number of {block_size}-element blocks")]
    PartialBlockElements {
        ty: GgmlType,
        elements: usize,
        block_size: usize,
    },
    /// The destination (or the other operand) has the wrong size for the
    /// source.
    #[error("{ty}: {what} has {actual} but the source needs {expected}")]
    SizeMismatch {
        ty: GgmlType,
        what: &'static str,
        expected: usize,
        actual: usize,
    },
    /// The type is known but this operation is not implemented for it.
    #[error("{ty}: {op} is not supported for this type")]
    Unsupported { ty: GgmlType, op: QuantOp },
}
