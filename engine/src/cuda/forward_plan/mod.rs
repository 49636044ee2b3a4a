//! The forward plan: every launch of the CUDA forward pass, decided once at
//! load from the profile, the tuned table, the device's limits and the
//! model's shapes.
//!
//! A plan has one `BucketPlan` per row-count bucket: the decode buckets of
//! 1..=8 rows (each exact) and the prefill buckets, whose bounds are the
//! row counts the tuned table distinguishes (`prefill_bounds`), the last
//! one the chunk size (`ubatch`). A chunk of `t` rows runs the bucket with
//! the smallest bound at or above `t`; because the tuned table picks its
//! entry the same way, that is the variant a plan made at `t` itself would
//! choose. Within a prefill bucket only the grids follow `t`
//! (`ForwardPlan::kernels_at`): the family, defines, binding and formats
//! stay as planned.
//!
//! Per layer the bucket lists, in forward order, what `stages` launches:
//! the input norm, the attention block (QKV projection, Q/K norm with RoPE
//! and the cache write, attention, output projection), the residual add
//! with the FFN input norm, the FFN block, the PLE injection and the layer
//! end (the last residual add with the layer scalar and the next layer's
//! input norm). Each projection is a `MatmulPlan` with its binding, the
//! activation format it reads and the pre-pass that produces it.
//!
//! Resolving needs no GPU (`ForwardPlan::resolve`; the CPU tests resolve
//! every committed profile on sm_80/89/90 and compile the result); loading
//! compiles and loads each distinct launch once (`ForwardPlan::load`).
//! After load the engine asks the planner nothing.
//!
//! The parts: `problems` (the sizes and the problem each launch is
//! resolved at), `launch` (a resolved launch and its grid rule), `bucket`
//! (what a bucket runs, stage by stage), `builder` (the resolution in
//! forward order), `moe` (the expert block's launches); this file holds
//! the plan itself, its layouts, loading and description.

use std::collections::BTreeSet;

use gemtune_kernels::defines::canonical;
use gemtune_kernels::family::{Problem, WType};
use gemtune_kernels::gpu::{Gpu, GpuError};
use gemtune_kernels::runtime::{Kernel, KernelCache};

mod bucket;
mod builder;
mod launch;
mod moe;
mod problems;

pub use bucket::{
    AttnPlan, BucketPlan, HeadPlan, LayerPlan, MatmulExec, MatmulPlan, PleInputsPlan, PleLayerPlan,
    PrepassPlan,
};
pub use launch::{Entry, GridRule, LaunchId, PlannedLaunch};
pub use moe::{MoeExperts, MoeGemmPlan, MoeGroupPlan, MoePlan, MOE_GROUP_ROWS};
pub use problems::{
    attn_problem, attn_scratch_bytes, prefill_bounds, rows_problem, scale_scratch_bytes, window,
    Sizing,
};

use super::model_dims::ModelDims;
use super::planner::{Decision, PlanError, Planner};
use super::slots::{Proj, Slot, GEMV_MAX_ROWS};
use super::weights::{self, ProjLayouts, PLANES_F16, PLANES_F32};
use crate::config::Gemma4Config;
use crate::work::RowWork;
use builder::Builder;
#[cfg(test)]
use builder::TAIL_MIN_WARPS;

/// Adds the layouts projection `m`'s launches read. A kernel whose scale
/// plane is expanded per launch reads the GEMV layout's quant and scale
/// planes (the expansion's input), not a resident f32 plane. F16/BF16
/// values are the same bytes in every planes layout (they have no scale
/// plane), so they count as the GEMV's: a 16-bit matrix must not make the
/// quantized matrices of its projection group upload a second scale plane.
fn add_layouts(lay: &mut ProjLayouts, m: &MatmulPlan) {
    let l = lay.get_mut(m.proj);
    if matches!(m.exec, MatmulExec::Vendor { .. }) {
        l.bf16 = true;
    }
    let w16 = WType::of(m.dim.2).is_some_and(|t| t.is_16bit());
    for b in m.bindings() {
        if (m.scales.is_some() || w16) && b.layout == PLANES_F32 {
            l.add(PLANES_F16);
        } else {
            l.add(b.layout);
        }
    }
}

/// Whether the tied head can read the embedding table's device copy (its
/// GGUF bytes) instead of a copy of its own: the head reads the table's
/// type in the file's bytes, which is GGUF blocks in any type, and any
/// kernel layout of F16/BF16 (their values are read as stored).
fn head_shares_table(dims: &ModelDims, head: weights::Layouts) -> bool {
    let Some(wt) = WType::of(dims.head.2) else {
        return false;
    };
    let as_stored = weights::Layouts {
        blocks: true,
        ..Default::default()
    };
    dims.head.2 == dims.embd_type
        && !head.bf16
        && (head == as_stored || (wt.is_16bit() && head != weights::Layouts::default()))
}

