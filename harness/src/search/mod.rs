//! Search strategies for `gemtune tune --strategy`: which points of a space
//! to evaluate, in what order, under a budget of evaluations and time.
//!
//! A strategy only sees the space (points and their defines) and the
//! history of evaluations (point, objective to minimize, or a failure); it
//! never runs anything. `driver::run` asks it for the next point, evaluates
//! it through a caller's function (on a GPU: compile, check, time one
//! cell; in tests and `gemtune search-replay`: a function or a recorded
//! result) and enforces the budget, so the same strategies are tested on
//! CPU with synthetic objectives and measured against committed tune
//! results.
//!
//! Every strategy is deterministic under its seed (given the same
//! objective values) and never proposes a point already in the history.
//! Restrictions (the family's `validate` on the shape) are applied when the
//! space is built, so a rejected point is never proposed and costs nothing.

pub mod bayes;
pub mod cells;
pub mod driver;
pub mod evolutionary;
pub mod random;
pub mod replay;
pub mod space;

#[cfg(test)]
mod tests;

pub use driver::{run, Budget, Eval, SearchError, SearchLog, Stop};
pub use space::{Dim, DimKind, Space};

/// One evaluation: the point and its objective (lower is better; `None`:
/// the evaluation failed, e.g. a compile error or a failed check, and still
/// counts against the budget).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Trial {
    pub point: usize,
    pub value: Option<f64>,
}

/// Chooses the next point to evaluate.
pub trait Strategy {
    /// The next point, never one in `history`; `None` when the strategy has
    /// nothing left to propose (every point evaluated).
    fn next(&mut self, space: &Space, history: &[Trial]) -> Option<usize>;
}

/// The strategies `tune --strategy` offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum StrategyKind {
    /// Every point in spec order (named variants, then each sweep's
    /// product, last axis fastest).
    Exhaustive,
    /// Points in a seeded random order.
    Random,
    /// A steady-state genetic algorithm: tournament selection among the
    /// best evaluated points, uniform crossover and one-step mutation of the
    /// defines, mapped back onto the nearest unevaluated point.
    Evolutionary,
    /// Bayesian optimization: a Gaussian process over the defines (Matern
    /// 5/2, hyperparameters by marginal likelihood) on log time, next point
    /// by expected improvement over every unevaluated point.
    Bayes,
}

impl StrategyKind {
    pub const ALL: [StrategyKind; 4] = [
        StrategyKind::Exhaustive,
        StrategyKind::Random,
        StrategyKind::Evolutionary,
        StrategyKind::Bayes,
    ];

    pub fn name(self) -> &'static str {
        match self {
            StrategyKind::Exhaustive => "exhaustive",
            StrategyKind::Random => "random",
            StrategyKind::Evolutionary => "evolutionary",
            StrategyKind::Bayes => "bayes",
        }
    }

    /// Whether the seed changes the order (exhaustive ignores it).
    pub fn seeded(self) -> bool {
        self != StrategyKind::Exhaustive
    }

    /// A fresh strategy of this kind for one search.
    pub fn build(self, seed: u64) -> Box<dyn Strategy> {
        match self {
            StrategyKind::Exhaustive => Box::new(Exhaustive),
            StrategyKind::Random => Box::new(random::Random::new(seed)),
            StrategyKind::Evolutionary => Box::new(evolutionary::Evolutionary::new(seed)),
            StrategyKind::Bayes => Box::new(bayes::Bayes::new(seed)),
        }
    }
}

impl std::fmt::Display for StrategyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Every point in the space's order.
pub struct Exhaustive;

impl Strategy for Exhaustive {
    fn next(&mut self, space: &Space, history: &[Trial]) -> Option<usize> {
        let done = evaluated(space, history);
        (0..space.len()).find(|&p| !done[p])
    }
}

/// Which points the history holds.
pub fn evaluated(space: &Space, history: &[Trial]) -> Vec<bool> {
    let mut done = vec![false; space.len()];
    for t in history {
        if let Some(d) = done.get_mut(t.point) {
            *d = true;
        }
    }
    done
}

/// A seed per search unit: the run's seed mixed with a label (family,
/// shape, regime), so each unit searches in its own order and the same
/// run seed always gives the same orders.
pub fn unit_seed(seed: u64, label: &str) -> u64 {
    let h = crate::hash::sha256_hex(format!("{seed:#x}\n{label}").as_bytes());
    u64::from_str_radix(&h[..16], 16).unwrap_or(seed)
}
