//! The work of `gemtune check`, shared with `tune`: expand each family's
//! spec, validate every (variant, shape), compile each distinct define set
//! of every family once (in one compile pool), and on a GPU run every
//! accepted cell against the oracle. Everything is recorded as `CheckRow`s; nothing is dropped.

use crate::cells::{work_cells, CellId, WorkCell};
use crate::results::CheckRow;
use crate::spec::{self, Cell, FamilySpec, Point, Shape};
use gemtune_kernels::check::check_variant;
use gemtune_kernels::compile::{Arch, CompileError, CompiledVariant};
use gemtune_kernels::defines::{canonical, Defines};
use gemtune_kernels::family::{DeviceLimits, Family};
use gemtune_kernels::gpu::Gpu;
use gemtune_kernels::pool::{compile_all, CompileJob};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

/// One family's spec, its expanded points (after the variant filter) and the
/// shapes to run on.
pub struct FamilyJob {
    pub spec: FamilySpec,
    pub family: &'static dyn Family,
    pub points: Vec<Point>,
    pub shapes: Vec<Shape>,
    /// sha256 of the family's resolved source (with common.cuh inlined).
    pub source_sha256: String,
}

/// Seed of the inputs for (family, shape): the first 8 bytes of
/// sha256("family\nshape").
pub fn seed_for(family: &str, shape: &str) -> u64 {
    let h = crate::hash::sha256_hex(format!("{family}\n{shape}").as_bytes());
    u64::from_str_radix(&h[..16], 16).unwrap_or(0)
}

/// `--variant` filter: exact ids, or prefixes written `NAME*`.
pub fn matches_filter(id: &str, filter: &[String]) -> bool {
    filter.is_empty()
        || filter.iter().any(|f| match f.strip_suffix('*') {
            Some(p) => id.starts_with(p),
            None => id == f,
        })
}

pub fn source_sha256(f: &dyn Family) -> String {
    match gemtune_kernels::source::resolve(f.source_file()) {
        Ok(t) => crate::hash::sha256_hex(t.as_bytes()),
        Err(e) => format!("unresolved: {e}"),
    }
}

/// What the compile pool gave for one define set.
#[derive(Clone)]
pub enum Compiled {
    Done(Arc<CompiledVariant>),
    Failed(String),
    /// Never started: `CheckOptions::stop` was set during the compiles.
    NotRun,
}

pub struct CheckOptions {
    /// What NVRTC compiles for and the nominal limits come from.
    pub arch: Arch,
    /// The target as asked (`sm_90a` names the same compiles as `sm_90`):
    /// what the rows record and the messages print.
    pub target: String,
    pub compile_only: bool,
    pub cache: Option<PathBuf>,
    /// Cells whose m exceeds this are checked at m = cap instead (same n, k,
    /// wtype): the f64 oracle grows with m and the kernel's indexing is the
    /// same; `None` checks every shape as is.
    pub check_max_m: Option<usize>,
    /// Set (by a Ctrl-C handler or a time budget) to stop after the current
    /// compiles or cell; the define sets not compiled and the cells not
    /// reached are listed as `skipped`.
    pub stop: Option<&'static std::sync::atomic::AtomicBool>,
}

impl CheckOptions {
    fn stopped(&self) -> bool {
        self.stop
            .is_some_and(|f| f.load(std::sync::atomic::Ordering::SeqCst))
    }
}

/// The rows of a check and what they add up to.
#[derive(Default)]
pub struct CheckOutcome {
    pub rows: Vec<CheckRow>,
    /// Infrastructure problems (compile errors, failed launches).
    pub infra: Vec<String>,
    /// Cells (or compile-only define sets) that failed the oracle or
    /// spilled where the spec forbids it.
    pub failures: usize,
}

/// `verdict` of a row whose cell was not run (stopped, or its worker
/// lost): never recorded as finished.
pub const VERDICT_SKIPPED: &str = "skipped";

fn nvrtc_str(v: (i32, i32)) -> String {
    format!("{}.{}", v.0, v.1)
}

