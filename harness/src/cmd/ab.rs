//! `gemtune ab --baseline A --candidate B`: an interleaved end-to-end A/B
//! of two engine arms (`gemtune::ab` has the workings). Writes
//! results.csv, summary.md, verdict.json, tps.png, ratio.png, phases.png
//! and the workers' logs. Exit: 0 SAME or FAST in every test, 1 any SLOW,
//! 2 any AMBIGUOUS (and no SLOW), 3 numerics gate failed (no timing ran),
//! 4 infrastructure or bad input (a worker that dies or breaks the
//! protocol, a failed git build, an unknown profile, no GPU).
//!
//! `ab` measures the CUDA engine: without a GPU it stops with one line
//! before it writes or builds anything. `--backend cpu` is the explicit
//! choice for arms that differ on the CPU (git revisions, other binaries)
//! on a given model; two profiles differ only in CUDA kernels, so on the
//! CPU they run the same computation and are refused.

use crate::cli;
use crate::exit::Exit;
use gemtune::ab::gate::GateConfig;
use gemtune::ab::session::{self, AbConfig};
use gemtune::ab::summary;
use gemtune::verdict::VerdictConfig;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    /// Baseline arm: a profile name (variants/profiles/NAME.toml) or file, git:REF, or a gemtune binary path.
    #[arg(long)]
    pub baseline: String,
    /// Candidate arm, as --baseline.
    #[arg(long)]
    pub candidate: String,
    /// Model GGUF (default: the synthetic e4b q8_0 that `bench` uses).
    #[arg(short = 'm', long)]
    pub model: Option<PathBuf>,
    /// Prompt tokens of each timed prefill.
    #[arg(short = 'p', long = "n-prompt", default_value_t = 2048, value_parser = cli::positive_u64)]
    pub n_prompt: u64,
    /// Decode steps after each prefill (0: prefill only).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128, value_parser = cli::count)]
    pub n_gen: usize,
    /// Tokens in the KV cache before each timed prefill (filled untimed).
    #[arg(short = 'd', long, default_value_t = 0, value_parser = cli::count)]
    pub depth: usize,
    /// Timed reps per arm: even, at least 6 (ABBA blocks of two reps each).
    #[arg(long, default_value_t = 12, value_parser = even_reps)]
    pub reps: usize,
    /// ABBA blocks of phase-timed requests after the timed ones, for the
    /// per-phase attribution (0 skips it; phase timing runs decode eagerly,
    /// so these never feed the verdict).
    #[arg(long, default_value_t = 3, value_parser = cli::count)]
    pub phase_blocks: usize,
    /// Warm-up rounds (one rep of each arm per round), discarded.
    #[arg(long, default_value_t = 1, value_parser = cli::count)]
    pub warmup: usize,
    /// Restart both workers before every ABBA block after the first, so a
    /// process's own placement bias becomes noise the interval measures
    /// (slower: one model load per arm per block).
    #[arg(long)]
    pub respawn: bool,
    /// Minimum effect: speed changes smaller than this fraction are SAME.
    #[arg(long, default_value_t = 0.01, value_parser = effect)]
    pub min_effect: f64,
    /// Confidence level of the intervals.
    #[arg(long, default_value_t = 0.95, value_parser = level)]
    pub confidence: f64,
    /// Judge throttled ABBA blocks too instead of dropping them.
    #[arg(long)]
    pub keep_throttled: bool,
    /// Report directory (default target/gemtune/ab-<timestamp> of the checkout).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Engine backend of both workers: cuda, or cpu for arms that are
    /// git revisions or binaries (with -m).
    #[arg(long, value_enum, default_value_t = AbBackend::Cuda)]
    pub backend: AbBackend,
    /// Prefill micro-batch passed to both workers.
    #[arg(long, value_parser = cli::positive_usize)]
    pub ubatch: Option<usize>,
    /// KV cache type passed to both workers (f16, f32).
    #[arg(long)]
    pub kv_type: Option<String>,
    /// Skip the numerics gate (timing only).
    #[arg(long)]
    pub no_gate: bool,
    /// Gate: prompt lengths in tokens.
    #[arg(long, value_delimiter = ',', default_values_t = GateConfig::default().lengths, value_parser = cli::positive_usize)]
    pub gate_lengths: Vec<usize>,
    /// Gate: minimum top-1 agreement over the prompt rows.
    #[arg(long, default_value_t = GateConfig::default().min_top1, value_parser = level)]
    pub gate_top1: f64,
    /// Gate: largest |delta logit| allowed.
    #[arg(long, default_value_t = GateConfig::default().max_delta, value_parser = positive)]
    pub gate_max_delta: f64,
    /// The binary that serves profile arms (default: this gemtune). It
    /// checks for its GPU itself: `ab` then skips its own check.
    #[arg(long)]
    pub worker: Option<PathBuf>,
    /// Seconds to wait for a worker's ready line or any reply.
    #[arg(long, default_value_t = 900, value_parser = cli::positive_u64)]
    pub timeout_s: u64,
    /// Seed of the bootstrap resampling.
    #[arg(long, default_value_t = VerdictConfig::default().seed, value_parser = cli::seed)]
    pub seed: u64,
    /// Do not echo the workers' stderr (it is still logged in the report directory).
    #[arg(long)]
    pub quiet: bool,
    /// The variants/ directory (default: found from the current directory).
    #[arg(long)]
    pub variants_dir: Option<PathBuf>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AbBackend {
    Cuda,
    Cpu,
}

