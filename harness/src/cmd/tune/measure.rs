//! The measurements of a `tune` run: the stages an earlier run into the
//! same directory finished, then either the exhaustive pool (every cell's
//! check, then every passing cell's timing per regime, on one worker per
//! GPU) or one search per (family, shape, regime) (`search`).

use super::search::{SearchRow, Searcher};
use super::worker::{self, TuneAnswer, TuneTask, TuneWorker};
use super::{Args, Session};
use crate::cmd::check;
use crate::exit::Exit;
use gemtune::cells::{CellId, WorkCell};
use gemtune::checker;
use gemtune::results::{CheckRow, TuneRow};
use gemtune::results_cache::{Record, ResultsLog, RunKey, STAGE_CHECK};
use gemtune::worker_pool::{run_pool, Done, FnWorker, ProcessWorker, Starter};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::collections::{HashMap, HashSet};

/// What the run measured (or found measured), and what it has to say.
#[derive(Default)]
pub(super) struct Measured {
    pub checks: HashMap<CellId, CheckRow>,
    /// Keyed by cell and regime ("l2" | "dram").
    pub timed: HashMap<(CellId, String), TuneRow>,
    pub notes: Vec<String>,
    /// The searches' description and accounts, for search.csv and the
    /// summary; `None` for an exhaustive run.
    pub search: Option<(String, Vec<SearchRow>)>,
}

fn progress_bar(len: u64) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    if let Ok(st) = ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}") {
        pb.set_style(st);
    }
    pb
}

/// The stages of this session's cells that an earlier run logged in the
/// report directory under the same key, source and devices.
pub(super) fn resume(s: &Session, log: &ResultsLog, m: &mut Measured) {
    let models: Vec<(String, String)> = s
        .devices
        .iter()
        .map(|i| (i.name.clone(), i.driver_version.to_string()))
        .collect();
    let found = log.finished(|_| true);
    for wc in &s.cells {
        let src = &s.jobs[wc.job].source_sha256;
        let get = |stage: &str| {
            found
                .get(&(wc.id.clone(), stage.to_string()))
                .filter(|r| check::record_matches(r, wc, &s.key, &models, src, stage))
        };
        if let Some(row) = get(STAGE_CHECK).and_then(|r| r.check.clone()) {
            m.checks.insert(wc.id.clone(), row);
        }
        for &r in &s.regimes {
            if let Some(row) = get(r).and_then(|rec| rec.tune.clone()) {
                m.timed.insert((wc.id.clone(), r.to_string()), row);
            }
        }
    }
}

/// One search per (family, shape, regime), on the first GPU in this
/// process. `Err(exit)`: its worker could not start (printed).
pub(super) fn search(a: &Args, s: &Session, m: &mut Measured) -> Result<(), Exit> {
    let d0 = &s.devices[0];
    if s.devices.len() > 1 {
        m.notes.push(format!(
            "the searches ran on GPU {} only ({} GPUs listed): each evaluation's next point depends on the last one's time",
            d0.ordinal,
            s.devices.len()
        ));
    }
    let mut w = match TuneWorker::start(d0.ordinal, &s.jobs, &s.planned, &s.cells, &s.opts, a) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("error: {e}");
            return Err(Exit::Infra);
        }
    };
    let pb = progress_bar(0);
    let mut sr = Searcher::new(&a.search, a.seed, &s.jobs, &s.cells, &s.lim);
    for &rn in &s.regimes {
        if !sr.phase(rn, &mut |t: &TuneTask| w.handle(t), &pb) {
            break;
        }
    }
    pb.finish_and_clear();
    let described = sr.describe();
    let done = sr.finish(&mut m.checks, &mut m.timed, &mut m.notes);
    m.search = Some((described, done));
    Ok(())
}

/// The tasks left: every unchecked cell's check (shape-major: a worker's
/// next cell often shares the inputs of its last), then per regime the
/// timing of every passing cell not yet timed, in plan order.
fn pending_tasks(s: &Session, m: &Measured) -> Vec<TuneTask> {
    let mut tasks: Vec<TuneTask> = Vec::new();
    let mut order: Vec<&WorkCell> = s.cells.iter().collect();
    order.sort_by_key(|c| (c.job, c.shape, c.plan_index));
    for wc in &order {
        if !m.checks.contains_key(&wc.id) {
            tasks.push(TuneTask::Check(wc.id.clone()));
        }
    }
    for &r in &s.regimes {
        for wc in &s.cells {
            let passed = m.checks.get(&wc.id).is_some_and(|c| c.verdict == "pass");
            if passed && !m.timed.contains_key(&(wc.id.clone(), r.to_string())) {
                tasks.push(TuneTask::Time(wc.id.clone(), r.to_string()));
            }
        }
    }
    tasks
}