/// A check row of a cell with its identity filled in and no verdict yet.
pub fn base_row(job: &FamilyJob, p: &Point, s: &Shape, target: &str, d: &Defines) -> CheckRow {
    CheckRow {
        schema_version: crate::results::SCHEMA_VERSION,
        family: job.family.name().to_string(),
        variant: p.id.clone(),
        hash: p.hash.clone(),
        shape: s.name.clone(),
        m: s.m,
        n: s.n,
        k: s.k,
        wtype: s.wtype_define(),
        problem: s.problem.describe(),
        arch: target.to_string(),
        contract: crate::spec::family::contract_name(job.family.contract(d)).to_string(),
        defines: canonical(d),
        ..Default::default()
    }
}

/// Every job's plan: each non-duplicate point on each shape, validated
/// against `lim`.
pub fn plan_jobs(jobs: &[FamilyJob], lim: &DeviceLimits) -> Vec<Vec<Cell>> {
    jobs.iter()
        .map(|job| spec::plan(job.family, &job.points, &job.shapes, lim))
        .collect()
}

/// One line per family: variants, shapes, rejected cells, define sets.
pub fn describe_plan(jobs: &[FamilyJob], planned: &[Vec<Cell>], target: &str) -> Vec<String> {
    jobs.iter()
        .zip(planned)
        .map(|(job, cells)| {
            let sets: std::collections::BTreeSet<String> = cells
                .iter()
                .filter(|c| c.outcome.is_ok())
                .map(|c| canonical(&c.defines))
                .collect();
            format!(
                "{}: {} variants x {} shapes, {} cells rejected, {} define sets to compile for {target}",
                job.family.name(),
                job.points
                    .iter()
                    .filter(|p| p.duplicate_of.is_none())
                    .count(),
                job.shapes.len(),
                cells.iter().filter(|c| c.outcome.is_err()).count(),
                sets.len(),
            )
        })
        .collect()
}

/// Runs cells in one process: compiles the define sets they need (each
/// once, through the cubin cache, in one compile pool), then gives each
/// cell its row: its resources (compile-only) or its check against the
/// oracle on `gpu`. Shared by the in-process run and the worker processes
/// of `check` and `tune`.
pub struct CellRunner<'a> {
    jobs: &'a [FamilyJob],
    planned: &'a [Vec<Cell>],
    by_id: HashMap<CellId, WorkCell>,
    gpu: Option<Gpu>,
    opts: &'a CheckOptions,
    compiled: HashMap<(usize, String), Compiled>,
    /// Shapes proxied to the same problem are checked once.
    proxied: BTreeMap<(String, String), gemtune_kernels::check::CheckReport>,
}

impl<'a> CellRunner<'a> {
    pub fn new(
        jobs: &'a [FamilyJob],
        planned: &'a [Vec<Cell>],
        cells: &[WorkCell],
        gpu: Option<Gpu>,
        opts: &'a CheckOptions,
    ) -> Self {
        CellRunner {
            jobs,
            planned,
            by_id: cells.iter().map(|c| (c.id.clone(), c.clone())).collect(),
            gpu,
            opts,
            compiled: HashMap::new(),
            proxied: BTreeMap::new(),
        }
    }

    /// The GPU the runner checks on (none: compile-only).
    pub fn gpu(&self) -> Option<&Gpu> {
        self.gpu.as_ref()
    }

    pub fn options(&self) -> &CheckOptions {
        self.opts
    }

