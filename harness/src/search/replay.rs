//! Measuring strategies without a GPU: a committed tune `results.csv` is
//! the objective. Each (family, shape, regime) of the file is one space
//! (its timed variant rows, in file order, which is spec order); evaluating
//! a point returns its recorded median. A replayed search ends at the first
//! evaluation within `tolerance` of the space's best recorded median, and
//! its figure is how many evaluations that took.
//!
//! What a replay does not see: points the tune rejected or that failed
//! their check are not in the file, so the replayed space is the accepted,
//! passing part of the real one (a live search may also spend evaluations
//! on failures); and every evaluation returns the same recorded median, so
//! timing noise between runs is not replayed.

use super::{driver, Budget, Eval, SearchError, Space, StrategyKind};
use crate::results::TuneRow;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

/// One replayed space.
pub struct Group {
    pub family: String,
    pub shape: String,
    pub regime: String,
    pub space: Space,
    /// Recorded median (us) per point of `space`.
    pub values: Vec<f64>,
}

impl Group {
    pub fn label(&self) -> String {
        format!("{} {} {}", self.family, self.shape, self.regime)
    }

    pub fn best(&self) -> f64 {
        self.values.iter().copied().fold(f64::INFINITY, f64::min)
    }
}

/// The spaces of a result file: timed variant rows with a finite median,
/// grouped by (family, shape, regime) in order of first appearance; a
/// variant repeated in a group (same defines) keeps its first row. Groups
/// with fewer than `min_points` points are left out.
pub fn groups(rows: &[TuneRow], min_points: usize) -> Vec<Group> {
    let mut order: Vec<(String, String, String)> = Vec::new();
    let mut by: BTreeMap<(String, String, String), Vec<&TuneRow>> = BTreeMap::new();
    for r in rows
        .iter()
        .filter(|r| !r.is_reference() && r.is_timed() && r.median_us.is_finite())
    {
        let key = (r.family.clone(), r.shape.clone(), r.regime.clone());
        let g = by.entry(key.clone()).or_default();
        if g.is_empty() {
            order.push(key);
        }
        if !g.iter().any(|x| x.defines == r.defines) {
            g.push(r);
        }
    }
    let mut out = Vec::new();
    for key in order {
        let rows = &by[&key];
        if rows.len() < min_points.max(1) {
            continue;
        }
        let points: Vec<(String, _)> = rows
            .iter()
            .map(|r| (r.variant.clone(), super::space::parse_canonical(&r.defines)))
            .collect();
        let space = Space::from_defines(&points);
        // Distinct defines give distinct coordinates, so the space keeps
        // every row in order.
        debug_assert_eq!(space.len(), rows.len());
        out.push(Group {
            family: key.0,
            shape: key.1,
            regime: key.2,
            space,
            values: rows.iter().map(|r| r.median_us).collect(),
        });
    }
    out
}

/// Evaluations a strategy needs to reach a point within `tolerance`
/// (0.03: 3 %) of the group's best; the search stops there.
pub fn evals_to_target(
    g: &Group,
    kind: StrategyKind,
    seed: u64,
    tolerance: f64,
) -> Result<usize, SearchError> {
    let target = g.best() * (1.0 + tolerance);
    let mut strategy = kind.build(seed);
    let mut reached = false;
    let mut clock = || Duration::ZERO;
    let log = driver::run(
        &g.space,
        strategy.as_mut(),
        Budget::default(),
        &mut clock,
        |p| {
            if reached {
                return Eval::Stop;
            }
            let v = g.values[p];
            reached = v <= target;
            Eval::Value(v)
        },
    )?;
    // The best point is in the space, so an unlimited search reaches it.
    Ok(log
        .trials
        .iter()
        .position(|t| t.value.is_some_and(|v| v <= target))
        .map_or(log.trials.len(), |i| i + 1))
}

/// One replayed search.
#[derive(Clone, Debug)]
pub struct Run {
    pub group: usize,
    pub strategy: StrategyKind,
    pub seed: u64,
    pub evals: usize,
}

