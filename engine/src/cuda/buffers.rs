//! Fixed-address activation buffers, sized once for `ubatch` rows and reused
//! by every layer and call (a captured decode graph bakes their addresses
//! in, so they never move).

use gemtune_kernels::bind::matmul::tail_scratch_bytes;
use gemtune_kernels::bind::moe::{moe_gemm_scratch, MoeGemmScratch};
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
    /// The prefill GEMMs' scale plane of the matrix being multiplied, when
    /// the profile expands it per launch (`scale_expand`; 16 bytes
    /// otherwise).
    pub scale_scratch: DeviceBuffer,
    /// The scratch of the decode GEMVs that run a norm in their last block
    /// (gemv TAIL=1, `bind::matmul::tail_scratch_bytes`): the arrival
    /// counter (a u32, 0 between launches) and the blocks' partial sums,
    /// for a grid of up to one block per output row. The launches sharing
    /// it run one after another on one stream.
    pub tail_scratch: DeviceBuffer,
}

/// Most rows the head runs at once (the GEMV's token limit).
pub const HEAD_ROWS: usize = super::slots::GEMV_MAX_ROWS;

impl Buffers {
    /// Buffers for chunks of `rows` rows (sized by `Buffers::bytes_for`).
    pub fn new(
        gpu: &Gpu,
        cfg: &Gemma4Config,
        vocab: usize,
        rows: usize,
        scratch: Scratch,
    ) -> Result<Buffers, GpuError> {
        let s = Sizes::of(cfg, vocab, rows, scratch);
        let a = |n: usize| gpu.alloc(n);
        Ok(Buffers {
            tokens: a(s.tokens)?,
            pos: a(s.pos)?,
            x: a(s.x)?,
            act: a(s.act)?,
            act_scales: a(s.act_scales)?,
            act16: a(s.act16)?,
            qkv: a(s.qkv)?,
            q: a(s.q)?,
            o: a(s.o)?,
            y: a(s.y)?,
            gu: a(s.gu)?,
            h: a(s.h)?,
            ple_proj: a(s.ple_proj)?,
            ple: a(s.ple)?,
            pg: a(s.pg)?,
            logits: a(s.logits)?,
            attn_scratch: a(s.attn_scratch)?,
            scale_scratch: a(s.scale_scratch)?,
            tail_scratch: gpu.upload(&vec![0u32; s.tail_scratch / 4])?,
        })
    }

    /// Bytes `new` allocates for these sizes (the fit check before any
    /// allocation).
    pub fn bytes_for(cfg: &Gemma4Config, vocab: usize, rows: usize, scratch: Scratch) -> u64 {
        Sizes::of(cfg, vocab, rows, scratch).total()
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
            &self.scale_scratch,
            &self.tail_scratch,
        ]
        .iter()
        .map(|b| b.bytes() as u64)
        .sum()
    }
}

/// Bytes of every buffer: the one sizing `new` and `bytes_for` share, from
/// the model's activation widths (`Gemma4Config::act_widths`).
struct Sizes {
    tokens: usize,
    pos: usize,
    x: usize,
    act: usize,
    act_scales: usize,
    act16: usize,
    qkv: usize,
    q: usize,
    o: usize,
    y: usize,
    gu: usize,
    h: usize,
    ple_proj: usize,
    ple: usize,
    pg: usize,
    logits: usize,
    attn_scratch: usize,
    scale_scratch: usize,
    tail_scratch: usize,
}

/// The scratch buffers the plan sizes (bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Scratch {
    /// Split-KV partials (`forward_plan::attn_scratch_bytes`).
    pub attn: usize,
    /// The largest expanded GEMM scale plane
    /// (`forward_plan::scale_scratch_bytes`).
    pub scales: usize,
}

impl Sizes {
    fn of(cfg: &Gemma4Config, vocab: usize, rows: usize, scratch: Scratch) -> Sizes {
        let w = cfg.act_widths();
        let widest = w.widest_input();
        let f = |n: usize| 4 * n.max(1);
        Sizes {
            tokens: f(rows),
            pos: f(4),
            x: f(rows * w.d),
            // Any activation format's main plane: at most 4 bytes a value
            // (f32; Q8_1 1, split Q8 records 2.5, DQ 2).
            act: f(rows * widest),
            act_scales: (rows * widest.div_ceil(32) * 8).max(1),
            act16: (rows * widest * 2).max(1),
            qkv: f(rows * w.qkv),
            q: f(rows * w.q),
            o: f(rows * w.q),
            y: f(rows * w.d),
            gu: f(rows * 2 * w.ffn),
            h: f(rows * w.ffn),
            ple_proj: f(rows * w.ple_all),
            ple: f(rows * w.ple_all),
            pg: f(rows * w.ple),
            logits: f(HEAD_ROWS * vocab),
            attn_scratch: scratch.attn.max(16),
            scale_scratch: scratch.scales.max(16),
            tail_scratch: tail_scratch_bytes(w.d, HEAD_ROWS),
        }
    }
    fn total(&self) -> u64 {
        [
            self.tokens,
            self.pos,
            self.x,
            self.act,
            self.act_scales,
            self.act16,
            self.qkv,
            self.q,
            self.o,
            self.y,
            self.gu,
            self.h,
            self.ple_proj,
            self.ple,
            self.pg,
            self.logits,
            self.attn_scratch,
            self.scale_scratch,
            self.tail_scratch,
        ]
        .iter()
        .map(|&b| b as u64)
        .sum()
    }
}

