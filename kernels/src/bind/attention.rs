//! Calling convention of the attention families (`attn_prefill`,
//! `attn_decode`): see `docs/calling-convention.md`.

use super::{i32_arg, ptr, DevPtr};
use crate::family::AttnProblem;
use crate::gpu::{Gpu, GpuError};
use crate::runtime::Kernel;

/// The buffers and sizes of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttnArgs {
    pub q: DevPtr,
    pub k_cache: DevPtr,
    pub v_cache: DevPtr,
    pub out: DevPtr,
    /// Position of the first query (prefill reads it as a scalar).
    pub pos0_host: usize,
    /// The same position in device memory (decode reads it there).
    pub pos0_dev: DevPtr,
    pub n_q: usize,
    pub capacity: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub window: usize,
    /// Split-KV partials (decode).
    pub scratch: DevPtr,
}

/// Bytes of split-KV partials a decode call of `p` needs.
pub fn decode_scratch_bytes(p: &AttnProblem) -> usize {
    let splits = p.kv_len().div_ceil(256).clamp(1, 64);
    splits * p.n_q * p.n_heads * (p.head_dim + 2) * 4
}

/// Launches the planned attention kernel of `p` with `a`.
pub fn launch(k: &Kernel, gpu: &Gpu, p: &AttnProblem, a: &AttnArgs) -> Result<(), GpuError> {
    let _ = p;
    let args = vec![
        ptr(a.q),
        ptr(a.k_cache),
        ptr(a.v_cache),
        ptr(a.out),
        i32_arg(a.pos0_host),
        i32_arg(a.n_q),
        i32_arg(a.capacity),
        i32_arg(a.n_heads),
        i32_arg(a.n_kv_heads),
        i32_arg(a.window),
        ptr(a.pos0_dev),
        ptr(a.scratch),
    ];
    k.launch(gpu, &args)
}
