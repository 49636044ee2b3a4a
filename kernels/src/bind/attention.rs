//! Calling convention of the attention families (`attn_prefill`,
//! `attn_decode`): see `docs/calling-convention.md`.
//!
//! Both kernels take `(q, k_cache, v_cache, out, pos0, n_q, capacity,
//! n_heads, n_kv_heads, window, pos0_dev, scratch)`. Prefill passes the
//! first query's position as the scalar `pos0` and `pos0_dev = NULL`;
//! decode reads it from `pos0_dev` (so a graph replay sees the current
//! length) and, on tensor cores, writes split-KV partials to `scratch`,
//! which `attn_combine(scratch, out, n_q, n_heads, splits)` then merges.

use super::{i32_arg, ptr, DevPtr};
use crate::device::{LaunchGeometry, LaunchSequence};
use crate::gpu::{Gpu, GpuError, KArg};
use crate::problem::AttnProblem;
use crate::runtime::Kernel;

/// Most KV splits a decode launch uses (grid.z); ATTN_MAX_SPLITS of
/// kernels/cuda/attn_decode.cu.
pub const MAX_SPLITS: usize = 256;

/// The buffers and sizes of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttnArgs {
    pub q: DevPtr,
    pub k_cache: DevPtr,
    pub v_cache: DevPtr,
    pub out: DevPtr,
    /// Position of the first query (prefill reads it as a scalar).
    pub pos0_host: usize,
    /// The same position in device memory (decode reads it there; NULL
    /// for prefill).
    pub pos0_dev: DevPtr,
    pub n_q: usize,
    pub capacity: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    /// Sliding window (0: full causal).
    pub window: usize,
    /// Split-KV partials (decode), or the tile counter (COUNT_TILES).
    pub scratch: DevPtr,
}

impl AttnArgs {
    pub fn kargs(&self) -> Vec<KArg> {
        vec![
            ptr(self.q),
            ptr(self.k_cache),
            ptr(self.v_cache),
            ptr(self.out),
            i32_arg(self.pos0_host),
            i32_arg(self.n_q),
            i32_arg(self.capacity),
            i32_arg(self.n_heads),
            i32_arg(self.n_kv_heads),
            i32_arg(self.window),
            ptr(self.pos0_dev),
            ptr(self.scratch),
        ]
    }
}

/// The combine's parameters after a decode launch with `splits` splits.
pub fn combine_kargs(a: &AttnArgs, splits: usize) -> Vec<KArg> {
    vec![
        ptr(a.scratch),
        ptr(a.out),
        i32_arg(a.n_q),
        i32_arg(a.n_heads),
        i32_arg(splits),
    ]
}

/// Bytes of split-KV partials a decode call of `p` may need (whatever its
/// variant's split count).
pub fn decode_scratch_bytes(p: &AttnProblem) -> usize {
    MAX_SPLITS * p.n_q * p.n_heads * (p.head_dim + 2) * 4
}

/// The combine launch of the decode kernel: one block per (token, head) row
/// and 64 head dims (attn_decode.cu).
pub fn combine_geometry(a: &AttnProblem) -> LaunchGeometry {
    LaunchGeometry {
        kernel: "attn_combine".into(),
        grid: (
            (a.n_q * a.n_heads) as u32,
            a.head_dim.div_ceil(64) as u32,
            1,
        ),
        block: (256, 1, 1),
        dyn_smem: 0,
    }
}

/// Launches a planned attention kernel as its family's `LaunchSequence`
/// says (`Kernel::sequence`, fixed when the kernel was resolved). `Single`
/// (prefill): one plain launch. `Decode`: the kernel is a programmatic
/// dependent of the launch before it (on sm_90 it starts while that grid
/// drains, copies the cache's older keys, and waits for that grid before it
/// reads Q or the step's new keys; kernels/cuda/attn_split.cuh), and with
/// `combine` (every tensor-core decode) the combine of its splits follows
/// as a programmatic dependent too (resident while the splits stream; it
/// reads their partials once `griddepcontrol.wait` says they are
/// complete).
pub fn launch(k: &Kernel, gpu: &Gpu, p: &AttnProblem, a: &AttnArgs) -> Result<(), GpuError> {
    let combine = combine_kernel(k, p)?;
    launch_planned(k, combine.as_ref(), gpu, a)
}

/// The combine entry a decode kernel's sequence asks for, with its geometry
/// for `p` (None for a sequence without one).
pub fn combine_kernel(k: &Kernel, p: &AttnProblem) -> Result<Option<Kernel>, GpuError> {
    match k.sequence() {
        LaunchSequence::Decode { combine: true } => Ok(Some(k.sibling(combine_geometry(p))?)),
        _ => Ok(None),
    }
}

/// `launch` with the combine already resolved (`combine_kernel`, once at
/// load: the engine's forward plan).
pub fn launch_planned(
    k: &Kernel,
    combine: Option<&Kernel>,
    gpu: &Gpu,
    a: &AttnArgs,
) -> Result<(), GpuError> {
    match k.sequence() {
        LaunchSequence::Single => k.launch(gpu, &a.kargs()),
        LaunchSequence::Decode { .. } => {
            k.launch_dependent(gpu, &a.kargs())?;
            if let Some(c) = combine {
                c.launch_dependent(gpu, &combine_kargs(a, k.geo.grid.2.max(1) as usize))?;
            }
            Ok(())
        }
    }
}