impl AbBackend {
    fn name(self) -> &'static str {
        match self {
            AbBackend::Cuda => "cuda",
            AbBackend::Cpu => "cpu",
        }
    }
}

/// Why this A/B cannot measure anything here, decided before anything is
/// written: no GPU for the CUDA engine (unless `--worker` serves the arms
/// and checks for itself), or on the CPU two profile arms (the same
/// computation) or no model (the synthetic default is for the GPU).
fn refusal(a: &Args, variants: &std::path::Path) -> Option<String> {
    use gemtune::ab::{parse_arm, ArmSpec};
    let profile_arm = |s: &str| {
        matches!(
            parse_arm(s, variants),
            Ok(ArmSpec::Profile { .. } | ArmSpec::ProfileFile(_))
        )
    };
    match a.backend {
        AbBackend::Cuda if a.worker.is_none() => {
            crate::engine_opts::gpu_status(0).err().map(|why| {
                format!(
                    "gemtune ab measures the CUDA engine and this machine has {why}; run it on a GPU host (--backend cpu compares git revisions or binaries on the CPU engine, with -m)"
                )
            })
        }
        AbBackend::Cuda => None,
        AbBackend::Cpu if profile_arm(&a.baseline) && profile_arm(&a.candidate) => Some(
            "--backend cpu: profiles choose CUDA kernels, so on the CPU engine both arms run the same computation; compare profiles on a GPU host, or git revisions and binaries on the CPU".into(),
        ),
        AbBackend::Cpu if a.model.is_none() && a.worker.is_none() => Some(
            "--backend cpu needs -m MODEL.gguf: without it ab runs a synthetic E4B, which is sized for the GPU".into(),
        ),
        AbBackend::Cpu => None,
    }
}

fn even_reps(s: &str) -> Result<usize, String> {
    let min = 2 * gemtune::verdict::MIN_BLOCKS;
    let need = format!(
        "an even number of at least {min} is needed (ABBA blocks hold two reps of each arm)"
    );
    let n = cli::count(s).map_err(|_| format!("{s}: {need}"))?;
    if n < min || n % 2 != 0 {
        return Err(format!("{n}: {need}"));
    }
    Ok(n)
}

fn effect(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("'{s}' is not a number (0.01 means 1%)"))?;
    if v > 0.0 && v < 0.5 {
        Ok(v)
    } else {
        Err(format!("{v} is not in (0, 0.5) (0.01 means 1%)"))
    }
}

fn positive(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("'{s}' is not a number"))?;
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(format!("{v} is not a non-negative number"))
    }
}

fn level(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("'{s}' is not a number"))?;
    if v > 0.5 && v < 1.0 {
        Ok(v)
    } else {
        Err(format!("{v} is not in (0.5, 1), e.g. 0.95"))
    }
}

