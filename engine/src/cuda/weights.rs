//! Weights on the device, uploaded once in the layouts the chosen kernels
//! read (`bind::matmul::WeightLayout`, built by
//! `MatmulBinding::device_weights`).
//!
//! - Every projection matrix is read from its own bits when its file type
//!   is a matmul weight type (`WType`: Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, F16,
//!   BF16): Q8_0/Q4_0 as a quant plane plus scale planes (f16 scales for
//!   the GEMV, f32 for the prefill GEMMs), the k-quants as their lossless
//!   plane repacks (one nibble plane, the GEMV side records and/or the GEMM
//!   side words), F16/BF16 as stored. Only the layouts some slot reads are
//!   built, and a plane two layouts share is uploaded once.
//! - Matrices that one kernel reads together are concatenated along the
//!   output features: Q, K and V of a layer (`qkv`), gate and up
//!   (`gate_up`). A Q|K|V whose parts' types differ (Q4_K_M files: a Q6_K
//!   `attn_v` beside Q4_K `attn_q`/`attn_k`) is split into runs of one type
//!   (`fused_runs`), each its own matrix and launch. A gate|up whose types
//!   differ, and a matrix of a type no matmul kernel reads (F32, Q5_0,
//!   ...), is read as Q8_0. Where every part is Q8_0, Q4_0 or Q5_0 (the
//!   Q5_0 fallbacks of Q4_K_M files) that is exact (`widening`,
//!   `quant::widen_to_q8_0`: each block's scale kept, its quants re-centred
//!   into int8; more bytes, the same values), listed in
//!   `ModelDims::widened`. Otherwise the rows are dequantized and
//!   requantized: 8.5 bits per weight, a relative error per weight of at
//!   most 1/254 of its 32-block's largest magnitude, on top of the file's
//!   own quantization. `ModelDims::converted` lists every such matrix
//!   before the upload, so `run`/`bench` say so, and a lossless profile
//!   (`strict`, `Profile::lossless`) refuses them.
//! - The token embedding (gathered by the `embed` kernel) and the PLE table
//!   stay in their GGUF bytes. The tied head reads `token_embd`'s own Q6_K
//!   super-blocks, the embed kernel's copy (no second one), when the
//!   profile's `gemv.head` slot resolves to the Q6_K GEMV on GGUF blocks at
//!   every row count (`model_dims::head_type`); otherwise it reads its own
//!   planes of the planned head type (`head_copy_type`: the table's device
//!   type, or the type a profile's `head_convert` asks for). When those
//!   planes are a Q6_K table's lossless repack and the embed slot reads
//!   that layout, the gather reads them too and the table has no GGUF copy
//!   (`model_dims::embed_on_head_planes`): one copy of the table.
//! - `upload` puts a whole model on the device in the layouts the forward
//!   plan reads (`ProjLayouts`); `model_dims::model_bytes` is the same
//!   sum computed from the model's shapes before any allocation (the fit
//!   check), and `planned_bytes` equals `HostCopies::bytes` of every
//!   matrix.
//! - Norm weights are f32 vectors, the layer scalars one f32 array.

use gemtune_kernels::bind::matmul::{
    MatmulBinding, MatmulFamily, Prepass, ScaleType, WeightLayout, Weights,
};
use gemtune_kernels::bind::{ActFormat, NULL};
use gemtune_kernels::family::WType;
use gemtune_kernels::gpu::{DeviceBuffer, Gpu, GpuError};
use gemtune_kernels::quant::{
    dequantize_row, quantize_row, widen_to_q8_0, widens_exactly_to_q8_0, GgmlType,
};
use rayon::prelude::*;
use std::sync::Arc;

use super::slots::Proj;
use crate::config::AttnKind;
use crate::model::{ExpertMats, MatRef, Model};
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
    fn planes(&self) -> bool {
        self.planes_f16 || self.planes_f32
    }
    /// The one weight layout set (`bf16` apart: the vendor arm's copy);
    /// `None` when none or several are.
    pub fn only(&self) -> Option<WeightLayout> {
        match (self.planes_f16, self.planes_f32, self.blocks) {
            (true, false, false) => Some(PLANES_F16),
            (false, true, false) => Some(PLANES_F32),
            (false, false, true) => Some(WeightLayout::GgufBlocks),
            _ => None,
        }
    }
    /// How many device layouts are set.
    pub fn count(&self) -> usize {
        [self.planes_f16, self.planes_f32, self.blocks, self.bf16]
            .iter()
            .filter(|&&b| b)
            .count()
    }
}

