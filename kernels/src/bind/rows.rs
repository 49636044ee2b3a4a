//! Calling convention of the row-wise families (`rmsnorm`, `qk_norm_rope`,
//! `gelu_mul`, `embed`, `ple`, `softcap`, `act_convert`): see
//! `docs/calling-convention.md`.

use super::{i32_arg, ptr, Act, DevPtr};
use crate::gpu::KArg;

/// `rmsnorm(h, y, w_add, scale, w_out, out, out_scales, y2, w_y, w_y2,
/// out2, w_out2, out3, w_out3, rows, width, eps)`.
#[derive(Clone, Copy, Debug)]
pub struct RmsNormArgs {
    pub h: DevPtr,
    pub y: DevPtr,
    pub w_add: DevPtr,
    pub scale: DevPtr,
    pub w_out: DevPtr,
    pub out: Act,
    /// The mixture-of-experts operands (SUM_IN, OUTS=3); all NULL otherwise.
    pub moe: RmsNormMoe,
    pub rows: usize,
    pub width: usize,
    pub eps: f32,
}

/// The operands of rmsnorm's mixture-of-experts modes: with SUM_IN the
/// addend is `rmsnorm(y) * w_y + rmsnorm(y2) * w_y2`; with OUTS=3 the
/// normalized h is also written times `w_out2` to `out2` and times
/// `w_out3` to `out3` (f32; NULL skips one).
#[derive(Clone, Copy, Debug, Default)]
pub struct RmsNormMoe {
    pub y2: DevPtr,
    pub w_y: DevPtr,
    pub w_y2: DevPtr,
    pub out2: DevPtr,
    pub w_out2: DevPtr,
    pub out3: DevPtr,
    pub w_out3: DevPtr,
}

impl RmsNormArgs {
    pub fn kargs(&self) -> Vec<KArg> {
        vec![
            ptr(self.h),
            ptr(self.y),
            ptr(self.w_add),
            ptr(self.scale),
            ptr(self.w_out),
            ptr(self.out.data),
            ptr(self.out.scales),
            ptr(self.moe.y2),
            ptr(self.moe.w_y),
            ptr(self.moe.w_y2),
            ptr(self.moe.out2),
            ptr(self.moe.w_out2),
            ptr(self.moe.out3),
            ptr(self.moe.w_out3),
            i32_arg(self.rows),
            i32_arg(self.width),
            KArg::F32(self.eps),
        ]
    }
}

/// `qk_norm_rope(q_in, q_stride, k_in, k_stride, v_in, v_stride, q_norm,
/// k_norm, inv_freq, pos0, q_out, k_cache, v_cache, capacity, rows,
/// n_heads, n_kv_heads, eps)`.
#[derive(Clone, Copy, Debug)]
pub struct QkNormRopeArgs {
    pub q_in: DevPtr,
    pub q_stride: usize,
    pub k_in: DevPtr,
    pub k_stride: usize,
    pub v_in: DevPtr,
    pub v_stride: usize,
    pub q_norm: DevPtr,
    pub k_norm: DevPtr,
    pub inv_freq: DevPtr,
    pub pos0: DevPtr,
    pub q_out: DevPtr,
    pub k_cache: DevPtr,
    pub v_cache: DevPtr,
    pub capacity: usize,
    pub rows: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub eps: f32,
}

impl QkNormRopeArgs {
    pub fn kargs(&self) -> Vec<KArg> {
        vec![
            ptr(self.q_in),
            i32_arg(self.q_stride),
            ptr(self.k_in),
            i32_arg(self.k_stride),
            ptr(self.v_in),
            i32_arg(self.v_stride),
            ptr(self.q_norm),
            ptr(self.k_norm),
            ptr(self.inv_freq),
            ptr(self.pos0),
            ptr(self.q_out),
            ptr(self.k_cache),
            ptr(self.v_cache),
            i32_arg(self.capacity),
            i32_arg(self.rows),
            i32_arg(self.n_heads),
            i32_arg(self.n_kv_heads),
            KArg::F32(self.eps),
        ]
    }
}

