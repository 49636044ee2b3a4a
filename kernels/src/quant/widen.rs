//! Exact widening to Q8_0 of the 32-element block types whose values are a
//! block scale times a signed integer: Q4_0 (`d * (q - 8)`, q in 0..16) and
//! Q5_0 (`d * (q - 16)`, q in 0..32). A Q8_0 block holds `d * q8` with the
//! same f16 `d` and `q8` an i8, so the block's scale is copied and each
//! quant re-centred into an i8: every dequantized value is the file's, bit
//! for bit (`dequant_q8_0` computes the same `q as f32 * d` product). The
//! engine reads matrices of such types on its Q8_0 kernels without the
//! rounding of a requantization; the cost is bytes (34 per 32 weights
//! against 18 or 22). Types with a block minimum (Q4_1, Q5_1) or per-group
//! scales (the k-quants) have no exact Q8_0 form.

use super::blocks::{rd_u32, Q4_0_BYTES, Q5_0_BYTES, Q8_0_BYTES};
use super::dequant::check_encoded;
use super::error::{QuantError, QuantOp};
use super::GgmlType;

/// Whether every row of type `ty` has an exact Q8_0 form ([`widen_to_q8_0`]).
pub fn widens_exactly_to_q8_0(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0)
}

/// Writes the row `src` of type `ty` as Q8_0 blocks into `dst` (Q8_0 rows
/// are copied). `dst` must hold exactly as many Q8_0 blocks as `src` holds
/// blocks; on error nothing is written.
pub fn widen_to_q8_0(ty: GgmlType, src: &[u8], dst: &mut [u8]) -> Result<(), QuantError> {
    if !widens_exactly_to_q8_0(ty) {
        return Err(QuantError::Unsupported {
            ty,
            op: QuantOp::Widen,
        });
    }
    check_encoded(
        ty,
        src.len(),
        src.len() / ty.type_size() * 32,
        QuantOp::Widen,
        "source",
    )?;
    let blocks = src.len() / ty.type_size();
    if dst.len() != blocks * Q8_0_BYTES {
        return Err(QuantError::SizeMismatch {
            ty,
            what: "the Q8_0 destination",
            expected: blocks * Q8_0_BYTES,
            actual: dst.len(),
        });
    }
    let out = dst.chunks_exact_mut(Q8_0_BYTES);
    match ty {
        GgmlType::Q8_0 => dst.copy_from_slice(src),
        GgmlType::Q4_0 => {
            for (b, o) in src.chunks_exact(Q4_0_BYTES).zip(out) {
                o[..2].copy_from_slice(&b[..2]);
                for (j, &byte) in b[2..18].iter().enumerate() {
                    o[2 + j] = ((byte & 0x0f) as i8 - 8) as u8;
                    o[2 + 16 + j] = ((byte >> 4) as i8 - 8) as u8;
                }
            }
        }
        GgmlType::Q5_0 => {
            for (b, o) in src.chunks_exact(Q5_0_BYTES).zip(out) {
                o[..2].copy_from_slice(&b[..2]);
                let qh = rd_u32(b, 2);
                for (j, &byte) in b[6..22].iter().enumerate() {
                    let lo = (byte & 0x0f) | ((((qh >> j) & 1) as u8) << 4);
                    let hi = (byte >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
                    o[2 + j] = (lo as i8 - 16) as u8;
                    o[2 + 16 + j] = (hi as i8 - 16) as u8;
                }
            }
        }
        _ => {
            return Err(QuantError::Unsupported {
                ty,
                op: QuantOp::Widen,
            })
        }
    }
    Ok(())
}
