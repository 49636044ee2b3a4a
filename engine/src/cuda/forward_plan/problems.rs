//! The sizes a plan is built for and the problems its launches are
//! resolved at: row buckets, rows-family and attention problems, and the
//! scratch buffers they need.

use std::collections::BTreeSet;

use gemtune_kernels::bind::ActFormat;
use gemtune_kernels::defines::DefineValue;
use gemtune_kernels::families::scale_expand;
use gemtune_kernels::family::{AttnProblem, KvType, Problem, RowsProblem, WType};
use gemtune_kernels::quant::GgmlType;

use super::ForwardPlan;
use crate::config::{AttnKind, Gemma4Config};
use crate::cuda::planner::Planner;
use crate::cuda::slots::{Slot, GEMV_MAX_ROWS};

/// The sizes an engine is built for; they travel together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizing {
    /// Most positions the cache holds.
    pub max_seq: usize,
    /// Most tokens per prefill chunk.
    pub ubatch: usize,
    pub kv_type: KvType,
}

impl Sizing {
    /// Slots of layer `l`'s cache (`Gemma4Config::cache_capacity`).
    pub fn capacity(&self, cfg: &Gemma4Config, l: usize) -> usize {
        cfg.cache_capacity(l, self.max_seq, self.ubatch)
    }
}

/// The prefill buckets' row bounds for chunks of at most `ubatch` rows:
/// every row count above `GEMV_MAX_ROWS` and below `ubatch` at which the
/// tuned table has an entry, then `ubatch`.
pub fn prefill_bounds(planner: &Planner, ubatch: usize) -> Vec<usize> {
    let mut b: BTreeSet<usize> = planner
        .tuned
        .iter()
        .flat_map(|t| t.entries.iter().map(|e| e.m))
        .filter(|&m| m > GEMV_MAX_ROWS && m < ubatch)
        .collect();
    if ubatch > GEMV_MAX_ROWS {
        b.insert(ubatch);
    }
    b.into_iter().collect()
}

/// Bytes of the scale scratch buffer: the largest GEMM scale plane any
/// `scale_expand` launch of the plan writes (0 when none does).
pub fn scale_scratch_bytes(plan: &ForwardPlan) -> usize {
    plan.launches
        .iter()
        .filter(|l| l.slot == Slot::ScaleExpand)
        .filter_map(|l| match l.problem {
            Problem::Matmul(m) => {
                WType::of(m.wtype).map(|wt| scale_expand::dst_bytes(wt, m.n * (m.k / 32)))
            }
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

/// The problem of a rows-family launch.
pub fn rows_problem(rows: usize, width: usize) -> Problem {
    Problem::Rows(RowsProblem {
        rows,
        width,
        dtype: GgmlType::F32,
        aux: 0,
    })
}

/// The bound defines of an `rmsnorm` launch.
pub(super) fn norm_bound(
    out: ActFormat,
    add: bool,
    norm_out: bool,
) -> Vec<(&'static str, DefineValue)> {
    vec![
        ("OUT", DefineValue::Str(out.define().into())),
        ("ADD", DefineValue::Int(add as i64)),
        ("NORM_OUT", DefineValue::Int(norm_out as i64)),
    ]
}

pub(super) fn out_bound(out: ActFormat) -> Vec<(&'static str, DefineValue)> {
    vec![("OUT", DefineValue::Str(out.define().into()))]
}

/// The attention problem a launch of `n_q` queries on layer `l` is planned
/// for: only launch-shaping dimensions. Decode (at most 8 queries) is
/// planned at the largest length the cache reaches, so its fixed grid
/// covers every later call (the kernel reads the true length on device);
/// prefill at position 0, its grid depending on the query count only.
pub fn attn_problem(cfg: &Gemma4Config, l: usize, n_q: usize, s: &Sizing) -> AttnProblem {
    let lc = &cfg.layers[l];
    let cap = s.capacity(cfg, l);
    let decode = n_q <= GEMV_MAX_ROWS;
    AttnProblem {
        n_heads: lc.n_heads,
        n_kv_heads: lc.n_kv_heads,
        head_dim: lc.head_dim,
        window: window(cfg, l),
        q_pos0: if decode {
            s.max_seq.saturating_sub(n_q)
        } else {
            0
        },
        n_q,
        capacity: if decode { cap } else { cap.max(n_q) },
        kv_type: s.kv_type,
    }
}

/// The sliding window of layer `l` (0 on full layers).
pub fn window(cfg: &Gemma4Config, l: usize) -> usize {
    match cfg.layers[l].kind {
        AttnKind::Sliding => cfg.sliding_window,
        AttnKind::Full => 0,
    }
}

/// Bytes of the split-KV partials the decode attention needs at most.
pub fn attn_scratch_bytes(cfg: &Gemma4Config, s: &Sizing) -> usize {
    let s32 = Sizing {
        kv_type: KvType::F32,
        ..*s
    };
    (0..cfg.n_layers)
        .map(|l| {
            gemtune_kernels::bind::attention::decode_scratch_bytes(&attn_problem(
                cfg,
                l,
                GEMV_MAX_ROWS,
                &s32,
            ))
        })
        .max()
        .unwrap_or(0)
}
