//! Calling convention of the mixture-of-experts families (`moe_route`,
//! `moe_gemv`): see `docs/calling-convention.md`.
//!
//! A decode step's MoE FFN is three launches: `moe_route` (router logits,
//! top-k, weights), then `moe_gemv` with `STAGE=GATE_UP` (each chosen
//! expert's `gelu(gate x) * up x` per (token, slot)) and `moe_gemv` with
//! `STAGE=DOWN` (the chosen experts' down projections, weighted and summed
//! per token). Each reads the expert ids the router wrote in device memory,
//! so the three replay in a CUDA graph with no host round trip.

use super::{i32_arg, ptr, DevPtr};
use crate::gpu::KArg;

/// `moe_route_nT(w, z, scale, logits, ids, weights, counter, d, n_experts,
/// n_used)`.
#[derive(Clone, Copy, Debug)]
pub struct MoeRouteArgs {
    /// The router, E rows of d as GGUF stores them.
    pub w: DevPtr,
    /// f32 [T][d] router input.
    pub z: DevPtr,
    /// f32 [E] per-expert scales, or NULL.
    pub scale: DevPtr,
    /// f32 [T][E] output.
    pub logits: DevPtr,
    /// i32 [T][K] output.
    pub ids: DevPtr,
    /// f32 [T][K] output.
    pub weights: DevPtr,
    /// One u32 per group of the launch (grid.y), zero before the first
    /// launch (the kernel leaves them zero).
    pub counter: DevPtr,
    pub d: usize,
    pub n_experts: usize,
    pub n_used: usize,
}

impl MoeRouteArgs {
    pub fn kargs(&self) -> Vec<KArg> {
        vec![
            ptr(self.w),
            ptr(self.z),
            ptr(self.scale),
            ptr(self.logits),
            ptr(self.ids),
            ptr(self.weights),
            ptr(self.counter),
            i32_arg(self.d),
            i32_arg(self.n_experts),
            i32_arg(self.n_used),
        ]
    }
}

/// The expert weights of one `moe_gemv` stage: the whole expert tensor as
/// one matrix of `E * rows_per_expert` rows (GGUF blocks in `q` with `d`
/// NULL, or the quant plane in `q` and the scale or side plane in `d`, as
/// `bind::matmul::WeightLayout` says for the variant's `LAYOUT`).
#[derive(Clone, Copy, Debug)]
pub struct ExpertWeights {
    pub q: DevPtr,
    pub d: DevPtr,
}

/// `moe_gemv_gate_up_nT(wq, wd, x, ids, h, count, d, ffn, n_experts,
/// n_used)`: `h[t*K + j] = gelu(gate_e x_t) * (up_e x_t)` for
/// `e = ids[t*K + j]`.
#[derive(Clone, Copy, Debug)]
pub struct MoeGateUpArgs {
    /// The gate_up tensor: `E * 2 * ffn` rows of `d`.
    pub w: ExpertWeights,
    /// f32 [T][d].
    pub x: DevPtr,
    /// i32 [T][K] from `moe_route`.
    pub ids: DevPtr,
    /// f32 [T*K][ffn] output.
    pub h: DevPtr,
    /// u64 [E] byte counters (COUNT_BYTES=1), else NULL.
    pub count: DevPtr,
    pub d: usize,
    pub ffn: usize,
    pub n_experts: usize,
    pub n_used: usize,
}

impl MoeGateUpArgs {
    pub fn kargs(&self) -> Vec<KArg> {
        vec![
            ptr(self.w.q),
            ptr(self.w.d),
            ptr(self.x),
            ptr(self.ids),
            ptr(self.h),
            ptr(self.count),
            i32_arg(self.d),
            i32_arg(self.ffn),
            i32_arg(self.n_experts),
            i32_arg(self.n_used),
        ]
    }
}

/// `moe_gemv_down_nT(wq, wd, h, ids, weights, y, count, d, ffn, n_experts,
/// n_used)`: `y[t] = sum_j weights[t*K + j] * down_e h[t*K + j]`.
#[derive(Clone, Copy, Debug)]
pub struct MoeDownArgs {
    /// The down tensor: `E * d` rows of `ffn`.
    pub w: ExpertWeights,
    /// f32 [T*K][ffn] from the gate_up stage.
    pub h: DevPtr,
    /// i32 [T][K] and f32 [T][K] from `moe_route`.
    pub ids: DevPtr,
    pub weights: DevPtr,
    /// f32 [T][d] output.
    pub y: DevPtr,
    /// u64 [E] byte counters (COUNT_BYTES=1), else NULL.
    pub count: DevPtr,
    pub d: usize,
    pub ffn: usize,
    pub n_experts: usize,
    pub n_used: usize,
}

impl MoeDownArgs {
    pub fn kargs(&self) -> Vec<KArg> {
        vec![
            ptr(self.w.q),
            ptr(self.w.d),
            ptr(self.h),
            ptr(self.ids),
            ptr(self.weights),
            ptr(self.y),
            ptr(self.count),
            i32_arg(self.d),
            i32_arg(self.ffn),
            i32_arg(self.n_experts),
            i32_arg(self.n_used),
        ]
    }
}

/// The layout of a `moe_gemv` variant's expert tensor: the dense GEMV's
/// (`LAYOUT` 0: GGUF blocks, 1: planes with f16 scales or the k-quants'
/// GEMV side records), as a single-matrix f32-activation GEMV binding whose
/// `device_weights` and `row_strides` build and address the whole tensor
/// (`E * rows` rows; expert `e`'s rows start `e * rows` strides in).
pub fn expert_binding(
    d: &crate::defines::Defines,
) -> Result<crate::bind::matmul::MatmulBinding, String> {
    use crate::bind::matmul::{MatmulBinding, MatmulFamily, Prepass, ScaleType, WeightLayout};
    let layout = match crate::defines::get_int(d, "LAYOUT")? {
        0 => WeightLayout::GgufBlocks,
        1 => WeightLayout::Planes {
            scales: ScaleType::F16,
        },
        v => return Err(format!("LAYOUT={v} is not 0 (GGUF blocks) or 1 (planes)")),
    };
    Ok(MatmulBinding {
        family: MatmulFamily::Gemv,
        layout,
        act: super::ActFormat::F32,
        prepass: Prepass::None,
        zero_output: false,
        matrices: 1,
    })
}