    pub fn job(&self, wc: &WorkCell) -> &'a FamilyJob {
        &self.jobs[wc.job]
    }

    pub fn cell(&self, id: &CellId) -> Option<&WorkCell> {
        self.by_id.get(id)
    }

    pub fn plan_cell(&self, wc: &WorkCell) -> &'a Cell {
        &self.planned[wc.job][wc.plan_index]
    }

    /// Compiles the define sets of `cells` not compiled yet, the families
    /// taking turns in the pool's queue (a pool stopped early has compiled
    /// some of every family).
    pub fn compile(&mut self, cells: &[&WorkCell], mut progress: impl FnMut(&str)) {
        let mut per_job: BTreeMap<usize, Vec<(String, Defines)>> = BTreeMap::new();
        let mut seen = std::collections::HashSet::new();
        for wc in cells {
            let key = (wc.job, wc.defines.clone());
            if self.compiled.contains_key(&key) || !seen.insert(key) {
                continue;
            }
            let d = self.plan_cell(wc).defines.clone();
            per_job
                .entry(wc.job)
                .or_default()
                .push((wc.defines.clone(), d));
        }
        if per_job.is_empty() {
            return;
        }
        let mut requests: Vec<CompileJob> = Vec::new();
        let mut keys: Vec<(usize, String)> = Vec::new();
        let rounds = per_job.values().map(Vec::len).max().unwrap_or(0);
        for round in 0..rounds {
            for (&ji, sets) in &per_job {
                if let Some((key, d)) = sets.get(round) {
                    requests.push(CompileJob {
                        family: self.jobs[ji].family,
                        defines: d.clone(),
                        arch: self.opts.arch,
                    });
                    keys.push((ji, key.clone()));
                }
            }
        }
        let (results, report) = compile_all(
            &requests,
            self.opts.cache.as_deref(),
            None,
            self.opts.stop,
            |done, total| progress(&format!("compile {done}/{total}")),
        );
        progress(&report.summary(&format!("define sets for {}", self.opts.target)));
        for (key, r) in keys.into_iter().zip(results) {
            let c = match r {
                Ok(mut cv) => {
                    // Compile-only rows need the resources, not the code.
                    if self.opts.compile_only {
                        cv.cubin = Vec::new();
                    }
                    Compiled::Done(Arc::new(cv))
                }
                // Not kept: a later call compiles it.
                Err(CompileError::NotRun { .. }) => continue,
                Err(e) => Compiled::Failed(e.to_string()),
            };
            self.compiled.insert(key, c);
        }
    }

    /// The compile of a cell's define set, once `compile` ran for it.
    pub fn compiled(&self, wc: &WorkCell) -> Compiled {
        self.compiled
            .get(&(wc.job, wc.defines.clone()))
            .cloned()
            .unwrap_or(Compiled::NotRun)
    }

    /// Compiles what `ids` need, then runs each (in the order given: a GPU
    /// check reuses the inputs of the previous cell when the shape is the
    /// same). A row `skipped` is a cell not run (stopped).
    pub fn run(
        &mut self,
        ids: &[CellId],
        mut progress: impl FnMut(&str),
    ) -> Result<Vec<(CellId, CheckRow)>, String> {
        let cells: Vec<WorkCell> = ids
            .iter()
            .map(|id| {
                self.by_id
                    .get(id)
                    .cloned()
                    .ok_or_else(|| format!("{id}: not a cell of this plan"))
            })
            .collect::<Result<_, _>>()?;
        if !self.opts.compile_only && self.gpu.is_none() {
            return Err("no GPU given to a non-compile-only check".into());
        }
        self.compile(&cells.iter().collect::<Vec<_>>(), &mut progress);
        let mut out = Vec::with_capacity(cells.len());
        for wc in &cells {
            let row = if self.opts.compile_only {
                self.compile_row(wc)
            } else {
                self.check_row(wc, &mut progress)
            };
            out.push((wc.id.clone(), row));
        }
        Ok(out)
    }

    /// A compile-only cell: the resources of the entry the cell launches.
    fn compile_row(&self, wc: &WorkCell) -> CheckRow {
        let job = &self.jobs[wc.job];
        let c = self.plan_cell(wc);
        let mut row = base_row(
            job,
            &job.points[wc.point],
            &job.shapes[wc.shape],
            &self.opts.target,
            &c.defines,
        );
        let Ok(geo) = &c.outcome else {
            // work cells are accepted cells
            row.verdict = "rejected".into();
            return row;
        };
        row.dyn_smem = Some(geo.dyn_smem);
        match self.compiled(wc) {
            Compiled::NotRun => {
                row.verdict = VERDICT_SKIPPED.into();
                row.reason = "not compiled: stopped before its turn".into();
            }
            Compiled::Failed(e) => {
                row.verdict = "compile-error".into();
                row.reason = first_lines(&e, 12);
            }
            Compiled::Done(cv) => {
                fill_resources(&mut row, &cv, &geo.kernel);
                if !forbidden_spill(&mut row, job) {
                    row.verdict = "compiled".into();
                }
            }
        }
        row
    }

    /// A cell checked against the oracle on the GPU.
    fn check_row(&mut self, wc: &WorkCell, progress: &mut impl FnMut(&str)) -> CheckRow {
        let job = &self.jobs[wc.job];
        let c = self.plan_cell(wc);
        let p = &job.points[wc.point];
        let s = &job.shapes[wc.shape];
        let mut row = base_row(job, p, s, &self.opts.target, &c.defines);
        let geo = match &c.outcome {
            Ok(g) => g.clone(),
            Err(reason) => {
                row.verdict = "rejected".into();
                row.reason = reason.clone();
                return row;
            }
        };
        if self.opts.stopped() {
            row.verdict = VERDICT_SKIPPED.into();
            row.reason = "interrupted".into();
            return row;
        }
        row.dyn_smem = Some(geo.dyn_smem);
        let cv = match self.compiled(wc) {
            Compiled::Done(cv) => cv,
            Compiled::NotRun => {
                row.verdict = VERDICT_SKIPPED.into();
                row.reason = "not compiled: interrupted".into();
                return row;
            }
            Compiled::Failed(e) => {
                row.verdict = "compile-error".into();
                row.reason = first_lines(&e, 12);
                return row;
            }
        };
        fill_resources(&mut row, &cv, &geo.kernel);
        if forbidden_spill(&mut row, job) {
            return row;
        }
        let Some(gpu) = self.gpu.as_ref() else {
            row.verdict = "error".into();
            row.reason = "no GPU".into();
            return row;
        };
        // Large token counts are checked at a capped proxy of the shape.
        let (problem, check_note) = match self.opts.check_max_m.and_then(|cap| s.capped(cap)) {
            Some(p) => (
                p,
                format!("checked at m={} (proxy of m={}); ", p.columns().0, s.m),
            ),
            None => (s.problem(), String::new()),
        };
        let seed = seed_for(job.family.name(), &s.name);
        row.seed = Some(seed);
        let mut tol = job.family.default_tolerance(&c.defines, &problem);
        job.spec.tolerance.apply(&mut tol);
        progress(&format!("check {} {} {}", job.family.name(), p.id, s.name));
        let key = (canonical(&c.defines), format!("{problem:?}"));
        let result = match self.proxied.get(&key) {
            Some(r) => Ok(r.clone()),
            None => {
                let r = check_variant(gpu, job.family, &cv, &c.defines, &problem, seed, &tol);
                if let (Ok(rep), false) = (&r, check_note.is_empty()) {
                    self.proxied.insert(key, rep.clone());
                }
                r
            }
        };
        match result {
            Ok(rep) => {
                fill_report(&mut row, &rep, &check_note);
                row.verdict = if rep.passed { "pass" } else { "fail" }.into();
            }
            Err(e) => {
                row.verdict = "error".into();
                row.reason = e.to_string();
            }
        }
        row
    }
}

