//! Row dequantization: GGML block bytes to f32.

use super::blocks::*;
use super::error::{QuantError, QuantOp};
use super::GgmlType;

impl GgmlType {
    /// Whether [`dequantize_row`] and [`super::dot_row_f32`] accept this
    /// type: the plain float types and the block formats found in published
    /// GGUFs (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q4_K, Q5_K, Q6_K).
    pub fn can_dequantize(self) -> bool {
        use GgmlType::*;
        matches!(
            self,
            F32 | F16 | Bf16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | Q4K | Q5K | Q6K
        )
    }
}

/// Checks that `bytes` encodes exactly `elements` values of `ty`.
pub(crate) fn check_encoded(
    ty: GgmlType,
    bytes: usize,
    elements: usize,
    op: QuantOp,
    what: &'static str,
) -> Result<(), QuantError> {
    let supported = match op {
        QuantOp::Dequantize | QuantOp::Dot | QuantOp::Widen => ty.can_dequantize(),
        QuantOp::Quantize => ty.can_quantize(),
    };
    if !supported {
        return Err(QuantError::Unsupported { ty, op });
    }
    let ts = ty.type_size();
    if bytes % ts != 0 {
        return Err(QuantError::PartialBlockBytes {
            ty,
            bytes,
            type_size: ts,
        });
    }
    let bs = ty.block_size();
    if elements % bs != 0 {
        return Err(QuantError::PartialBlockElements {
            ty,
            elements,
            block_size: bs,
        });
    }
    let want = bytes / ts * bs;
    if want != elements {
        return Err(QuantError::SizeMismatch {
            ty,
            what,
            expected: want,
            actual: elements,
        });
    }
    Ok(())
}

/// Decodes the row `src` of type `ty` into `dst`.
///
/// `src` must be a whole number of blocks and `dst.len()` must equal the
/// number of elements they hold; otherwise an error is returned and `dst`
/// is untouched. The values are bit-identical to ggml's reference
/// `dequantize_row_*`.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    check_encoded(ty, src.len(), dst.len(), QuantOp::Dequantize, "destination")?;
    let ts = ty.type_size();
    let bs = ty.block_size();
    type BlockFn = fn(&[u8], &mut [f32]);
    let block: BlockFn = match ty {
        GgmlType::F32 => {
            for (y, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *y = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
            return Ok(());
        }
        GgmlType::F16 => {
            for (y, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *y = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
            return Ok(());
        }
        GgmlType::Bf16 => {
            for (y, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *y = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
            return Ok(());
        }
        GgmlType::Q4_0 => dequant_q4_0,
        GgmlType::Q4_1 => dequant_q4_1,
        GgmlType::Q5_0 => dequant_q5_0,
        GgmlType::Q5_1 => dequant_q5_1,
        GgmlType::Q8_0 => dequant_q8_0,
        GgmlType::Q8_1 => dequant_q8_1,
        GgmlType::Q4K => dequant_q4_k,
        GgmlType::Q5K => dequant_q5_k,
        GgmlType::Q6K => dequant_q6_k,
        _ => {
            return Err(QuantError::Unsupported {
                ty,
                op: QuantOp::Dequantize,
            })
        }
    };
    for (b, y) in src.chunks_exact(ts).zip(dst.chunks_exact_mut(bs)) {
        block(b, y);
    }
    Ok(())
}

/// Convenience: dequantizes `src` into a new vector of `n_elements` floats.
pub fn dequantize_to_vec(
    ty: GgmlType,
    src: &[u8],
    n_elements: usize,
) -> Result<Vec<f32>, QuantError> {
    check_encoded(
        ty,
        src.len(),
        n_elements,
        QuantOp::Dequantize,
        "destination",
    )?;
    let mut out = vec![0f32; n_elements];
    dequantize_row(ty, src, &mut out)?;
    Ok(out)
}
