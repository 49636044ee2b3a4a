//! `gemtune tune FAMILY[,FAMILY] --shapes FILE`: check first, then time every
//! passing variant x shape x regime, and write one compact report directory:
//! check.csv, results.csv, summary.md, time.png, roofline.png, one
//! heatmap-<family>.png per family with a two-axis sweep, run.json and the
//! results log cells.jsonl. `--promote` merges the per-shape winners into
//! variants/tuned/sm_XX.toml.
//!
//! Every GPU of `--devices` (default: all visible) runs one worker (a
//! `tune --serve` process each when there are several, in this process for
//! one) that owns its GPU: a cell's timing never shares a GPU. Cells are
//! handed out as workers finish: every check first, then every L2 timing,
//! then every DRAM timing (cold and hot cells are never interleaved). The
//! define sets are compiled once up front into the cubin cache, where the
//! workers load them from. Each finished stage is appended to cells.jsonl,
//! so a rerun into the same directory (or `--resume DIR`) measures only
//! what is missing; `--shard I/N` takes a slice of the cells for
//! `gemtune merge`. Ctrl-C stops after the current measurements; everything
//! measured so far is still written.
//!
//! `--strategy` / `--max-evals` / `--time-limit` replace the check of every
//! cell and the timing of every passing one by one search per (family,
//! shape, regime) (`search`), run on the first GPU of `--devices` in
//! this process (an evaluation's next point depends on the last one's
//! time); the report is the same.
//!
//! Vendor references (cuBLAS bf16 and int8 GEMM, `--no-reference` turns
//! them off) are checked against the oracle and timed on the first GPU
//! after the variants, in shard 1 only; a reference that cannot run
//! (cuBLAS not loadable, a shape it does not support, a failed check)
//! still gets its rows, with the verdict and reason instead of numbers.
//! NVML samples the clocks in the background throughout; each row keeps
//! the clocks seen during its measured samples.

mod measure;
mod references;
mod report;
mod rows;
pub mod search;
mod worker;