/// `gelu_mul(g, g_stride, u, u_stride, out, out_scales, rows, width)`.
#[derive(Clone, Copy, Debug)]
pub struct GeluMulArgs {
    pub g: DevPtr,
    pub g_stride: usize,
    pub u: DevPtr,
    pub u_stride: usize,
    pub out: Act,
    pub rows: usize,
    pub width: usize,
}

impl GeluMulArgs {
    pub fn kargs(&self) -> Vec<KArg> {
        vec![
            ptr(self.g),
            i32_arg(self.g_stride),
            ptr(self.u),
            i32_arg(self.u_stride),
            ptr(self.out.data),
            ptr(self.out.scales),
            i32_arg(self.rows),
            i32_arg(self.width),
        ]
    }
}

/// `embed(tokens, table, side, out, rows, width, scale)`. With LAYOUT=0
/// `table` holds GGUF rows and `side` is unused (`NULL`); with LAYOUT=1
/// (Q6_K) they are the nibble plane and the GEMV side records of the plane
/// repack.
#[derive(Clone, Copy, Debug)]
pub struct EmbedArgs {
    pub tokens: DevPtr,
    pub table: DevPtr,
    pub side: DevPtr,
    pub out: DevPtr,
    pub rows: usize,
    pub width: usize,
    pub scale: f32,
}

impl EmbedArgs {
    pub fn kargs(&self) -> Vec<KArg> {
        vec![
            ptr(self.tokens),
            ptr(self.table),
            ptr(self.side),
            ptr(self.out),
            i32_arg(self.rows),
            i32_arg(self.width),
            KArg::F32(self.scale),
        ]
    }
}

/// `ple(tokens, table, proj, proj_norm, out, rows, n_layers, ple_dim,
/// proj_scale, tok_scale, eps)`.
#[derive(Clone, Copy, Debug)]
pub struct PleArgs {
    pub tokens: DevPtr,
    pub table: DevPtr,
    pub proj: DevPtr,
    pub proj_norm: DevPtr,
    pub out: DevPtr,
    pub rows: usize,
    pub n_layers: usize,
    pub ple_dim: usize,
    pub proj_scale: f32,
    pub tok_scale: f32,
    pub eps: f32,
}

impl PleArgs {
    pub fn kargs(&self) -> Vec<KArg> {
        vec![
            ptr(self.tokens),
            ptr(self.table),
            ptr(self.proj),
            ptr(self.proj_norm),
            ptr(self.out),
            i32_arg(self.rows),
            i32_arg(self.n_layers),
            i32_arg(self.ple_dim),
            KArg::F32(self.proj_scale),
            KArg::F32(self.tok_scale),
            KArg::F32(self.eps),
        ]
    }
}

/// `softcap(x, rows, width, cap)`.
#[derive(Clone, Copy, Debug)]
pub struct SoftcapArgs {
    pub x: DevPtr,
    pub rows: usize,
    pub width: usize,
    pub cap: f32,
}

impl SoftcapArgs {
    pub fn kargs(&self) -> Vec<KArg> {
        vec![
            ptr(self.x),
            i32_arg(self.rows),
            i32_arg(self.width),
            KArg::F32(self.cap),
        ]
    }
}

/// `act_convert(x, out, n)`: `n` f32 values of `x` to f16 or bf16 (`DQ_TYPE`)
/// in `out`, in order (the cuBLAS arm's operand).
#[derive(Clone, Copy, Debug)]
pub struct ActConvertArgs {
    pub x: DevPtr,
    pub out: DevPtr,
    pub n: usize,
}

impl ActConvertArgs {
    pub fn kargs(&self) -> Vec<KArg> {
        vec![ptr(self.x), ptr(self.out), KArg::U64(self.n as u64)]
    }
}

/// `scale_expand(src, dst, groups)`: the GEMV's scale plane of a matrix of
/// `groups` 32-element groups in, the prefill GEMMs' plane out.
pub struct ScaleExpandArgs {
    pub src: DevPtr,
    pub dst: DevPtr,
    pub groups: usize,
}

impl ScaleExpandArgs {
    pub fn kargs(&self) -> Vec<KArg> {
        vec![ptr(self.src), ptr(self.dst), KArg::U64(self.groups as u64)]
    }
}
