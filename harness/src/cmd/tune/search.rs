//! `tune --strategy S --max-evals N --time-limit T`: instead of checking
//! and timing every accepted cell, one search per (family, shape, regime)
//! chooses which cells to evaluate (`gemtune::search`).
//!
//! Why per (family, shape, regime): that is the group tune picks a winner
//! for (`tuned::select_winners`), and the best variant of one shape says
//! little about another's (different head dims, token counts and types
//! are why winners are per shape). The budget applies to each search.
//!
//! An evaluation is one cell: compile its define set (through the cubin
//! cache, so a define set evaluated on another shape or regime is not
//! compiled again), check it against the oracle on that shape (once per
//! cell, whatever the regime), time it in the phase's regime; the
//! objective is the median time. A cell that fails to compile, fails its
//! check, spills where the spec forbids it or cannot be timed is a failed
//! evaluation: it counts against the budget and the strategy avoids it.
//! Cells the family's `validate` rejects on the shape are left out of the
//! space before the search, so they cost nothing. The phases keep tune's
//! order: every search of the L2 phase, then every search of the DRAM
//! phase.

use super::worker::{TuneAnswer, TuneTask};
use gemtune::cells::{CellId, WorkCell};
use gemtune::checker::FamilyJob;
use gemtune::results::{CheckRow, TuneRow};
use gemtune::search::{self, cells, Budget, Eval, StrategyKind};
use gemtune_kernels::family::DeviceLimits;
use indicatif::ProgressBar;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

#[derive(clap::Args, Clone, Debug)]
pub struct SearchArgs {
    /// Which cells of each (family, shape, regime) to time: exhaustive
    /// (every accepted cell), random, evolutionary or bayes (a Gaussian
    /// process with expected improvement). Any strategy other than
    /// exhaustive, or a budget, runs one search per (family, shape,
    /// regime), seeded by --seed.
    #[arg(long, value_enum, default_value_t = StrategyKind::Exhaustive)]
    pub strategy: StrategyKind,
    /// Most evaluations (cells compiled, checked and timed) per search.
    #[arg(long, value_parser = crate::cli::positive_usize)]
    pub max_evals: Option<usize>,
    /// Seconds per search after which no new evaluation starts.
    #[arg(long, value_parser = crate::cli::positive_f64)]
    pub time_limit: Option<f64>,
}

impl SearchArgs {
    /// Whether tune searches (otherwise it checks and times every cell).
    pub fn active(&self) -> bool {
        self.strategy != StrategyKind::Exhaustive
            || self.max_evals.is_some()
            || self.time_limit.is_some()
    }

    pub fn budget(&self) -> Budget {
        Budget {
            max_evals: self.max_evals,
            time_limit: self.time_limit.map(Duration::from_secs_f64),
        }
    }
}

/// One search's account: a row of search.csv and of the summary's table.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SearchRow {
    pub family: String,
    pub shape: String,
    pub regime: String,
    pub strategy: String,
    pub seed: String,
    pub budget: String,
    /// Accepted cells: the space searched.
    pub space: usize,
    /// Cells `validate` rejected before the search.
    pub rejected: usize,
    pub evaluations: usize,
    /// Evaluations that gave no time (compile error, failed check, spills,
    /// timing error).
    pub failed: usize,
    pub stop: String,
    pub elapsed_s: f64,
    pub best_variant: String,
    pub best_median_us: f64,
}

type CellKey = (usize, usize, usize);

/// The searches of one tune: their spaces, what they evaluated and their
/// accounts. An evaluation goes through the tune worker that owns the GPU
/// (`TuneTask::Check`, then `TuneTask::Time` in the phase's regime).
pub struct Searcher<'a> {
    args: &'a SearchArgs,
    seed: u64,
    jobs: &'a [FamilyJob],
    /// Per job, per shape: the space and the rejected cells.
    spaces: Vec<Vec<cells::ShapeSpace>>,
    /// The work cell of every accepted (job, point, shape).
    ids: HashMap<CellKey, CellId>,
    /// Check rows of the evaluated cells (later regimes reuse the verdict).
    checks: BTreeMap<CellKey, CheckRow>,
    /// Timed rows per (cell, regime).
    timed: Vec<((CellId, String), TuneRow)>,
    notes: Vec<String>,
    searches: Vec<SearchRow>,
}

impl<'a> Searcher<'a> {
    /// Builds every (family, shape) space over the plan's work cells.
    pub fn new(
        args: &'a SearchArgs,
        seed: u64,
        jobs: &'a [FamilyJob],
        work: &[WorkCell],
        lim: &DeviceLimits,
    ) -> Self {
        let spaces = jobs
            .iter()
            .map(|job| {
                job.shapes
                    .iter()
                    .map(|s| cells::shape_space(job.family, &job.points, s, lim))
                    .collect()
            })
            .collect();
        let ids = work
            .iter()
            .map(|c| ((c.job, c.point, c.shape), c.id.clone()))
            .collect();
        Searcher {
            args,
            seed,
            jobs,
            spaces,
            ids,
            checks: BTreeMap::new(),
            timed: Vec::new(),
            notes: Vec::new(),
            searches: Vec::new(),
        }
    }

    /// The summary's one-line account of the search setup and use.
    pub fn describe(&self) -> String {
        let evals: usize = self.searches.iter().map(|s| s.evaluations).sum();
        let space: usize = self.searches.iter().map(|s| s.space).sum();
        format!(
            "{} (seed {:#x}), budget {} per (family, shape, regime); {} evaluations in {} searches over {} accepted cells (see the Search section)",
            self.args.strategy,
            self.seed,
            self.args.budget().describe(),
            evals,
            self.searches.len(),
            space
        )
    }