/// The whole forward pass, resolved.
pub struct ForwardPlan {
    pub sizing: Sizing,
    pub limits: gemtune_kernels::family::DeviceLimits,
    /// Every distinct launch.
    pub launches: Vec<PlannedLaunch>,
    /// Decode buckets (1..=8 rows) first, then the prefill buckets by bound.
    pub buckets: Vec<BucketPlan>,
    pub layouts: ProjLayouts,
    /// Some slot is served by cuBLAS.
    pub uses_vendor: bool,
    /// The first layer that carries only the rows whose logits are
    /// wanted: `Gemma4Config::compact_from`, or `n_layers` after
    /// `set_row_work(RowWork::Full)`.
    pub compact_from: usize,
    pub profile: String,
    /// Slot resolutions the planner made while building this plan.
    pub lookups: usize,
}

/// Refuses a model with a feature the CUDA stages do not implement. Every
/// Gemma 4 feature has its stages (the 26B-A4B expert block: `cuda::moe`),
/// so only a MoE shape the router and expert kernels cannot hold is
/// refused here.
pub fn refuse_unsupported(cfg: &Gemma4Config) -> Result<(), PlanError> {
    match &cfg.moe {
        Some(moe) if moe.n_experts_used > gemtune_kernels::families::moe_gemv::MAX_USED => {
            Err(PlanError::Unsupported(format!(
                "top-{} routing (the expert kernels hold at most {} experts per token)",
                moe.n_experts_used,
                gemtune_kernels::families::moe_gemv::MAX_USED
            )))
        }
        _ => Ok(()),
    }
}

impl ForwardPlan {
    /// Resolves every launch of every bucket (no GPU work).
    pub fn resolve(
        planner: &Planner,
        cfg: &Gemma4Config,
        dims: &ModelDims,
        sizing: Sizing,
    ) -> Result<ForwardPlan, PlanError> {
        refuse_unsupported(cfg)?;
        let before = planner.lookups();
        let mut b = Builder::new(planner, cfg, sizing);
        let mut rows: Vec<usize> = (1..=GEMV_MAX_ROWS.min(sizing.ubatch)).collect();
        rows.extend(prefill_bounds(planner, sizing.ubatch));
        let mut buckets = Vec::with_capacity(rows.len());
        for r in rows {
            buckets.push(b.bucket(dims, r)?);
        }
        let mut layouts = ProjLayouts::default();
        let mut moe_layouts = (weights::Layouts::default(), weights::Layouts::default());
        let union = |a: weights::Layouts, b: weights::Layouts| weights::Layouts {
            planes_f16: a.planes_f16 || b.planes_f16,
            planes_f32: a.planes_f32 || b.planes_f32,
            blocks: a.blocks || b.blocks,
            bf16: a.bf16 || b.bf16,
        };
        let mut uses_vendor = false;
        for bk in &buckets {
            let mut each = |m: &MatmulPlan| {
                uses_vendor |= matches!(m.exec, MatmulExec::Vendor { .. });
                add_layouts(&mut layouts, m);
            };
            if let Some(p) = &bk.per_layer_inputs {
                each(&p.model_proj);
            }
            for l in &bk.layers {
                for m in &l.qkv {
                    each(m);
                }
                each(&l.o);
                each(&l.gate_up);
                each(&l.down);
                if let Some(p) = &l.ple {
                    each(&p.gate);
                    each(&p.proj);
                }
                if let Some(m) = &l.moe {
                    moe_layouts.0 = union(moe_layouts.0, m.gate_up_layout);
                    moe_layouts.1 = union(moe_layouts.1, m.down_layout);
                }
            }
            if let Some(h) = &bk.head {
                each(&h.matmul);
            }
        }
        layouts.experts_gate_up = moe_layouts.0;
        layouts.experts_down = moe_layouts.1;
        layouts.head_native = head_shares_table(dims, layouts.get(Proj::Head));
        layouts.embd_on_head = dims.embd_on_head;
        layouts.head_type = WType::of(dims.head.2);
        Ok(ForwardPlan {
            sizing,
            limits: planner.limits.clone(),
            launches: b.launches,
            buckets,
            layouts,
            uses_vendor,
            compact_from: cfg.compact_from(),
            profile: planner.profile.name.clone(),
            lookups: planner.lookups() - before,
        })
    }

    /// Sets the first layer that carries only the wanted rows: the
    /// model's (`Gemma4Config::compact_from`, what `resolve` plans) or
    /// none under `RowWork::Full`. Both run on the planned buckets: the
    /// trimmed layers on the one-row bucket, or on the chunk's.
    pub fn set_row_work(&mut self, cfg: &Gemma4Config, row_work: RowWork) {
        self.compact_from = row_work.compact_from(cfg);
    }