/// The MoE block's buffers, sized for chunks of `rows` rows.
pub struct MoeBuffers {
    /// The router input, f32 `[rows][d]`.
    pub z: DeviceBuffer,
    /// The experts' input `a2`, f32 `[rows][d]`.
    pub a2: DeviceBuffer,
    /// The experts' weighted sum, f32 `[rows][d]`.
    pub e: DeviceBuffer,
    /// Router logits, f32 `[rows][E]`.
    pub logits: DeviceBuffer,
    /// Each row's chosen experts and weights, i32 / f32 `[rows][K]`.
    pub ids: DeviceBuffer,
    pub weights: DeviceBuffer,
    /// `gelu(gate x) * up x` per (row, slot) pair, f32 `[pairs][ffn]`: a
    /// group's 8 * K pairs, or a chunk's `rows * K` when the grouped GEMMs
    /// run.
    pub h: DeviceBuffer,
    /// `moe_route`'s completion counters, one per group of 8 rows (zero
    /// between launches).
    pub counter: DeviceBuffer,
    /// The grouped GEMMs' scratch (`bind::moe::moe_gemm_scratch`), when a
    /// bucket plans them.
    pub grouped: Option<MoeGemmBuffers>,
}

/// The sort and per-pair outputs of `moe_gemm`.
pub struct MoeGemmBuffers {
    pub counts: DeviceBuffer,
    pub offsets: DeviceBuffer,
    pub sorted: DeviceBuffer,
    pub tiles: DeviceBuffer,
    /// Each pair's down projection, f32 `[rows * K][d]`.
    pub yp: DeviceBuffer,
}

/// Byte sizes of `MoeBuffers` for `rows` rows, and of `MoeGemmBuffers`
/// when the grouped GEMMs run with `bm`-row tiles.
fn sizes(
    cfg: &Gemma4Config,
    rows: usize,
    grouped_bm: Option<usize>,
) -> Option<([usize; 8], Option<MoeGemmScratch>)> {
    let m = cfg.moe.as_ref()?;
    let (d, e, k, fe) = (cfg.d_model, m.n_experts, m.n_experts_used, m.expert_ffn_dim);
    let rows = rows.max(1);
    let g = super::slots::GEMV_MAX_ROWS;
    let grouped = grouped_bm.map(|bm| moe_gemm_scratch(rows, k, e, d, fe, bm));
    let h = grouped.map_or(0, |s| s.h).max(4 * g * k * fe);
    Some((
        [
            4 * rows * d,
            4 * rows * d,
            4 * rows * d,
            4 * rows * e,
            4 * rows * k,
            4 * rows * k,
            h,
            4 * (rows / g + 1),
        ],
        grouped,
    ))
}

impl MoeBuffers {
    /// The buffers of a MoE model (`None` for a dense one); `grouped_bm`:
    /// the tile rows of the grouped GEMMs when the plan runs them.
    pub fn new(
        gpu: &Gpu,
        cfg: &Gemma4Config,
        rows: usize,
        grouped_bm: Option<usize>,
    ) -> Result<Option<MoeBuffers>, GpuError> {
        let Some((s, grouped)) = sizes(cfg, rows, grouped_bm) else {
            return Ok(None);
        };
        let a = |n: usize| gpu.alloc(n.max(16));
        let grouped = match grouped {
            Some(g) => Some(MoeGemmBuffers {
                counts: a(g.counts)?,
                offsets: a(g.offsets)?,
                sorted: a(g.sorted)?,
                tiles: a(g.tiles)?,
                yp: a(g.yp)?,
            }),
            None => None,
        };
        Ok(Some(MoeBuffers {
            z: a(s[0])?,
            a2: a(s[1])?,
            e: a(s[2])?,
            logits: a(s[3])?,
            ids: a(s[4])?,
            weights: a(s[5])?,
            h: a(s[6])?,
            counter: gpu.upload(&vec![0u32; s[7] / 4])?,
            grouped,
        }))
    }

    /// Bytes `new` allocates (the fit check).
    pub fn bytes_for(cfg: &Gemma4Config, rows: usize, grouped_bm: Option<usize>) -> u64 {
        sizes(cfg, rows, grouped_bm).map_or(0, |(s, g)| {
            let scratch = g.map_or(0, |g| g.total() - g.h);
            (s.iter().sum::<usize>() + scratch) as u64
        })
    }
}
