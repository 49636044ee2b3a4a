//! `gemtune check [FAMILY...]`: every variant of every family on every shape
//! against the CPU oracle (or, with `--compile-only`, compiled for an arch
//! with its registers, spills and shared memory). Prints a table, writes
//! `check.csv`, exits 0 pass / 3 correctness failure / 4 infrastructure.

use crate::exit::Exit;
use gemtune::cells::{CellId, WorkCell};
use gemtune::checker::{self, CheckOptions, CheckOutcome};
use gemtune::results::{write_csv, CheckRow};
use gemtune::results_cache::{Record, ResultsLog, RunKey, LOG_FILE, STAGE_CHECK, STAGE_COMPILE};
use gemtune::run_info::{DeviceEntry, RunInfo};
use gemtune::util::{clip, sci};
use gemtune::worker_pool::{run_pool, FnWorker, ProcessWorker, Starter};
use gemtune_kernels::compile::Arch;
use gemtune_kernels::family::DeviceLimits;
use gemtune_kernels::gpu::{DeviceInfo, Gpu};
use std::collections::HashMap;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Families to check (all registered families when none); "a,b" lists work too.
    pub families: Vec<String>,
    /// Only these variant ids ("NAME*" matches a prefix); repeatable.
    #[arg(long = "variant")]
    pub variants: Vec<String>,
    /// Shapes file(s): a path, or a bare name in variants/shapes/ (default: each spec's `shapes`).
    #[arg(long)]
    pub shapes: Vec<String>,
    /// Only these token counts, e.g. --tokens 1,8,512.
    #[arg(long, value_delimiter = ',', value_parser = crate::cli::positive_usize)]
    pub tokens: Vec<usize>,
    /// Only shapes whose name starts with this (e.g. e4b.ffn_up); repeatable.
    #[arg(long = "shape")]
    pub shape_filter: Vec<String>,
    /// Compile only (no GPU needed): registers, spills, shared memory per variant.
    #[arg(long)]
    pub compile_only: bool,
    /// Target architecture for --compile-only (default sm_90): any that the
    /// loaded NVRTC targets, sm_90a included; must match the GPU otherwise.
    #[arg(long)]
    pub arch: Option<String>,
    /// Report directory (default: target/gemtune/check-<timestamp> of the
    /// checkout, printed; pass --out for a report to keep).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The variants/ directory (default: found from the current directory).
    #[arg(long)]
    pub variants_dir: Option<PathBuf>,
    /// Bypass the on-disk cubin cache.
    #[arg(long)]
    pub no_cache: bool,
    /// Check shapes with more tokens than this at this many tokens instead.
    #[arg(long, value_parser = crate::cli::positive_usize)]
    pub check_max_m: Option<usize>,
    /// Also write the compile report: one row per family x variant x arch with
    /// the worst registers, spills and shared memory over the shapes. Rows of
    /// the families and arch checked replace theirs in an existing FILE; the
    /// rest is kept (`scripts/compile-report.sh` builds sm_80/89/90 this way).
    #[arg(long, value_name = "FILE")]
    pub compile_report: Option<PathBuf>,
    #[command(flatten)]
    pub sweep: SweepArgs,
}

/// How a sweep (`check` or `tune`) is split, spread and resumed: shards,
/// GPUs, worker processes.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct SweepArgs {
    /// Only the I-th of N deterministic slices of the cells (counted from
    /// 1); `gemtune merge` joins the shards' report directories.
    #[arg(long, value_name = "I/N", value_parser = gemtune::cells::parse_shard)]
    pub shard: Option<gemtune::cells::Shard>,
    /// Continue the run of this report directory (as `--out DIR` again:
    /// the cells finished in DIR/cells.jsonl are not run again); DIR must
    /// hold that log.
    #[arg(long, value_name = "DIR")]
    pub resume: Option<PathBuf>,
    /// GPUs to run on, one worker each (default: every visible GPU).
    #[arg(long, value_delimiter = ',', value_parser = crate::cli::count)]
    pub devices: Vec<usize>,
    /// Run on GPUs of different models (refused otherwise).
    #[arg(long)]
    pub allow_mixed: bool,
    /// --compile-only: compile in this many worker processes, each handed
    /// one define set at a time (default: in this process).
    #[arg(long, value_parser = crate::cli::positive_usize)]
    pub workers: Option<usize>,
    /// Serve as a worker process over stdin/stdout (internal).
    #[arg(long, hide = true)]
    pub serve: bool,
}

