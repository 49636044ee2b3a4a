//! The search space of one family on one shape: every non-duplicate point
//! the spec expands to, split by the family's `validate` into the cells a
//! search may evaluate and the rejected ones. Rejection happens here,
//! before any strategy runs, so a rejected point is never compiled nor
//! counted as an evaluation.

use super::Space;
use crate::spec::{self, Cell, Point, Shape};
use gemtune_kernels::family::{DeviceLimits, Family};

pub struct ShapeSpace {
    /// The accepted cells as a space, in spec order.
    pub space: Space,
    /// The accepted cells, aligned with `space` (cell `i` is point `i`).
    pub accepted: Vec<Cell>,
    /// The cells `validate` rejected, with the reason in `outcome`.
    pub rejected: Vec<Cell>,
}

/// Plans `points` on `shape` (cells index into `points`; `shape` is cell
/// shape 0).
pub fn shape_space(
    family: &dyn Family,
    points: &[Point],
    shape: &Shape,
    lim: &DeviceLimits,
) -> ShapeSpace {
    let (accepted, rejected): (Vec<Cell>, Vec<Cell>) =
        spec::plan(family, points, std::slice::from_ref(shape), lim)
            .into_iter()
            .partition(|c| c.outcome.is_ok());
    let labelled: Vec<(String, _)> = accepted
        .iter()
        .map(|c| (points[c.point].id.clone(), c.defines.clone()))
        .collect();
    let space = Space::from_defines(&labelled);
    ShapeSpace {
        space,
        accepted,
        rejected,
    }
}
