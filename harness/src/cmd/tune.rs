//! `gemtune tune FAMILY[,FAMILY] --shapes FILE`: check first, then time every
//! passing variant x shape x regime, and write one compact report directory:
//! check.csv, results.csv, summary.md, time.png, roofline.png and one
//! heatmap-<family>.png per family with a two-axis sweep. `--promote` merges
//! the per-shape winners into variants/tuned/sm_XX.toml.
//!
//! The L2 phase runs before the DRAM phase (cold and hot cells are never
//! interleaved). Ctrl-C stops after the current measurement; everything
//! measured so far is still written.

use crate::exit::Exit;
use gemtune::checker::{self, CheckOptions};
use gemtune::results::{join_samples, write_csv, TuneRow};
use gemtune::roofline;
use gemtune::stats;
use gemtune_kernels::defines::canonical;
use gemtune_kernels::gpu::Gpu;
use gemtune_kernels::timing::{measure_ceilings, time_variant, Regime, TimingConfig};
use gemtune_kernels::workload::OpKind;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);

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
    #[arg(long, value_delimiter = ',')]
    pub tokens: Vec<usize>,
    /// Only shapes whose name starts with this; repeatable.
    #[arg(long = "shape")]
    pub shape_filter: Vec<String>,
    /// Report directory (default reports/tune-<family>-<timestamp>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Merge per-shape winners into <variants>/tuned/sm_XX.toml.
    #[arg(long)]
    pub promote: bool,
    #[arg(long)]
    pub variants_dir: Option<PathBuf>,
    /// Measured GPU time per cell before sampling stops, ms.
    #[arg(long, default_value_t = 300.0)]
    pub budget_ms: f64,
    #[arg(long, default_value_t = 20)]
    pub min_reps: usize,
    #[arg(long, default_value_t = 200)]
    pub max_reps: usize,
    /// Correctness of shapes with more tokens is checked at this many tokens.
    #[arg(long, default_value_t = 512)]
    pub check_max_m: usize,
    /// Seed of the bootstrap resampling.
    #[arg(long, default_value_t = 0x5eed)]
    pub seed: u64,
}

