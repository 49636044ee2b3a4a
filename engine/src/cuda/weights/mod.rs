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
//!
//! The parts: `types` (which type each matrix is read in), `host` (its
//! bytes in each layout before the upload), `upload` (the model on the
//! device); this file holds the layouts, their planned bytes and the
//! device matrix.

use gemtune_kernels::bind::matmul::{
    MatmulBinding, MatmulFamily, Prepass, ScaleType, TailMode, WeightLayout, Weights,
};
use gemtune_kernels::bind::{ActFormat, NULL};
use gemtune_kernels::family::WType;
use gemtune_kernels::gpu::{DeviceBuffer, GpuError};
use std::sync::Arc;

use super::slots::Proj;

mod host;
mod types;
mod upload;

pub use types::{
    conversion, device_type, exact_as, fused_runs, gguf_bytes, head_copy_type, qkv_run_name,
    router_type, table_type, widening, EMBED_TYPES, ROUTER_TYPES,
};
pub use upload::{qkv_parts, upload, DeviceWeights, MoeLayerWeights};

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
        side: false,
        out: ActFormat::F32,
        tail: TailMode::None,
    }
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

#[cfg(test)]
mod tests;
