//! Weights on the device, uploaded once and repacked into the layouts the
//! chosen kernels read (`bind::matmul::WeightLayout`).
//!
//! - Projection matrices become a quant plane plus scale planes: f16 scales
//!   for the GEMV, f32 scales for the prefill GEMMs (only the layouts some
//!   slot reads are built; the quant plane is shared). Matrices that one
//!   kernel reads together are concatenated along the output features: Q,
//!   K and V of a layer (`qkv`), gate and up (`gate_up`), when their types
//!   agree.
//! - The matmul kernels implement Q8_0 and Q4_0. A matrix of any other type
//!   (F32, F16, BF16, Q6_K, Q4_K, Q5_K, ...) is dequantized and requantized
//!   to Q8_0 at load: 8.5 bits per weight, a relative error per weight of
//!   at most 1/254 of its 32-block's largest magnitude, on top of the
//!   file's own quantization. `describe` lists every converted matrix.
//! - The token embedding (gathered by the `embed` kernel) and the PLE table
//!   stay in their GGUF bytes. The tied head reads `token_embd`'s own Q6_K
//!   super-blocks, the embed kernel's copy (no second one), when the
//!   profile's `gemv.head` slot resolves to the Q6_K GEMV at every row count
//!   (`calls::head_type`); otherwise it reads its own planes or blocks of
//!   the device type, converted as above.
//! - Norm weights are f32 vectors, the layer scalars one f32 array.

use gemtune_kernels::bind::matmul::{ScaleType, WeightLayout, Weights};
use gemtune_kernels::bind::NULL;
use gemtune_kernels::families::to_planes;
use gemtune_kernels::family::WType;
use gemtune_kernels::gpu::{DeviceBuffer, Gpu, GpuError};
use gemtune_kernels::quant::{dequantize_row, quantize_row, GgmlType};
use rayon::prelude::*;
use std::sync::Arc;

use crate::model::{MatRef, Model};

/// Which device layouts of a matrix some slot reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Layouts {
    pub planes_f16: bool,
    pub planes_f32: bool,
    pub blocks: bool,
    /// Dequantized bf16 `[n][k]` (the cuBLAS profile).
    pub bf16: bool,
}

impl Layouts {
    pub fn add(&mut self, l: WeightLayout) {
        match l {
            WeightLayout::GgufBlocks => self.blocks = true,
            WeightLayout::Planes {
                scales: ScaleType::F16,
            } => self.planes_f16 = true,
            WeightLayout::Planes {
                scales: ScaleType::F32,
            } => self.planes_f32 = true,
        }
    }
}

/// One (possibly fused) projection matrix `[n][k]` on the device.
pub struct GpuMatrix {
    pub name: String,
    pub n: usize,
    pub k: usize,
    pub wtype: WType,
    /// Source types that were requantized to Q8_0 at load.
    pub converted_from: Vec<GgmlType>,
    q: Option<DeviceBuffer>,
    d16: Option<DeviceBuffer>,
    d32: Option<DeviceBuffer>,
    blocks: Option<Arc<DeviceBuffer>>,
    /// `blocks` is another owner's buffer (the embedding table the tied
    /// head shares): not counted in `bytes`.
    blocks_shared: bool,
    bf16: Option<DeviceBuffer>,
}

impl GpuMatrix {
    /// A matrix read as GGUF blocks from a buffer that another owner also
    /// reads (and accounts for): the tied head on the embedding table.
    pub fn shared_blocks(
        name: &str,
        n: usize,
        k: usize,
        wtype: WType,
        blocks: Arc<DeviceBuffer>,
    ) -> Result<GpuMatrix, GpuError> {
        let need = n * wtype.row_bytes(k);
        if k % wtype.block_elems() != 0 || blocks.bytes() < need {
            return Err(GpuError::Other(format!(
                "{name}: {} bytes cannot hold {n} rows of {k} {} elements ({need} bytes)",
                blocks.bytes(),
                wtype.ggml().name()
            )));
        }
        Ok(GpuMatrix {
            name: name.to_string(),
            n,
            k,
            wtype,
            converted_from: Vec::new(),
            q: None,
            d16: None,
            d32: None,
            blocks: Some(blocks),
            blocks_shared: true,
            bf16: None,
        })
    }