pub fn run(a: Args) -> anyhow::Result<Exit> {
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
    let _ = ctrlc::set_handler(|| {
        eprintln!("\ninterrupted: finishing the current measurement, then writing the report");
        STOP.store(true, Ordering::SeqCst);
    });
    let out = a.out.clone().unwrap_or_else(|| {
        PathBuf::from(format!(
            "reports/tune-{}-{}",
            a.family.replace(',', "+"),
            gemtune::util::timestamp()
        ))
    });
    std::fs::create_dir_all(&out)?;
    let info = gpu.info().clone();
    let arch = gpu.arch();

    // 1. Check.
    let opts = CheckOptions {
        arch,
        compile_only: false,
        cache: gemtune_kernels::compile::default_cache_dir(),
        check_max_m: Some(a.check_max_m),
        stop: Some(&STOP),
    };
    let outcome = checker::run_check(
        &jobs,
        Some(&gpu),
        &opts,
        crate::cmd::check::progress_printer(),
    );
    write_csv(&out.join("check.csv"), &outcome.rows)?;
    crate::cmd::check::print_table(
        &outcome
            .rows
            .iter()
            .filter(|r| r.verdict != "pass" && r.verdict != "rejected")
            .cloned()
            .collect::<Vec<_>>(),
    );
    let check_exit = crate::cmd::check::verdict(&outcome);

    // 2. Ceilings.
    let ceil = measure_ceilings(&gpu)?;
    let peaks = roofline::peaks_for(&info.name, info.cc);
    let nvrtc = gemtune_kernels::compile::nvrtc_version()
        .map(|v| format!("{}.{}", v.0, v.1))
        .unwrap_or_else(|e| e.to_string());

    // 3. Time: the L2 phase, then the DRAM phase.
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
    let total = (outcome.passing.len() * regimes.len()) as u64;
    let pb = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    if let Ok(st) = ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}") {
        pb.set_style(st);
    }
    let mut rows: Vec<TuneRow> = Vec::new();
    let mut notes = Vec::new();
    'phases: for &regime in &regimes {
        for ps in &outcome.passing {
            if STOP.load(Ordering::SeqCst) {
                notes.push(
                    "interrupted with Ctrl-C: the tables hold only what was measured".to_string(),
                );
                break 'phases;
            }
            let job = &jobs[ps.job];
            let p = &job.points[ps.point];
            let s = &job.shapes[ps.shape];
            let rname = if regime == Regime::L2 { "l2" } else { "dram" };
            pb.set_message(format!("{} {} {} {rname}", job.family.name(), p.id, s.name));
            let t = match time_variant(
                &gpu,
                job.family,
                &ps.cv,
                &ps.defines,
                &s.problem(),
                regime,
                &cfg,
            ) {
                Ok(t) => t,
                Err(e) => {
                    notes.push(format!(
                        "{} {} {} {rname}: timing failed: {e}",
                        job.family.name(),
                        p.id,
                        s.name
                    ));
                    pb.inc(1);
                    continue;
                }
            };
            let sm = stats::summarize(&t.samples_us, a.seed);
            let secs = sm.median * 1e-6;
            let fits_l2 = t.bytes_per_call <= info.l2_bytes;
            let (bw_label, bw) = match regime {
                Regime::L2 if fits_l2 => ("L2", ceil.l2_read_gbps),
                _ => ("HBM", ceil.hbm_read_gbps),
            };
            let instr = roofline::instr_of(job.family.name(), &ps.defines);
            let compute = peaks
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
            let regime_label = match regime {
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
            let (regs, spill, smem) = match ps.cv.function(
                &job.family
                    .validate(&ps.defines, &s.problem(), &gpu.limits())
                    .map(|g| g.kernel)
                    .unwrap_or_default(),
            ) {
                Some(f) => (f.registers, f.spill_bytes, f.static_smem),
                None => (ps.cv.registers, ps.cv.spill_bytes, ps.cv.static_smem),
            };
            rows.push(TuneRow {
                schema_version: gemtune::results::SCHEMA_VERSION,
                family: job.family.name().to_string(),
                variant: p.id.clone(),
                hash: p.hash.clone(),
                base: p.base.clone(),
                defines: canonical(&ps.defines),
                shape: s.name.clone(),
                shape_base: s.base.clone(),
                m: s.m,
                n: s.n,
                k: s.k,
                wtype: s.wtype_define(),
                regime: rname.to_string(),
                regime_label,
                weight_copies: t.weight_copies,
                rotated_bytes: t.rotated_bytes,
                samples: sm.n,
                median_us: sm.median,
                p10_us: sm.p10,
                p90_us: sm.p90,
                min_us: sm.min,
                mean_us: sm.mean,
                ci_lo_us: sm.ci_lo,
                ci_hi_us: sm.ci_hi,
                bytes_per_call: t.bytes_per_call,
                ops_per_call: t.ops_per_call,
                op_kind: match t.op_kind {
                    OpKind::Flop => "flop".into(),
                    OpKind::IntOp => "intop".into(),
                },
                gbps: t.bytes_per_call as f64 / secs / 1e9,
                tops: t.ops_per_call as f64 / secs / 1e12,
                roof: v.roof,
                roof_time_us: v.roof_time_us,
                pct_of_roof: v.pct_of_roof,
                intensity: v.intensity,
                roof_why: v.why,
                hbm_gbps: ceil.hbm_read_gbps,
                l2_gbps: ceil.l2_read_gbps,
                registers: regs,
                spill_bytes: spill,
                static_smem: smem,
                dyn_smem: ps.dyn_smem,
                launches_per_sample: t.launches_per_sample,
                blocks_per_sm: t.blocks_per_sm,
                device: info.name.clone(),
                cc: format!("{}.{}", info.cc.0, info.cc.1),
                sm_count: info.sm_count,
                l2_bytes: info.l2_bytes,
                clock_mhz: info.clock_mhz,
                mem_clock_mhz: info.mem_clock_mhz,
                driver_version: info.driver_version,
                nvrtc_version: nvrtc.clone(),
                spec_sha256: job.spec.sha256.clone(),
                source_sha256: job.source_sha256.clone(),
                timing_note: t.note.clone(),
                samples_us: join_samples(&t.samples_us),
            });
            // Rewritten after every cell so a crash keeps what was measured.
            write_csv(&out.join("results.csv"), &rows)?;
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    write_csv(&out.join("results.csv"), &rows)?;

    // 4. Summary and plots.
    let device_block = vec![
        ("device".to_string(), info.name.clone()),
        ("compute capability".into(), format!("{}.{}", info.cc.0, info.cc.1)),
        ("SMs".into(), info.sm_count.to_string()),
        ("L2".into(), format!("{} B", info.l2_bytes)),
        ("SM clock (max)".into(), format!("{} MHz", info.clock_mhz)),
        ("memory clock".into(), format!("{} MHz", info.mem_clock_mhz)),
        ("driver".into(), info.driver_version.to_string()),
        ("NVRTC".into(), nvrtc.clone()),
        ("HBM read (measured)".into(), format!("{:.0} GB/s", ceil.hbm_read_gbps)),
        ("L2 read (measured)".into(), format!("{:.0} GB/s", ceil.l2_read_gbps)),
        (
            "instruction peaks".into(),
            peaks.map_or("none known for this device: % of roof uses bandwidth only".to_string(), |p| {
                format!(
                    "mma.s8 {:.0} TOPS, mma.f16 {:.0} TFLOP/s, dp4a {:.0} TOPS, ffma {:.0} TFLOP/s ({})",
                    p.mma_s8 / 1e12,
                    p.mma_f16 / 1e12,
                    p.dp4a / 1e12,
                    p.ffma / 1e12,
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
    let md = gemtune::report::summary_md(&gemtune::report::SummaryInput {
        title: format!("gemtune tune {}", a.family),
        device_block,
        rows: &rows,
        checks: &outcome.rows,
        notes: notes.clone(),
    });
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
    if a.promote && !rows.is_empty() {
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
    Ok(check_exit)
}