/// Every cell checked and every passing one timed in each regime, on one
/// worker per GPU (in this process for one GPU, `tune --serve` processes
/// for several); each finished stage appended to the log.
pub(super) fn exhaustive(a: &Args, s: &Session, log: &mut ResultsLog, m: &mut Measured) {
    let tasks = pending_tasks(s, m);
    eprintln!(
        "{} cells{} on {} GPU(s): {} checks and {} timings finished in {}, {} tasks to run",
        s.cells.len(),
        a.sweep
            .shard
            .map(|s| format!(" in shard {s}"))
            .unwrap_or_default(),
        s.devices.len(),
        m.checks.len(),
        m.timed.len(),
        log.path().display(),
        tasks.len()
    );
    // Compile every define set with work left at once, on every core, into
    // the cubin cache; each worker then loads its cubins from there.
    if !tasks.is_empty() && s.opts.cache.is_some() {
        let ids: HashSet<&CellId> = tasks
            .iter()
            .map(|t| match t {
                TuneTask::Check(id) | TuneTask::Time(id, _) => id,
            })
            .collect();
        let pending: Vec<&WorkCell> = s.cells.iter().filter(|c| ids.contains(&c.id)).collect();
        let mut pre = checker::CellRunner::new(&s.jobs, &s.planned, &s.cells, None, &s.opts);
        pre.compile(&pending, &mut check::progress_printer());
    }
    let pb = progress_bar(tasks.len() as u64);
    let mut on_done = |d: Done<TuneTask, TuneAnswer>| -> Vec<TuneTask> {
        pb.inc(1);
        if let (TuneTask::Time(id, r), Ok(_)) = (&d.task, &d.result) {
            pb.set_message(format!("{id} {r}"));
        }
        let follow = record(s, log, m, d);
        pb.inc_length(follow.len() as u64);
        follow
    };
    let end = if s.devices.len() == 1 {
        let dev = s.devices[0].ordinal;
        let starter: Starter<'_, FnWorker<_>> = Box::new(move || {
            let mut w = TuneWorker::start(dev, &s.jobs, &s.planned, &s.cells, &s.opts, a)?;
            Ok(FnWorker(move |t: &TuneTask| w.handle(t)))
        });
        run_pool(
            vec![starter],
            tasks,
            worker::phase,
            s.opts.stop,
            &mut on_done,
        )
    } else {
        let args = worker::worker_args(a);
        let starters: Vec<Starter<'_, ProcessWorker>> = s
            .devices
            .iter()
            .map(|i| {
                let mut args = args.clone();
                args.extend(["--devices".into(), i.ordinal.to_string()]);
                let name = format!("worker (GPU {})", i.ordinal);
                Box::new(move || ProcessWorker::spawn(&name, check::worker_command(&args)))
                    as Starter<'_, ProcessWorker>
            })
            .collect();
        run_pool(starters, tasks, worker::phase, s.opts.stop, &mut on_done)
    };
    pb.finish_and_clear();
    for (w, why) in end.lost_workers {
        m.notes.push(format!("worker {w} lost: {why}"));
    }
    if !end.not_run.is_empty() && !gemtune::interrupt::requested() {
        m.notes.push(format!(
            "{} tasks not run: no worker left",
            end.not_run.len()
        ));
    }
}

/// Keeps a worker's answer and appends it to the log; returns the tasks it
/// opens (a passed check's timings in the regimes not yet timed).
fn record(
    s: &Session,
    log: &mut ResultsLog,
    m: &mut Measured,
    d: Done<TuneTask, TuneAnswer>,
) -> Vec<TuneTask> {
    let dev = &s.devices[d.worker.min(s.devices.len() - 1)];
    let (id, stage) = match &d.task {
        TuneTask::Check(id) => (id.clone(), STAGE_CHECK.to_string()),
        TuneTask::Time(id, r) => (id.clone(), r.clone()),
    };
    let Some(wc) = s.cells.iter().find(|c| c.id == id) else {
        return Vec::new();
    };
    let mut rec = Record {
        run: RunKey {
            device: dev.name.clone(),
            driver: dev.driver_version.to_string(),
            ..s.key.clone()
        },
        cell: id.clone(),
        defines: wc.defines.clone(),
        source_sha256: s.jobs[wc.job].source_sha256.clone(),
        stage: stage.clone(),
        gpu: Some(dev.ordinal),
        check: None,
        tune: None,
    };
    let mut follow = Vec::new();
    match d.result {
        Ok(TuneAnswer::Check(row)) => {
            if row.verdict == checker::VERDICT_SKIPPED {
                return Vec::new();
            }
            if row.verdict == "pass" {
                follow = s
                    .regimes
                    .iter()
                    .filter(|r| !m.timed.contains_key(&(id.clone(), r.to_string())))
                    .map(|r| TuneTask::Time(id.clone(), r.to_string()))
                    .collect();
            }
            rec.check = Some((*row).clone());
            m.checks.insert(id, *row);
        }
        Ok(TuneAnswer::Time(row)) => {
            rec.tune = Some((*row).clone());
            m.timed.insert((id, stage), *row);
        }
        Err(e) => {
            m.notes.push(format!("{id} {stage}: {e}"));
            return Vec::new();
        }
    }
    if let Err(e) = log.append(&rec) {
        m.notes.push(e.to_string());
    }
    follow
}