/// The rows of a report: per family, its duplicate points, then its cells
/// (`selected` with their rows from `done`, a cell with no row listed as
/// skipped), then (compile-only) its rejections. Compile-only rows are one
/// per (point, define set) with the worst resources over the entries its
/// shapes launch and the shapes counted ("Q8_0: 33 shapes"), and one per
/// (point, rejection reason) naming its shapes; GPU rows are one per
/// (point, shape), rejected ones included, in variant-major order. Every
/// shard of a run lists the same duplicate and rejected rows.
pub fn render_rows(
    jobs: &[FamilyJob],
    planned: &[Vec<Cell>],
    selected: &[WorkCell],
    done: &HashMap<CellId, CheckRow>,
    target: &str,
    compile_only: bool,
) -> Vec<CheckRow> {
    let mut out = Vec::new();
    for (ji, (job, cells)) in jobs.iter().zip(planned).enumerate() {
        // Duplicates are listed once, then skipped.
        for p in job.points.iter().filter(|p| p.duplicate_of.is_some()) {
            let mut r = CheckRow {
                verdict: "duplicate".into(),
                reason: format!(
                    "same defines as {}",
                    p.duplicate_of.clone().unwrap_or_default()
                ),
                ..base_row(job, p, &job.shapes[0], target, &p.defines)
            };
            r.shape = "*".into();
            out.push(r);
        }
        let row_of = |wc: &WorkCell| -> CheckRow {
            done.get(&wc.id).cloned().unwrap_or_else(|| {
                let c = &cells[wc.plan_index];
                let mut r = base_row(
                    job,
                    &job.points[wc.point],
                    &job.shapes[wc.shape],
                    target,
                    &c.defines,
                );
                r.verdict = VERDICT_SKIPPED.into();
                r.reason = "not run: interrupted".into();
                r
            })
        };
        let mine: Vec<&WorkCell> = selected.iter().filter(|c| c.job == ji).collect();
        if compile_only {
            let mut groups: BTreeMap<(usize, String), Vec<CheckRow>> = BTreeMap::new();
            for wc in &mine {
                groups
                    .entry((wc.point, wc.defines.clone()))
                    .or_default()
                    .push(row_of(wc));
            }
            for rows in groups.into_values() {
                out.push(aggregate_compile_rows(job, rows));
            }
            let mut rejected: BTreeMap<(usize, String), Vec<usize>> = BTreeMap::new();
            for c in cells {
                if let Err(r) = &c.outcome {
                    rejected
                        .entry((c.point, r.clone()))
                        .or_default()
                        .push(c.shape);
                }
            }
            for ((pi, reason), shapes) in rejected {
                let p = &job.points[pi];
                let s = &job.shapes[shapes[0]];
                let d = spec::resolve(p, s, &job.family.declared_defines());
                let mut row = base_row(job, p, s, target, &d);
                let names: Vec<&str> = shapes
                    .iter()
                    .map(|&i| job.shapes[i].name.as_str())
                    .collect();
                row.shape = names.join(",");
                row.verdict = "rejected".into();
                row.reason = reason;
                out.push(row);
            }
        } else {
            let mut rows: Vec<((usize, usize), CheckRow)> = mine
                .iter()
                .map(|wc| ((wc.point, wc.shape), row_of(wc)))
                .collect();
            for c in cells {
                if let Err(reason) = &c.outcome {
                    let mut r = base_row(
                        job,
                        &job.points[c.point],
                        &job.shapes[c.shape],
                        target,
                        &c.defines,
                    );
                    r.verdict = "rejected".into();
                    r.reason = reason.clone();
                    rows.push(((c.point, c.shape), r));
                }
            }
            rows.sort_by_key(|(k, _)| *k);
            out.extend(rows.into_iter().map(|(_, r)| r));
        }
    }
    out
}