pub fn run(a: Args) -> anyhow::Result<Exit> {
    let variants = gemtune::spec::variants_dir(a.variants_dir.as_deref());
    let variants = std::path::absolute(&variants).unwrap_or(variants);
    // A misspelt arm is named first; then whether anything can run here.
    for arm in [&a.baseline, &a.candidate] {
        if let Err(e) = gemtune::ab::parse_arm(arm, &variants) {
            eprintln!("error: {e}");
            return Ok(Exit::Infra);
        }
    }
    if let Some(why) = refusal(&a, &variants) {
        eprintln!("error: {why}");
        return Ok(Exit::Infra);
    }
    // A signal stops both workers (and a git build) and removes the gate's
    // logit files; the report directory keeps the workers' logs.
    if let Err(e) = gemtune::interrupt::install(gemtune::interrupt::Mode::Exit) {
        eprintln!("warning: {e}");
    }
    let root = variants
        .parent()
        .map(|p| p.to_path_buf())
        .unwrap_or_else(gemtune::scratch::checkout_root);
    let scratch = root.join("target").join("gemtune");
    let worker_bin = match a.worker.clone() {
        Some(w) => w,
        None => std::env::current_exe()
            .map_err(|e| anyhow::anyhow!("cannot find this executable: {e}"))?,
    };
    // The workers run in the checkout root: every path they get is absolute.
    let abs = |p: PathBuf| std::path::absolute(&p).unwrap_or(p);
    let worker_bin = abs(worker_bin);
    // With no -m, bench's synthetic default is written here, once, rather
    // than by two workers racing for the same file.
    let model = match (&a.model, &a.worker) {
        (Some(m), _) => Some(abs(m.clone())),
        (None, None) => Some(abs(super::bench::model_path(None)?)),
        (None, Some(_)) => None,
    };
    let out = abs(a
        .out
        .clone()
        .unwrap_or_else(|| session::default_out(&scratch)));
    let cfg = AbConfig {
        baseline: a.baseline.clone(),
        candidate: a.candidate.clone(),
        model,
        n_prompt: a.n_prompt as usize,
        n_gen: a.n_gen,
        depth: a.depth,
        reps: a.reps,
        phase_blocks: a.phase_blocks,
        warmup: a.warmup,
        respawn: a.respawn,
        backend: Some(a.backend.name().to_string()),
        ubatch: a.ubatch,
        kv_type: a.kv_type.clone(),
        worker_bin,
        variants,
        root,
        scratch,
        timeout: Duration::from_secs(a.timeout_s.max(1)),
        gate: (!a.no_gate).then(|| GateConfig {
            lengths: a.gate_lengths.clone(),
            min_top1: a.gate_top1,
            max_delta: a.gate_max_delta,
            ..GateConfig::default()
        }),
        verdict: VerdictConfig {
            min_effect: a.min_effect,
            level: a.confidence,
            seed: a.seed,
            keep_throttled: a.keep_throttled,
            ..VerdictConfig::default()
        },
        out: out.clone(),
        echo: !a.quiet,
    };
    let run = match session::run(&cfg, |m| eprintln!("ab: {m}")) {
        Ok(r) => r,
        Err(e) => {
            // A worker the interrupt handler killed is no error of its own.
            gemtune::interrupt::settle();
            eprintln!("error: {e}");
            return Ok(Exit::Infra);
        }
    };
    gemtune::results::write_csv(&out.join("results.csv"), &run.rows)?;
    let title = format!("gemtune ab: {} vs {}", a.baseline, a.candidate);
    let method = summary::method_text(
        a.reps,
        a.warmup,
        a.min_effect,
        a.confidence,
        a.keep_throttled,
    );
    std::fs::write(
        out.join("summary.md"),
        summary::summary_md(&run, &title, &method),
    )?;
    std::fs::write(out.join("verdict.json"), summary::verdict_json(&run))?;
    if let Err(e) = summary::write_plots(&out, &run) {
        eprintln!("warning: plots: {e:#}");
    }
    let code = summary::exit_code(&run);
    if let Some(g) = &run.gate {
        println!("numerics gate: {}", g.message);
    }
    for t in &run.tests {
        let j = &t.judgement;
        println!(
            "{:<8} {:<12} {:<9} ratio {:.4} [{:.4}, {:.4}]  baseline {:.2} t/s, candidate {:.2} t/s{}",
            t.phase,
            t.test,
            j.verdict.name(),
            j.ratio,
            j.ci.0,
            j.ci.1,
            j.baseline_tps,
            j.candidate_tps,
            match (j.blocks_dropped, j.blocks_stalled) {
                (0, 0) => String::new(),
                (t, 0) => format!("; {t} of {} blocks dropped (throttled)", j.blocks_total),
                (0, st) => format!("; {st} of {} blocks dropped (stalled rep)", j.blocks_total),
                (t, st) => format!(
                    "; {} of {} blocks dropped ({t} throttled, {st} stalled)",
                    t + st,
                    j.blocks_total
                ),
            }
        );
    }
    eprintln!("wrote {}", out.display());
    Ok(match code {
        0 => Exit::Pass,
        1 => Exit::Regression,
        2 => Exit::Ambiguous,
        3 => Exit::Correctness,
        _ => Exit::Infra,
    })
}
