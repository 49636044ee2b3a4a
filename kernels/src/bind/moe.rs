//! Calling convention of the mixture-of-experts families (`moe_route`,
//! `moe_gemv`, `moe_gemm`): see `docs/calling-convention.md`.
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
        side: false,
        out: super::ActFormat::F32,
        tail: crate::bind::matmul::TailMode::None,
    })
}

// ---- moe_gemm: the prefill experts (kernels/cuda/moe_gemm.cu) -------------
//
// A prefill chunk's MoE FFN after `moe_route`'s ids and weights is four
// launches of `moe_gemm`, one variant per `STAGE`: GROUP (pairs sorted by
// expert and the tile table), GATE_UP (`h`), DOWN (`yp`), COMBINE (`y`).
// Each reads what the one before wrote in device memory, so the chain
// replays in a CUDA graph with no host round trip; no scratch buffer needs
// clearing between launches. The launch geometry of each stage is
// `MoeGemm::validate` (`families::moe_gemm`) for the variant's defines and
// a `MoeProblem` of the chunk; the tile table is built for the GEMM stages'
// BM (the `bm` argument of GROUP must equal the BM define of GATE_UP and
// DOWN).

/// Tiles a GEMM stage's grid.y holds for `pairs = tokens * n_used` pairs
/// over `n_experts` experts with `bm` rows per tile: every expert's pairs
/// cut into `ceil(count / bm)` tiles is at most `ceil(pairs / bm) + E`.
pub fn moe_gemm_max_tiles(pairs: usize, n_experts: usize, bm: usize) -> usize {
    pairs.div_ceil(bm.max(1)) + n_experts
}

/// The device buffers a `moe_gemm` chain needs besides its inputs (ids,
/// weights, x, the expert tensors) and its output y, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeGemmScratch {
    /// i32 [E] pairs per expert.
    pub counts: usize,
    /// i32 [E + 1] first sorted row of each expert, then the valid pairs.
    pub offsets: usize,
    /// i32 [T*K] pairs sorted by expert.
    pub sorted: usize,
    /// int2 [moe_gemm_max_tiles] (expert, first sorted row).
    pub tiles: usize,
    /// f32 [T*K][ffn] GATE_UP's output, DOWN's input.
    pub h: usize,
    /// f32 [T*K][d] DOWN's output, COMBINE's input.
    pub yp: usize,
}

impl MoeGemmScratch {
    pub fn total(&self) -> usize {
        self.counts + self.offsets + self.sorted + self.tiles + self.h + self.yp
    }
}

/// Scratch sizes for `tokens` tokens of `n_used` experts each over
/// `n_experts` experts of `d` x `ffn`, with the GEMM stages' `bm`.
pub fn moe_gemm_scratch(
    tokens: usize,
    n_used: usize,
    n_experts: usize,
    d: usize,
    ffn: usize,
    bm: usize,
) -> MoeGemmScratch {
    let pairs = tokens * n_used;
    MoeGemmScratch {
        counts: 4 * n_experts,
        offsets: 4 * (n_experts + 1),
        sorted: 4 * pairs,
        tiles: 8 * moe_gemm_max_tiles(pairs, n_experts, bm),
        h: 4 * pairs * ffn,
        yp: 4 * pairs * d,
    }
}

/// `moe_gemm_group(ids, counts, offsets, sorted, tiles, n_tokens,
/// n_experts, n_used, bm)`: grid (1, 1, 1), 1024 threads.
#[derive(Clone, Copy, Debug)]
pub struct MoeGroupArgs {
    /// i32 [T][K] from `moe_route` (ids outside 0..E-1: skipped pairs).
    pub ids: DevPtr,
    /// Outputs: i32 [E], i32 [E + 1], i32 [T*K], int2 [max tiles].
    pub counts: DevPtr,
    pub offsets: DevPtr,
    pub sorted: DevPtr,
    pub tiles: DevPtr,
    pub n_tokens: usize,
    pub n_experts: usize,
    pub n_used: usize,
    /// The GEMM stages' BM.
    pub bm: usize,
}

impl MoeGroupArgs {
    pub fn kargs(&self) -> Vec<KArg> {
        vec![
            ptr(self.ids),
            ptr(self.counts),
            ptr(self.offsets),
            ptr(self.sorted),
            ptr(self.tiles),
            i32_arg(self.n_tokens),
            i32_arg(self.n_experts),
            i32_arg(self.n_used),
            i32_arg(self.bm),
        ]
    }
}

/// `moe_gemm_gate_up(wq, wd, x, sorted, tiles, offsets, h, d, ffn,
/// n_used)`: `h[p] = gelu(gate_e x_t) * (up_e x_t)` for every valid pair
/// `p = t*K + j`; grid (ceil(ffn / (BN/2)), max tiles).
#[derive(Clone, Copy, Debug)]
pub struct MoeGemmGateUpArgs {
    /// The gate_up tensor (`E * 2 * ffn` rows of `d`), LAYOUT 1.
    pub w: ExpertWeights,
    /// f32 [T][d].
    pub x: DevPtr,
    /// GROUP's outputs.
    pub sorted: DevPtr,
    pub tiles: DevPtr,
    pub offsets: DevPtr,
    /// f32 [T*K][ffn] output.
    pub h: DevPtr,
    pub d: usize,
    pub ffn: usize,
    pub n_used: usize,
}