pub const PLANES_F16: WeightLayout = WeightLayout::Planes {
    scales: ScaleType::F16,
};
pub(super) const PLANES_F32: WeightLayout = WeightLayout::Planes {
    scales: ScaleType::F32,
};

/// A binding with `layout` alone: its row strides and device repacks
/// depend on the layout only, so the engine asks the kernels crate for
/// them through it (one source of truth for every type's layout).
fn layout_binding(layout: WeightLayout) -> MatmulBinding {
    MatmulBinding {
        family: MatmulFamily::Gemv,
        layout,
        act: ActFormat::F32,
        prepass: Prepass::None,
        zero_output: false,
        matrices: 1,
    }
}

/// One (possibly fused) projection matrix `[n][k]` on the device.
pub struct GpuMatrix {
    pub name: String,
    pub n: usize,
    pub k: usize,
    pub wtype: WType,
    /// Quant plane (Q8_0, Q4_0, the k-quants' nibbles).
    q: Option<DeviceBuffer>,
    /// Scale plane of the GEMV (k-quants: the GEMV side records).
    d16: Option<DeviceBuffer>,
    /// Scale plane of the prefill GEMMs (k-quants: the GEMM side words).
    d32: Option<DeviceBuffer>,
    /// GGUF bytes: the blocks of LAYOUT=0, and F16/BF16 values in every
    /// layout.
    blocks: Option<Arc<DeviceBuffer>>,
    /// `blocks` is another owner's buffer (the embedding table the tied
    /// head shares): not counted in `bytes`.
    blocks_shared: bool,
    bf16: Option<DeviceBuffer>,
}

