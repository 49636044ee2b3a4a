//! The mixture-of-experts block's launches (the stage: `cuda::moe`): the
//! router per group size, the chosen experts as `moe_gemv` groups or as
//! `moe_gemm`'s grouped GEMMs, and the layouts the expert stacks are read
//! in. The norms around the block ride on the dense launches
//! (`Builder::bucket`: the attention residual's OUTS=3, the layer end's
//! SUM_IN).

use gemtune_kernels::bind::moe::expert_binding;
use gemtune_kernels::defines::DefineValue;
use gemtune_kernels::family::{MoeProblem, Problem};

use super::{Builder, GridRule, LaunchId};
use crate::cuda::model_dims::MoeDims;
use crate::cuda::planner::PlanError;
use crate::cuda::slots::{Slot, GEMV_MAX_ROWS};
use crate::cuda::weights::{Layouts, PLANES_F16};

/// Most rows one router / expert launch serves (`moe_route`, `moe_gemv`).
pub const MOE_GROUP_ROWS: usize = GEMV_MAX_ROWS;

/// The expert GEMVs of a group of `rows` rows (`moe_gemv`).
#[derive(Clone, Copy, Debug)]
pub struct MoeGroupPlan {
    pub rows: usize,
    pub gate_up: LaunchId,
    pub down: LaunchId,
}

/// The grouped expert GEMMs of a prefill chunk (`moe_gemm`): pairs sorted
/// by expert into BM-row tiles, gate|up with GELU, down, and the weighted
/// sum per row.
#[derive(Clone, Copy, Debug)]
pub struct MoeGemmPlan {
    pub group: LaunchId,
    pub gate_up: LaunchId,
    pub down: LaunchId,
    pub combine: LaunchId,
    /// Rows per tile (the BM of every stage).
    pub bm: usize,
}

/// How a bucket runs the chosen experts.
#[derive(Clone, Debug)]
pub enum MoeExperts {
    /// `moe_gemv` on consecutive groups of at most `MOE_GROUP_ROWS` rows:
    /// one plan per group size a chunk of the bucket's rows is cut into
    /// (a decode bucket: its own row count; a prefill bucket: 8 and every
    /// remainder).
    Groups(Vec<MoeGroupPlan>),
    /// `moe_gemm` over the whole chunk (prefill buckets whose profile
    /// serves `moe_gemm` with that family at the model's shapes).
    Grouped(MoeGemmPlan),
}

/// A MoE layer's expert block at a bucket's rows.
#[derive(Clone, Debug)]
pub struct MoePlan {
    /// `moe_route` per group size (as `MoeExperts::Groups`), the full
    /// groups of a chunk in one launch (grid.y).
    pub routes: Vec<(usize, LaunchId)>,
    pub experts: MoeExperts,
    /// The router runs before the shared MLP, right after the attention
    /// residual (`Profile::moe_route_early`); otherwise after it.
    pub route_early: bool,
    /// The layouts the expert stacks are read in.
    pub gate_up_layout: Layouts,
    pub down_layout: Layouts,
}

impl MoePlan {
    /// The router launch of a group of `rows` rows.
    pub fn route(&self, rows: usize) -> Option<LaunchId> {
        self.routes.iter().find(|r| r.0 == rows).map(|r| r.1)
    }
    /// The expert GEMVs of a group of `rows` rows (`MoeExperts::Groups`).
    pub fn group(&self, rows: usize) -> Option<&MoeGroupPlan> {
        match &self.experts {
            MoeExperts::Groups(g) => g.iter().find(|g| g.rows == rows),
            MoeExperts::Grouped(_) => None,
        }
    }
}

/// The group sizes a chunk of at most `r` rows is cut into.
fn group_sizes(r: usize) -> Vec<usize> {
    if r <= MOE_GROUP_ROWS {
        vec![r]
    } else {
        (1..=MOE_GROUP_ROWS).collect()
    }
}

fn stage(s: &str) -> Vec<(&'static str, DefineValue)> {
    vec![("STAGE", DefineValue::Str(s.into()))]
}

/// A resolved `moe_gemv`'s PRELOAD (absent: 0).
fn preload_of(d: &gemtune_kernels::defines::Defines) -> i64 {
    match d.get("PRELOAD") {
        Some(DefineValue::Int(v)) => *v,
        _ => 0,
    }
}

/// Whether a resolved `moe_gemv` DOWN reads h as the split records a
/// GATE_UP with `H_RECORDS=1` writes (ALGO 3).
fn down_reads_records(d: &gemtune_kernels::defines::Defines) -> bool {
    matches!(d.get("ALGO"), Some(DefineValue::Int(3)))
}