/// A batch of cells handed to one worker.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct CellTask {
    pub cells: Vec<CellId>,
}

/// What a worker answers for a `CellTask`: each cell's row.
pub type CellRows = Vec<(CellId, CheckRow)>;

/// The GPUs of a sweep (`--devices`, default every visible one), read once
/// (each context is dropped again); models must agree unless
/// `--allow-mixed`.
pub fn open_devices(sweep: &SweepArgs) -> Result<Vec<DeviceInfo>, String> {
    let list: Vec<usize> = if sweep.devices.is_empty() {
        let n = gemtune_kernels::gpu::device_count().map_err(|e| e.to_string())?;
        (0..n).collect()
    } else {
        sweep.devices.clone()
    };
    if list.is_empty() {
        return Err("no CUDA GPU visible".into());
    }
    let mut infos = Vec::new();
    for d in list {
        let g = Gpu::new(d).map_err(|e| format!("GPU {d}: {e}"))?;
        infos.push(g.info().clone());
    }
    let mut models: Vec<&str> = infos.iter().map(|i| i.name.as_str()).collect();
    models.sort();
    models.dedup();
    if models.len() > 1 && !sweep.allow_mixed {
        return Err(format!(
            "the GPUs are of different models ({}): timings would not compare; pick one model with --devices, or pass --allow-mixed",
            models.join(", ")
        ));
    }
    Ok(infos)
}

/// The report directory of a sweep: `--resume DIR` (which must hold a
/// results log), else `--out`, else a fresh default one.
pub fn sweep_out(
    sweep: &SweepArgs,
    out: Option<&std::path::Path>,
    name: &str,
) -> Result<PathBuf, String> {
    if let Some(r) = &sweep.resume {
        if !r.join(LOG_FILE).is_file() {
            return Err(format!(
                "--resume {}: no {LOG_FILE} there to resume from",
                r.display()
            ));
        }
        if out.is_some_and(|o| o != r.as_path()) {
            return Err("--resume DIR writes its report into DIR; leave out --out".into());
        }
        return Ok(r.clone());
    }
    Ok(out
        .map(|o| o.to_path_buf())
        .unwrap_or_else(|| gemtune::scratch::default_out(name)))
}

/// A `gemtune` worker process: this binary, `args`, `--serve`.
pub fn worker_command(args: &[String]) -> std::process::Command {
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("gemtune"));
    let mut c = std::process::Command::new(exe);
    c.args(args).arg("--serve");
    c
}

/// The options a `check` worker needs to plan the same cells.
fn worker_args(a: &Args) -> Vec<String> {
    let mut v = vec!["check".to_string()];
    v.extend(a.families.iter().cloned());
    for x in &a.variants {
        v.extend(["--variant".into(), x.clone()]);
    }
    for x in &a.shapes {
        v.extend(["--shapes".into(), x.clone()]);
    }
    if !a.tokens.is_empty() {
        let t: Vec<String> = a.tokens.iter().map(|t| t.to_string()).collect();
        v.extend(["--tokens".into(), t.join(",")]);
    }
    for x in &a.shape_filter {
        v.extend(["--shape".into(), x.clone()]);
    }
    if a.compile_only {
        v.push("--compile-only".into());
    }
    if let Some(x) = &a.arch {
        v.extend(["--arch".into(), x.clone()]);
    }
    if let Some(x) = &a.variants_dir {
        v.extend(["--variants-dir".into(), x.display().to_string()]);
    }
    if a.no_cache {
        v.push("--no-cache".into());
    }
    if let Some(m) = a.check_max_m {
        v.extend(["--check-max-m".into(), m.to_string()]);
    }
    v
}

