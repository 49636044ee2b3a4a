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

use gemtune::checker::{self, CheckOptions, CheckOutcome, FamilyJob, Passing};
use gemtune::results::{write_csv, CheckRow, TuneRow};
use gemtune::search::{self, cells, Budget, Eval, StrategyKind};
use gemtune_kernels::family::DeviceLimits;
use gemtune_kernels::gpu::Gpu;
use indicatif::ProgressBar;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;
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

pub struct Searcher<'a> {
    args: &'a SearchArgs,
    seed: u64,
    jobs: &'a [FamilyJob],
    opts: CheckOptions,
    /// Per job, per shape: the space and the rejected cells.
    spaces: Vec<Vec<cells::ShapeSpace>>,
    /// Check result per evaluated cell: `Some` when it passed.
    checked: BTreeMap<CellKey, Option<Passing>>,
    /// Check rows with their (job, point, shape) for the final order.
    rows: Vec<(CellKey, CheckRow)>,
    failures: usize,
    infra: Vec<String>,
    searches: Vec<SearchRow>,
}

impl<'a> Searcher<'a> {
    /// Builds every (family, shape) space; rejected and duplicate points
    /// get their check rows now (they are never evaluated).
    pub fn new(
        args: &'a SearchArgs,
        seed: u64,
        jobs: &'a [FamilyJob],
        opts: CheckOptions,
        lim: &DeviceLimits,
    ) -> Self {
        let mut rows = Vec::new();
        let mut spaces = Vec::new();
        for (ji, job) in jobs.iter().enumerate() {
            for (pi, p) in job.points.iter().enumerate() {
                if let (Some(of), Some(s)) = (&p.duplicate_of, job.shapes.first()) {
                    let mut r = checker::base_row(job, p, s, &opts.target, &p.defines);
                    r.verdict = "duplicate".into();
                    r.reason = format!("same defines as {of}");
                    r.shape = "*".into();
                    rows.push(((ji, pi, usize::MAX), r));
                }
            }
            let mut per_shape = Vec::new();
            for (si, s) in job.shapes.iter().enumerate() {
                let ss = cells::shape_space(job.family, &job.points, s, lim);
                for c in &ss.rejected {
                    let p = &job.points[c.point];
                    let mut r = checker::base_row(job, p, s, &opts.target, &c.defines);
                    r.verdict = "rejected".into();
                    r.reason = c.outcome.clone().err().unwrap_or_default();
                    rows.push(((ji, c.point, si), r));
                }
                per_shape.push(ss);
            }
            spaces.push(per_shape);
        }
        Searcher {
            args,
            seed,
            jobs,
            opts,
            spaces,
            checked: BTreeMap::new(),
            rows,
            failures: 0,
            infra: Vec::new(),
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

    /// Checks one cell once (later regimes reuse the verdict).
    fn check_cell(&mut self, gpu: &Gpu, key: CellKey) -> Option<Passing> {
        if let Some(c) = self.checked.get(&key) {
            return c.clone();
        }
        let (ji, pi, si) = key;
        let job = &self.jobs[ji];
        let one = FamilyJob {
            spec: job.spec.clone(),
            family: job.family,
            points: vec![job.points[pi].clone()],
            shapes: vec![job.shapes[si].clone()],
            source_sha256: job.source_sha256.clone(),
        };
        let out = checker::run_check(std::slice::from_ref(&one), Some(gpu), &self.opts, |_| {});
        self.failures += out.failures;
        self.infra.extend(out.infra);
        self.rows.extend(out.rows.into_iter().map(|r| (key, r)));
        let passing = out.passing.into_iter().next().map(|p| Passing {
            job: ji,
            point: pi,
            shape: si,
            ..p
        });
        self.checked.insert(key, passing.clone());
        passing
    }

    /// Runs every search of one regime. `time` times a passing cell in
    /// this regime; each timed row is appended to `rows` and results.csv
    /// is rewritten. Returns false when interrupted.
    #[allow(clippy::too_many_arguments)]
    pub fn phase(
        &mut self,
        gpu: &Gpu,
        regime: &str,
        time: &mut dyn FnMut(&Passing) -> Result<TuneRow, String>,
        rows: &mut Vec<TuneRow>,
        results: &Path,
        notes: &mut Vec<String>,
        pb: &ProgressBar,
    ) -> anyhow::Result<bool> {
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
                let mut write_err: Option<anyhow::Error> = None;
                let mut failed = 0usize;
                let log = search::run(&space, strategy.as_mut(), budget, &mut clock, |p| {
                    if gemtune::interrupt::requested() || write_err.is_some() {
                        return Eval::Stop;
                    }
                    let pi = point_of[p];
                    pb.inc_length(1);
                    pb.set_message(format!("{family} {} {shape} {regime}", space.label(p)));
                    let eval = match self.check_cell(gpu, (ji, pi, si)) {
                        None => Eval::Failed,
                        Some(ps) => match time(&ps) {
                            Ok(row) => {
                                let v = row.median_us;
                                rows.push(row);
                                if let Err(e) = write_csv(results, rows) {
                                    write_err = Some(e);
                                }
                                if v.is_finite() {
                                    Eval::Value(v)
                                } else {
                                    Eval::Failed
                                }
                            }
                            Err(e) => {
                                notes.push(e);
                                Eval::Failed
                            }
                        },
                    };
                    if eval == Eval::Failed {
                        failed += 1;
                    }
                    pb.inc(1);
                    eval
                })?;
                if let Some(e) = write_err {
                    return Err(e);
                }
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
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// The check outcome of the searches (every evaluated cell's check,
    /// the rejected and duplicate points, and a `skipped` row for each
    /// accepted cell no search evaluated), rows in spec order, and the
    /// searches' accounts.
    pub fn finish(mut self) -> (CheckOutcome, Vec<SearchRow>) {
        let evaluated: BTreeSet<CellKey> = self.checked.keys().copied().collect();
        for (ji, per_shape) in self.spaces.iter().enumerate() {
            let job = &self.jobs[ji];
            for (si, ss) in per_shape.iter().enumerate() {
                for c in &ss.accepted {
                    if evaluated.contains(&(ji, c.point, si)) {
                        continue;
                    }
                    let mut r = checker::base_row(
                        job,
                        &job.points[c.point],
                        &job.shapes[si],
                        &self.opts.target,
                        &c.defines,
                    );
                    r.verdict = "skipped".into();
                    r.reason = format!(
                        "not evaluated by the {} search (budget {})",
                        self.args.strategy,
                        self.args.budget().describe()
                    );
                    self.rows.push(((ji, c.point, si), r));
                }
            }
        }
        self.rows.sort_by_key(|(k, _)| *k);
        let mut passing: Vec<Passing> = self.checked.into_values().flatten().collect();
        passing.sort_by_key(|p| (p.job, p.point, p.shape));
        (
            CheckOutcome {
                rows: self.rows.into_iter().map(|(_, r)| r).collect(),
                infra: self.infra,
                failures: self.failures,
                passing,
            },
            self.searches,
        )
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
