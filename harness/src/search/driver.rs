//! The search loop: ask the strategy, check the budget, evaluate, record.
//!
//! Budget contract: at most `max_evals` evaluations are made, and none is
//! started once `time_limit` has passed since the search began (the one in
//! progress finishes, so a search overruns its time limit by at most one
//! evaluation). A point the strategy proposes twice, or one outside the
//! space, is a strategy bug and ends the search with an error instead of
//! being evaluated again.

use super::{Space, Strategy, Trial};
use std::time::Duration;

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Budget {
    pub max_evals: Option<usize>,
    pub time_limit: Option<Duration>,
}

impl Budget {
    /// Neither bound set: the strategy runs until it has proposed every
    /// point.
    pub fn unlimited(&self) -> bool {
        self.max_evals.is_none() && self.time_limit.is_none()
    }

    pub fn describe(&self) -> String {
        match (self.max_evals, self.time_limit) {
            (None, None) => "unlimited (every accepted point)".to_string(),
            (Some(n), None) => format!("{n} evaluations"),
            (None, Some(t)) => format!("{} s", t.as_secs_f64()),
            (Some(n), Some(t)) => format!("{n} evaluations or {} s", t.as_secs_f64()),
        }
    }
}

/// What one evaluation gave.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Eval {
    /// The objective (lower is better; on a GPU the median time in us).
    Value(f64),
    /// The point could not be measured (compile error, failed check,
    /// forbidden spills, a timing error): it counts as an evaluation.
    Failed,
    /// The caller ends the search before measuring this point (Ctrl-C; a
    /// replay that has reached its target): not recorded.
    Stop,
}

/// Why a search ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The strategy had nothing left to propose: every point evaluated.
    Exhausted,
    MaxEvals,
    TimeLimit,
    /// The evaluator ended it (`Eval::Stop`).
    Caller,
}

impl Stop {
    pub fn name(self) -> &'static str {
        match self {
            Stop::Exhausted => "space exhausted",
            Stop::MaxEvals => "max evaluations",
            Stop::TimeLimit => "time limit",
            Stop::Caller => "stopped",
        }
    }
}

#[derive(Clone, Debug)]
pub struct SearchLog {
    pub trials: Vec<Trial>,
    pub stop: Stop,
    /// Time from the start of the search to its end, per the caller's clock.
    pub elapsed: Duration,
}

impl SearchLog {
    /// The best trial with a value (lowest; the earliest on ties).
    pub fn best(&self) -> Option<Trial> {
        self.trials
            .iter()
            .filter(|t| t.value.is_some_and(f64::is_finite))
            .min_by(|a, b| {
                a.value
                    .unwrap_or(f64::INFINITY)
                    .total_cmp(&b.value.unwrap_or(f64::INFINITY))
            })
            .copied()
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SearchError {
    #[error("strategy proposed point {point} twice")]
    Repeated { point: usize },
    #[error("strategy proposed point {point}, outside a space of {len}")]
    OutOfRange { point: usize, len: usize },
}

/// Runs one search. `clock` returns the time since the search started
/// (`Instant::elapsed` on a GPU; a fake clock in tests); `evaluate` measures
/// one point.
pub fn run(
    space: &Space,
    strategy: &mut dyn Strategy,
    budget: Budget,
    clock: &mut dyn FnMut() -> Duration,
    mut evaluate: impl FnMut(usize) -> Eval,
) -> Result<SearchLog, SearchError> {
    let mut trials: Vec<Trial> = Vec::new();
    let mut seen = vec![false; space.len()];
    let stop = loop {
        if budget.max_evals.is_some_and(|n| trials.len() >= n) {
            break Stop::MaxEvals;
        }
        if budget.time_limit.is_some_and(|t| clock() >= t) {
            break Stop::TimeLimit;
        }
        let Some(point) = strategy.next(space, &trials) else {
            break Stop::Exhausted;
        };
        match seen.get_mut(point) {
            None => {
                return Err(SearchError::OutOfRange {
                    point,
                    len: space.len(),
                })
            }
            Some(true) => return Err(SearchError::Repeated { point }),
            Some(s) => *s = true,
        }
        let value = match evaluate(point) {
            Eval::Value(v) => Some(v),
            Eval::Failed => None,
            Eval::Stop => break Stop::Caller,
        };
        trials.push(Trial { point, value });
    };
    Ok(SearchLog {
        trials,
        stop,
        elapsed: clock(),
    })
}
