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
//!   (`forward_plan::head_type`); otherwise it reads its own planes or blocks of
//!   the device type, converted as above.
//! - `upload` puts a whole model on the device in the layouts the forward
//!   plan reads (`ProjLayouts`); `model_bytes` is the same sum before any
//!   allocation (the fit check).
//! - Norm weights are f32 vectors, the layer scalars one f32 array.

use gemtune_kernels::bind::matmul::{ScaleType, WeightLayout, Weights};
use gemtune_kernels::bind::NULL;
use gemtune_kernels::families::to_planes;
use gemtune_kernels::family::WType;
use gemtune_kernels::gpu::{DeviceBuffer, Gpu, GpuError};
use gemtune_kernels::quant::{dequantize_row, quantize_row, GgmlType};
use rayon::prelude::*;
use std::sync::Arc;

use super::slots::Proj;
use crate::config::AttnKind;
use crate::model::{MatRef, Model};
use crate::rope::RopeFreqs;

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

/// The type the matmul kernels read for matrices of file types `parts`
/// fused into one: Q4_0 when every part is Q4_0, else Q8_0 (fused parts
/// share one device type; every other type is requantized at load).
pub fn device_type(parts: &[GgmlType]) -> WType {
    if !parts.is_empty() && parts.iter().all(|&t| t == GgmlType::Q4_0) {
        WType::Q4_0
    } else {
        WType::Q8_0
    }
}

/// Embedding-table types the `embed` and `ple` kernels read as they are;
/// other types are requantized to Q8_0 at load.
pub const EMBED_TYPES: &[GgmlType] = &[
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q6K,
    GgmlType::F16,
    GgmlType::Bf16,
    GgmlType::F32,
];

/// The type an embedding table of file type `t` is gathered from.
pub fn table_type(t: GgmlType) -> GgmlType {
    if EMBED_TYPES.contains(&t) {
        t
    } else {
        GgmlType::Q8_0
    }
}

/// The device layouts each projection's matrices are uploaded in (the
/// union over every launch the forward plan makes of that projection).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProjLayouts {
    by_proj: [Layouts; 6],
    /// The tied head reads `token_embd`'s Q6_K blocks, the embedding
    /// table's device copy: no copy of its own.
    pub head_native: bool,
}

impl ProjLayouts {
    pub fn get(&self, p: Proj) -> Layouts {
        self.by_proj[p as usize]
    }
    pub fn get_mut(&mut self, p: Proj) -> &mut Layouts {
        &mut self.by_proj[p as usize]
    }
}