    /// One evaluation: the cell's check (once), then its timing in
    /// `regime`; the median time, or None when it gave none.
    fn evaluate(
        &mut self,
        key: CellKey,
        regime: &str,
        run: &mut dyn FnMut(&TuneTask) -> Result<TuneAnswer, String>,
    ) -> Option<f64> {
        let Some(id) = self.ids.get(&key).cloned() else {
            self.notes.push(format!(
                "search: cell {key:?} is not in the plan's work cells"
            ));
            return None;
        };
        if let std::collections::btree_map::Entry::Vacant(slot) = self.checks.entry(key) {
            match run(&TuneTask::Check(id.clone())) {
                Ok(TuneAnswer::Check(row)) => {
                    slot.insert(*row);
                }
                Ok(TuneAnswer::Time(_)) => {
                    self.notes
                        .push(format!("{id}: the worker answered a check with a timing"));
                    return None;
                }
                Err(e) => {
                    self.notes.push(format!("{id} check: {e}"));
                    return None;
                }
            }
        }
        if self.checks.get(&key).is_none_or(|r| r.verdict != "pass") {
            return None;
        }
        match run(&TuneTask::Time(id.clone(), regime.to_string())) {
            Ok(TuneAnswer::Time(row)) => {
                let v = row.median_us;
                self.timed.push(((id, regime.to_string()), *row));
                v.is_finite().then_some(v)
            }
            Ok(TuneAnswer::Check(_)) => {
                self.notes
                    .push(format!("{id}: the worker answered a timing with a check"));
                None
            }
            Err(e) => {
                self.notes.push(format!("{id} {regime}: {e}"));
                None
            }
        }
    }

    /// Runs every search of one regime through `run`. Returns false when
    /// interrupted.
    pub fn phase(
        &mut self,
        regime: &str,
        run: &mut dyn FnMut(&TuneTask) -> Result<TuneAnswer, String>,
        pb: &ProgressBar,
    ) -> bool {
        let budget = self.args.budget();
        for ji in 0..self.jobs.len() {
            for si in 0..self.jobs[ji].shapes.len() {
                let family = self.jobs[ji].family.name().to_string();
                let shape = self.jobs[ji].shapes[si].name.clone();
                let seed = search::unit_seed(self.seed, &format!("{family}\n{shape}\n{regime}"));
                let mut strategy = self.args.strategy.build(seed);
                let space = self.spaces[ji][si].space.clone();
                let point_of: Vec<usize> = self.spaces[ji][si]
                    .accepted
                    .iter()
                    .map(|c| c.point)
                    .collect();
                let start = Instant::now();
                let mut clock = || start.elapsed();
                let mut failed = 0usize;
                let log = search::run(&space, strategy.as_mut(), budget, &mut clock, |p| {
                    if gemtune::interrupt::requested() {
                        return Eval::Stop;
                    }
                    pb.inc_length(1);
                    pb.set_message(format!("{family} {} {shape} {regime}", space.label(p)));
                    let eval = match self.evaluate((ji, point_of[p], si), regime, run) {
                        Some(v) => Eval::Value(v),
                        None => {
                            failed += 1;
                            Eval::Failed
                        }
                    };
                    pb.inc(1);
                    eval
                });
                let log = match log {
                    Ok(l) => l,
                    Err(e) => {
                        self.notes
                            .push(format!("search {family} {shape} {regime}: {e}"));
                        continue;
                    }
                };
                let best = log.best();
                self.searches.push(SearchRow {
                    family: family.clone(),
                    shape: shape.clone(),
                    regime: regime.to_string(),
                    strategy: self.args.strategy.to_string(),
                    seed: format!("{seed:#x}"),
                    budget: budget.describe(),
                    space: space.len(),
                    rejected: self.spaces[ji][si].rejected.len(),
                    evaluations: log.trials.len(),
                    failed,
                    stop: log.stop.name().to_string(),
                    elapsed_s: log.elapsed.as_secs_f64(),
                    best_variant: best
                        .map(|t| space.label(t.point).to_string())
                        .unwrap_or_default(),
                    best_median_us: best.and_then(|t| t.value).unwrap_or(f64::NAN),
                });
                if log.stop == search::Stop::Caller {
                    return false;
                }
            }
        }
        true
    }

    /// Hands the evaluated cells' check rows and timed rows to the tune's
    /// maps (its report renders them, and lists every cell no search
    /// evaluated as skipped), its notes to `notes`; returns the searches'
    /// accounts.
    pub fn finish(
        self,
        checks: &mut HashMap<CellId, CheckRow>,
        timed: &mut HashMap<(CellId, String), TuneRow>,
        notes: &mut Vec<String>,
    ) -> Vec<SearchRow> {
        for (key, row) in self.checks {
            if let Some(id) = self.ids.get(&key) {
                checks.insert(id.clone(), row);
            }
        }
        timed.extend(self.timed);
        notes.extend(self.notes);
        self.searches
    }
}

/// The summary's Search section.
pub fn section(searches: &[SearchRow]) -> String {
    let mut s = String::from(
        "## Search\n\nOne search per (family, shape, regime); an evaluation compiles (cubin cache), checks and times one cell, and a failed one (no time) counts against the budget. Rejected cells were left out before the search.\n\n| family | shape | regime | strategy | budget | space | rejected | evaluations | failed | stop | s | best | best median us |\n|---|---|---|---|---|---:|---:|---:|---:|---|---:|---|---:|\n",
    );
    for r in searches {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {} | {:.3} |",
            r.family,
            r.shape,
            r.regime,
            r.strategy,
            r.budget,
            r.space,
            r.rejected,
            r.evaluations,
            r.failed,
            r.stop,
            r.elapsed_s,
            r.best_variant,
            r.best_median_us
        );
    }
    s
}
