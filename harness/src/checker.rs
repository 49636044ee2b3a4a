//! The work of `gemtune check`, shared with `tune`: expand each family's
//! spec, validate every (variant, shape), compile each distinct define set
//! of every family once (in one compile pool), and on a GPU run every
//! accepted cell against the oracle. Everything is recorded as `CheckRow`s; nothing is dropped.

use crate::results::CheckRow;
use crate::spec::{self, Cell, FamilySpec, Point, Shape};
use gemtune_kernels::check::check_variant;
use gemtune_kernels::compile::{Arch, CompileError, CompiledVariant};
use gemtune_kernels::defines::{canonical, Defines};
use gemtune_kernels::family::{DeviceLimits, Family};
use gemtune_kernels::gpu::Gpu;
use gemtune_kernels::pool::{compile_all, CompileJob};
use std::collections::BTreeMap;
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
enum Compiled {
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

/// A (family, point, shape) that passed, with what `tune` needs to time it.
#[derive(Clone)]
pub struct Passing {
    pub job: usize,
    pub point: usize,
    pub shape: usize,
    pub defines: Defines,
    pub dyn_smem: u32,
    pub cv: Arc<CompiledVariant>,
}

#[derive(Default)]
pub struct CheckOutcome {
    pub rows: Vec<CheckRow>,
    pub infra: Vec<String>,
    pub failures: usize,
    pub passing: Vec<Passing>,
}

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

/// Runs the check. `gpu` is required unless `opts.compile_only`.
pub fn run_check(
    jobs: &[FamilyJob],
    gpu: Option<&Gpu>,
    opts: &CheckOptions,
    mut progress: impl FnMut(&str),
) -> CheckOutcome {
    let mut out = CheckOutcome::default();
    let lim = match gpu {
        Some(g) => g.limits(),
        None => DeviceLimits::for_arch(opts.arch),
    };
    // Plan every family, then compile the distinct accepted define sets of
    // all of them in one pool (a family with few define sets does not leave
    // the other cores idle).
    let planned: Vec<Vec<Cell>> = jobs
        .iter()
        .map(|job| spec::plan(job.family, &job.points, &job.shapes, &lim))
        .collect();
    let mut unique_of: Vec<Vec<(String, Defines)>> = Vec::with_capacity(jobs.len());
    for (job, cells) in jobs.iter().zip(&planned) {
        let mut keys = std::collections::BTreeSet::new();
        let unique: Vec<(String, Defines)> = cells
            .iter()
            .filter(|c| c.outcome.is_ok() && keys.insert(canonical(&c.defines)))
            .map(|c| (canonical(&c.defines), c.defines.clone()))
            .collect();
        progress(&format!(
            "{}: {} variants x {} shapes, {} cells rejected, {} define sets to compile for {}",
            job.family.name(),
            job.points
                .iter()
                .filter(|p| p.duplicate_of.is_none())
                .count(),
            job.shapes.len(),
            cells.iter().filter(|c| c.outcome.is_err()).count(),
            unique.len(),
            opts.target
        ));
        unique_of.push(unique);
    }
    // The families take turns in the pool's queue, so a pool stopped early
    // (a time budget) has compiled some of every family.
    let mut requests: Vec<CompileJob> = Vec::new();
    let mut request_of: Vec<BTreeMap<String, usize>> = vec![BTreeMap::new(); jobs.len()];
    let rounds = unique_of.iter().map(Vec::len).max().unwrap_or(0);
    for round in 0..rounds {
        for (ji, unique) in unique_of.iter().enumerate() {
            if let Some((key, defines)) = unique.get(round) {
                requests.push(CompileJob {
                    family: jobs[ji].family,
                    defines: defines.clone(),
                    arch: opts.arch,
                });
                request_of[ji].insert(key.clone(), requests.len() - 1);
            }
        }
    }
    let (results, report) = compile_all(
        &requests,
        opts.cache.as_deref(),
        None,
        opts.stop,
        |done, total| progress(&format!("compile {done}/{total}")),
    );
    progress(&report.summary(&format!("define sets for {}", opts.target)));
    let mut results: Vec<Option<Compiled>> = results
        .into_iter()
        .map(|r| {
            Some(match r {
                Ok(mut cv) => {
                    // Compile-only rows need the resources, not the code.
                    if opts.compile_only {
                        cv.cubin = Vec::new();
                    }
                    Compiled::Done(Arc::new(cv))
                }
                Err(CompileError::NotRun { .. }) => Compiled::NotRun,
                Err(e) => Compiled::Failed(e.to_string()),
            })
        })
        .collect();

    for (ji, (job, cells)) in jobs.iter().zip(planned).enumerate() {
        // Duplicates are listed once, then skipped.
        for p in job.points.iter().filter(|p| p.duplicate_of.is_some()) {
            let mut r = CheckRow {
                verdict: "duplicate".into(),
                reason: format!(
                    "same defines as {}",
                    p.duplicate_of.clone().unwrap_or_default()
                ),
                ..base_row(job, p, &job.shapes[0], &opts.target, &p.defines)
            };
            r.shape = "*".into();
            out.rows.push(r);
        }
        let compiled: BTreeMap<String, Compiled> = request_of[ji]
            .iter()
            .filter_map(|(key, &i)| Some((key.clone(), results[i].take()?)))
            .collect();

        if opts.compile_only {
            compile_only_rows(job, &cells, &compiled, &opts.target, &mut out);
            continue;
        }
        let Some(gpu) = gpu else {
            out.infra
                .push("no GPU given to a non-compile-only check".into());
            return out;
        };
        let mut proxied: BTreeMap<(String, String), gemtune_kernels::check::CheckReport> =
            BTreeMap::new();
        // Cells run shape by shape, so the inputs and CPU references that
        // every variant of a shape shares are generated once (the kernels
        // crate memoizes the most recent ones); rows are put back in
        // variant-major order afterwards.
        let (rows_start, passing_start) = (out.rows.len(), out.passing.len());
        let mut order: Vec<usize> = (0..cells.len()).collect();
        order.sort_by_key(|&i| (cells[i].shape, i));
        for c in order.iter().map(|&i| &cells[i]) {
            let p = &job.points[c.point];
            let s = &job.shapes[c.shape];
            let mut row = base_row(job, p, s, &opts.target, &c.defines);
            if opts
                .stop
                .is_some_and(|f| f.load(std::sync::atomic::Ordering::SeqCst))
            {
                row.verdict = "skipped".into();
                row.reason = "interrupted".into();
                out.rows.push(row);
                continue;
            }
            let geo = match &c.outcome {
                Err(reason) => {
                    row.verdict = "rejected".into();
                    row.reason = reason.clone();
                    out.rows.push(row);
                    continue;
                }
                Ok(g) => g.clone(),
            };
            row.dyn_smem = Some(geo.dyn_smem);
            let cv = match compiled.get(&canonical(&c.defines)) {
                Some(Compiled::Done(cv)) => cv.clone(),
                Some(Compiled::NotRun) => {
                    row.verdict = "skipped".into();
                    row.reason = "not compiled: interrupted".into();
                    out.rows.push(row);
                    continue;
                }
                Some(Compiled::Failed(e)) => {
                    row.verdict = "compile-error".into();
                    row.reason = first_lines(e, 12);
                    out.infra
                        .push(format!("{} {}: compile failed", job.family.name(), p.id));
                    out.rows.push(row);
                    continue;
                }
                None => continue,
            };
            fill_resources(&mut row, &cv, &geo.kernel);
            if forbidden_spill(&mut row, job) {
                out.failures += 1;
                out.rows.push(row);
                continue;
            }
            // Large token counts are checked at a capped proxy of the shape.
            let (problem, check_note) = match opts.check_max_m.and_then(|cap| s.capped(cap)) {
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
            // Shapes proxied to the same problem are checked once.
            let key = (canonical(&c.defines), format!("{problem:?}"));
            let result = match proxied.get(&key) {
                Some(r) => Ok(r.clone()),
                None => {
                    let r = check_variant(gpu, job.family, &cv, &c.defines, &problem, seed, &tol);
                    if let (Ok(rep), false) = (&r, check_note.is_empty()) {
                        proxied.insert(key, rep.clone());
                    }
                    r
                }
            };
            match result {
                Ok(rep) => {
                    fill_report(&mut row, &rep, &check_note);
                    if rep.passed {
                        row.verdict = "pass".into();
                        out.passing.push(Passing {
                            job: ji,
                            point: c.point,
                            shape: c.shape,
                            defines: c.defines.clone(),
                            dyn_smem: geo.dyn_smem,
                            cv: cv.clone(),
                        });
                    } else {
                        row.verdict = "fail".into();
                        out.failures += 1;
                    }
                }
                Err(e) => {
                    row.verdict = "error".into();
                    row.reason = e.to_string();
                    out.infra
                        .push(format!("{} {} {}: {e}", job.family.name(), p.id, s.name));
                }
            }
            out.rows.push(row);
        }
        let point_of: BTreeMap<&str, usize> = job
            .points
            .iter()
            .enumerate()
            .map(|(i, p)| (p.id.as_str(), i))
            .collect();
        let shape_of: BTreeMap<&str, usize> = job
            .shapes
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name.as_str(), i))
            .collect();
        out.rows[rows_start..].sort_by_key(|r| {
            (
                point_of
                    .get(r.variant.as_str())
                    .copied()
                    .unwrap_or(usize::MAX),
                shape_of
                    .get(r.shape.as_str())
                    .copied()
                    .unwrap_or(usize::MAX),
            )
        });
        out.passing[passing_start..].sort_by_key(|p| (p.point, p.shape));
    }
    out
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

/// Compile-only: one row per (point, weight type) that compiled or failed,
/// and one row per (point, rejection reason) listing the shapes it covers.
fn compile_only_rows(
    job: &FamilyJob,
    cells: &[Cell],
    compiled: &BTreeMap<String, Compiled>,
    target: &str,
    out: &mut CheckOutcome,
) {
    // (point, define set) -> (first accepted cell, count)
    let mut seen: BTreeMap<(usize, String), (usize, usize)> = BTreeMap::new();
    // The kernels the accepted cells of a (point, define set) launch: one
    // module can hold several entries (gemv has one per token count), and
    // the row reports the worst of them, so a spill in any launched entry
    // fails the gate exactly as it fails the GPU check of that cell.
    let mut kernels: BTreeMap<(usize, String), std::collections::BTreeSet<String>> =
        BTreeMap::new();
    let mut rejected: BTreeMap<(usize, String), Vec<usize>> = BTreeMap::new();
    for (ci, c) in cells.iter().enumerate() {
        match &c.outcome {
            Ok(g) => {
                let e = seen
                    .entry((c.point, canonical(&c.defines)))
                    .or_insert((ci, 0));
                e.1 += 1;
                kernels
                    .entry((c.point, canonical(&c.defines)))
                    .or_default()
                    .insert(g.kernel.clone());
            }
            Err(r) => rejected
                .entry((c.point, r.clone()))
                .or_default()
                .push(c.shape),
        }
    }
    for ((pi, key), (ci, count)) in &seen {
        let c = &cells[*ci];
        let p = &job.points[*pi];
        let s = &job.shapes[c.shape];
        let mut row = base_row(job, p, s, target, &c.defines);
        row.shape = format!("{}: {count} shapes", s.wtype_define());
        row.m = 0;
        row.n = 0;
        row.k = 0;
        if let Ok(g) = &c.outcome {
            row.dyn_smem = Some(g.dyn_smem);
        }
        match compiled.get(key) {
            Some(Compiled::NotRun) => {
                row.verdict = "skipped".into();
                row.reason = "not compiled: stopped before its turn".into();
            }
            Some(Compiled::Done(cv)) => {
                let used = kernels.get(&(*pi, key.clone()));
                let worst = used
                    .into_iter()
                    .flatten()
                    .filter_map(|k| cv.function(k))
                    .max_by_key(|f| (f.spill_bytes, f.registers));
                fill_resources(&mut row, cv, worst.map_or("", |f| f.name.as_str()));
                if forbidden_spill(&mut row, job) {
                    out.failures += 1;
                } else {
                    row.verdict = "compiled".into();
                }
            }
            Some(Compiled::Failed(e)) => {
                row.verdict = "compile-error".into();
                row.reason = first_lines(e, 12);
                out.infra.push(format!(
                    "{} {} [{key}]: compile failed for {target}",
                    job.family.name(),
                    p.id
                ));
            }
            None => {}
        }
        out.rows.push(row);
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
        out.rows.push(row);
    }
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