/// One compile-only row from the per-shape rows of one (point, define
/// set): the first shape's row, with the worst (spills, registers) entry's
/// resources, the worst verdict and the shapes counted.
fn aggregate_compile_rows(job: &FamilyJob, rows: Vec<CheckRow>) -> CheckRow {
    let rank = |v: &str| match v {
        "compile-error" => 0,
        "skipped" => 1,
        "spills" => 2,
        _ => 3,
    };
    let count = rows.len();
    let worst_verdict = rows
        .iter()
        .min_by_key(|r| rank(&r.verdict))
        .map(|r| (r.verdict.clone(), r.reason.clone()))
        .unwrap_or_default();
    let worst = rows
        .iter()
        .filter(|r| r.registers.is_some())
        .max_by_key(|r| (r.spill_bytes, r.registers))
        .cloned();
    let mut row = rows.into_iter().next().unwrap_or_default();
    row.shape = format!("{}: {count} shapes", row.wtype);
    row.m = 0;
    row.n = 0;
    row.k = 0;
    if let Some(w) = worst {
        row.registers = w.registers;
        row.spill_bytes = w.spill_bytes;
        row.static_smem = w.static_smem;
        row.nvrtc_version = w.nvrtc_version;
    }
    row.verdict = worst_verdict.0;
    row.reason = worst_verdict.1;
    if row.verdict == "compiled" || row.verdict == "spills" {
        // The spill verdict follows the worst entry.
        row.reason = String::new();
        row.verdict = String::new();
        if !forbidden_spill(&mut row, job) {
            row.verdict = "compiled".into();
        }
    }
    row
}