    /// Device addresses of rows `r0..` of the matrix in `layout`.
    pub fn weights_from(&self, layout: WeightLayout, r0: usize) -> Result<Weights, GpuError> {
        let nb = self.k / 32;
        let missing = || {
            GpuError::Other(format!(
                "{}: no {layout:?} copy was uploaded (a slot planned after load?)",
                self.name
            ))
        };
        Ok(match layout {
            WeightLayout::GgufBlocks => {
                let b = self.blocks.as_ref().ok_or_else(missing)?;
                Weights {
                    q: b.ptr() + (r0 * self.wtype.row_bytes(self.k)) as u64,
                    d: NULL,
                }
            }
            WeightLayout::Planes { scales } => {
                let q = self.q.as_ref().ok_or_else(missing)?;
                let (d, es) = match scales {
                    ScaleType::F16 => (self.d16.as_ref().ok_or_else(missing)?, 2),
                    ScaleType::F32 => (self.d32.as_ref().ok_or_else(missing)?, 4),
                };
                Weights {
                    q: q.ptr() + (r0 * nb * self.wtype.quant_bytes_per_block()) as u64,
                    d: d.ptr() + (r0 * nb * es) as u64,
                }
            }
        })
    }
    /// The bf16 copy (cuBLAS profile).
    pub fn bf16(&self) -> Option<&DeviceBuffer> {
        self.bf16.as_ref()
    }
    /// Device bytes of every copy this matrix owns (a shared block buffer
    /// is its owner's).
    pub fn bytes(&self) -> u64 {
        let own_blocks = match &self.blocks {
            Some(b) if !self.blocks_shared => b.bytes() as u64,
            _ => 0,
        };
        [&self.q, &self.d16, &self.d32, &self.bf16]
            .iter()
            .filter_map(|b| b.as_ref())
            .map(|b| b.bytes() as u64)
            .sum::<u64>()
            + own_blocks
    }
    /// Bytes of the bf16 copy alone (the cuBLAS profile's extra memory).
    pub fn bf16_bytes(&self) -> u64 {
        self.bf16.as_ref().map(|b| b.bytes() as u64).unwrap_or(0)
    }
}

/// The type the matmul kernels read for a file type.
pub fn device_type(t: GgmlType) -> WType {
    match t {
        GgmlType::Q4_0 => WType::Q4_0,
        _ => WType::Q8_0,
    }
}

/// Bytes one `[n][k]` matrix of file type `t` takes on the device in
/// `layouts` (for the fit check before any allocation).
pub fn planned_bytes(t: GgmlType, n: usize, k: usize, layouts: Layouts) -> u64 {
    let wt = device_type(t);
    let nb = (n * k / 32) as u64;
    let mut b = 0;
    if layouts.planes_f16 || layouts.planes_f32 {
        b += nb * wt.quant_bytes_per_block() as u64;
    }
    if layouts.planes_f16 {
        b += nb * 2;
    }
    if layouts.planes_f32 {
        b += nb * 4;
    }
    if layouts.blocks {
        b += nb * wt.ggml().type_size() as u64;
    }
    if layouts.bf16 {
        b += (n * k * 2) as u64;
    }
    b
}

