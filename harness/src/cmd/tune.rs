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
//! shape, regime) (`tune_search`), run on the first GPU of `--devices` in
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

use super::tune_search::{SearchArgs, Searcher};
use crate::cmd::check::{self, SweepArgs};
use crate::exit::Exit;
use gemtune::cells::{CellId, WorkCell};
use gemtune::checker::{self, CheckOptions, Compiled};
use gemtune::references::{self, RefJob};
use gemtune::results::CheckRow;
use gemtune::results::{join_samples, write_csv, TuneRow, KIND_REFERENCE, KIND_VARIANT};
use gemtune::results_cache::{Record, ResultsLog, RunKey, STAGE_CHECK};
use gemtune::roofline::{self, DevicePeaks, Instr};
use gemtune::run_info::RunInfo;
use gemtune::spec::Shape;
use gemtune::stats;
use gemtune::worker_pool::{run_pool, Done, FnWorker, ProcessWorker, Starter};
use gemtune_kernels::clocks::{reason_names, ClockSampler};
use gemtune_kernels::defines::canonical;
use gemtune_kernels::gpu::{DeviceInfo, Gpu};
use gemtune_kernels::reference::{time_reference, Cublas};
use gemtune_kernels::timing::{
    measure_ceilings, time_variant, Ceilings, Launches, Regime, Timing, TimingConfig,
};
use gemtune_kernels::workload::OpKind;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

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

/// NVML polling period: most cells measure for tens of ms and see several
/// polls; the shortest (a few ms) read the last poll of their warm-up
/// (`clocks::select_window`). Polls are a few driver queries each, far
/// apart enough not to disturb the GPU.
const CLOCK_PERIOD: Duration = Duration::from_millis(10);

/// What every row of one run shares.
struct RunCtx<'a> {
    info: &'a DeviceInfo,
    ceil: &'a Ceilings,
    peaks: Option<&'static DevicePeaks>,
    nvrtc: String,
    seed: u64,
    sampler: Option<&'a ClockSampler>,
    launches: Launches,
}

/// Who a row is about: a variant of a family, or a vendor reference.
struct Ident<'a> {
    kind: &'static str,
    family: String,
    variant: String,
    hash: String,
    base: String,
    defines: String,
    shape: &'a Shape,
    spec_sha256: String,
    source_sha256: String,
    /// Resources of the launch (registers, spill bytes, static and dynamic
    /// shared memory); zero for a vendor library.
    resources: (u32, u32, u32, u32),
    instr: Instr,
    reason: String,
}

fn rname(regime: Regime) -> &'static str {
    match regime {
        Regime::L2 => "l2",
        Regime::Dram => "dram",
    }
}

/// A row with no measurement: NaN statistics, the verdict and reason.
fn untimed_row(
    cx: &RunCtx<'_>,
    id: Ident<'_>,
    regime: Regime,
    verdict: &str,
    reason: String,
) -> TuneRow {
    let nan = f64::NAN;
    let s = id.shape;
    TuneRow {
        schema_version: gemtune::results::SCHEMA_VERSION,
        kind: id.kind.to_string(),
        family: id.family,
        variant: id.variant,
        hash: id.hash,
        base: id.base,
        defines: id.defines,
        shape: s.name.clone(),
        shape_base: s.base.clone(),
        m: s.m,
        n: s.n,
        k: s.k,
        wtype: s.wtype_define(),
        problem: s.problem.describe(),
        regime: rname(regime).to_string(),
        regime_label: String::new(),
        verdict: verdict.to_string(),
        reason,
        weight_copies: 0,
        rotated_bytes: 0,
        samples: 0,
        median_us: nan,
        p10_us: nan,
        p90_us: nan,
        min_us: nan,
        mean_us: nan,
        ci_lo_us: nan,
        ci_hi_us: nan,
        bytes_per_call: 0,
        ops_per_call: 2 * (s.m * s.n * s.k) as u64,
        op_kind: String::new(),
        gbps: nan,
        tops: nan,
        roof: String::new(),
        roof_time_us: nan,
        pct_of_roof: nan,
        intensity: nan,
        roof_why: String::new(),
        hbm_gbps: cx.ceil.hbm_read_gbps,
        l2_gbps: cx.ceil.l2_read_gbps,
        launch_floor_us: cx.ceil.launch_floor_for(cx.launches),
        registers: id.resources.0,
        spill_bytes: id.resources.1,
        static_smem: id.resources.2,
        dyn_smem: id.resources.3,
        launches_per_sample: 0,
        blocks_per_sm: 0,
        launches: cx.launches.name().to_string(),
        device: cx.info.name.clone(),
        cc: format!("{}.{}", cx.info.cc.0, cx.info.cc.1),
        sm_count: cx.info.sm_count,
        l2_bytes: cx.info.l2_bytes,
        clock_mhz: cx.info.clock_mhz,
        mem_clock_mhz: cx.info.mem_clock_mhz,
        driver_version: cx.info.driver_version,
        nvrtc_version: cx.nvrtc.clone(),
        spec_sha256: id.spec_sha256,
        source_sha256: id.source_sha256,
        timing_note: String::new(),
        sm_clock_min_mhz: None,
        sm_clock_max_mhz: None,
        sm_clock_mean_mhz: None,
        mem_clock_min_mhz: None,
        mem_clock_max_mhz: None,
        temp_max_c: None,
        power_max_w: None,
        clock_samples: 0,
        clock_reasons: String::new(),
        clock_note: String::new(),
        samples_us: String::new(),
        device_index: Some(cx.info.ordinal),
        pci_bus_id: cx.info.pci_bus_id.clone(),
    }
}

