//! What a one-token decode step of the CUDA engine reads
//! (`crate::step_bytes::StepReads`), from its forward plan: each
//! projection matrix of the one-row bucket in the layout that bucket's
//! launch reads (GGUF blocks, a quant plane with f16 or f32 scales, or the
//! vendor arm's bf16 copy), the embedding and PLE rows in the types the
//! gather kernels read, and the cache element of the plan's KV type.
//! Resolved without a GPU, like the plan.

use gemtune_kernels::bind::matmul::WeightLayout;
use gemtune_kernels::family::WType;

use super::forward_plan::{ForwardPlan, MatmulExec, MatmulPlan};
use super::model_dims::{MatDim, ModelDims};
use super::weights::{planned_bytes, Layouts};
use crate::config::Gemma4Config;
use crate::step_bytes::{vector_bytes, StepReads};

/// Bytes of an `[n][k]` matrix of device type `t` in `layout`: both of its
/// device buffers (`MatmulBinding::row_strides`: GGUF blocks; a quant
/// plane and f16/f32 scales for Q8_0/Q4_0; the nibble plane and GEMV side
/// records or GEMM side words for the k-quants; F16/BF16 values as stored).
pub fn layout_bytes((n, k, t): MatDim, layout: WeightLayout) -> u64 {
    let Some(wt) = WType::of(t) else {
        return (n * k / t.block_size() * t.type_size()) as u64;
    };
    let mut l = Layouts::default();
    l.add(layout);
    planned_bytes(wt, n, k, l)
}

/// Bytes projection `m` reads at one row: its matrix once, in the layout
/// its launch reads (a row-blocked GEMV runs its one-row block).
pub fn matmul_bytes(m: &MatmulPlan) -> u64 {
    match &m.exec {
        MatmulExec::Kernel { binding, .. } => layout_bytes(m.dim, binding.layout),
        MatmulExec::RowBlocks { blocks } => blocks
            .first()
            .map_or(0, |(_, b)| layout_bytes(m.dim, b.layout)),
        MatmulExec::Vendor { .. } => (m.dim.0 * m.dim.1 * 2) as u64,
    }
}

/// The reads of a decode step of `plan` (made from `dims` for `cfg`);
/// `None` when the plan has no one-row bucket with a head.
pub fn of_plan(plan: &ForwardPlan, cfg: &Gemma4Config, dims: &ModelDims) -> Option<StepReads> {
    let b = plan.bucket(1)?;
    let head = b.head.as_ref()?;
    let mut matrices = matmul_bytes(&head.matmul);
    if let Some(p) = &b.per_layer_inputs {
        matrices += matmul_bytes(&p.model_proj);
    }
    for l in &b.layers {
        matrices += l.qkv.iter().map(matmul_bytes).sum::<u64>();
        matrices += [&l.o, &l.gate_up, &l.down]
            .into_iter()
            .map(matmul_bytes)
            .sum::<u64>();
        if let Some(p) = &l.ple {
            matrices += matmul_bytes(&p.gate) + matmul_bytes(&p.proj);
        }
    }
    // A MoE layer reads its router and the chosen experts' rows of each
    // stack, never the others (`moe_gemv` reads whole experts).
    for (lp, ld) in b.layers.iter().zip(&dims.layers) {
        if let (Some(mp), Some(m)) = (&lp.moe, &ld.moe) {
            let per_expert = |(n, k, t): MatDim, lay: Layouts| {
                lay.only()
                    .map_or(0, |l| layout_bytes((n / m.n_experts, k, t), l))
            };
            matrices += layout_bytes(m.router, WeightLayout::GgufBlocks);
            matrices += m.n_used as u64
                * (per_expert(m.gate_up, mp.gate_up_layout) + per_expert(m.down, mp.down_layout));
        }
    }
    // A table row is whole blocks (the GGUF reader refuses anything else).
    let row = |t: gemtune_kernels::quant::GgmlType, n: usize| {
        (n.div_ceil(t.block_size()) * t.type_size()) as u64
    };
    let mut rows = row(dims.embd_type, cfg.d_model);
    if let Some(t) = dims.ple_type {
        rows += row(t, cfg.n_layers * cfg.ple_dim);
    }
    Some(StepReads {
        matrices,
        rows,
        vectors: vector_bytes(cfg),
        kv_elem: plan.sizing.kv_type.bytes() as u64,
        logits: 4 * dims.vocab as u64,
    })
}