impl Builder<'_> {
    /// The expert block of a MoE layer of shapes `m` at `r` rows.
    pub(super) fn moe(&mut self, m: &MoeDims, r: usize) -> Result<MoePlan, PlanError> {
        let d = self.cfg.d_model;
        let problem = |rows: usize, wtype| {
            Problem::Moe(MoeProblem {
                tokens: rows,
                d_model: d,
                ffn: m.ffn,
                experts: m.n_experts,
                used: m.n_used,
                wtype,
            })
        };
        let route_early = self.planner.profile.moe_route_early;
        let mut routes = Vec::new();
        for n in group_sizes(r) {
            let id = self.push(
                Slot::MoeRoute,
                problem(n, m.router.2),
                vec![],
                GridRule::Fixed,
            )?;
            routes.push((n, id));
        }
        let (mut gate_up_layout, mut down_layout) = (Layouts::default(), Layouts::default());
        let grouped = if self.prefill {
            self.moe_gemm(m, r)?
        } else {
            None
        };
        let experts = match grouped {
            Some(g) => {
                // moe_gemm reads moe_gemv's planes (LAYOUT=1).
                gate_up_layout.add(PLANES_F16);
                down_layout.add(PLANES_F16);
                MoeExperts::Grouped(g)
            }
            None => {
                let mut groups = Vec::new();
                for n in group_sizes(r) {
                    // DOWN first: where it reads h as split records
                    // (ALGO 3), GATE_UP is bound to write them.
                    let down = self.push(
                        Slot::MoeDown,
                        problem(n, m.down.2),
                        stage("DOWN"),
                        GridRule::Fixed,
                    )?;
                    let records = down_reads_records(&self.launches[down].res.defines);
                    let mut bound = stage("GATE_UP");
                    bound.push(("H_RECORDS", DefineValue::Int(i64::from(records))));
                    let gate_up = self
                        .push(
                            Slot::MoeGateUp,
                            problem(n, m.gate_up.2),
                            bound,
                            GridRule::Fixed,
                        )
                        .map_err(|e| {
                            if records {
                                PlanError::slot(
                                    Slot::MoeGateUp,
                                    format!("the down stage reads h as split records (moe_gemv ALGO=3), so gate_up must write them (H_RECORDS=1, WARPS * ROWS a multiple of 32): {e}"),
                                )
                            } else {
                                e
                            }
                        })?;
                    if !route_early && preload_of(&self.launches[gate_up].res.defines) == 2 {
                        return Err(PlanError::slot(
                            Slot::MoeGateUp,
                            "moe_gemv PRELOAD=2 reads the router's ids before the chained launch's wait, which needs a grid between the router and gate|up: the profile must launch the router before the shared MLP (moe_route = \"early\")",
                        ));
                    }
                    for (id, lay) in [(gate_up, &mut gate_up_layout), (down, &mut down_layout)] {
                        let l = &self.launches[id];
                        let b = expert_binding(&l.res.defines)
                            .map_err(|e| PlanError::slot(l.slot, e))?;
                        lay.add(b.layout);
                    }
                    groups.push(MoeGroupPlan {
                        rows: n,
                        gate_up,
                        down,
                    });
                }
                MoeExperts::Groups(groups)
            }
        };
        for (lay, slot) in [
            (gate_up_layout, Slot::MoeGateUp),
            (down_layout, Slot::MoeDown),
        ] {
            if lay.count() > 1 {
                return Err(PlanError::slot(
                    slot,
                    "the launches of one expert stack read different weight layouts (one copy is uploaded)",
                ));
            }
        }
        Ok(MoePlan {
            routes,
            experts,
            route_early,
            gate_up_layout,
            down_layout,
        })
    }

    /// The grouped expert GEMMs of a prefill bucket of `r` rows, when the
    /// profile serves `moe_gemm` with that family and every stage accepts
    /// the model's shapes (`None`: the bucket runs `moe_gemv` groups, as
    /// under a profile that serves the slot with `moe_gemv`, or for expert
    /// widths the tiles cannot cut, such as tiny models' 96).
    fn moe_gemm(&mut self, m: &MoeDims, r: usize) -> Result<Option<MoeGemmPlan>, PlanError> {
        let slot = Slot::MoeGemm;
        let family = self
            .planner
            .profile
            .choice(slot.name())
            .map_err(|e| PlanError::slot(slot, e.to_string()))?
            .family
            .clone();
        if family != "moe_gemm" {
            return Ok(None);
        }
        // Each GEMM stage at its own stack's type (the down stacks of
        // k-quant files can be another type); GROUP and COMBINE read none.
        let p = |wtype| {
            Problem::Moe(MoeProblem {
                tokens: r,
                d_model: self.cfg.d_model,
                ffn: m.ffn,
                experts: m.n_experts,
                used: m.n_used,
                wtype,
            })
        };
        let stages = [
            ("GROUP", m.gate_up.2),
            ("GATE_UP", m.gate_up.2),
            ("DOWN", m.down.2),
            ("COMBINE", m.gate_up.2),
        ];
        // DOWN has a slot of its own (`moe_gemm.down`, served by the
        // `moe_gemm` entry unless a profile names it): its warp layout may
        // differ, its row tile may not.
        let slot_of = |st: &str| {
            if st == "DOWN" {
                Slot::MoeGemmDown
            } else {
                slot
            }
        };
        if stages.iter().any(|&(st, t)| {
            self.planner
                .resolve(slot_of(st), &p(t), &stage(st))
                .is_err()
        }) {
            return Ok(None);
        }
        let mut ids = [0; 4];
        for (i, (st, t)) in stages.into_iter().enumerate() {
            ids[i] = self.push(slot_of(st), p(t), stage(st), GridRule::Rows)?;
        }
        let bm_of = |id: LaunchId| match self.launches[id].res.defines.get("BM") {
            Some(DefineValue::Int(b)) if *b > 0 => Some(*b as usize),
            _ => None,
        };
        let bm =
            bm_of(ids[1]).ok_or_else(|| PlanError::slot(slot, "moe_gemm resolved without a BM"))?;
        if self.launches[ids[2]].res.family.name() != "moe_gemm" {
            return Err(PlanError::slot(
                Slot::MoeGemmDown,
                "the grouped GEMMs' down stage must be served by moe_gemm when moe_gemm serves the others",
            ));
        }
        if bm_of(ids[2]) != Some(bm) {
            return Err(PlanError::slot(
                Slot::MoeGemmDown,
                format!("the down stage's row tile BM must be the other stages' ({bm}): the pairs are cut into tiles once"),
            ));
        }
        Ok(Some(MoeGemmPlan {
            group: ids[0],
            gate_up: ids[1],
            down: ids[2],
            combine: ids[3],
            bm,
        }))
    }
}