/// Whether a record answers for `wc` in a run of `key`'s options on one of
/// `models`.
pub fn record_matches(
    r: &Record,
    wc: &WorkCell,
    key: &RunKey,
    models: &[(String, String)],
    source: &str,
    stage: &str,
) -> bool {
    r.stage == stage
        && r.cell == wc.id
        && r.defines == wc.defines
        && r.source_sha256 == source
        && r.run.nvrtc == key.nvrtc
        && r.run.target == key.target
        && r.run.params == key.params
        && (models.is_empty()
            || models
                .iter()
                .any(|(m, d)| r.run.device == *m && r.run.driver == *d))
}

fn nvrtc_string() -> String {
    gemtune_kernels::compile::nvrtc_version()
        .map(|v| format!("{}.{}", v.0, v.1))
        .unwrap_or_else(|e| e.to_string())
}

pub fn run(a: Args) -> anyhow::Result<Exit> {
    // Without NVRTC nothing can be checked: one message, before any work.
    if let Err(e) = gemtune_kernels::compile::nvrtc_version() {
        eprintln!("error: {e}");
        return Ok(Exit::Infra);
    }
    let vdir = gemtune::spec::variants_dir(a.variants_dir.as_deref());
    let jobs = match checker::load_jobs(
        &vdir,
        &a.families,
        &a.shapes,
        &a.variants,
        &a.tokens,
        &a.shape_filter,
    ) {
        Ok(j) => j,
        Err(e) => {
            if a.sweep.serve {
                gemtune::worker_pool::refuse(&e)?;
            }
            eprintln!("error: {e}");
            return Ok(Exit::Infra);
        }
    };
    let arch_arg: Option<Arch> = match a
        .arch
        .as_deref()
        .map(gemtune_kernels::compile::parse_target_arch)
        .transpose()
    {
        Ok(x) => x,
        Err(e) => {
            eprintln!("error: --arch: {e}");
            return Ok(Exit::Infra);
        }
    };
    if a.sweep.serve {
        return serve(&a, &jobs, arch_arg);
    }
    if a.compile_only && !a.sweep.devices.is_empty() {
        eprintln!("error: --devices names GPUs for a GPU check; --compile-only spreads over --workers N processes");
        return Ok(Exit::Infra);
    }
    if a.sweep.workers.is_some() && !a.compile_only {
        eprintln!("error: --workers applies to --compile-only; a GPU check runs one worker per GPU of --devices");
        return Ok(Exit::Infra);
    }
    let devices = if a.compile_only {
        Vec::new()
    } else {
        match open_devices(&a.sweep) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("error: {e} (use --compile-only to compile without a GPU)");
                return Ok(Exit::Infra);
            }
        }
    };
    let gpu_arch = devices.first().map(|i| Arch(i.cc.0 * 10 + i.cc.1));
    let arch = match (gpu_arch, arch_arg) {
        (Some(g), Some(x)) if g != x => {
            eprintln!("error: --arch {x} but the GPU is {g}");
            return Ok(Exit::Infra);
        }
        (Some(g), _) => g,
        (None, x) => x.unwrap_or(Arch(90)),
    };
    // Rows and messages name the target as asked (`sm_90a`), or the GPU's.
    let target = match (gpu_arch, a.arch.as_deref()) {
        (None, Some(t)) if t.trim().ends_with('a') => format!("{arch}a"),
        _ => arch.to_string(),
    };
    let opts = CheckOptions {
        arch,
        target,
        compile_only: a.compile_only,
        cache: if a.no_cache {
            None
        } else {
            gemtune_kernels::compile::default_cache_dir()
        },
        check_max_m: a.check_max_m,
        stop: Some(gemtune::interrupt::flag()),
    };
    let out = match sweep_out(&a.sweep, a.out.as_deref(), "check") {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(Exit::Infra);
        }
    };
    std::fs::create_dir_all(&out)?;
    let lim = match devices.first() {
        Some(i) => Gpu::new(i.ordinal)
            .map(|g| g.limits())
            .map_err(|e| anyhow::anyhow!("GPU {}: {e}", i.ordinal))?,
        None => DeviceLimits::for_arch(arch),
    };
    let mut progress = progress_printer();
    let planned = checker::plan_jobs(&jobs, &lim);
    for line in checker::describe_plan(&jobs, &planned, &opts.target) {
        progress(&line);
    }
    let cells = gemtune::cells::select(gemtune::cells::work_cells(&jobs, &planned), a.sweep.shard);

    // Finished cells of an earlier run into this directory are not run again.
    let mut log = ResultsLog::open_in(&out)?;
    if log.dropped_tail > 0 {
        eprintln!(
            "{}: dropped an unterminated last line ({} bytes) left by a killed run",
            log.path().display(),
            log.dropped_tail
        );
    }
    let nvrtc = nvrtc_string();
    let params = if a.compile_only {
        "compile-only".to_string()
    } else {
        format!("check check_max_m={:?}", a.check_max_m)
    };
    let models: Vec<(String, String)> = devices
        .iter()
        .map(|i| (i.name.clone(), i.driver_version.to_string()))
        .collect();
    let key = RunKey {
        device: String::new(),
        driver: String::new(),
        nvrtc: nvrtc.clone(),
        target: opts.target.clone(),
        params,
    };
    let stage = if a.compile_only {
        STAGE_COMPILE
    } else {
        STAGE_CHECK
    };
    let source_of = |ji: usize| jobs[ji].source_sha256.clone();
    let mut done: HashMap<CellId, CheckRow> = HashMap::new();
    {
        let found = log.finished(|_| true);
        for wc in &cells {
            if let Some(r) = found.get(&(wc.id.clone(), stage.to_string())) {
                if record_matches(r, wc, &key, &models, &source_of(wc.job), stage) {
                    if let Some(row) = &r.check {
                        done.insert(wc.id.clone(), row.clone());
                    }
                }
            }
        }
    }
    let todo: Vec<&WorkCell> = cells.iter().filter(|c| !done.contains_key(&c.id)).collect();
    eprintln!(
        "{} cells{}: {} finished in {}, {} to run",
        cells.len(),
        a.sweep
            .shard
            .map(|s| format!(" in shard {s}"))
            .unwrap_or_default(),
        done.len(),
        log.path().display(),
        todo.len()
    );

    // The first SIGINT/SIGTERM stops handing out cells and writes the
    // report of what finished; a second exits now.
    if let Err(e) = gemtune::interrupt::install(gemtune::interrupt::Mode::Finish) {
        eprintln!("warning: {e}");
    }
    let tasks = make_tasks(&todo, a.compile_only);
    let worker_args = worker_args(&a);
    let mut notes: Vec<String> = Vec::new();
    let started = std::time::Instant::now();
    let index: HashMap<&CellId, &WorkCell> = cells.iter().map(|c| (&c.id, c)).collect();
    // Who runs the cells: one process per GPU (in this process for one
    // GPU); compile-only, `--workers N` processes, else one thread per
    // compile-pool thread of this process.
    let in_process = match (a.compile_only, a.sweep.workers) {
        (true, None) => gemtune_kernels::pool::pool_threads(tasks.len()),
        (true, Some(_)) => 0,
        (false, _) if devices.len() == 1 => 1,
        (false, _) => 0,
    };
    let device_of: Vec<Option<&DeviceInfo>> = match (a.compile_only, in_process) {
        (true, 0) => vec![None; a.sweep.workers.unwrap_or(1)],
        (true, n) => vec![None; n],
        (false, _) => devices.iter().map(Some).collect(),
    };
    let n_tasks = tasks.len();
    {
        let mut on_done = |d: gemtune::worker_pool::Done<CellTask, CellRows>| {
            match d.result {
                Ok(rows) => {
                    let dev = device_of.get(d.worker).copied().flatten();
                    for (id, mut row) in rows {
                        if row.verdict == checker::VERDICT_SKIPPED {
                            continue;
                        }
                        let Some(wc) = index.get(&id) else { continue };
                        row.device_index = dev.map(|i| i.ordinal);
                        let rec = Record {
                            run: RunKey {
                                device: dev.map(|i| i.name.clone()).unwrap_or_default(),
                                driver: dev
                                    .map(|i| i.driver_version.to_string())
                                    .unwrap_or_default(),
                                ..key.clone()
                            },
                            cell: id.clone(),
                            defines: wc.defines.clone(),
                            source_sha256: source_of(wc.job),
                            stage: stage.to_string(),
                            gpu: dev.map(|i| i.ordinal),
                            check: Some(row.clone()),
                            tune: None,
                        };
                        if let Err(e) = log.append(&rec) {
                            notes.push(e.to_string());
                        }
                        progress(&format!("check {id}"));
                        done.insert(id, row);
                    }
                }
                Err(e) => notes.push(format!(
                    "worker {}: {} cells not run: {e}",
                    d.worker,
                    d.task.cells.len()
                )),
            }
            Vec::new()
        };
        let end = if in_process > 0 {
            let starters: Vec<Starter<'_, FnWorker<_>>> = device_of
                .iter()
                .map(|dev| {
                    let (jobs, planned, cells, opts) = (&jobs, &planned, &cells, &opts);
                    let dev = dev.map(|i| i.ordinal);
                    Box::new(move || {
                        let gpu = match dev {
                            Some(d) => Some(Gpu::new(d).map_err(|e| format!("GPU {d}: {e}"))?),
                            None => None,
                        };
                        let mut runner = checker::CellRunner::new(jobs, planned, cells, gpu, opts);
                        Ok(FnWorker(move |t: &CellTask| runner.run(&t.cells, |_| {})))
                    }) as Starter<'_, _>
                })
                .collect();
            run_pool(starters, tasks, |_| 0, opts.stop, &mut on_done)
        } else {
            let starters: Vec<Starter<'_, ProcessWorker>> = device_of
                .iter()
                .enumerate()
                .map(|(wi, dev)| {
                    let mut args = worker_args.clone();
                    if let Some(i) = dev {
                        args.extend(["--devices".into(), i.ordinal.to_string()]);
                    }
                    let name = match dev {
                        Some(i) => format!("worker {wi} (GPU {})", i.ordinal),
                        None => format!("worker {wi}"),
                    };
                    Box::new(move || ProcessWorker::spawn(&name, worker_command(&args)))
                        as Starter<'_, ProcessWorker>
                })
                .collect();
            run_pool(starters, tasks, |_| 0, opts.stop, &mut on_done)
        };
        for (w, why) in end.lost_workers {
            notes.push(format!("worker {w} lost: {why}"));
        }
        if !end.not_run.is_empty() && !gemtune::interrupt::requested() {
            notes.push(format!(
                "{} tasks not run: no worker left",
                end.not_run.len()
            ));
        }
    }
    if n_tasks > 0 {
        progress(&format!(
            "ran {} {} in {:.1} s on {} worker{}{}",
            n_tasks,
            if a.compile_only {
                "define sets"
            } else {
                "cells"
            },
            started.elapsed().as_secs_f64(),
            device_of.len(),
            if device_of.len() == 1 { "" } else { "s" },
            if in_process > 0 { "" } else { " (processes)" },
        ));
    }
    let rows = checker::render_rows(&jobs, &planned, &cells, &done, &opts.target, a.compile_only);
    let mut outcome = checker::outcome_of(rows, a.compile_only);
    outcome.infra.extend(notes);
    print_table(&outcome.rows);
    let csv = out.join("check.csv");
    write_csv(&csv, &outcome.rows)?;
    let info = RunInfo {
        command: "check".into(),
        compile_only: a.compile_only,
        target: opts.target.clone(),
        nvrtc,
        params: key.params.clone(),
        source_sha256: jobs
            .iter()
            .map(|j| (j.family.name().to_string(), j.source_sha256.clone()))
            .collect(),
        devices: devices.iter().map(device_entry).collect(),
        shards: a.sweep.shard.into_iter().collect(),
        cells: cells.len(),
        finished: cells.iter().filter(|c| done.contains_key(&c.id)).count(),
    };
    info.write(&out)?;
    eprintln!("wrote {}", csv.display());
    if let Some(path) = &a.compile_report {
        gemtune::results::update_compile_report(path, &outcome.rows)?;
        eprintln!("wrote {}", path.display());
    }
    if gemtune::interrupt::requested() {
        eprintln!(
            "interrupted: {} of {} cells finished; `--resume {}` runs the rest",
            info.finished,
            info.cells,
            out.display()
        );
        return Ok(Exit::Interrupted);
    }
    Ok(verdict(&outcome))
}

