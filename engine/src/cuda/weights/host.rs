//! A matrix's bytes on the host before the upload: GGUF blocks of its
//! device type (copied, widened or requantized from the file's), and the
//! copies in each layout some slot reads.

use gemtune_kernels::bind::matmul::WeightLayout;
use gemtune_kernels::family::WType;
use gemtune_kernels::gpu::GpuError;
use gemtune_kernels::quant::{dequantize_row, quantize_row, widen_to_q8_0};
use rayon::prelude::*;

use super::{exact_as, layout_binding, Layouts, PLANES_F16, PLANES_F32};
use crate::model::{ExpertMats, MatRef, Model};

/// The host copies of one matrix in the layouts some slot reads, before
/// the upload: planes shared by two layouts are built once, and F16/BF16
/// values serve every layout from one buffer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostCopies {
    pub q: Option<Vec<u8>>,
    pub d16: Option<Vec<u8>>,
    pub d32: Option<Vec<u8>>,
    pub blocks: Option<Vec<u8>>,
    pub bf16: Option<Vec<u16>>,
}

impl HostCopies {
    /// Builds the copies of an `[n][k]` matrix of device type `wt` from
    /// its GGUF bytes (`n` rows of `wt.row_bytes(k)`); every repack is
    /// lossless (`MatmulBinding::device_weights`).
    pub fn build(
        wt: WType,
        gguf: &[u8],
        n: usize,
        k: usize,
        layouts: Layouts,
    ) -> Result<HostCopies, String> {
        let mut c = HostCopies::default();
        let planes = |l: WeightLayout| {
            layout_binding(l)
                .device_weights(wt, gguf, n, k)
                .map_err(|e| e.to_string())
        };
        if wt.is_16bit() {
            if layouts.planes() || layouts.blocks {
                c.blocks = Some(gguf.to_vec());
            }
        } else {
            if layouts.planes_f16 {
                let dw = planes(PLANES_F16)?;
                c.q = Some(dw.q);
                c.d16 = Some(dw.d);
            }
            if layouts.planes_f32 {
                let dw = planes(PLANES_F32)?;
                c.q.get_or_insert(dw.q);
                c.d32 = Some(dw.d);
            }
            if layouts.blocks {
                c.blocks = Some(gguf.to_vec());
            }
        }
        if layouts.bf16 {
            let row = wt.row_bytes(k);
            let mut h = vec![0u16; n * k];
            h.par_chunks_mut(k).zip(gguf.par_chunks(row)).try_for_each(
                |(d, s)| -> Result<(), String> {
                    let mut f = vec![0f32; k];
                    dequantize_row(wt.ggml(), s, &mut f).map_err(|e| e.to_string())?;
                    for (o, v) in d.iter_mut().zip(&f) {
                        *o = gemtune_kernels::quant::blocks::f32_to_bf16(*v);
                    }
                    Ok(())
                },
            )?;
            c.bf16 = Some(h);
        }
        Ok(c)
    }

    /// Bytes of every copy.
    pub fn bytes(&self) -> u64 {
        let b = |v: &Option<Vec<u8>>| v.as_ref().map(|v| v.len()).unwrap_or(0);
        (b(&self.q)
            + b(&self.d16)
            + b(&self.d32)
            + b(&self.blocks)
            + self.bf16.as_ref().map(|v| 2 * v.len()).unwrap_or(0)) as u64
    }
}

/// The rows of `parts` (same k), concatenated, as GGUF blocks of the device
/// type: copied as they are when the file type is the device type, widened
/// exactly when it has an exact Q8_0 form (`exact_as`), else dequantized
/// and requantized to Q8_0.
pub(super) fn device_blocks(
    model: &Model,
    parts: &[&MatRef],
    wt: WType,
) -> Result<Vec<u8>, GpuError> {
    let k = parts[0].n_in;
    let row_out = wt.row_bytes(k);
    let n: usize = parts.iter().map(|p| p.n_out).sum();
    let mut out = vec![0u8; n * row_out];
    let mut o = 0;
    for p in parts {
        let src = model.mat_bytes(p);
        let dst = &mut out[o * row_out..(o + p.n_out) * row_out];
        if p.ty == wt.ggml() {
            dst.copy_from_slice(&src[..p.n_out * row_out]);
        } else if exact_as(p.ty, wt.ggml()) {
            dst.par_chunks_mut(row_out)
                .zip(src.par_chunks(p.row_bytes))
                .try_for_each(|(d, s)| {
                    widen_to_q8_0(p.ty, s, d)
                        .map_err(|e| GpuError::Other(format!("{}: {e}", p.name)))
                })?;
        } else {
            dst.par_chunks_mut(row_out)
                .zip(src.par_chunks(p.row_bytes))
                .try_for_each(|(d, s)| -> Result<(), GpuError> {
                    let mut f = vec![0f32; k];
                    dequantize_row(p.ty, s, &mut f)
                        .map_err(|e| GpuError::Other(format!("{}: {e}", p.name)))?;
                    quantize_row(wt.ggml(), &f, d)
                        .map_err(|e| GpuError::Other(format!("{}: {e}", p.name)))
                })?;
        }
        o += p.n_out;
    }
    Ok(out)
}

/// The expert stacks `parts` (same input width and expert count) as one
/// matrix of device type `wt` in GGUF blocks: for each expert in turn, its
/// rows of every part (gate then up for the fused gate|up), copied when
/// the file's type is `wt`, widened exactly when it can be (`exact_as`),
/// else requantized to Q8_0.
pub(super) fn expert_blocks(
    model: &Model,
    parts: &[&ExpertMats],
    wt: WType,
) -> Result<Vec<u8>, GpuError> {
    let k = parts[0].n_in;
    let n_exp = parts[0].n_experts;
    let row_out = wt.row_bytes(k);
    let per_expert: usize = parts.iter().map(|p| p.n_out).sum();
    let mut out = vec![0u8; n_exp * per_expert * row_out];
    out.par_chunks_mut(per_expert * row_out)
        .enumerate()
        .try_for_each(|(e, dst)| -> Result<(), GpuError> {
            let mut o = 0;
            let mut f = vec![0f32; k];
            for p in parts {
                let src = model.expert_bytes(p, e);
                let d = &mut dst[o * row_out..(o + p.n_out) * row_out];
                let err = |e: gemtune_kernels::quant::QuantError| {
                    GpuError::Other(format!("{}: {e}", p.name))
                };
                if p.ty == wt.ggml() {
                    d.copy_from_slice(&src[..p.n_out * row_out]);
                } else if exact_as(p.ty, wt.ggml()) {
                    for (dr, sr) in d.chunks_mut(row_out).zip(src.chunks(p.row_bytes)) {
                        widen_to_q8_0(p.ty, sr, dr).map_err(err)?;
                    }
                } else {
                    for (dr, sr) in d.chunks_mut(row_out).zip(src.chunks(p.row_bytes)) {
                        dequantize_row(p.ty, sr, &mut f).map_err(err)?;
                        quantize_row(wt.ggml(), &f, dr).map_err(err)?;
                    }
                }
                o += p.n_out;
            }
            Ok(())
        })?;
    Ok(out)
}