/// A measured row: statistics, derived figures, the roof, the clocks.
fn timed_row(cx: &RunCtx<'_>, id: Ident<'_>, t: &Timing) -> TuneRow {
    let regime = t.regime;
    let info = cx.info;
    let instr = id.instr;
    let reason = id.reason.clone();
    let mut row = untimed_row(cx, id, regime, gemtune::results::VERDICT_TIMED, reason);
    let sm = stats::summarize(&t.samples_us, cx.seed);
    let secs = sm.median * 1e-6;
    let fits_l2 = t.bytes_per_call <= info.l2_bytes;
    let (bw_label, bw) = match regime {
        Regime::L2 if fits_l2 => ("L2", cx.ceil.l2_read_gbps),
        _ => ("HBM", cx.ceil.hbm_read_gbps),
    };
    let compute = cx
        .peaks
        .and_then(|pk| pk.rate(instr))
        .map(|r| (instr.label(), r));
    let v = roofline::verdict(
        t.bytes_per_call,
        t.ops_per_call,
        sm.median,
        bw_label,
        bw,
        compute,
    );
    row.regime_label = match regime {
        Regime::L2 => format!(
            "l2: same buffers every call; {} B per call {} the {} B L2",
            t.bytes_per_call,
            if fits_l2 { "fits in" } else { "exceeds" },
            info.l2_bytes
        ),
        Regime::Dram => format!(
            "dram: {} weight copies, {} B rotated ({:.1}x L2){}",
            t.weight_copies,
            t.rotated_bytes,
            t.rotated_bytes as f64 / info.l2_bytes.max(1) as f64,
            if t.note.is_empty() {
                String::new()
            } else {
                format!("; {}", t.note)
            }
        ),
    };
    row.weight_copies = t.weight_copies;
    row.rotated_bytes = t.rotated_bytes;
    row.samples = sm.n;
    row.median_us = sm.median;
    row.p10_us = sm.p10;
    row.p90_us = sm.p90;
    row.min_us = sm.min;
    row.mean_us = sm.mean;
    row.ci_lo_us = sm.ci_lo;
    row.ci_hi_us = sm.ci_hi;
    row.bytes_per_call = t.bytes_per_call;
    row.ops_per_call = t.ops_per_call;
    row.op_kind = match t.op_kind {
        OpKind::Flop => "flop".into(),
        OpKind::IntOp => "intop".into(),
    };
    row.gbps = t.bytes_per_call as f64 / secs / 1e9;
    row.tops = t.ops_per_call as f64 / secs / 1e12;
    row.roof = v.roof;
    row.roof_time_us = v.roof_time_us;
    row.pct_of_roof = v.pct_of_roof;
    row.intensity = v.intensity;
    row.roof_why = v.why;
    row.launches_per_sample = t.launches_per_sample;
    row.launches = t.launches.name().to_string();
    row.blocks_per_sm = t.blocks_per_sm;
    row.timing_note = t.note.clone();
    row.samples_us = join_samples(&t.samples_us);
    if let Some(w) = cx
        .sampler
        .and_then(|c| c.window(t.warmup_from_s, t.measured_from_s, t.measured_to_s))
    {
        row.sm_clock_min_mhz = Some(w.sm_min_mhz);
        row.sm_clock_max_mhz = Some(w.sm_max_mhz);
        row.sm_clock_mean_mhz = Some(w.sm_mean_mhz);
        row.mem_clock_min_mhz = Some(w.mem_min_mhz);
        row.mem_clock_max_mhz = Some(w.mem_max_mhz);
        row.temp_max_c = w.temp_max_c;
        row.power_max_w = w.power_max_w;
        row.clock_samples = w.samples;
        row.clock_reasons = reason_names(w.reasons);
    }
    row
}

fn ref_ident(j: &RefJob) -> Ident<'_> {
    Ident {
        kind: KIND_REFERENCE,
        family: j.kind.library().to_string(),
        variant: j.kind.name().to_string(),
        hash: String::new(),
        base: String::new(),
        defines: String::new(),
        shape: &j.shape,
        spec_sha256: String::new(),
        source_sha256: String::new(),
        resources: (0, 0, 0, 0),
        instr: roofline::instr_of_reference(j.kind.name()),
        reason: String::new(),
    }
}

/// What a tune worker is handed: a cell's check, or its timing in one
/// regime ("l2" | "dram") once its check passed.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub enum TuneTask {
    Check(CellId),
    Time(CellId, String),
}