/// Every strategy on every group, run seeds `0..seeds`, each mixed with
/// the group's label by `unit_seed` as tune mixes its `--seed` (so the
/// groups do not share one random order); exhaustive once, its order has
/// no seed.
pub fn replay_all(
    groups: &[Group],
    strategies: &[StrategyKind],
    seeds: u64,
    tolerance: f64,
) -> Result<Vec<Run>, SearchError> {
    let mut out = Vec::new();
    for (gi, g) in groups.iter().enumerate() {
        for &kind in strategies {
            let n = if kind.seeded() { seeds } else { 1 };
            for seed in 0..n {
                out.push(Run {
                    group: gi,
                    strategy: kind,
                    seed,
                    evals: evals_to_target(g, kind, super::unit_seed(seed, &g.label()), tolerance)?,
                });
            }
        }
    }
    Ok(out)
}

fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    crate::stats::quantile_sorted(v, q)
}

/// Per strategy: the mean over groups of the mean fraction of the space
/// evaluated (over seeds); what the 25 % target is about.
pub fn mean_fraction(groups: &[Group], runs: &[Run], kind: StrategyKind) -> f64 {
    let mut per_group = Vec::new();
    for (gi, g) in groups.iter().enumerate() {
        let e: Vec<f64> = runs
            .iter()
            .filter(|r| r.group == gi && r.strategy == kind)
            .map(|r| r.evals as f64 / g.space.len() as f64)
            .collect();
        if !e.is_empty() {
            per_group.push(e.iter().sum::<f64>() / e.len() as f64);
        }
    }
    per_group.iter().sum::<f64>() / per_group.len().max(1) as f64
}

/// Markdown tables: per group and strategy, then the summary per strategy.
pub fn table(
    groups: &[Group],
    runs: &[Run],
    strategies: &[StrategyKind],
    tolerance: f64,
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Evaluations to reach a point within {:.1} % of the space's best recorded median (mean, median, p90, max over seeds; % of the space in parentheses).\n",
        tolerance * 100.0
    );
    let _ = writeln!(
        s,
        "| family | shape | regime | points | dims | strategy | seeds | mean | median | p90 | max |\n|---|---|---|---:|---:|---|---:|---:|---:|---:|---:|"
    );
    for (gi, g) in groups.iter().enumerate() {
        let n = g.space.len() as f64;
        for &kind in strategies {
            let mut e: Vec<f64> = runs
                .iter()
                .filter(|r| r.group == gi && r.strategy == kind)
                .map(|r| r.evals as f64)
                .collect();
            if e.is_empty() {
                continue;
            }
            let mean = e.iter().sum::<f64>() / e.len() as f64;
            let med = quantile(&mut e, 0.5);
            let p90 = quantile(&mut e, 0.9);
            let max = e.iter().copied().fold(0.0, f64::max);
            let pc = |v: f64| format!("{v:.1} ({:.0} %)", 100.0 * v / n);
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {kind} | {} | {} | {} | {} | {} |",
                g.family,
                g.shape,
                g.regime,
                g.space.len(),
                g.space.dims().len(),
                e.len(),
                pc(mean),
                pc(med),
                pc(p90),
                pc(max)
            );
        }
    }
    let _ = writeln!(
        s,
        "\n| strategy | mean % of the space (mean over spaces) | worst space's mean % | runs within 25 % of the space |\n|---|---:|---:|---:|"
    );
    for &kind in strategies {
        let mut worst: f64 = 0.0;
        let (mut hit, mut all) = (0usize, 0usize);
        for (gi, g) in groups.iter().enumerate() {
            let e: Vec<f64> = runs
                .iter()
                .filter(|r| r.group == gi && r.strategy == kind)
                .map(|r| r.evals as f64 / g.space.len() as f64)
                .collect();
            if e.is_empty() {
                continue;
            }
            worst = worst.max(e.iter().sum::<f64>() / e.len() as f64);
            hit += e.iter().filter(|&&f| f <= 0.25).count();
            all += e.len();
        }
        let _ = writeln!(
            s,
            "| {kind} | {:.1} % | {:.1} % | {hit} / {all} |",
            100.0 * mean_fraction(groups, runs, kind),
            100.0 * worst
        );
    }
    s
}