pub fn device_entry(i: &DeviceInfo) -> DeviceEntry {
    DeviceEntry {
        index: i.ordinal,
        name: i.name.clone(),
        driver: i.driver_version,
        pci_bus_id: i.pci_bus_id.clone(),
    }
}

/// The tasks of a check: on GPUs one cell each, in shape-major order (a
/// worker's next cell often shares the inputs of its last); compile-only,
/// one define set each (its cells share one compile).
fn make_tasks(todo: &[&WorkCell], compile_only: bool) -> Vec<CellTask> {
    if !compile_only {
        let mut order: Vec<&&WorkCell> = todo.iter().collect();
        order.sort_by_key(|c| (c.job, c.shape, c.plan_index));
        return order
            .into_iter()
            .map(|c| CellTask {
                cells: vec![c.id.clone()],
            })
            .collect();
    }
    let mut groups: Vec<Vec<CellId>> = Vec::new();
    let mut index: HashMap<(usize, &str), usize> = HashMap::new();
    for c in todo {
        let g = *index.entry((c.job, c.defines.as_str())).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[g].push(c.id.clone());
    }
    groups.into_iter().map(|cells| CellTask { cells }).collect()
}

/// `check --serve`: plans the same cells as the coordinator and runs the
/// tasks it is handed, on the one GPU of `--devices` (or compile-only).
fn serve(a: &Args, jobs: &[checker::FamilyJob], arch_arg: Option<Arch>) -> anyhow::Result<Exit> {
    let gpu = if a.compile_only {
        None
    } else {
        let d = a.sweep.devices.first().copied().unwrap_or(0);
        match Gpu::new(d) {
            Ok(g) => Some(g),
            Err(e) => {
                gemtune::worker_pool::refuse(&format!("GPU {d}: {e}"))?;
                return Ok(Exit::Infra);
            }
        }
    };
    let arch = gpu
        .as_ref()
        .map(|g| g.arch())
        .or(arch_arg)
        .unwrap_or(Arch(90));
    let target = match (&gpu, a.arch.as_deref()) {
        (None, Some(t)) if t.trim().ends_with('a') => format!("{arch}a"),
        _ => arch.to_string(),
    };
    let opts = CheckOptions {
        arch,
        target,
        compile_only: a.compile_only,
        cache: if a.no_cache {
            None
        } else {
            gemtune_kernels::compile::default_cache_dir()
        },
        check_max_m: a.check_max_m,
        stop: None,
    };
    let lim = match &gpu {
        Some(g) => g.limits(),
        None => DeviceLimits::for_arch(arch),
    };
    let planned = checker::plan_jobs(jobs, &lim);
    let cells = gemtune::cells::work_cells(jobs, &planned);
    let ready = serde_json::json!({
        "device": gpu.as_ref().map(|g| g.info().name.clone()),
        "pid": std::process::id(),
    });
    let mut runner = checker::CellRunner::new(jobs, &planned, &cells, gpu, &opts);
    gemtune::worker_pool::serve(ready, |t: CellTask| runner.run(&t.cells, |_| {}))?;
    Ok(Exit::Pass)
}