/// A tune worker's answer.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub enum TuneAnswer {
    Check(Box<CheckRow>),
    Time(Box<TuneRow>),
}

/// Checks come first, then every L2 timing, then every DRAM timing: the
/// pool never starts a later phase while an earlier one has work left, so
/// cold and hot measurements are never interleaved on a GPU.
fn phase(t: &TuneTask) -> usize {
    match t {
        TuneTask::Check(_) => 0,
        TuneTask::Time(_, r) if r == "l2" => 1,
        TuneTask::Time(..) => 2,
    }
}

fn regime_named(name: &str) -> Regime {
    if name == "l2" {
        Regime::L2
    } else {
        Regime::Dram
    }
}

/// The options a `tune` worker needs to plan and time the same cells.
fn worker_args(a: &Args) -> Vec<String> {
    let mut v = vec!["tune".to_string(), a.family.clone()];
    for x in &a.shapes {
        v.extend(["--shapes".into(), x.clone()]);
    }
    for x in &a.variants {
        v.extend(["--variant".into(), x.clone()]);
    }
    if !a.tokens.is_empty() {
        let t: Vec<String> = a.tokens.iter().map(|t| t.to_string()).collect();
        v.extend(["--tokens".into(), t.join(",")]);
    }
    for x in &a.shape_filter {
        v.extend(["--shape".into(), x.clone()]);
    }
    if let Some(x) = &a.variants_dir {
        v.extend(["--variants-dir".into(), x.display().to_string()]);
    }
    v.extend([
        "--budget-ms".into(),
        a.budget_ms.to_string(),
        "--min-reps".into(),
        a.min_reps.to_string(),
        "--max-reps".into(),
        a.max_reps.to_string(),
        "--check-max-m".into(),
        a.check_max_m.to_string(),
        "--seed".into(),
        a.seed.to_string(),
    ]);
    v
}

/// One GPU's worker: the cell runner (which owns the GPU), the device's
/// measured ceilings and its clock sampler.
struct TuneWorker<'a> {
    runner: checker::CellRunner<'a>,
    info: DeviceInfo,
    ceil: Ceilings,
    peaks: Option<&'static DevicePeaks>,
    sampler: Option<ClockSampler>,
    nvrtc: String,
    seed: u64,
    cfg: TimingConfig,
}

impl<'a> TuneWorker<'a> {
    fn start(
        device: usize,
        jobs: &'a [checker::FamilyJob],
        planned: &'a [Vec<gemtune::spec::Cell>],
        cells: &[WorkCell],
        opts: &'a CheckOptions,
        a: &Args,
    ) -> Result<Self, String> {
        let gpu = Gpu::new(device).map_err(|e| format!("GPU {device}: {e}"))?;
        let info = gpu.info().clone();
        let ceil = measure_ceilings(&gpu).map_err(|e| format!("GPU {device}: ceilings: {e}"))?;
        let sampler = ClockSampler::start(&info.pci_bus_id, CLOCK_PERIOD).ok();
        Ok(TuneWorker {
            peaks: roofline::peaks_for(&info.name, info.cc),
            runner: checker::CellRunner::new(jobs, planned, cells, Some(gpu), opts),
            info,
            ceil,
            sampler,
            nvrtc: nvrtc_string(),
            seed: a.seed,
            cfg: TimingConfig {
                budget_ms: a.budget_ms,
                min_reps: a.min_reps,
                max_reps: a.max_reps,
                launches: a.launches.mode(),
                ..TimingConfig::default()
            },
        })
    }

    fn handle(&mut self, t: &TuneTask) -> Result<TuneAnswer, String> {
        match t {
            TuneTask::Check(id) => {
                let mut rows = self.runner.run(std::slice::from_ref(id), |_| {})?;
                let (_, mut row) = rows.pop().ok_or("no row")?;
                row.device_index = Some(self.info.ordinal);
                Ok(TuneAnswer::Check(Box::new(row)))
            }
            TuneTask::Time(id, regime) => {
                let wc = self
                    .runner
                    .cell(id)
                    .cloned()
                    .ok_or_else(|| format!("{id}: not a cell of this plan"))?;
                self.runner.compile(&[&wc], |_| {});
                let cv = match self.runner.compiled(&wc) {
                    Compiled::Done(cv) => cv,
                    Compiled::Failed(e) => return Err(format!("compile failed: {e}")),
                    Compiled::NotRun => return Err("not compiled".into()),
                };
                let job = self.runner.job(&wc);
                let c = self.runner.plan_cell(&wc);
                let p = &job.points[wc.point];
                let s = &job.shapes[wc.shape];
                let gpu = self.runner.gpu().ok_or("no GPU")?;
                let regime = regime_named(regime);
                let t = time_variant(
                    gpu,
                    job.family,
                    &cv,
                    &c.defines,
                    &s.problem(),
                    regime,
                    &self.cfg,
                )
                .map_err(|e| format!("timing failed: {e}"))?;
                let dyn_smem = c.outcome.as_ref().map(|g| g.dyn_smem).unwrap_or(0);
                let kernel = job
                    .family
                    .validate(&c.defines, &s.problem(), &gpu.limits())
                    .map(|g| g.kernel)
                    .unwrap_or_default();
                let (regs, spill, smem) = match cv.function(&kernel) {
                    Some(f) => (f.registers, f.spill_bytes, f.static_smem),
                    None => (cv.registers, cv.spill_bytes, cv.static_smem),
                };
                let cx = RunCtx {
                    info: &self.info,
                    ceil: &self.ceil,
                    peaks: self.peaks,
                    nvrtc: self.nvrtc.clone(),
                    seed: self.seed,
                    sampler: self.sampler.as_ref(),
                    launches: self.cfg.launches,
                };
                let ident = Ident {
                    kind: KIND_VARIANT,
                    family: job.family.name().to_string(),
                    variant: p.id.clone(),
                    hash: p.hash.clone(),
                    base: p.base.clone(),
                    defines: canonical(&c.defines),
                    shape: s,
                    spec_sha256: job.spec.sha256.clone(),
                    source_sha256: job.source_sha256.clone(),
                    resources: (regs, spill, smem, dyn_smem),
                    instr: roofline::instr_of(job.family.name(), &c.defines),
                    reason: String::new(),
                };
                Ok(TuneAnswer::Time(Box::new(timed_row(&cx, ident, &t))))
            }
        }
    }
}

