//! `gemtune tune FAMILY[,FAMILY] --shapes FILE`: check first, then time every
//! passing variant x shape x regime, and write one compact report directory:
//! check.csv, results.csv, summary.md, time.png, roofline.png and one
//! heatmap-<family>.png per family with a two-axis sweep. `--promote` merges
//! the per-shape winners into variants/tuned/sm_XX.toml.
//!
//! The L2 phase runs before the DRAM phase (cold and hot cells are never
//! interleaved). Ctrl-C stops after the current measurement; everything
//! measured so far is still written.
//!
//! `--strategy` / `--max-evals` / `--time-limit` replace the check of every
//! cell and the timing of every passing one by one search per (family,
//! shape, regime) (`tune_search`); the rest of the run is the same.
//!
//! Vendor references (cuBLAS bf16 and int8 GEMM, `--no-reference` turns
//! them off) are checked against the oracle with the variants, then timed
//! at the same problems in each phase after the variants, by the same loop;
//! a reference that cannot run (cuBLAS not loadable, a shape it does not
//! support, a failed check) still gets its rows, with the verdict and
//! reason instead of numbers. NVML samples the clocks in the background
//! throughout; each row keeps the clocks seen during its measured samples.

use super::tune_search::{SearchArgs, Searcher};
use crate::exit::Exit;
use gemtune::checker::{self, CheckOptions, FamilyJob, Passing};
use gemtune::references::{self, RefJob};
use gemtune::results::{join_samples, write_csv, TuneRow, KIND_REFERENCE, KIND_VARIANT};
use gemtune::roofline::{self, DevicePeaks, Instr};
use gemtune::spec::Shape;
use gemtune::stats;
use gemtune_kernels::clocks::{reason_names, ClockSampler};
use gemtune_kernels::defines::canonical;
use gemtune_kernels::gpu::{DeviceInfo, Gpu};
use gemtune_kernels::reference::{time_reference, Cublas};
use gemtune_kernels::timing::{
    measure_ceilings, time_variant, Ceilings, Regime, Timing, TimingConfig,
};
use gemtune_kernels::workload::OpKind;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RegimeArg {
    L2,
    Dram,
    Both,
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
    #[command(flatten)]
    pub search: SearchArgs,
    /// Leave out the vendor reference rows (cuBLAS bf16 / int8 GEMM at the
    /// same shapes and regimes).
    #[arg(long)]
    pub no_reference: bool,
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
        launch_floor_us: cx.ceil.launch_floor_us,
        registers: id.resources.0,
        spill_bytes: id.resources.1,
        static_smem: id.resources.2,
        dyn_smem: id.resources.3,
        launches_per_sample: 0,
        blocks_per_sm: 0,
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

/// Times one passing cell in one regime: its row, or the note saying why
/// it could not be timed.
fn time_cell(
    cx: &RunCtx<'_>,
    gpu: &Gpu,
    jobs: &[FamilyJob],
    ps: &Passing,
    regime: Regime,
    cfg: &TimingConfig,
) -> Result<TuneRow, String> {
    let job = &jobs[ps.job];
    let p = &job.points[ps.point];
    let s = &job.shapes[ps.shape];
    let t = time_variant(
        gpu,
        job.family,
        &ps.cv,
        &ps.defines,
        &s.problem(),
        regime,
        cfg,
    )
    .map_err(|e| {
        format!(
            "{} {} {} {}: timing failed: {e}",
            job.family.name(),
            p.id,
            s.name,
            rname(regime)
        )
    })?;
    let (regs, spill, smem) = match ps.cv.function(
        &job.family
            .validate(&ps.defines, &s.problem(), &gpu.limits())
            .map(|g| g.kernel)
            .unwrap_or_default(),
    ) {
        Some(f) => (f.registers, f.spill_bytes, f.static_smem),
        None => (ps.cv.registers, ps.cv.spill_bytes, ps.cv.static_smem),
    };
    let id = Ident {
        kind: KIND_VARIANT,
        family: job.family.name().to_string(),
        variant: p.id.clone(),
        hash: p.hash.clone(),
        base: p.base.clone(),
        defines: canonical(&ps.defines),
        shape: s,
        spec_sha256: job.spec.sha256.clone(),
        source_sha256: job.source_sha256.clone(),
        resources: (regs, spill, smem, ps.dyn_smem),
        instr: roofline::instr_of(job.family.name(), &ps.defines),
        reason: String::new(),
    };
    Ok(timed_row(cx, id, &t))
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
            eprintln!("error: {e}");
            return Ok(Exit::Infra);
        }
    };
    let gpu = match Gpu::new(0) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(Exit::Infra);
        }
    };
    // The first SIGINT/SIGTERM finishes the current measurement and writes
    // the report of what was measured (no promotion); a second exits now.
    if let Err(e) = gemtune::interrupt::install(gemtune::interrupt::Mode::Finish) {
        eprintln!("warning: {e}");
    }
    let out = a.out.clone().unwrap_or_else(|| {
        gemtune::scratch::default_out(&format!("tune-{}", a.family.replace(',', "+")))
    });
    std::fs::create_dir_all(&out)?;
    let info = gpu.info().clone();
    let arch = gpu.arch();
    let mut notes = Vec::new();
    let sampler = match ClockSampler::start(&info.pci_bus_id, CLOCK_PERIOD) {
        Ok(c) => Some(c),
        Err(e) => {
            notes.push(format!("{e}: rows carry no sampled clocks"));
            None
        }
    };

    // 1. Check: the variants, then the references at the same shapes.
    let opts = CheckOptions {
        arch,
        target: arch.to_string(),
        compile_only: false,
        cache: gemtune_kernels::compile::default_cache_dir(),
        check_max_m: Some(a.check_max_m),
        stop: Some(gemtune::interrupt::flag()),
    };
    // A search checks each cell it evaluates, during the timing phases.
    let mut searcher = None;
    let mut outcome = if a.search.active() {
        searcher = Some(Searcher::new(&a.search, a.seed, &jobs, opts, &gpu.limits()));
        checker::CheckOutcome::default()
    } else {
        checker::run_check(
            &jobs,
            Some(&gpu),
            &opts,
            crate::cmd::check::progress_printer(),
        )
    };
    let mut ref_jobs: Vec<RefJob> = if a.no_reference {
        Vec::new()
    } else {
        references::plan(jobs.iter().map(|j| (j.family.name(), j.shapes.as_slice())))
    };
    let cublas: Result<Cublas, String> = if ref_jobs.is_empty() {
        Err("none applies to these families".into())
    } else {
        Cublas::new(&gpu).map_err(|e| e.to_string())
    };
    if !ref_jobs.is_empty() {
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
            crate::cmd::check::progress_printer(),
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
        outcome.rows.extend(rows);
    }
    write_csv(&out.join("check.csv"), &outcome.rows)?;
    crate::cmd::check::print_table(
        &outcome
            .rows
            .iter()
            .filter(|r| r.verdict != "pass" && r.verdict != "rejected")
            .cloned()
            .collect::<Vec<_>>(),
    );
    let mut check_exit = crate::cmd::check::verdict(&outcome);

    // 2. Ceilings.
    let ceil = measure_ceilings(&gpu)?;
    let peaks = roofline::peaks_for(&info.name, info.cc);
    let nvrtc = gemtune_kernels::compile::nvrtc_version()
        .map(|v| format!("{}.{}", v.0, v.1))
        .unwrap_or_else(|e| e.to_string());
    let cx = RunCtx {
        info: &info,
        ceil: &ceil,
        peaks,
        nvrtc: nvrtc.clone(),
        seed: a.seed,
        sampler: sampler.as_ref(),
    };

    // 3. Time: the L2 phase, then the DRAM phase; in each, the variants,
    // then the references.
    let regimes: Vec<Regime> = match a.regime {
        RegimeArg::L2 => vec![Regime::L2],
        RegimeArg::Dram => vec![Regime::Dram],
        RegimeArg::Both => vec![Regime::L2, Regime::Dram],
    };
    let cfg = TimingConfig {
        budget_ms: a.budget_ms,
        min_reps: a.min_reps,
        max_reps: a.max_reps,
        ..TimingConfig::default()
    };
    let timed_refs = ref_jobs.iter().filter(|j| j.ready()).count();
    let total = ((outcome.passing.len() + timed_refs) * regimes.len()) as u64;
    let pb = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    if let Ok(st) = ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}") {
        pb.set_style(st);
    }
    let mut rows: Vec<TuneRow> = Vec::new();
    let interrupted = |notes: &mut Vec<String>| {
        let stop = gemtune::interrupt::requested();
        if stop {
            notes.push(
                "interrupted (SIGINT/SIGTERM): the tables hold only what was measured".to_string(),
            );
        }
        stop
    };
    'phases: for &regime in &regimes {
        let rn = rname(regime);
        if let Some(sr) = searcher.as_mut() {
            let mut time = |ps: &Passing| time_cell(&cx, &gpu, &jobs, ps, regime, &cfg);
            let results = out.join("results.csv");
            if !sr.phase(&gpu, rn, &mut time, &mut rows, &results, &mut notes, &pb)? {
                interrupted(&mut notes);
                break 'phases;
            }
        }
        for ps in &outcome.passing {
            if interrupted(&mut notes) {
                break 'phases;
            }
            let job = &jobs[ps.job];
            let p = &job.points[ps.point];
            let s = &job.shapes[ps.shape];
            pb.set_message(format!("{} {} {} {rn}", job.family.name(), p.id, s.name));
            match time_cell(&cx, &gpu, &jobs, ps, regime, &cfg) {
                Ok(row) => {
                    rows.push(row);
                    // Rewritten after every cell so a crash keeps what was measured.
                    write_csv(&out.join("results.csv"), &rows)?;
                }
                Err(note) => notes.push(note),
            }
            pb.inc(1);
        }
        for j in &ref_jobs {
            if interrupted(&mut notes) {
                break 'phases;
            }
            let row = match (&j.status, &cublas) {
                (Some(Ok(())), Ok(c)) => {
                    pb.set_message(format!("{} {} {rn}", j.kind.name(), j.shape.name));
                    let r = time_reference(&gpu, c, j.kind, &j.shape.problem(), regime, &cfg);
                    pb.inc(1);
                    match r {
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
            rows.push(row);
            write_csv(&out.join("results.csv"), &rows)?;
        }
    }
    pb.finish_and_clear();
    // The search's line for the summary's header and its section.
    let mut search_report: Option<(String, String)> = None;
    if let Some(sr) = searcher {
        let described = sr.describe();
        let (checks, done) = sr.finish();
        let refs: Vec<_> = outcome.rows.drain(..).collect();
        outcome = checks;
        outcome.rows.extend(refs);
        write_csv(&out.join("check.csv"), &outcome.rows)?;
        crate::cmd::check::print_table(
            &outcome
                .rows
                .iter()
                .filter(|r| !matches!(r.verdict.as_str(), "pass" | "rejected" | "skipped"))
                .cloned()
                .collect::<Vec<_>>(),
        );
        check_exit = crate::cmd::check::verdict(&outcome);
        write_csv(&out.join("search.csv"), &done)?;
        search_report = Some((described, super::tune_search::section(&done)));
    }
    gemtune::report::flag_throttled(&mut rows);
    write_csv(&out.join("results.csv"), &rows)?;

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
                "{:.2} us per launch (an empty kernel, one block per SM, enqueued back to back)",
                ceil.launch_floor_us
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
                "CUDA events, budget {} ms/cell, {}..{} samples, bootstrap CI seed {:#x}; correctness of m > {} checked at m = {}",
                a.budget_ms, a.min_reps, a.max_reps, a.seed, a.check_max_m, a.check_max_m
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
    if let Some((_, section)) = &search_report {
        md.push('\n');
        md.push_str(section);
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