    /// The tile rows of the grouped expert GEMMs when some bucket runs
    /// them (every bucket's come from the one `moe_gemm` slot).
    pub fn moe_gemm_bm(&self) -> Option<usize> {
        self.buckets
            .iter()
            .flat_map(|b| &b.layers)
            .filter_map(|l| match l.moe.as_ref().map(|m| &m.experts) {
                Some(MoeExperts::Grouped(g)) => Some(g.bm),
                _ => None,
            })
            .max()
    }

    /// The bucket a chunk of `rows` rows runs (`rows` >= 1 and at most
    /// the chunk size).
    pub fn bucket(&self, rows: usize) -> Option<&BucketPlan> {
        if rows <= GEMV_MAX_ROWS {
            return self.buckets.get(rows.checked_sub(1)?);
        }
        self.buckets[GEMV_MAX_ROWS.min(self.buckets.len())..]
            .iter()
            .find(|b| b.rows >= rows)
    }

    /// Compiles and loads every launch, each distinct (family, defines)
    /// module once.
    pub fn load(&self, gpu: &Gpu, cache: &KernelCache) -> Result<LoadedKernels, PlanError> {
        let mut kernels = Vec::with_capacity(self.launches.len());
        let mut combine = Vec::with_capacity(self.launches.len());
        for l in &self.launches {
            let gpu_err = |err: GpuError| PlanError::Gpu {
                slot: l.slot.name().to_string(),
                err,
            };
            let k = cache
                .kernel(gpu, l.res.family, &l.res.defines, l.res.geo.clone())
                .map_err(gpu_err)?;
            let c = match l.problem {
                Problem::Attention(a) => {
                    gemtune_kernels::bind::attention::combine_kernel(&k, &a).map_err(gpu_err)?
                }
                _ => None,
            };
            kernels.push(k);
            combine.push(c);
        }
        Ok(LoadedKernels { kernels, combine })
    }

    /// The kernels of bucket `b` with their grids for a chunk of `t` rows
    /// (`t` below the bucket's bound; launches outside the bucket keep
    /// their planned geometry).
    pub fn kernels_at(
        &self,
        loaded: &LoadedKernels,
        b: &BucketPlan,
        t: usize,
    ) -> Result<Vec<Kernel>, PlanError> {
        let mut out = loaded.kernels.clone();
        for &id in &b.launches {
            let l = &self.launches[id];
            if l.grid == GridRule::Fixed {
                continue;
            }
            let geo = l.geometry_at(t, self)?;
            out[id] = if geo.kernel == out[id].geo.kernel {
                out[id].with_geometry(geo)
            } else {
                out[id].sibling(geo).map_err(|err| PlanError::Gpu {
                    slot: l.slot.name().to_string(),
                    err,
                })?
            };
        }
        Ok(out)
    }

    /// Every decision, for `run -v`: one per launch.
    pub fn decisions(&self) -> Vec<Decision> {
        self.launches
            .iter()
            .filter(|l| l.entry == Entry::Main)
            .map(|l| Decision {
                slot: l.slot.name().to_string(),
                problem: l.problem.describe(),
                family: l.res.family.name().to_string(),
                defines: canonical(&l.res.defines),
                why: l.res.why.clone(),
            })
            .collect()
    }

    /// The plan as `run -v` prints it: the buckets, then each distinct
    /// (slot, variant) with the bucket rows it serves and why it was
    /// chosen.
    pub fn describe(&self) -> Vec<String> {
        let bounds: Vec<String> = self.buckets.iter().map(|b| b.rows.to_string()).collect();
        let mut v = vec![format!(
            "plan: {} launches over {} row buckets ({}), profile {}; layers from {} carry only the rows whose logits are wanted",
            self.launches.len(),
            self.buckets.len(),
            bounds.join(", "),
            self.profile,
            self.compact_from
        )];
        let mut rows_of: Vec<(String, BTreeSet<usize>)> = Vec::new();
        for b in &self.buckets {
            for &id in &b.launches {
                let l = &self.launches[id];
                if l.entry != Entry::Main {
                    continue;
                }
                let line = format!(
                    "{}: {} {} <- {}",
                    l.slot,
                    l.res.family.name(),
                    canonical(&l.res.defines),
                    l.res.why
                );
                match rows_of.iter_mut().find(|(s, _)| *s == line) {
                    Some((_, r)) => {
                        r.insert(b.rows);
                    }
                    None => rows_of.push((line, BTreeSet::from([b.rows]))),
                }
            }
        }
        rows_of.sort_by_key(|(s, _)| Slot::from_name(s.split(':').next().unwrap_or("")));
        for (line, rows) in rows_of {
            let r: Vec<String> = rows.iter().map(|r| r.to_string()).collect();
            v.push(format!("{line} [rows {}]", r.join(",")));
        }
        v
    }
}

/// The loaded kernel of every launch (`ForwardPlan::launches` order), and
/// the combine that follows a decode attention launch with splits.
pub struct LoadedKernels {
    pub kernels: Vec<Kernel>,
    pub combine: Vec<Option<Kernel>>,
}

#[cfg(test)]
mod tests;