/// The verdict a set of rows adds up to: compile errors and failed runs
/// are infrastructure, oracle failures and forbidden spills are failures.
pub fn outcome_of(rows: Vec<CheckRow>, compile_only: bool) -> CheckOutcome {
    let mut o = CheckOutcome::default();
    for r in &rows {
        match r.verdict.as_str() {
            "compile-error" if compile_only => o.infra.push(format!(
                "{} {} [{}]: compile failed for {}",
                r.family, r.variant, r.defines, r.arch
            )),
            "compile-error" => o
                .infra
                .push(format!("{} {}: compile failed", r.family, r.variant)),
            "error" => o.infra.push(format!(
                "{} {} {}: {}",
                r.family, r.variant, r.shape, r.reason
            )),
            "fail" | "spills" => o.failures += 1,
            _ => {}
        }
    }
    o.rows = rows;
    o
}

/// Runs a whole check in this process: every accepted cell (GPU checks in
/// shape-major order, so the inputs of a shape are made once), then the
/// report's rows. `gpu` is required unless `opts.compile_only`.
pub fn run_check(
    jobs: &[FamilyJob],
    gpu: Option<Gpu>,
    opts: &CheckOptions,
    mut progress: impl FnMut(&str),
) -> CheckOutcome {
    let lim = match &gpu {
        Some(g) => g.limits(),
        None => DeviceLimits::for_arch(opts.arch),
    };
    let planned = plan_jobs(jobs, &lim);
    for line in describe_plan(jobs, &planned, &opts.target) {
        progress(&line);
    }
    let mut cells = work_cells(jobs, &planned);
    if !opts.compile_only {
        cells.sort_by_key(|c| (c.job, c.shape, c.plan_index));
    }
    let mut runner = CellRunner::new(jobs, &planned, &cells, gpu, opts);
    let ids: Vec<CellId> = cells.iter().map(|c| c.id.clone()).collect();
    match runner.run(&ids, &mut progress) {
        Ok(rows) => {
            let done: HashMap<CellId, CheckRow> = rows.into_iter().collect();
            outcome_of(
                render_rows(
                    jobs,
                    &planned,
                    &cells,
                    &done,
                    &opts.target,
                    opts.compile_only,
                ),
                opts.compile_only,
            )
        }
        Err(e) => CheckOutcome {
            infra: vec![e],
            ..Default::default()
        },
    }
}

/// Copies a check's metrics into its row; the reason is `note` (e.g. the
/// capped-proxy remark) followed by the report's detail.
pub fn fill_report(row: &mut CheckRow, rep: &gemtune_kernels::check::CheckReport, note: &str) {
    row.rms_rel = Some(rep.rms_rel);
    row.max_rel = Some(rep.max_rel);
    row.max_abs = Some(rep.max_abs);
    row.outliers = Some(rep.outliers);
    row.replay_rms_rel = rep.replay_rms_rel;
    row.unwritten = Some(rep.unwritten);
    row.non_finite = Some(rep.non_finite);
    row.reason = format!("{note}{}", rep.detail);
}