/// Progress of a check on stderr: a spinner with the current cell (or the
/// compile count), and the per-family summary lines printed above it. Without
/// a terminal the compile count is printed every tenth of the way.
pub fn progress_printer() -> impl FnMut(&str) {
    let pb =
        indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
    if let Ok(st) =
        indicatif::ProgressStyle::with_template("{spinner} {elapsed_precise} {pos} cells {msg}")
    {
        pb.set_style(st);
    }
    move |m: &str| {
        if let Some(cell) = m.strip_prefix("check ") {
            pb.inc(1);
            pb.set_message(cell.to_string());
        } else if let Some(count) = m.strip_prefix("compile ") {
            if !pb.is_hidden() {
                pb.set_message(format!("compiling {count}"));
            } else if tenth_mark(count) {
                eprintln!("compiling {count}");
            }
        } else if pb.is_hidden() {
            eprintln!("{m}");
        } else {
            pb.println(m);
        }
    }
}

/// Whether "done/total" is the first count to reach a new tenth of the way
/// (the tenth tenth being the end).
fn tenth_mark(count: &str) -> bool {
    let Some((d, t)) = count.split_once('/') else {
        return false;
    };
    match (d.parse::<usize>(), t.parse::<usize>()) {
        (Ok(d), Ok(t)) if t > 0 && d > 0 => d * 10 / t != (d - 1) * 10 / t,
        _ => false,
    }
}