use crate::cmd::check::{self, SweepArgs};
use crate::exit::Exit;
use gemtune::cells::WorkCell;
use gemtune::checker::{self, CheckOptions};
use gemtune::results_cache::{ResultsLog, RunKey};
use gemtune::spec::Cell;
use gemtune_kernels::family::DeviceLimits;
use gemtune_kernels::gpu::DeviceInfo;
use gemtune_kernels::timing::Launches;
use search::SearchArgs;
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RegimeArg {
    L2,
    Dram,
    Both,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LaunchesArg {
    Stream,
    Graph,
    Chained,
}

impl LaunchesArg {
    pub fn mode(self) -> Launches {
        match self {
            LaunchesArg::Stream => Launches::Stream,
            LaunchesArg::Graph => Launches::Graph,
            LaunchesArg::Chained => Launches::Chained,
        }
    }
}

#[derive(clap::Args)]
pub struct Args {
    /// Family, or a comma list (e.g. mmq,gemm_dq to compare both algorithms in one report).
    pub family: String,
    /// Shapes file(s): a path, or a bare name in variants/shapes/ (default: the spec's `shapes`).
    #[arg(long)]
    pub shapes: Vec<String>,
    #[arg(long, value_enum, default_value = "both")]
    pub regime: RegimeArg,
    /// How a sample's launches are enqueued: `stream` (one launch at a
    /// time, as an eager engine), `graph` (captured once into a CUDA graph
    /// and replayed, as the engine's captured decode step) or `chained`
    /// (the graph with each launch a programmatic dependent of the one
    /// before, as the engine's chained decode step). Every row records it.
    #[arg(long, value_enum, default_value = "stream")]
    pub launches: LaunchesArg,
    /// Only these variant ids ("NAME*" matches a prefix); repeatable.
    #[arg(long = "variant")]
    pub variants: Vec<String>,
    /// Only these token counts, e.g. --tokens 512,2048.
    #[arg(long, value_delimiter = ',', value_parser = crate::cli::positive_usize)]
    pub tokens: Vec<usize>,
    /// Only shapes whose name starts with this; repeatable.
    #[arg(long = "shape")]
    pub shape_filter: Vec<String>,
    /// Report directory (default: target/gemtune/tune-<family>-<timestamp> of
    /// the checkout, printed; pass --out for a report to keep).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Merge per-shape winners into <variants>/tuned/sm_XX.toml.
    #[arg(long)]
    pub promote: bool,
    #[arg(long)]
    pub variants_dir: Option<PathBuf>,
    /// Measured GPU time per cell before sampling stops, ms.
    #[arg(long, default_value_t = 300.0, value_parser = crate::cli::positive_f64)]
    pub budget_ms: f64,
    /// Fewest timed samples per cell.
    #[arg(long, default_value_t = 20, value_parser = crate::cli::positive_usize)]
    pub min_reps: usize,
    /// Most timed samples per cell.
    #[arg(long, default_value_t = 200, value_parser = crate::cli::positive_usize)]
    pub max_reps: usize,
    /// Correctness of shapes with more tokens is checked at this many tokens.
    #[arg(long, default_value_t = 512, value_parser = crate::cli::positive_usize)]
    pub check_max_m: usize,
    /// Seed of the bootstrap resampling and of the search strategy.
    #[arg(long, default_value_t = 0x5eed, value_parser = crate::cli::seed)]
    pub seed: u64,
    /// Leave out the vendor reference rows (cuBLAS bf16 / int8 GEMM at the
    /// same shapes and regimes).
    #[arg(long)]
    pub no_reference: bool,
    #[command(flatten)]
    pub sweep: SweepArgs,
    #[command(flatten)]
    pub search: SearchArgs,
}

/// What every stage of one `tune` run shares: the cells and how they are
/// planned, the GPUs, the report directory and the key its records carry.
struct Session {
    vdir: PathBuf,
    jobs: Vec<checker::FamilyJob>,
    devices: Vec<DeviceInfo>,
    out: PathBuf,
    lim: DeviceLimits,
    opts: CheckOptions,
    planned: Vec<Vec<Cell>>,
    /// This shard's cells.
    cells: Vec<WorkCell>,
    /// "l2", "dram" or both, in the order they are measured.
    regimes: Vec<&'static str>,
    /// The run's key with no device: each record adds its GPU's.
    key: RunKey,
    nvrtc: String,
}

pub fn run(a: Args) -> anyhow::Result<Exit> {
    let s = match open(&a)? {
        Ok(s) => s,
        Err(exit) => return Ok(exit),
    };
    let mut log = ResultsLog::open_in(&s.out)?;
    if log.dropped_tail > 0 {
        eprintln!(
            "{}: dropped an unterminated last line ({} bytes) left by a killed run",
            log.path().display(),
            log.dropped_tail
        );
    }
    let mut m = measure::Measured::default();
    if a.search.active() {
        // A search chooses its cells from scratch; what an earlier run
        // logged here does not steer it.
        if let Err(exit) = measure::search(&a, &s, &mut m) {
            return Ok(exit);
        }
    } else {
        measure::resume(&s, &log, &mut m);
        measure::exhaustive(&a, &s, &mut log, &mut m);
    }
    if gemtune::interrupt::requested() {
        m.notes.push(
            "interrupted (SIGINT/SIGTERM): the tables hold only what was measured".to_string(),
        );
    }
    report::write(&a, &s, m)
}

/// Everything before the first measurement: the jobs, the checks of the
/// arguments, the GPUs, the report directory and the plan. `Err(exit)`:
/// the run ends with that exit (an error was printed, or this process was
/// a `--serve` worker and served its tasks).
fn open(a: &Args) -> anyhow::Result<Result<Session, Exit>> {
    if let Err(e) = gemtune_kernels::compile::nvrtc_version() {
        eprintln!("error: {e}");
        return Ok(Err(Exit::Infra));
    }
    let vdir = gemtune::spec::variants_dir(a.variants_dir.as_deref());
    let fams: Vec<String> = vec![a.family.clone()];
    let jobs = match checker::load_jobs(
        &vdir,
        &fams,
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
            return Ok(Err(Exit::Infra));
        }
    };
    if a.sweep.serve {
        return worker::serve(a, &jobs).map(Err);
    }
    if a.sweep.workers.is_some() {
        eprintln!("error: --workers applies to check --compile-only; tune runs one worker per GPU of --devices");
        return Ok(Err(Exit::Infra));
    }
    if a.search.active() && (a.sweep.shard.is_some() || a.sweep.resume.is_some()) {
        eprintln!(
            "error: --strategy/--max-evals/--time-limit run their searches in one process on one GPU; --shard and --resume apply to the exhaustive tune"
        );
        return Ok(Err(Exit::Infra));
    }
    let devices = match check::open_devices(&a.sweep) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(Err(Exit::Infra));
        }
    };
    // The first SIGINT/SIGTERM stops handing out work and writes the report
    // of what was measured (no promotion); a second exits now.
    if let Err(e) = gemtune::interrupt::install(gemtune::interrupt::Mode::Finish) {
        eprintln!("warning: {e}");
    }
    let out = match check::sweep_out(
        &a.sweep,
        a.out.as_deref(),
        &format!("tune-{}", a.family.replace(',', "+")),
    ) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(Err(Exit::Infra));
        }
    };
    std::fs::create_dir_all(&out)?;
    let lim = gemtune_kernels::gpu::Gpu::new(devices[0].ordinal)?.limits();
    let opts = worker::check_options(lim.arch, a, true);
    let mut progress = check::progress_printer();
    let planned = checker::plan_jobs(&jobs, &lim);
    for line in checker::describe_plan(&jobs, &planned, &opts.target) {
        progress(&line);
    }
    let cells = gemtune::cells::select(gemtune::cells::work_cells(&jobs, &planned), a.sweep.shard);
    let regimes = match a.regime {
        RegimeArg::L2 => vec!["l2"],
        RegimeArg::Dram => vec!["dram"],
        RegimeArg::Both => vec!["l2", "dram"],
    };
    let nvrtc = worker::nvrtc_string();
    let key = RunKey {
        device: String::new(),
        driver: String::new(),
        nvrtc: nvrtc.clone(),
        target: opts.target.clone(),
        params: format!(
            "tune check_max_m={} budget_ms={} min_reps={} max_reps={} seed={}{}",
            a.check_max_m,
            a.budget_ms,
            a.min_reps,
            a.max_reps,
            a.seed,
            // Stream launches keep the key of records written before the
            // launch modes, so their cells still resume.
            match a.launches.mode() {
                Launches::Stream => String::new(),
                m => format!(" launches={}", m.name()),
            }
        ),
    };
    Ok(Ok(Session {
        vdir,
        jobs,
        devices,
        out,
        lim,
        opts,
        planned,
        cells,
        regimes,
        key,
        nvrtc,
    }))
}