fn nvrtc_string() -> String {
    gemtune_kernels::compile::nvrtc_version()
        .map(|v| format!("{}.{}", v.0, v.1))
        .unwrap_or_else(|e| e.to_string())
}

fn check_options(arch: gemtune_kernels::compile::Arch, a: &Args, stop: bool) -> CheckOptions {
    CheckOptions {
        arch,
        target: arch.to_string(),
        compile_only: false,
        cache: gemtune_kernels::compile::default_cache_dir(),
        check_max_m: Some(a.check_max_m),
        stop: stop.then(gemtune::interrupt::flag),
    }
}

/// `tune --serve`: plans the same cells and runs the tasks it is handed on
/// the one GPU of `--devices`.
fn serve(a: &Args, jobs: &[checker::FamilyJob]) -> anyhow::Result<Exit> {
    let d = a.sweep.devices.first().copied().unwrap_or(0);
    let lim = match Gpu::new(d) {
        Ok(g) => g.limits(),
        Err(e) => {
            gemtune::worker_pool::refuse(&format!("GPU {d}: {e}"))?;
            return Ok(Exit::Infra);
        }
    };
    let opts = check_options(lim.arch, a, false);
    let planned = checker::plan_jobs(jobs, &lim);
    let cells = gemtune::cells::work_cells(jobs, &planned);
    let mut w = match TuneWorker::start(d, jobs, &planned, &cells, &opts, a) {
        Ok(w) => w,
        Err(e) => {
            gemtune::worker_pool::refuse(&e)?;
            return Ok(Exit::Infra);
        }
    };
    let ready = serde_json::json!({ "device": w.info.name, "index": d });
    gemtune::worker_pool::serve(ready, |t: TuneTask| w.handle(&t))?;
    Ok(Exit::Pass)
}