impl GpuMatrix {
    /// A matrix read as its GGUF bytes from a buffer that another owner
    /// also reads (and accounts for): the tied head on the embedding table.
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
            q: None,
            d16: None,
            d32: None,
            blocks: Some(blocks),
            blocks_shared: true,
            bf16: None,
        })
    }

    /// Device addresses of rows `r0..` of the matrix in `layout` (rows
    /// start `r0` row strides into each buffer, `MatmulBinding::row_strides`).
    pub fn weights_from(&self, layout: WeightLayout, r0: usize) -> Result<Weights, GpuError> {
        let missing = || {
            GpuError::Other(format!(
                "{}: no {layout:?} copy was uploaded (a slot planned after load?)",
                self.name
            ))
        };
        let (qs, ds) = layout_binding(layout).row_strides(self.wtype, self.k);
        let at = |b: &DeviceBuffer, stride: usize| b.ptr() + (r0 * stride) as u64;
        Ok(match layout {
            WeightLayout::GgufBlocks => Weights {
                q: at(self.blocks.as_ref().ok_or_else(missing)?, qs),
                d: NULL,
            },
            WeightLayout::Planes { .. } if self.wtype.is_16bit() => Weights {
                q: at(self.blocks.as_ref().ok_or_else(missing)?, qs),
                d: NULL,
            },
            WeightLayout::Planes { scales } => {
                let q = self.q.as_ref().ok_or_else(missing)?;
                let d = match scales {
                    ScaleType::F16 => self.d16.as_ref(),
                    ScaleType::F32 => self.d32.as_ref(),
                }
                .ok_or_else(missing)?;
                Weights {
                    q: at(q, qs),
                    d: at(d, ds),
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
/// fused into one: the file's own type when every part has it and it is a
/// matmul weight type (`WType`), else Q8_0 (fused parts share one device
/// type, so mixed parts and types without a matmul kernel, F32 among them,
/// are requantized at load).
pub fn device_type(parts: &[GgmlType]) -> WType {
    match parts.split_first() {
        Some((&t, rest)) if rest.iter().all(|&r| r == t) => WType::of(t).unwrap_or(WType::Q8_0),
        _ => WType::Q8_0,
    }
}

/// The runs a fused Q|K|V of file types `parts` is uploaded and launched
/// as: consecutive parts whose device types (`device_type` of each alone)
/// agree share a run, so a V stored as Q6_K beside Q4_K Q and K (Q4_K_M
/// files) is a second matrix read in its own type, not requantized. Each
/// run's launch writes its own `[rows][n_run]` block of the Q|K|V buffer
/// (`stages::attention_block`), and Q, K and V are read from there with
/// their run's row stride.
pub fn fused_runs(parts: &[GgmlType]) -> Vec<std::ops::Range<usize>> {
    let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
    for (i, &t) in parts.iter().enumerate() {
        match runs.last_mut() {
            Some(r) if device_type(&[parts[r.start]]) == device_type(&[t]) => r.end = i + 1,
            _ => runs.push(i..i + 1),
        }
    }
    runs
}

/// The name of run `j` of `runs` of layer `l`'s Q|K|V.
pub fn qkv_run_name(l: usize, j: usize, runs: usize) -> String {
    if runs == 1 {
        format!("blk.{l}.attn_qkv")
    } else {
        format!("blk.{l}.attn_qkv.{j}")
    }
}

/// Why matrices of file types `parts` fused into one are converted lossily
/// to `wt` (`device_type`), or `None` when they are read as they are or
/// widened exactly (`widening`).
pub fn conversion(parts: &[GgmlType], wt: WType) -> Option<String> {
    if parts.iter().all(|&t| t == wt.ggml()) || widening(parts, wt.ggml()).is_some() {
        return None;
    }
    let names: Vec<&str> = parts.iter().map(|t| t.name()).collect();
    let why = match parts.iter().find(|&&t| WType::of(t).is_none()) {
        Some(t) => format!("no matmul kernel reads {} weights", t.name()),
        None => "the fused parts' types differ and one kernel reads them".to_string(),
    };
    Some(format!(
        "({}) -> {} planes, lossy: {why}",
        names.join(", "),
        wt.ggml().name()
    ))
}

/// Whether rows of file type `from` uploaded as `to` keep every value:
/// the same type, or a widening to Q8_0 (`quant::widen_to_q8_0`).
pub fn exact_as(from: GgmlType, to: GgmlType) -> bool {
    from == to || (to == GgmlType::Q8_0 && widens_exactly_to_q8_0(from))
}

/// The line naming an exact widening of matrices of file types `parts` to
/// `to` (Q8_0 from Q4_0 / Q5_0 parts, alone or beside Q8_0 ones), or `None`
/// when they are read as they are or converted lossily (`conversion`).
pub fn widening(parts: &[GgmlType], to: GgmlType) -> Option<String> {
    if parts.iter().all(|&t| t == to) || !parts.iter().all(|&t| exact_as(t, to)) {
        return None;
    }
    let names: Vec<&str> = parts.iter().map(|t| t.name()).collect();
    let why = match parts.iter().find(|&&t| WType::of(t).is_none()) {
        Some(t) => format!("no matmul kernel reads {} weights", t.name()),
        None => "the fused parts' types differ and one kernel reads them".to_string(),
    };
    Some(format!(
        "({}) -> {} planes, exact (block scales kept, quants re-centred into int8; {} B per 32 weights): {why}",
        names.join(", "),
        to.name(),
        to.type_size(),
    ))
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

/// Bytes of `n` rows of `k` elements of type `t` as GGUF stores them.
pub fn gguf_bytes(t: GgmlType, n: usize, k: usize) -> u64 {
    (n * (k / t.block_size()) * t.type_size()) as u64
}

/// The device layouts each projection's matrices are uploaded in (the
/// union over every launch the forward plan makes of that projection).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProjLayouts {
    by_proj: [Layouts; 6],
    /// The tied head reads `token_embd`'s GGUF bytes, the embedding
    /// table's device copy: no copy of its own.
    pub head_native: bool,
    /// The type the head's own copy is read as (`model_dims::head_type`,
    /// which a profile's `head_convert` may set apart from the file's);
    /// `None`: `device_type` of the table's file type.
    pub head_type: Option<WType>,
    /// The embedding gather reads the head's Q6_K planes: no GGUF copy of
    /// the token table is uploaded (`model_dims::embed_on_head_planes`).
    pub embd_on_head: bool,
    /// MoE layers: the layouts the expert stacks are read in (gate|up and
    /// down; `moe_gemv`'s `LAYOUT`).
    pub experts_gate_up: Layouts,
    pub experts_down: Layouts,
}

impl ProjLayouts {
    pub fn get(&self, p: Proj) -> Layouts {
        self.by_proj[p as usize]
    }
    pub fn get_mut(&mut self, p: Proj) -> &mut Layouts {
        &mut self.by_proj[p as usize]
    }
}

/// Bytes one `[n][k]` matrix of device type `wt` takes on the device in
/// `layouts` (the fit check before any allocation): what
/// `HostCopies::bytes` gives for the same matrix.
pub fn planned_bytes(wt: WType, n: usize, k: usize, layouts: Layouts) -> u64 {
    let stride = |l: WeightLayout| layout_binding(l).row_strides(wt, k);
    let mut b = 0usize;
    if wt.is_16bit() {
        if layouts.planes() || layouts.blocks {
            b += n * wt.row_bytes(k);
        }
    } else {
        if layouts.planes() {
            b += n * stride(PLANES_F16).0;
        }
        if layouts.planes_f16 {
            b += n * stride(PLANES_F16).1;
        }
        if layouts.planes_f32 {
            b += n * stride(PLANES_F32).1;
        }
        if layouts.blocks {
            b += n * wt.row_bytes(k);
        }
    }
    if layouts.bf16 {
        b += n * k * 2;
    }
    b as u64
}

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
fn device_blocks(model: &Model, parts: &[&MatRef], wt: WType) -> Result<Vec<u8>, GpuError> {
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

/// The router types `moe_route` reads as GGUF stores them; any other is
/// converted to Q8_0 at load.
pub const ROUTER_TYPES: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Bf16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
];

/// The device type of a router stored as `t`.
pub fn router_type(t: GgmlType) -> GgmlType {
    if ROUTER_TYPES.contains(&t) {
        t
    } else {
        GgmlType::Q8_0
    }
}

/// The type the tied head's own copy is uploaded in: the planned head type
/// (`ProjLayouts::head_type`), else `device_type` of the table's file type
/// `file`. The head's launches were planned for this type, so the upload
/// must not decide another.
pub fn head_copy_type(lay: &ProjLayouts, file: GgmlType) -> WType {
    lay.head_type.unwrap_or_else(|| device_type(&[file]))
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
    let types: Vec<GgmlType> = parts.iter().map(|p| p.ty).collect();
    upload_matrix_as(gpu, model, name, parts, device_type(&types), layouts)
}

/// `upload_matrix` read as `wt` (converted at load when the file's type
/// differs: the tied head under a profile's `head_convert`).
pub fn upload_matrix_as(
    gpu: &Gpu,
    model: &Model,
    name: &str,
    parts: &[&MatRef],
    wt: WType,
    layouts: Layouts,
) -> Result<GpuMatrix, GpuError> {
    let k = parts[0].n_in;
    if parts.iter().any(|p| p.n_in != k) || k % 32 != 0 {
        return Err(GpuError::Other(format!(
            "{name}: the fused matrices need one input width that is a multiple of 32"
        )));
    }
    let n: usize = parts.iter().map(|p| p.n_out).sum();
    let gguf = device_blocks(model, parts, wt)?;
    upload_blocks(gpu, name, wt, &gguf, (n, k), layouts)
}

/// Uploads an `[n][k]` matrix of device type `wt`, given as GGUF blocks,
/// in `layouts` (the copies `HostCopies::build` makes).
fn upload_blocks(
    gpu: &Gpu,
    name: &str,
    wt: WType,
    gguf: &[u8],
    (n, k): (usize, usize),
    layouts: Layouts,
) -> Result<GpuMatrix, GpuError> {
    let c = HostCopies::build(wt, gguf, n, k, layouts)
        .map_err(|e| GpuError::Other(format!("{name}: {e}")))?;
    // The fit check counted `planned_bytes`; the copies are those bytes.
    debug_assert_eq!(c.bytes(), planned_bytes(wt, n, k, layouts), "{name}");
    let up = |v: Option<Vec<u8>>| v.map(|v| gpu.upload(&v)).transpose();
    Ok(GpuMatrix {
        name: name.to_string(),
        n,
        k,
        wtype: wt,
        q: up(c.q)?,
        d16: up(c.d16)?,
        d32: up(c.d32)?,
        blocks: up(c.blocks)?.map(Arc::new),
        blocks_shared: false,
        bf16: c.bf16.map(|v| gpu.upload(&v)).transpose()?,
    })
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
    /// Q | K | V (K-shared layers: Q only; k_eq_v layers: Q | K), in the
    /// runs of `fused_runs` (one unless the parts' types differ).
    pub qkv: Vec<GpuMatrix>,
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
    /// The mixture-of-experts block (26B-A4B).
    pub moe: Option<MoeLayerWeights>,
}

/// The device weights of a MoE layer's expert block.
pub struct MoeLayerWeights {
    /// `ffn_gate_inp` as GGUF stores it (`model_dims::router_type`).
    pub router: DeviceBuffer,
    /// f32 `[d]`: `ffn_gate_inp.scale * d^-1/2`, the weight of the router
    /// input's norm.
    pub router_norm: DeviceBuffer,
    /// f32 `[E]`: `ffn_down_exps.scale`.
    pub expert_scale: DeviceBuffer,
    /// Every expert's gate then up rows, `E * 2 * ffn` rows of `d`.
    pub gate_up: GpuMatrix,
    /// `E * d` rows of `ffn`.
    pub down: GpuMatrix,
    pub pre_norm_2: DeviceBuffer,
    pub post_norm_1: DeviceBuffer,
    pub post_norm_2: DeviceBuffer,
}

impl MoeLayerWeights {
    fn bytes(&self) -> u64 {
        self.router.bytes() as u64 + self.gate_up.bytes() + self.down.bytes()
    }
}

/// The expert stacks `parts` (same input width and expert count) as one
/// matrix of device type `wt` in GGUF blocks: for each expert in turn, its
/// rows of every part (gate then up for the fused gate|up), copied when
/// the file's type is `wt`, widened exactly when it can be (`exact_as`),
/// else requantized to Q8_0.
fn expert_blocks(model: &Model, parts: &[&ExpertMats], wt: WType) -> Result<Vec<u8>, GpuError> {
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

/// Uploads an expert stack (`expert_blocks`) in `layouts`.
fn upload_experts(
    gpu: &Gpu,
    model: &Model,
    name: &str,
    parts: &[&ExpertMats],
    layouts: Layouts,
) -> Result<GpuMatrix, GpuError> {
    let k = parts[0].n_in;
    if parts
        .iter()
        .any(|p| p.n_in != k || p.n_experts != parts[0].n_experts)
        || k % 32 != 0
    {
        return Err(GpuError::Other(format!(
            "{name}: the fused expert stacks need one input width (a multiple of 32) and one expert count"
        )));
    }
    let types: Vec<GgmlType> = parts.iter().map(|p| p.ty).collect();
    let wt = device_type(&types);
    let n = parts[0].n_experts * parts.iter().map(|p| p.n_out).sum::<usize>();
    let gguf = expert_blocks(model, parts, wt)?;
    upload_blocks(gpu, name, wt, &gguf, (n, k), layouts)
}

/// Uploads layer `i`'s MoE block.
fn upload_moe(
    gpu: &Gpu,
    model: &Model,
    i: usize,
    mw: &crate::model::MoeWeights,
    lay: &ProjLayouts,
) -> Result<MoeLayerWeights, GpuError> {
    let d = model.config().d_model;
    let rt = router_type(mw.router.ty);
    let router = if rt == mw.router.ty {
        gpu.upload(model.mat_bytes(&mw.router))?
    } else {
        gpu.upload(&device_blocks(model, &[&mw.router], WType::Q8_0)?)?
    };
    let inv_sqrt_d = 1.0f32 / (d as f32).sqrt();
    let router_norm: Vec<f32> = mw.router_scale.iter().map(|&g| g * inv_sqrt_d).collect();
    Ok(MoeLayerWeights {
        router,
        router_norm: gpu.upload(&router_norm)?,
        expert_scale: gpu.upload(&mw.expert_scale)?,
        gate_up: upload_experts(
            gpu,
            model,
            &format!("blk.{i}.ffn_gate_up_exps"),
            &[&mw.gate, &mw.up],
            lay.experts_gate_up,
        )?,
        down: upload_experts(gpu, model, &mw.down.name, &[&mw.down], lay.experts_down)?,
        pre_norm_2: gpu.upload(&mw.experts_pre_norm)?,
        post_norm_1: gpu.upload(&mw.shared_post_norm)?,
        post_norm_2: gpu.upload(&mw.experts_post_norm)?,
    })
}

/// A model's device weights.
pub struct DeviceWeights {
    pub layers: Vec<LayerWeights>,
    /// `token_embd` as GGUF bytes (the embedding gather); `None` when the
    /// gather reads the head's Q6_K planes (`ProjLayouts::embd_on_head`).
    pub embd: Option<GpuTable>,
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

/// Uploads a model's weights in the layouts `lay` names.
pub fn upload(gpu: &Gpu, model: &Model, lay: &ProjLayouts) -> Result<DeviceWeights, GpuError> {
    let cfg = model.config();
    let w = model.weights();
    let mut layers = Vec::with_capacity(cfg.n_layers);
    let f32_buf = |v: &[f32]| gpu.upload(v);
    for (i, lw) in w.layers.iter().enumerate() {
        let up = |name: &str, parts: &[&MatRef], p: Proj| -> Result<GpuMatrix, GpuError> {
            upload_matrix(gpu, model, name, parts, lay.get(p))
        };
        let parts = qkv_parts(lw);
        let types: Vec<GgmlType> = parts.iter().map(|p| p.ty).collect();
        let runs = fused_runs(&types);
        let qkv = runs
            .iter()
            .enumerate()
            .map(|(j, r)| {
                up(
                    &qkv_run_name(i, j, runs.len()),
                    &parts[r.clone()],
                    Proj::Qkv,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
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
            moe: lw
                .moe
                .as_ref()
                .map(|mw| upload_moe(gpu, model, i, mw, lay))
                .transpose()?,
        });
    }
    let embd = if lay.embd_on_head {
        None
    } else {
        Some(upload_table(gpu, model, &w.token_embd, EMBED_TYPES)?)
    };
    let head = if lay.head_native {
        let Some(embd) = &embd else {
            return Err(GpuError::Other(
                "token_embd: the head was planned on the table's bytes and the table on the head's planes".into(),
            ));
        };
        let wt = WType::of(embd.ty).filter(|_| embd.ty == w.token_embd.ty);
        let Some(wt) = wt else {
            return Err(GpuError::Other(format!(
                "token_embd: the head was planned on the table's own bytes, which hold {} (the file's {})",
                embd.ty.name(),
                w.token_embd.ty.name()
            )));
        };
        GpuMatrix::shared_blocks(
            "token_embd (head)",
            w.token_embd.n_out,
            w.token_embd.n_in,
            wt,
            embd.buf.clone(),
        )?
    } else {
        let wt = head_copy_type(lay, w.token_embd.ty);
        upload_matrix_as(
            gpu,
            model,
            "token_embd (head)",
            &[&w.token_embd],
            wt,
            lay.get(Proj::Head),
        )?
    };
    let (ple_table, ple_model_proj, ple_proj_norm) = match &w.ple {
        Some(p) => {
            let mp = upload_matrix(
                gpu,
                model,
                &p.model_proj.name,
                &[&p.model_proj],
                lay.get(Proj::Ple),
            )?;
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
            l.qkv.iter().map(|m| m.bytes()).sum::<u64>()
                + l.o.bytes()
                + l.gate_up.bytes()
                + l.down.bytes()
                + opt(&l.ple_gate)
                + opt(&l.ple_proj)
                + l.moe.as_ref().map_or(0, |m| m.bytes())
        })
        .sum();
    bytes += embd.as_ref().map_or(0, |t| t.buf.bytes() as u64) + head.bytes();
    bytes += ple_table
        .as_ref()
        .map(|t| t.buf.bytes() as u64)
        .unwrap_or(0);
    bytes += opt(&ple_model_proj);
    let bf16_bytes = layers
        .iter()
        .map(|l| {
            l.qkv.iter().map(|m| m.bf16_bytes()).sum::<u64>()
                + l.o.bf16_bytes()
                + l.gate_up.bf16_bytes()
                + l.down.bf16_bytes()
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
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::weights::{fill_tensor, Dist};

    fn every_layout_set() -> Vec<Layouts> {
        (0..16u8)
            .map(|b| Layouts {
                planes_f16: b & 1 != 0,
                planes_f32: b & 2 != 0,
                blocks: b & 4 != 0,
                bf16: b & 8 != 0,
            })
            .collect()
    }

    /// The bytes the fit check plans for a matrix are the bytes its upload
    /// builds, for every weight type and every set of layouts (the legal
    /// ones: Q4_K/Q5_K have no GGUF-block kernel, but the sums hold anyway).
    #[test]
    fn planned_bytes_equal_the_host_copies() {
        let (n, k) = (5usize, 512usize);
        for wt in WType::ALL {
            let mut gguf = vec![0u8; n * wt.row_bytes(k)];
            fill_tensor(
                wt.ggml(),
                &Dist::Symmetric { std: 0.02 },
                n * k,
                7,
                wt as u64,
                &mut gguf,
            )
            .expect("fill");
            for l in every_layout_set() {
                let c = HostCopies::build(wt, &gguf, n, k, l).expect("copies");
                assert_eq!(
                    c.bytes(),
                    planned_bytes(wt, n, k, l),
                    "{} {l:?}",
                    wt.define()
                );
                assert_eq!(c.bytes() == 0, l == Layouts::default(), "{l:?}");
            }
        }
    }

    /// Read in its own type, a matrix takes its file's bytes in the GEMV's
    /// layout (Q6_K: the side records' 6 padding bytes per super-block on
    /// top), and the k-quants' prefill side words and Q8_0/Q4_0's f32
    /// scales come on top when prefill reads them.
    #[test]
    fn native_layouts_take_about_the_file_bytes() {
        let (n, k) = (64usize, 2560usize);
        let gemv = Layouts {
            planes_f16: true,
            ..Default::default()
        };
        for wt in WType::ALL {
            let file = (n * wt.row_bytes(k)) as f64;
            let r = planned_bytes(wt, n, k, gemv) as f64 / file;
            let bound = if wt == WType::Q6K { 216.0 / 210.0 } else { 1.0 };
            assert!(
                (r - bound).abs() < 1e-12,
                "{}: {r} of the file's bytes",
                wt.define()
            );
        }
        assert_eq!(
            planned_bytes(
                WType::Q4K,
                n,
                k,
                Layouts {
                    planes_f16: true,
                    planes_f32: true,
                    ..Default::default()
                }
            ),
            (n * k / 256 * (128 + 16 + 64)) as u64
        );
    }

    #[test]
    fn device_type_keeps_uniform_matmul_types() {
        use GgmlType::*;
        assert_eq!(device_type(&[Q4K, Q4K, Q4K]), WType::Q4K);
        assert_eq!(device_type(&[Bf16]), WType::Bf16);
        assert_eq!(device_type(&[F16, F16]), WType::F16);
        assert_eq!(device_type(&[Q4K, Q4K, Q6K]), WType::Q8_0);
        assert_eq!(device_type(&[F32]), WType::Q8_0);
        assert_eq!(device_type(&[Q5_0]), WType::Q8_0);
        assert!(conversion(&[Q6K], WType::Q6K).is_none());
        let mixed = conversion(&[Q4K, Q4K, Q6K], WType::Q8_0).expect("converted");
        assert!(mixed.contains("differ"), "{mixed}");
        let f32 = conversion(&[F32], WType::Q8_0).expect("converted");
        assert!(f32.contains("no matmul kernel reads f32"), "{f32}");
    }

    /// Q5_0 (and Q4_0 beside Q8_0 or Q5_0) read as Q8_0 is a widening, not
    /// a lossy conversion; a part with no exact Q8_0 form makes the whole
    /// fused matrix a lossy conversion, as before.
    #[test]
    fn q8_0_widenings_are_not_lossy_conversions() {
        use GgmlType::*;
        for parts in [
            &[Q5_0][..],
            &[Q5_0, Q5_0, Q8_0],
            &[Q4_0, Q8_0],
            &[Q5_0, Q4_0],
        ] {
            let wt = device_type(parts);
            assert_eq!(wt, WType::Q8_0, "{parts:?}");
            assert!(conversion(parts, wt).is_none(), "{parts:?}");
            let w = widening(parts, wt.ggml()).expect("widened");
            assert!(w.contains("-> q8_0 planes, exact"), "{w}");
        }
        for parts in [&[Q8_0][..], &[Q4_0], &[Q4K]] {
            assert!(
                widening(parts, device_type(parts).ggml()).is_none(),
                "{parts:?}"
            );
        }
        for parts in [&[Q5_1][..], &[Q4_1], &[Q5_0, Q4K], &[Q5_0, F16], &[F32]] {
            let wt = device_type(parts);
            assert!(widening(parts, wt.ggml()).is_none(), "{parts:?}");
            assert!(conversion(parts, wt).is_some(), "{parts:?}");
        }
        assert!(exact_as(Q5_0, Q8_0) && exact_as(Q6K, Q6K));
        assert!(!exact_as(Q5_0, Q4_0) && !exact_as(Q8_0, Q5_0));
    }
}