/// Marks the row `spills` (with the reason) when it spilled and its spec
/// forbids that; true if so.
fn forbidden_spill(row: &mut CheckRow, job: &FamilyJob) -> bool {
    let spilled = row.spill_bytes.unwrap_or(0);
    if !job.spec.forbid_spills || spilled == 0 {
        return false;
    }
    row.verdict = "spills".into();
    row.reason = format!("{spilled} bytes spilled; {} forbids spills", job.spec.file);
    true
}

fn first_lines(s: &str, n: usize) -> String {
    s.lines().take(n).collect::<Vec<_>>().join(" | ")
}

fn fill_resources(row: &mut CheckRow, cv: &CompiledVariant, kernel: &str) {
    let (regs, spill, smem) = match cv.function(kernel) {
        Some(f) => (f.registers, f.spill_bytes, f.static_smem),
        None => (cv.registers, cv.spill_bytes, cv.static_smem),
    };
    row.registers = Some(regs);
    row.spill_bytes = Some(spill);
    row.static_smem = Some(smem);
    row.nvrtc_version = nvrtc_str(cv.nvrtc_version);
}

/// Loads every named family (all registered families when `names` is empty),
/// the shapes, and applies the variant filter.
pub fn load_jobs(
    vdir: &std::path::Path,
    names: &[String],
    shapes_arg: &[String],
    variant_filter: &[String],
    tokens: &[usize],
    shape_filter: &[String],
) -> Result<Vec<FamilyJob>, String> {
    let names: Vec<String> = if names.is_empty() {
        gemtune_kernels::family::families()
            .iter()
            .map(|f| f.name().to_string())
            .collect()
    } else {
        names
            .iter()
            .flat_map(|n| n.split(','))
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    };
    let mut jobs = Vec::new();
    for name in &names {
        let (spec, family) = spec::load_family(vdir, name).map_err(|e| e.to_string())?;
        let files: Vec<String> = if shapes_arg.is_empty() {
            spec.shapes.clone()
        } else {
            shapes_arg.to_vec()
        };
        if files.is_empty() {
            return Err(format!(
                "{}: no shapes: pass --shapes FILE or set `shapes` in [kernel]",
                spec.file
            ));
        }
        let mut shapes: Vec<Shape> = Vec::new();
        let kind = family.problem_kind();
        let mut other_kinds = 0usize;
        for f in &files {
            let sf = spec::load_shapes(&spec::shapes_path(vdir, f)).map_err(|e| e.to_string())?;
            for s in sf.expand() {
                // A family runs on shapes of its own kind only; several
                // families may share one `--shapes` list.
                if s.kind() != kind || !s.base.starts_with(spec.shape_prefix.as_str()) {
                    other_kinds += 1;
                    continue;
                }
                if !tokens.is_empty() && !tokens.contains(&s.m) {
                    continue;
                }
                if !shape_filter.is_empty()
                    && !shape_filter
                        .iter()
                        .any(|p| s.base == *p || s.name == *p || s.base.starts_with(p.as_str()))
                {
                    continue;
                }
                if !shapes.iter().any(|x| x.name == s.name) {
                    shapes.push(s);
                }
            }
        }
        if shapes.is_empty() {
            return Err(
                if other_kinds > 0 && tokens.is_empty() && shape_filter.is_empty() {
                    format!(
                    "{name} runs on {} shapes{}, and {} holds none ({other_kinds} shapes of other kinds or names)",
                    kind.name(),
                    if spec.shape_prefix.is_empty() {
                        String::new()
                    } else {
                        format!(" named {}*", spec.shape_prefix)
                    },
                    files.join(", ")
                )
                } else {
                    format!("{name}: no shape left after --tokens/--shape filters")
                },
            );
        }
        let points: Vec<Point> = spec::expand(&spec)
            .into_iter()
            .filter(|p| matches_filter(&p.id, variant_filter))
            .collect();
        if points.is_empty() {
            return Err(format!(
                "{name}: no variant matches --variant {}",
                variant_filter.join(" ")
            ));
        }
        let source_sha256 = source_sha256(family);
        jobs.push(FamilyJob {
            spec,
            family,
            points,
            shapes,
            source_sha256,
        });
    }
    Ok(jobs)
}
