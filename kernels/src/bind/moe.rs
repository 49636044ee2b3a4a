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
    /// One u32, zero before the first launch (the kernel leaves it zero).
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