/// The rows of `parts` (same k), concatenated, as GGUF blocks of the device
/// type: copied as they are when the file type is the device type, else
/// dequantized and requantized to Q8_0.
fn device_blocks(model: &Model, parts: &[&MatRef], wt: WType) -> Result<Vec<u8>, GpuError> {
    let k = parts[0].n_in;
    let row_out = wt.ggml().type_size() * k / 32;
    let n: usize = parts.iter().map(|p| p.n_out).sum();
    let mut out = vec![0u8; n * row_out];
    let mut o = 0;
    for p in parts {
        let src = model.mat_bytes(p);
        let dst = &mut out[o * row_out..(o + p.n_out) * row_out];
        if p.ty == wt.ggml() {
            dst.copy_from_slice(&src[..p.n_out * row_out]);
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

/// Uploads `parts` (matrices with the same input width, concatenated along
/// their outputs) in `layouts`.
pub fn upload_matrix(
    gpu: &Gpu,
    model: &Model,
    name: &str,
    parts: &[&MatRef],
    layouts: Layouts,
) -> Result<GpuMatrix, GpuError> {
    let k = parts[0].n_in;
    if parts.iter().any(|p| p.n_in != k) || k % 32 != 0 {
        return Err(GpuError::Other(format!(
            "{name}: the fused matrices need one input width that is a multiple of 32"
        )));
    }
    // Requantize everything to Q8_0 unless every part is Q4_0 (fused parts
    // must share one device type).
    let wt = if parts.iter().all(|p| p.ty == GgmlType::Q4_0) {
        WType::Q4_0
    } else {
        WType::Q8_0
    };
    let converted_from: Vec<GgmlType> = parts
        .iter()
        .map(|p| p.ty)
        .filter(|&t| t != wt.ggml())
        .collect();
    let n: usize = parts.iter().map(|p| p.n_out).sum();
    let gguf = device_blocks(model, parts, wt)?;
    let mut m = GpuMatrix {
        name: name.to_string(),
        n,
        k,
        wtype: wt,
        converted_from,
        q: None,
        d16: None,
        d32: None,
        blocks: None,
        blocks_shared: false,
        bf16: None,
    };
    if layouts.planes_f16 || layouts.planes_f32 {
        let (q, d) = to_planes(wt, &gguf, n, k);
        m.q = Some(gpu.upload(&q)?);
        if layouts.planes_f16 {
            m.d16 = Some(gpu.upload(&d)?);
        }
        if layouts.planes_f32 {
            let f: Vec<f32> = d
                .par_iter()
                .map(|&h| gemtune_kernels::quant::blocks::f16_to_f32(h))
                .collect();
            m.d32 = Some(gpu.upload(&f)?);
        }
    }
    if layouts.bf16 {
        let row = wt.ggml().type_size() * k / 32;
        let mut h = vec![0u16; n * k];
        h.par_chunks_mut(k).zip(gguf.par_chunks(row)).try_for_each(
            |(d, s)| -> Result<(), GpuError> {
                let mut f = vec![0f32; k];
                dequantize_row(wt.ggml(), s, &mut f)
                    .map_err(|e| GpuError::Other(format!("{name}: {e}")))?;
                for (o, v) in d.iter_mut().zip(&f) {
                    *o = gemtune_kernels::quant::blocks::f32_to_bf16(*v);
                }
                Ok(())
            },
        )?;
        m.bf16 = Some(gpu.upload(&h)?);
    }
    if layouts.blocks {
        m.blocks = Some(Arc::new(gpu.upload(&gguf)?));
    }
    Ok(m)
}

/// A tensor uploaded as its GGUF bytes (embedding tables). `buf` is shared
/// with the tied head when it reads the table's Q6_K blocks.
pub struct GpuTable {
    pub ty: GgmlType,
    pub buf: Arc<DeviceBuffer>,
}

pub fn upload_table(
    gpu: &Gpu,
    model: &Model,
    m: &MatRef,
    readable: &[GgmlType],
) -> Result<GpuTable, GpuError> {
    if !readable.contains(&m.ty) {
        let q = device_blocks(model, &[m], WType::Q8_0)?;
        return Ok(GpuTable {
            ty: GgmlType::Q8_0,
            buf: Arc::new(gpu.upload(&q)?),
        });
    }
    Ok(GpuTable {
        ty: m.ty,
        buf: Arc::new(gpu.upload(model.mat_bytes(m))?),
    })
}
