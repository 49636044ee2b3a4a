//! Fixed-address activation buffers, sized once for `ubatch` rows and reused
//! by every layer and call (a captured decode graph bakes their addresses
//! in, so they never move).

use gemtune_kernels::gpu::{DeviceBuffer, Gpu, GpuError};

use crate::config::Gemma4Config;

/// Every activation buffer of the forward pass.
pub struct Buffers {
    /// Token ids of the call, i32 `[rows]`.
    pub tokens: DeviceBuffer,
    /// `[0]`: position of the call's first token; `[1]`: position of the
    /// first row carried past the compaction point.
    pub pos: DeviceBuffer,
    /// Residual stream, f32 `[rows][d]`.
    pub x: DeviceBuffer,
    /// The next GEMM's input in its activation format (main plane).
    pub act: DeviceBuffer,
    /// Its Q8_1 scale plane.
    pub act_scales: DeviceBuffer,
    /// bf16 operands of the vendor GEMM arm (`[rows][widest]`).
    pub act16: DeviceBuffer,
    /// Fused Q|K|V projection output, f32 `[rows][qkv]`.
    pub qkv: DeviceBuffer,
    /// Normed, roped queries, f32 `[rows][n_heads * hd]`.
    pub q: DeviceBuffer,
    /// Attention output, f32 `[rows][n_heads * hd]`.
    pub o: DeviceBuffer,
    /// Projection back to d_model (attention output, FFN down, PLE), f32.
    pub y: DeviceBuffer,
    /// Fused gate|up output, f32 `[rows][2 * ffn]`.
    pub gu: DeviceBuffer,
    /// GELU(gate) * up when the down GEMM reads f32, f32 `[rows][ffn]`.
    pub h: DeviceBuffer,
    /// PLE: the model projection, f32 `[rows][L * P]`.
    pub ple_proj: DeviceBuffer,
    /// PLE: per-layer inputs, f32 `[rows][L * P]`.
    pub ple: DeviceBuffer,
    /// PLE: the gate projection, f32 `[rows][P]`.
    pub pg: DeviceBuffer,
    /// Logits of at most 8 rows, f32 `[8][vocab]`.
    pub logits: DeviceBuffer,
    /// Split-KV partials of the decode attention.
    pub attn_scratch: DeviceBuffer,
}

/// Most rows the head runs at once (the GEMV's token limit).
pub const HEAD_ROWS: usize = 8;

impl Buffers {
    pub fn new(
        gpu: &Gpu,
        cfg: &Gemma4Config,
        vocab: usize,
        rows: usize,
        attn_scratch_bytes: usize,
    ) -> Result<Buffers, GpuError> {
        let d = cfg.d_model;
        let qmax = cfg.layers.iter().map(|l| l.q_dim()).max().unwrap_or(0);
        let qkvmax = cfg
            .layers
            .iter()
            .map(|l| l.q_dim() + 2 * l.kv_dim())
            .max()
            .unwrap_or(0);
        let ffmax = cfg.layers.iter().map(|l| l.ffn_dim).max().unwrap_or(0);
        let lp = cfg.n_layers * cfg.ple_dim;
        let widest = d.max(qmax).max(ffmax).max(cfg.ple_dim).max(32);
        let f = |n: usize| gpu.alloc(4 * n.max(1));
        Ok(Buffers {
            tokens: f(rows)?,
            pos: f(4)?,
            x: f(rows * d)?,
            act: f(rows * widest)?,
            act_scales: gpu.alloc(rows * widest.div_ceil(32) * 8)?,
            act16: gpu.alloc(rows * widest * 2)?,
            qkv: f(rows * qkvmax)?,
            q: f(rows * qmax)?,
            o: f(rows * qmax)?,
            y: f(rows * d)?,
            gu: f(rows * 2 * ffmax)?,
            h: f(rows * ffmax)?,
            ple_proj: f(rows * lp)?,
            ple: f(rows * lp)?,
            pg: f(rows * cfg.ple_dim)?,
            logits: f(HEAD_ROWS * vocab)?,
            attn_scratch: gpu.alloc(attn_scratch_bytes.max(16))?,
        })
    }

    pub fn bytes(&self) -> u64 {
        [
            &self.tokens,
            &self.pos,
            &self.x,
            &self.act,
            &self.act_scales,
            &self.act16,
            &self.qkv,
            &self.q,
            &self.o,
            &self.y,
            &self.gu,
            &self.h,
            &self.ple_proj,
            &self.ple,
            &self.pg,
            &self.logits,
            &self.attn_scratch,
        ]
        .iter()
        .map(|b| b.bytes() as u64)
        .sum()
    }
}