pub fn verdict(o: &CheckOutcome) -> Exit {
    for e in &o.infra {
        eprintln!("infrastructure: {e}");
    }
    if !o.infra.is_empty() {
        Exit::Infra
    } else if o.failures > 0 {
        eprintln!("{} variant x shape cells failed", o.failures);
        Exit::Correctness
    } else {
        Exit::Pass
    }
}

pub fn print_table(rows: &[CheckRow]) {
    println!(
        "{:<14} {:<34} {:<28} {:<13} {:>9} {:>9} {:>9} {:>5} {:>6} {:>7}  note",
        "family",
        "variant",
        "shape",
        "verdict",
        "rms_rel",
        "max_rel",
        "replay",
        "regs",
        "spill",
        "smem"
    );
    for r in rows {
        let smem = match (r.static_smem, r.dyn_smem) {
            (None, None) => "-".to_string(),
            (s, d) => (s.unwrap_or(0) + d.unwrap_or(0)).to_string(),
        };
        let note = if r.verdict == "pass" || r.verdict == "compiled" {
            String::new()
        } else {
            clip(&r.reason, 120)
        };
        println!(
            "{:<14} {:<34} {:<28} {:<13} {:>9} {:>9} {:>9} {:>5} {:>6} {:>7}  {}",
            r.family,
            clip(&r.variant, 34),
            clip(&r.shape, 28),
            r.verdict,
            sci(r.rms_rel),
            sci(r.max_rel),
            sci(r.replay_rms_rel),
            r.registers.map_or("-".into(), |v| v.to_string()),
            r.spill_bytes.map_or("-".into(), |v| v.to_string()),
            smem,
            note
        );
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn compile_progress_prints_ten_lines_without_a_terminal() {
        let marks = (1..=176)
            .filter(|d| super::tenth_mark(&format!("{d}/176")))
            .count();
        assert_eq!(marks, 10);
        assert!(super::tenth_mark("176/176"));
        assert!(super::tenth_mark("3/3"));
        assert!(!super::tenth_mark("0/3"));
        assert!(!super::tenth_mark("x/3"));
    }
}
