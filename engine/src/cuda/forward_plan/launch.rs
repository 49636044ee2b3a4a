//! A plan's launches: each resolved once (`PlannedLaunch`), named by its
//! index, with the entry it calls and how its grid follows a prefill
//! chunk's rows.

use gemtune_kernels::bind::matmul::MatmulBinding;
use gemtune_kernels::defines::DefineValue;
use gemtune_kernels::family::{LaunchGeometry, Problem};

use super::ForwardPlan;
use crate::cuda::planner::{PlanError, Resolution};
use crate::cuda::slots::Slot;

/// Index of a launch in `ForwardPlan::launches`.
pub type LaunchId = usize;

/// Which function of a variant's module a launch calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Entry {
    /// The entry `Family::validate` names.
    Main,
    /// `gemm_dq_convert`, the f32 -> DQ pre-pass of a gemm_dq / gemm_wgmma
    /// module, over `[rows][k]`.
    DqConvert { k: usize },
}

/// How a launch's grid follows the rows of a prefill chunk smaller than its
/// bucket's bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GridRule {
    /// The grid never changes (decode launches; row-blocked GEMVs).
    Fixed,
    /// `Family::validate` at the problem with the chunk's rows.
    Rows,
    /// The same for an attention problem over a cache of `capacity` slots
    /// (`capacity` grows to the query count when a chunk exceeds it).
    AttnRows { capacity: usize },
}

/// One launch, resolved.
#[derive(Clone)]
pub struct PlannedLaunch {
    pub slot: Slot,
    pub problem: Problem,
    pub bound: Vec<(&'static str, DefineValue)>,
    pub entry: Entry,
    pub grid: GridRule,
    pub res: Resolution,
}

impl PlannedLaunch {
    /// The geometry of this launch for a prefill chunk of `t` rows.
    pub(super) fn geometry_at(
        &self,
        t: usize,
        plan: &ForwardPlan,
    ) -> Result<LaunchGeometry, PlanError> {
        let err = |msg: String| {
            PlanError::slot(
                self.slot,
                format!("{} rows: {msg} ({})", t, self.problem.describe()),
            )
        };
        if let Entry::DqConvert { k } = self.entry {
            return Ok(MatmulBinding::dq_convert_geometry(t, k));
        }
        let p = match (self.grid, self.problem) {
            (GridRule::Fixed, _) => return Ok(self.res.geo.clone()),
            (GridRule::Rows, Problem::Matmul(mut m)) => {
                m.m = t;
                Problem::Matmul(m)
            }
            (GridRule::Rows, Problem::Rows(mut r)) => {
                r.rows = t;
                Problem::Rows(r)
            }
            (GridRule::Rows, Problem::Moe(mut m)) => {
                m.tokens = t;
                Problem::Moe(m)
            }
            (GridRule::AttnRows { capacity }, Problem::Attention(mut a)) => {
                a.n_q = t;
                a.capacity = capacity.max(t);
                Problem::Attention(a)
            }
            (rule, p) => return Err(err(format!("grid rule {rule:?} on {}", p.describe()))),
        };
        self.res
            .family
            .validate(&self.res.defines, &p, &plan.limits)
            .map_err(err)
    }
}