pub fn run(a: Args) -> anyhow::Result<Exit> {
    if let Err(e) = gemtune_kernels::compile::nvrtc_version() {
        eprintln!("error: {e}");
        return Ok(Exit::Infra);
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
            return Ok(Exit::Infra);
        }
    };
    if a.sweep.serve {
        return serve(&a, &jobs);
    }
    if a.sweep.workers.is_some() {
        eprintln!("error: --workers applies to check --compile-only; tune runs one worker per GPU of --devices");
        return Ok(Exit::Infra);
    }
    if a.search.active() && (a.sweep.shard.is_some() || a.sweep.resume.is_some()) {
        eprintln!(
            "error: --strategy/--max-evals/--time-limit run their searches in one process on one GPU; --shard and --resume apply to the exhaustive tune"
        );
        return Ok(Exit::Infra);
    }
    let devices = match check::open_devices(&a.sweep) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(Exit::Infra);
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
            return Ok(Exit::Infra);
        }
    };
    std::fs::create_dir_all(&out)?;
    let d0 = devices[0].clone();
    let lim = Gpu::new(d0.ordinal)?.limits();
    let arch = lim.arch;
    let opts = check_options(arch, &a, true);
    let mut progress = check::progress_printer();
    let planned = checker::plan_jobs(&jobs, &lim);
    for line in checker::describe_plan(&jobs, &planned, &opts.target) {
        progress(&line);
    }
    let cells = gemtune::cells::select(gemtune::cells::work_cells(&jobs, &planned), a.sweep.shard);
    let regimes: Vec<&str> = match a.regime {
        RegimeArg::L2 => vec!["l2"],
        RegimeArg::Dram => vec!["dram"],
        RegimeArg::Both => vec!["l2", "dram"],
    };

    // Finished stages of an earlier run into this directory.
    let mut log = ResultsLog::open_in(&out)?;
    if log.dropped_tail > 0 {
        eprintln!(
            "{}: dropped an unterminated last line ({} bytes) left by a killed run",
            log.path().display(),
            log.dropped_tail
        );
    }
    let nvrtc = nvrtc_string();
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
    let models: Vec<(String, String)> = devices
        .iter()
        .map(|i| (i.name.clone(), i.driver_version.to_string()))
        .collect();
    let mut checks: HashMap<CellId, CheckRow> = HashMap::new();
    let mut timed: HashMap<(CellId, String), TuneRow> = HashMap::new();
    {
        let found = log.finished(|_| true);
        for wc in &cells {
            let src = &jobs[wc.job].source_sha256;
            let get = |stage: &str| {
                found
                    .get(&(wc.id.clone(), stage.to_string()))
                    .filter(|r| check::record_matches(r, wc, &key, &models, src, stage))
            };
            if let Some(row) = get(STAGE_CHECK).and_then(|r| r.check.clone()) {
                checks.insert(wc.id.clone(), row);
            }
            for &r in &regimes {
                if let Some(row) = get(r).and_then(|rec| rec.tune.clone()) {
                    timed.insert((wc.id.clone(), r.to_string()), row);
                }
            }
        }
    }
    let mut notes: Vec<String> = Vec::new();
    // The searches' accounts, for search.csv and the summary.
    let mut search_report: Option<(String, Vec<super::tune_search::SearchRow>)> = None;
    if a.search.active() {
        // A search chooses its cells from scratch; what an earlier run
        // logged here does not steer it.
        checks.clear();
        timed.clear();
        if devices.len() > 1 {
            notes.push(format!(
                "the searches ran on GPU {} only ({} GPUs listed): each evaluation's next point depends on the last one's time",
                d0.ordinal,
                devices.len()
            ));
        }
        let mut w = match TuneWorker::start(d0.ordinal, &jobs, &planned, &cells, &opts, &a) {
            Ok(w) => w,
            Err(e) => {
                eprintln!("error: {e}");
                return Ok(Exit::Infra);
            }
        };
        let pb = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
        if let Ok(st) =
            ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
        {
            pb.set_style(st);
        }
        let mut sr = Searcher::new(&a.search, a.seed, &jobs, &cells, &lim);
        for &rn in &regimes {
            if !sr.phase(rn, &mut |t: &TuneTask| w.handle(t), &pb) {
                break;
            }
        }
        pb.finish_and_clear();
        let described = sr.describe();
        let done = sr.finish(&mut checks, &mut timed, &mut notes);
        search_report = Some((described, done));
    } else {
        let passed = |checks: &HashMap<CellId, CheckRow>, id: &CellId| {
            checks.get(id).is_some_and(|r| r.verdict == "pass")
        };
        let mut tasks: Vec<TuneTask> = Vec::new();
        let mut order: Vec<&WorkCell> = cells.iter().collect();
        // Checks shape-major (a worker's next cell often shares the inputs of
        // its last); timings in plan order.
        order.sort_by_key(|c| (c.job, c.shape, c.plan_index));
        for wc in &order {
            if !checks.contains_key(&wc.id) {
                tasks.push(TuneTask::Check(wc.id.clone()));
            }
        }
        for &r in &regimes {
            for wc in &cells {
                if passed(&checks, &wc.id) && !timed.contains_key(&(wc.id.clone(), r.to_string())) {
                    tasks.push(TuneTask::Time(wc.id.clone(), r.to_string()));
                }
            }
        }
        eprintln!(
            "{} cells{} on {} GPU(s): {} checks and {} timings finished in {}, {} tasks to run",
            cells.len(),
            a.sweep
                .shard
                .map(|s| format!(" in shard {s}"))
                .unwrap_or_default(),
            devices.len(),
            checks.len(),
            timed.len(),
            log.path().display(),
            tasks.len()
        );
        // Compile every define set with work left at once, on every core, into
        // the cubin cache; each worker then loads its cubins from there.
        if !tasks.is_empty() && opts.cache.is_some() {
            let ids: std::collections::HashSet<&CellId> = tasks
                .iter()
                .map(|t| match t {
                    TuneTask::Check(id) | TuneTask::Time(id, _) => id,
                })
                .collect();
            let pending: Vec<&WorkCell> = cells.iter().filter(|c| ids.contains(&c.id)).collect();
            let mut pre = checker::CellRunner::new(&jobs, &planned, &cells, None, &opts);
            pre.compile(&pending, &mut progress);
        }

        let pb =
            ProgressBar::with_draw_target(Some(tasks.len() as u64), ProgressDrawTarget::stderr());
        if let Ok(st) =
            ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
        {
            pb.set_style(st);
        }
        {
            let source_of = |ji: usize| jobs[ji].source_sha256.clone();
            let device_of = &devices;
            let mut on_done = |d: Done<TuneTask, TuneAnswer>| -> Vec<TuneTask> {
                pb.inc(1);
                let dev = &device_of[d.worker.min(device_of.len() - 1)];
                let (id, stage) = match &d.task {
                    TuneTask::Check(id) => (id.clone(), STAGE_CHECK.to_string()),
                    TuneTask::Time(id, r) => (id.clone(), r.clone()),
                };
                let Some(wc) = cells.iter().find(|c| c.id == id) else {
                    return Vec::new();
                };
                let mut rec = Record {
                    run: RunKey {
                        device: dev.name.clone(),
                        driver: dev.driver_version.to_string(),
                        ..key.clone()
                    },
                    cell: id.clone(),
                    defines: wc.defines.clone(),
                    source_sha256: source_of(wc.job),
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
                            follow = regimes
                                .iter()
                                .filter(|r| !timed.contains_key(&(id.clone(), r.to_string())))
                                .map(|r| TuneTask::Time(id.clone(), r.to_string()))
                                .collect();
                            pb.inc_length(follow.len() as u64);
                        }
                        rec.check = Some((*row).clone());
                        checks.insert(id, *row);
                    }
                    Ok(TuneAnswer::Time(row)) => {
                        pb.set_message(format!("{id} {stage}"));
                        rec.tune = Some((*row).clone());
                        timed.insert((id, stage), *row);
                    }
                    Err(e) => {
                        notes.push(format!("{id} {stage}: {e}"));
                        return Vec::new();
                    }
                }
                if let Err(e) = log.append(&rec) {
                    notes.push(e.to_string());
                }
                follow
            };
            let end = if devices.len() == 1 {
                let (jobs, planned, cells, opts, a) = (&jobs, &planned, &cells, &opts, &a);
                let dev = d0.ordinal;
                let starter: Starter<'_, FnWorker<_>> = Box::new(move || {
                    let mut w = TuneWorker::start(dev, jobs, planned, cells, opts, a)?;
                    Ok(FnWorker(move |t: &TuneTask| w.handle(t)))
                });
                run_pool(vec![starter], tasks, phase, opts.stop, &mut on_done)
            } else {
                let args = worker_args(&a);
                let starters: Vec<Starter<'_, ProcessWorker>> = devices
                    .iter()
                    .map(|i| {
                        let mut args = args.clone();
                        args.extend(["--devices".into(), i.ordinal.to_string()]);
                        let name = format!("worker (GPU {})", i.ordinal);
                        Box::new(move || ProcessWorker::spawn(&name, check::worker_command(&args)))
                            as Starter<'_, ProcessWorker>
                    })
                    .collect();
                run_pool(starters, tasks, phase, opts.stop, &mut on_done)
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
        pb.finish_and_clear();
    }
    if gemtune::interrupt::requested() {
        notes.push(
            "interrupted (SIGINT/SIGTERM): the tables hold only what was measured".to_string(),
        );
    }

    // Vendor references, on the first GPU once the workers are done (in
    // the first shard only, so a merge holds them once).
    let gpu = Gpu::new(d0.ordinal)?;
    let info = gpu.info().clone();
    let sampler = match ClockSampler::start(&info.pci_bus_id, CLOCK_PERIOD) {
        Ok(c) => Some(c),
        Err(e) => {
            notes.push(format!("{e}: rows carry no sampled clocks"));
            None
        }
    };
    let mut check_rows =
        checker::render_rows(&jobs, &planned, &cells, &checks, &opts.target, false);
    if a.search.active() && !gemtune::interrupt::requested() {
        for r in check_rows
            .iter_mut()
            .filter(|r| r.verdict == checker::VERDICT_SKIPPED)
        {
            r.reason = format!(
                "not evaluated by the {} search (budget {})",
                a.search.strategy,
                a.search.budget().describe()
            );
        }
    }
    let first_shard = a.sweep.shard.is_none_or(|s| s.index == 1);
    let mut ref_jobs: Vec<RefJob> = if a.no_reference || !first_shard {
        Vec::new()
    } else {
        references::plan(jobs.iter().map(|j| (j.family.name(), j.shapes.as_slice())))
    };
    let cublas: Result<Cublas, String> = if ref_jobs.is_empty() {
        Err(if first_shard {
            "none applies to these families".into()
        } else {
            "timed in shard 1".into()
        })
    } else {
        Cublas::new(&gpu).map_err(|e| e.to_string())
    };
    let ceil = measure_ceilings(&gpu)?;
    let peaks = roofline::peaks_for(&info.name, info.cc);
    let cx = RunCtx {
        info: &info,
        ceil: &ceil,
        peaks,
        nvrtc: nvrtc.clone(),
        seed: a.seed,
        sampler: sampler.as_ref(),
        launches: a.launches.mode(),
    };
    let cfg = TimingConfig {
        budget_ms: a.budget_ms,
        min_reps: a.min_reps,
        max_reps: a.max_reps,
        launches: a.launches.mode(),
        ..TimingConfig::default()
    };
    let mut ref_rows: Vec<(String, TuneRow)> = Vec::new();
    if !ref_jobs.is_empty() && !gemtune::interrupt::requested() {
        if let Err(e) = &cublas {
            notes.push(format!("vendor references not run: {e}"));
        }
        let rows = references::check_all(
            &gpu,
            cublas.as_ref().map_err(|e| e.as_str()),
            &mut ref_jobs,
            a.check_max_m,
            &arch.to_string(),
            Some(gemtune::interrupt::flag()),
            check::progress_printer(),
        );
        for r in rows
            .iter()
            .filter(|r| r.verdict == "fail" || r.verdict == "error")
        {
            notes.push(format!(
                "reference {} {}: {} ({}); not timed",
                r.variant, r.shape, r.verdict, r.reason
            ));
        }
        check_rows.extend(rows);
        'phases: for &rn in &regimes {
            let regime = regime_named(rn);
            for j in &ref_jobs {
                if gemtune::interrupt::requested() {
                    break 'phases;
                }
                let row = match (&j.status, &cublas) {
                    (Some(Ok(())), Ok(c)) => {
                        match time_reference(&gpu, c, j.kind, &j.shape.problem(), regime, &cfg) {
                            Ok(t) => {
                                let mut id = ref_ident(j);
                                id.reason = j.kind.note().to_string();
                                timed_row(&cx, id, &t)
                            }
                            Err(e) => {
                                notes.push(format!(
                                    "reference {} {} {rn}: {}: {e}",
                                    j.kind.name(),
                                    j.shape.name,
                                    e.verdict()
                                ));
                                untimed_row(&cx, ref_ident(j), regime, e.verdict(), e.to_string())
                            }
                        }
                    }
                    (Some(Err((verdict, reason))), _) => {
                        untimed_row(&cx, ref_ident(j), regime, verdict, reason.clone())
                    }
                    (_, Err(e)) => untimed_row(&cx, ref_ident(j), regime, "unavailable", e.clone()),
                    (None, Ok(_)) => {
                        untimed_row(&cx, ref_ident(j), regime, "error", "not checked".into())
                    }
                };
                ref_rows.push((rn.to_string(), row));
            }
        }
    }
    write_csv(&out.join("check.csv"), &check_rows)?;
    let outcome = checker::outcome_of(check_rows, false);
    crate::cmd::check::print_table(
        &outcome
            .rows
            .iter()
            .filter(|r| r.verdict != "pass" && r.verdict != "rejected")
            // The cells no search chose are listed in check.csv, not here.
            .filter(|r| !(search_report.is_some() && r.verdict == checker::VERDICT_SKIPPED))
            .cloned()
            .collect::<Vec<_>>(),
    );
    let check_exit = crate::cmd::check::verdict(&outcome);

    // The L2 rows, then the DRAM rows; in each, the variants in plan order,
    // then the references.
    let mut rows: Vec<TuneRow> = Vec::new();
    for &rn in &regimes {
        for wc in &cells {
            if let Some(r) = timed.get(&(wc.id.clone(), rn.to_string())) {
                rows.push(r.clone());
            }
        }
        rows.extend(
            ref_rows
                .iter()
                .filter(|(r, _)| r == rn)
                .map(|(_, row)| row.clone()),
        );
    }
    gemtune::report::flag_throttled(&mut rows);
    write_csv(&out.join("results.csv"), &rows)?;
    let info_file = RunInfo {
        command: "tune".into(),
        compile_only: false,
        target: opts.target.clone(),
        nvrtc: nvrtc.clone(),
        params: key.params.clone(),
        source_sha256: jobs
            .iter()
            .map(|j| (j.family.name().to_string(), j.source_sha256.clone()))
            .collect(),
        devices: devices.iter().map(check::device_entry).collect(),
        shards: a.sweep.shard.into_iter().collect(),
        cells: cells.len(),
        finished: cells
            .iter()
            .filter(|c| {
                checks.get(&c.id).is_some_and(|r| r.verdict != "pass")
                    || regimes
                        .iter()
                        .all(|r| timed.contains_key(&(c.id.clone(), r.to_string())))
            })
            .count(),
    };
    info_file.write(&out)?;

    if let Some((_, done)) = &search_report {
        write_csv(&out.join("search.csv"), done)?;
    }

    // 4. Summary and plots.
    let mut device_block = vec![
        ("device".to_string(), info.name.clone()),
        ("compute capability".into(), format!("{}.{}", info.cc.0, info.cc.1)),
        ("SMs".into(), info.sm_count.to_string()),
        ("L2".into(), format!("{} B", info.l2_bytes)),
        ("SM clock (max)".into(), format!("{} MHz", info.clock_mhz)),
        ("memory clock".into(), format!("{} MHz", info.mem_clock_mhz)),
        ("driver".into(), match sampler.as_ref() {
            Some(c) => format!("{} (CUDA {})", c.facts().driver, info.driver_version),
            None => format!("CUDA {}", info.driver_version),
        }),
        ("PCI bus id".into(), info.pci_bus_id.clone()),
        ("GPUs".into(), devices
            .iter()
            .map(|i| format!("{} ({})", i.ordinal, i.pci_bus_id))
            .collect::<Vec<_>>()
            .join(", ")
            + "; each row names its GPU (device_index, pci_bus_id)"),
        ("clock sampling".into(), match sampler.as_ref() {
            Some(c) => {
                let f = c.facts();
                let opt = |v: Option<u32>| v.map_or("?".to_string(), |x| x.to_string());
                format!(
                    "NVML {} every {} ms during each row's measured samples, read-only (clocks are never set); max SM {} MHz, max memory {} MHz, power limit {}",
                    f.nvml_version,
                    c.period().as_millis(),
                    opt(f.max_sm_mhz),
                    opt(f.max_mem_mhz),
                    f.power_limit_w.map_or("?".to_string(), |w| format!("{w:.0} W"))
                )
            }
            None => "not sampled: NVML (libnvidia-ml.so.1) could not be loaded".into(),
        }),
        ("vendor references".into(), if a.no_reference {
            "off (--no-reference)".to_string()
        } else {
            match &cublas {
                Ok(c) => format!("cuBLAS {} (cublasGemmEx; see the references table)", c.version()),
                Err(e) => format!("none: {e}"),
            }
        }),
        ("NVRTC".into(), nvrtc.clone()),
        ("HBM read (measured)".into(), format!("{:.0} GB/s", ceil.hbm_read_gbps)),
        ("L2 read (measured)".into(), format!("{:.0} GB/s", ceil.l2_read_gbps)),
        (
            "launch floor (measured)".into(),
            format!(
                "{:.2} us per launch (an empty kernel, one block per SM, enqueued back to back); {:.2} us replayed from a graph, {:.2} us chained in the graph",
                ceil.launch_floor_us, ceil.graph_launch_floor_us, ceil.chained_launch_floor_us
            ),
        ),
        (
            "instruction peaks".into(),
            peaks.map_or("none known for this device: % of roof uses bandwidth only".to_string(), |p| {
                format!(
                    "mma.s8 {:.0} TOPS, mma.f16 {:.0} TFLOP/s, dp4a {:.0} TOPS, ffma {:.0} TFLOP/s; wgmma and reference rows: tc.bf16 {:.0} TFLOP/s, tc.s8 {:.0} TOPS ({})",
                    p.mma_s8 / 1e12,
                    p.mma_f16 / 1e12,
                    p.dp4a / 1e12,
                    p.ffma / 1e12,
                    p.dense_bf16 / 1e12,
                    p.dense_s8 / 1e12,
                    p.source
                )
            }),
        ),
        (
            "timing".into(),
            format!(
                "CUDA events, budget {} ms/cell, {}..{} samples, bootstrap CI seed {:#x}; launches: {}; correctness of m > {} checked at m = {}",
                a.budget_ms,
                a.min_reps,
                a.max_reps,
                a.seed,
                match a.launches.mode() {
                    Launches::Stream => "stream (one enqueue per call)",
                    Launches::Graph => "graph (each sample's calls captured once into a CUDA graph and replayed)",
                    Launches::Chained => "chained (each sample's calls captured into a CUDA graph, every launch after a kernel a programmatic dependent of it)",
                },
                a.check_max_m,
                a.check_max_m
            ),
        ),
    ];
    if let Some((line, _)) = &search_report {
        device_block.push(("search".into(), line.clone()));
    }
    let mut md = gemtune::report::summary_md(&gemtune::report::SummaryInput {
        title: format!("gemtune tune {}", a.family),
        device_block,
        rows: &rows,
        checks: &outcome.rows,
        notes: notes.clone(),
    });
    if let Some((_, done)) = &search_report {
        md.push('\n');
        md.push_str(&super::tune_search::section(done));
    }
    std::fs::write(out.join("summary.md"), md)?;
    let heat_axes: Vec<(String, String, String)> = jobs
        .iter()
        .filter_map(|j| {
            j.spec.sweeps.iter().find(|s| s.axes.len() >= 2).map(|s| {
                (
                    j.family.name().to_string(),
                    s.axes[0].name.clone(),
                    s.axes[1].name.clone(),
                )
            })
        })
        .collect();
    if let Err(e) = gemtune::report::write_plots(&out, &rows, &heat_axes) {
        eprintln!("warning: plots: {e:#}");
    }
    let was_interrupted = gemtune::interrupt::requested();
    if a.promote && was_interrupted {
        eprintln!("not promoting: the run was interrupted");
    }
    if a.promote && !was_interrupted && !rows.is_empty() {
        let path = vdir.join("tuned").join(format!("{arch}.toml"));
        let winners = gemtune::tuned::select_winners(&rows, &out.display().to_string());
        let n = winners.len();
        gemtune::tuned::promote(&path, &arch.to_string(), winners)?;
        eprintln!("promoted {n} winners into {}", path.display());
    }
    eprintln!("wrote {}", out.display());
    for n in &notes {
        eprintln!("note: {n}");
    }
    if was_interrupted {
        return Ok(Exit::Interrupted);
    }
    Ok(check_exit)
}