/// Bytes one `[n][k]` matrix of file type `t` takes on the device in
/// `layouts` (for the fit check before any allocation).
pub fn planned_bytes(t: GgmlType, n: usize, k: usize, layouts: Layouts) -> u64 {
    let wt = device_type(&[t]);
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
    let types: Vec<GgmlType> = parts.iter().map(|p| p.ty).collect();
    let wt = device_type(&types);
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

/// One layer's device weights.
pub struct LayerWeights {
    /// Q | K | V (K-shared layers: Q only; k_eq_v layers: Q | K).
    pub qkv: GpuMatrix,
    pub o: GpuMatrix,
    /// gate | up.
    pub gate_up: GpuMatrix,
    pub down: GpuMatrix,
    pub ple_gate: Option<GpuMatrix>,
    pub ple_proj: Option<GpuMatrix>,
    pub attn_norm: DeviceBuffer,
    pub q_norm: DeviceBuffer,
    pub k_norm: Option<DeviceBuffer>,
    pub post_attn_norm: DeviceBuffer,
    pub ffn_norm: DeviceBuffer,
    pub post_ffw_norm: DeviceBuffer,
    pub ple_post_norm: Option<DeviceBuffer>,
}

/// A model's device weights.
pub struct DeviceWeights {
    pub layers: Vec<LayerWeights>,
    /// `token_embd` as GGUF bytes (the embedding gather).
    pub embd: GpuTable,
    /// `token_embd` as the head reads it.
    pub head: GpuMatrix,
    pub output_norm: DeviceBuffer,
    pub ple_table: Option<GpuTable>,
    pub ple_model_proj: Option<GpuMatrix>,
    pub ple_proj_norm: Option<DeviceBuffer>,
    /// f32 `[n_layers]` layer scalars.
    pub layer_scales: DeviceBuffer,
    /// f64 inverse frequencies per layer kind (`[hd/2]`, `crate::rope`).
    pub rope_swa: DeviceBuffer,
    pub rope_full: DeviceBuffer,
    pub bytes: u64,
    pub bf16_bytes: u64,
    /// One line per matrix converted at load.
    pub converted: Vec<String>,
}

impl DeviceWeights {
    /// The inverse RoPE frequencies of a layer kind.
    pub fn rope(&self, kind: AttnKind) -> &DeviceBuffer {
        match kind {
            AttnKind::Sliding => &self.rope_swa,
            AttnKind::Full => &self.rope_full,
        }
    }
}

/// The matrices of a layer's fused Q|K|V projection.
pub fn qkv_parts(lw: &crate::model::LayerWeights) -> Vec<&MatRef> {
    let mut parts: Vec<&MatRef> = vec![&lw.attn_q];
    if let Some(k) = &lw.attn_k {
        parts.push(k);
        if let Some(v) = &lw.attn_v {
            parts.push(v);
        }
    }
    parts
}

/// Device bytes of a model's weights in `lay` (the fit check before any
/// allocation; `upload` allocates exactly these).
pub fn model_bytes(model: &Model, lay: &ProjLayouts) -> u64 {
    let w = model.weights();
    let mat = |m: &MatRef, p: Proj| planned_bytes(m.ty, m.n_out, m.n_in, lay.get(p));
    let mut b = 0u64;
    for lw in &w.layers {
        b += qkv_parts(lw).iter().map(|m| mat(m, Proj::Qkv)).sum::<u64>();
        b += mat(&lw.attn_output, Proj::O);
        b += mat(&lw.ffn_gate, Proj::GateUp) + mat(&lw.ffn_up, Proj::GateUp);
        b += mat(&lw.ffn_down, Proj::Down);
        if let Some(p) = &lw.ple {
            b += mat(&p.inp_gate, Proj::Ple) + mat(&p.proj, Proj::Ple);
        }
    }
    b += model.mat_bytes(&w.token_embd).len() as u64;
    if !lay.head_native {
        b += mat(&w.token_embd, Proj::Head);
    }
    if let Some(p) = &w.ple {
        b += model.mat_bytes(&p.token_embd).len() as u64 + mat(&p.model_proj, Proj::Ple);
    }
    b
}

/// Uploads a model's weights in the layouts `lay` names.
pub fn upload(gpu: &Gpu, model: &Model, lay: &ProjLayouts) -> Result<DeviceWeights, GpuError> {
    let cfg = model.config();
    let w = model.weights();
    let mut layers = Vec::with_capacity(cfg.n_layers);
    let mut converted = Vec::new();
    let mut note = |m: &GpuMatrix| {
        if !m.converted_from.is_empty() {
            converted.push(format!(
                "{} ({}) -> {} planes",
                m.name,
                m.converted_from
                    .iter()
                    .map(|t| t.name())
                    .collect::<Vec<_>>()
                    .join(", "),
                m.wtype.ggml().name()
            ));
        }
    };
    let f32_buf = |v: &[f32]| gpu.upload(v);
    for (i, lw) in w.layers.iter().enumerate() {
        let mut up = |name: &str, parts: &[&MatRef], p: Proj| -> Result<GpuMatrix, GpuError> {
            let m = upload_matrix(gpu, model, name, parts, lay.get(p))?;
            note(&m);
            Ok(m)
        };
        let qkv = up(&format!("blk.{i}.attn_qkv"), &qkv_parts(lw), Proj::Qkv)?;
        let o = up(&lw.attn_output.name, &[&lw.attn_output], Proj::O)?;
        let gate_up = up(
            &format!("blk.{i}.ffn_gate_up"),
            &[&lw.ffn_gate, &lw.ffn_up],
            Proj::GateUp,
        )?;
        let down = up(&lw.ffn_down.name, &[&lw.ffn_down], Proj::Down)?;
        let (ple_gate, ple_proj, ple_post_norm) = match &lw.ple {
            Some(p) => (
                Some(up(&p.inp_gate.name, &[&p.inp_gate], Proj::Ple)?),
                Some(up(&p.proj.name, &[&p.proj], Proj::Ple)?),
                Some(f32_buf(&p.post_norm)?),
            ),
            None => (None, None, None),
        };
        layers.push(LayerWeights {
            qkv,
            o,
            gate_up,
            down,
            ple_gate,
            ple_proj,
            attn_norm: f32_buf(&lw.attn_norm)?,
            q_norm: f32_buf(&lw.attn_q_norm)?,
            k_norm: lw.attn_k_norm.as_deref().map(f32_buf).transpose()?,
            post_attn_norm: f32_buf(&lw.post_attention_norm)?,
            ffn_norm: f32_buf(&lw.ffn_norm)?,
            post_ffw_norm: f32_buf(&lw.post_ffw_norm)?,
            ple_post_norm,
        });
    }
    let embd = upload_table(gpu, model, &w.token_embd, EMBED_TYPES)?;
    let head = if lay.head_native {
        if embd.ty != GgmlType::Q6K {
            return Err(GpuError::Other(format!(
                "token_embd: the head was planned on Q6_K blocks, the table is {}",
                embd.ty.name()
            )));
        }
        GpuMatrix::shared_blocks(
            "token_embd (head)",
            w.token_embd.n_out,
            w.token_embd.n_in,
            WType::Q6K,
            embd.buf.clone(),
        )?
    } else {
        upload_matrix(
            gpu,
            model,
            "token_embd (head)",
            &[&w.token_embd],
            lay.get(Proj::Head),
        )?
    };
    note(&head);
    let (ple_table, ple_model_proj, ple_proj_norm) = match &w.ple {
        Some(p) => {
            let mp = upload_matrix(
                gpu,
                model,
                &p.model_proj.name,
                &[&p.model_proj],
                lay.get(Proj::Ple),
            )?;
            note(&mp);
            (
                Some(upload_table(gpu, model, &p.token_embd, EMBED_TYPES)?),
                Some(mp),
                Some(f32_buf(&p.proj_norm)?),
            )
        }
        None => (None, None, None),
    };
    let scales: Vec<f32> = w.layers.iter().map(|l| l.layer_scale).collect();
    let opt = |m: &Option<GpuMatrix>| m.as_ref().map(|m| m.bytes()).unwrap_or(0);
    let mut bytes: u64 = layers
        .iter()
        .map(|l| {
            l.qkv.bytes()
                + l.o.bytes()
                + l.gate_up.bytes()
                + l.down.bytes()
                + opt(&l.ple_gate)
                + opt(&l.ple_proj)
        })
        .sum();
    bytes += embd.buf.bytes() as u64 + head.bytes();
    bytes += ple_table
        .as_ref()
        .map(|t| t.buf.bytes() as u64)
        .unwrap_or(0);
    bytes += opt(&ple_model_proj);
    let bf16_bytes = layers
        .iter()
        .map(|l| {
            l.qkv.bf16_bytes() + l.o.bf16_bytes() + l.gate_up.bf16_bytes() + l.down.bf16_bytes()
        })
        .sum::<u64>()
        + ple_model_proj.as_ref().map(|m| m.bf16_bytes()).unwrap_or(0);
    let rope = |kind: AttnKind| gpu.upload(&RopeFreqs::new(cfg.rope(kind)).inv_freq);
    Ok(DeviceWeights {
        layers,
        embd,
        head,
        output_norm: f32_buf(&w.output_norm)?,
        ple_table,
        ple_model_proj,
        ple_proj_norm,
        layer_scales: f32_buf(&scales)?,
        rope_swa: rope(AttnKind::Sliding)?,
        rope_full: rope(AttnKind::Full)?,
        bytes,
        bf16_bytes,
        converted,
    })
}