impl MoeGemmGateUpArgs {
    pub fn kargs(&self) -> Vec<KArg> {
        vec![
            ptr(self.w.q),
            ptr(self.w.d),
            ptr(self.x),
            ptr(self.sorted),
            ptr(self.tiles),
            ptr(self.offsets),
            ptr(self.h),
            i32_arg(self.d),
            i32_arg(self.ffn),
            i32_arg(self.n_used),
        ]
    }
}

/// `moe_gemm_down(wq, wd, h, sorted, tiles, offsets, yp, d, ffn)`:
/// `yp[p] = down_e h[p]` for every valid pair; grid (ceil(d / BN), max
/// tiles).
#[derive(Clone, Copy, Debug)]
pub struct MoeGemmDownArgs {
    /// The down tensor (`E * d` rows of `ffn`), LAYOUT 1.
    pub w: ExpertWeights,
    /// f32 [T*K][ffn] from GATE_UP.
    pub h: DevPtr,
    pub sorted: DevPtr,
    pub tiles: DevPtr,
    pub offsets: DevPtr,
    /// f32 [T*K][d] output (unweighted).
    pub yp: DevPtr,
    pub d: usize,
    pub ffn: usize,
}

impl MoeGemmDownArgs {
    pub fn kargs(&self) -> Vec<KArg> {
        vec![
            ptr(self.w.q),
            ptr(self.w.d),
            ptr(self.h),
            ptr(self.sorted),
            ptr(self.tiles),
            ptr(self.offsets),
            ptr(self.yp),
            i32_arg(self.d),
            i32_arg(self.ffn),
        ]
    }
}

/// `moe_gemm_combine(yp, ids, weights, y, n_tokens, d, n_experts,
/// n_used)`: `y[t] = sum_j weights[t][j] * yp[t*K + j]` over the valid
/// slots in slot order; grid (ceil(d / 1024), T), 256 threads.
#[derive(Clone, Copy, Debug)]
pub struct MoeCombineArgs {
    pub yp: DevPtr,
    pub ids: DevPtr,
    pub weights: DevPtr,
    /// f32 [T][d] output.
    pub y: DevPtr,
    pub n_tokens: usize,
    pub d: usize,
    pub n_experts: usize,
    pub n_used: usize,
}

impl MoeCombineArgs {
    pub fn kargs(&self) -> Vec<KArg> {
        vec![
            ptr(self.yp),
            ptr(self.ids),
            ptr(self.weights),
            ptr(self.y),
            i32_arg(self.n_tokens),
            i32_arg(self.d),
            i32_arg(self.n_experts),
            i32_arg(self.n_used),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_sizes_at_the_26b_a4b_chunk() {
        // 2048 tokens x top-8 of 128 experts, d 2816, ffn 704, BM 64.
        let s = moe_gemm_scratch(2048, 8, 128, 2816, 704, 64);
        assert_eq!(moe_gemm_max_tiles(16384, 128, 64), 256 + 128);
        assert_eq!(s.counts, 512);
        assert_eq!(s.offsets, 516);
        assert_eq!(s.sorted, 65536);
        assert_eq!(s.tiles, 8 * 384);
        assert_eq!(s.h, 16384 * 704 * 4);
        assert_eq!(s.yp, 16384 * 2816 * 4);
        assert_eq!(
            s.total(),
            512 + 516 + 65536 + 3072 + 16384 * 704 * 4 + 16384 * 2816 * 4
        );
        // A partial tile per expert at most: 5 pairs, 3 experts, BM 4.
        assert_eq!(moe_gemm_max_tiles(5, 3, 4), 2 + 3);
    }

    #[test]
    fn kargs_follow_the_kernel_signatures() {
        let g = MoeGroupArgs {
            ids: 1,
            counts: 2,
            offsets: 3,
            sorted: 4,
            tiles: 5,
            n_tokens: 6,
            n_experts: 7,
            n_used: 8,
            bm: 9,
        };
        assert_eq!(g.kargs().len(), 9);
        let w = ExpertWeights { q: 1, d: 2 };
        let gu = MoeGemmGateUpArgs {
            w,
            x: 3,
            sorted: 4,
            tiles: 5,
            offsets: 6,
            h: 7,
            d: 8,
            ffn: 9,
            n_used: 10,
        };
        assert_eq!(gu.kargs().len(), 10);
        let dn = MoeGemmDownArgs {
            w,
            h: 3,
            sorted: 4,
            tiles: 5,
            offsets: 6,
            yp: 7,
            d: 8,
            ffn: 9,
        };
        assert_eq!(dn.kargs().len(), 9);
        let c = MoeCombineArgs {
            yp: 1,
            ids: 2,
            weights: 3,
            y: 4,
            n_tokens: 5,
            d: 6,
            n_experts: 7,
            n_used: 8,
        };
        assert_eq!(c.kargs().len(), 8);
    }
}
