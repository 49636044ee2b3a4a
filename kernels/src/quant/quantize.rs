//! Row quantization: f32 to GGML block bytes, following ggml's reference
//! (`*_ref`) quantizers so that files we write match what llama.cpp's
//! `quantize` would write from the same f32 data.

use super::blocks::*;
use super::error::{QuantError, QuantOp};
use super::GgmlType;

/// Sub-blocks whose largest magnitude is below this are treated as all zero
/// (ggml's `GROUP_MAX_EPS`).
const GROUP_MAX_EPS: f32 = 1e-15;

impl GgmlType {
    /// Whether [`quantize_row`] accepts this type: F32, F16, BF16, Q8_0,
    /// Q8_1, Q4_0 and Q6_K.
    pub fn can_quantize(self) -> bool {
        use GgmlType::*;
        matches!(self, F32 | F16 | Bf16 | Q8_0 | Q8_1 | Q4_0 | Q6K)
    }
}

/// Encodes the f32 row `src` as type `ty` into `dst`.
///
/// `src.len()` must be a whole number of blocks and `dst.len()` exactly the
/// encoded size (`ty.row_bytes(src.len())`); otherwise an error is returned
/// and `dst` is untouched. Rounding rules, per type:
/// - F16: round to nearest even. BF16: round to nearest even, NaN kept quiet.
/// - Q8_0: `d = amax / 127`, `q = round_half_away(x * (1/d))` (ggml multiplies
///   by the f32 reciprocal of the unrounded `d`; `d` is then stored as f16).
/// - Q8_1: like Q8_0, plus `s = f16(d * Σq)` with `Σq` the integer sum of the
///   32 stored quants (ggml's `quantize_row_q8_1_ref`).
/// - Q4_0: `max` is the element of largest magnitude (first one on ties),
///   `d = max / -8`, `q = min(15, trunc(x * (1/d) + 8.5))`.
/// - Q6_K: ggml's reference search: per 16-element sub-block a weighted
///   (w = x²) least-squares scale over 19 candidate inverse scales
///   (`make_qx_quants` with nmax 32), then the 16 scales quantized to i8
///   against the largest (`d = max_scale / -128`), and the values requantized
///   with the rounded scales.
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    if !ty.can_quantize() {
        return Err(QuantError::Unsupported {
            ty,
            op: QuantOp::Quantize,
        });
    }
    let bs = ty.block_size();
    if src.len() % bs != 0 {
        return Err(QuantError::PartialBlockElements {
            ty,
            elements: src.len(),
            block_size: bs,
        });
    }
    let want = src.len() / bs * ty.type_size();
    if dst.len() != want {
        return Err(QuantError::SizeMismatch {
            ty,
            what: "destination bytes",
            expected: want,
            actual: dst.len(),
        });
    }
    let ts = ty.type_size();
    match ty {
        GgmlType::F32 => {
            for (x, b) in src.iter().zip(dst.chunks_exact_mut(4)) {
                b.copy_from_slice(&x.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for (x, b) in src.iter().zip(dst.chunks_exact_mut(2)) {
                b.copy_from_slice(&f32_to_f16(*x).to_le_bytes());
            }
        }
        GgmlType::Bf16 => {
            for (x, b) in src.iter().zip(dst.chunks_exact_mut(2)) {
                b.copy_from_slice(&f32_to_bf16(*x).to_le_bytes());
            }
        }
        _ => {
            let block: fn(&[f32], &mut [u8]) = match ty {
                GgmlType::Q8_0 => quantize_block_q8_0,
                GgmlType::Q8_1 => quantize_block_q8_1,
                GgmlType::Q4_0 => quantize_block_q4_0,
                GgmlType::Q6K => quantize_block_q6_k,
                _ => {
                    return Err(QuantError::Unsupported {
                        ty,
                        op: QuantOp::Quantize,
                    })
                }
            };
            for (x, b) in src.chunks_exact(bs).zip(dst.chunks_exact_mut(ts)) {
                block(x, b);
            }
        }
    }
    Ok(())
}

/// Convenience: quantizes `src` into a new byte vector.
pub fn quantize_to_vec(ty: GgmlType, src: &[f32]) -> Result<Vec<u8>, QuantError> {
    if !ty.can_quantize() {
        return Err(QuantError::Unsupported {
            ty,
            op: QuantOp::Quantize,
        });
    }
    let bs = ty.block_size();
    if src.len() % bs != 0 {
        return Err(QuantError::PartialBlockElements {
            ty,
            elements: src.len(),
            block_size: bs,
        });
    }
    let mut out = vec![0u8; src.len() / bs * ty.type_size()];
    quantize_row(ty, src, &mut out)?;
    Ok(out)
}

/// ggml's `nearest_int`: round half to even via the 1.5·2^23 trick. Exact
/// for |x| < 2^22, which every caller guarantees (values are bounded by the
/// quant range).
#[inline(always)]
fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0f32;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// (largest magnitude, the signed element that has it; first one on ties)
#[inline]
fn signed_amax(x: &[f32]) -> (f32, f32) {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    (amax, max)
}

fn quantize_block_q8_0(x: &[f32], y: &mut [u8]) {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    y[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
    for (q, &v) in y[2..34].iter_mut().zip(x) {
        *q = (v * id).round() as i8 as u8;
    }
}

fn quantize_block_q8_1(x: &[f32], y: &mut [u8]) {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut sum = 0i32;
    for (q, &v) in y[4..36].iter_mut().zip(x) {
        let qi = (v * id).round() as i8;
        sum += qi as i32;
        *q = qi as u8;
    }
    y[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
    y[2..4].copy_from_slice(&f32_to_f16(sum as f32 * d).to_le_bytes());
}

fn quantize_block_q4_0(x: &[f32], y: &mut [u8]) {
    let (_, max) = signed_amax(&x[..32]);
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    y[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
    for j in 0..16 {
        // Truncation towards zero of a value in [0.5, 16.5]: the +8.5 makes
        // it round-half-up of x/d + 8.
        let q0 = ((x[j] * id + 8.5) as i8).min(15) as u8;
        let q1 = ((x[j + 16] * id + 8.5) as i8).min(15) as u8;
        y[2 + j] = q0 | (q1 << 4);
    }
}

/// ggml's `make_qx_quants` with `rmse_type = 1` (weights x²) and no
/// importance matrix. Writes `l + nmax` (0..2·nmax) into `out` and returns
/// the sub-block scale (negative when the largest-magnitude element is
/// positive, because the inverse scale is `-nmax / max`).
fn make_qx_quants(x: &[f32], nmax: i32, out: &mut [i8]) -> f32 {
    let (amax, max) = signed_amax(x);
    if amax < GROUP_MAX_EPS {
        out.iter_mut().for_each(|l| *l = 0);
        return 0.0;
    }
    let clamp = |v: i32| v.clamp(-nmax, nmax - 1);
    let mut iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for (o, &v) in out.iter_mut().zip(x) {
        let l = clamp(nearest_int(iscale * v));
        *o = (l + nmax) as i8;
        let w = v * v;
        sumlx += w * v * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &v in x {
            let l = clamp(nearest_int(iscale * v));
            let w = v * v;
            sumlx += w * v * l as f32;
            suml2 += w * l as f32 * l as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = (clamp(nearest_int(iscale * v)) + nmax) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

fn quantize_block_q6_k(x: &[f32], y: &mut [u8]) {
    let x = &x[..QK_K];
    let y = &mut y[..Q6_K_BYTES];
    let mut l_all = [0i8; QK_K];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
    for ib in 0..16 {
        let s = make_qx_quants(
            &x[16 * ib..16 * ib + 16],
            32,
            &mut l_all[16 * ib..16 * ib + 16],
        );
        scales[ib] = s;
        if s.abs() > max_abs_scale {
            max_abs_scale = s.abs();
            max_scale = s;
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        y.iter_mut().for_each(|b| *b = 0);
        return;
    }
    let iscale = -128.0f32 / max_scale;
    let d16 = f32_to_f16(1.0 / iscale);
    y[208..210].copy_from_slice(&d16.to_le_bytes());
    let dq = f16_to_f32(d16);
    for ib in 0..16 {
        let sc = nearest_int(iscale * scales[ib]).min(127) as i8;
        y[192 + ib] = sc as u8;
        let d = dq * sc as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let l = nearest_int(x[16 * ib + ii] / d).clamp(-32, 31);
            l_all[16 * ib + ii] = (l + 32) as i8;
        }
    }
    let l_all = l_all.map(|v| v as u8);
    for h in 0..2 {
        let lh = &l_all[128 * h..128 * h + 128];
        for l in 0..32 {
            let (q1, q2, q3, q4) = (lh[l], lh[l + 32], lh[l + 64], lh[l + 96]);
            y[64 * h + l] = (q1 & 0x0f) | ((q3 & 0x0f) << 4);
            y[64 * h + l + 32] = (q2 & 0x0f) | ((q4 & 0x0f) << 4);
            y[128 + 32 * h + l] =
                (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
        }
    }
}
