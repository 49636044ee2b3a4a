//! `gemtune demo`: what gemtune is for, on whatever machine it runs, in a
//! couple of minutes (the README's first command).
//!
//! - With a GPU: a variant sweep and an engine figure, each as a child
//!   `gemtune` process so its output is exactly that command's:
//!   `tune gemv` on the E4B `ffn_up` decode shape at one token (every gemv
//!   variant checked against the CPU oracle, then timed in the L2 and DRAM
//!   regimes; the summary's best-variant table is printed), then `bench -p
//!   512 -n 64 -r 3` on the synthetic E4B Q8_0 model.
//! - Without a GPU (or with `--cpu`): the compile report of every kernel
//!   variant for one architecture (NVRTC only: registers, spill bytes and
//!   shared memory, summarised per family; the full table goes to a CSV),
//!   then the CPU engine generating from the built-in demo model. Without
//!   NVRTC the compile report is skipped with the fix, not failed.
//!
//! Step headers and progress go to stderr, results to stdout. The exit code
//! is the worst of the steps' (0 when all passed).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use gemtune::checker::{self, CheckOptions};
use gemtune::results::{write_csv, CheckRow};
use gemtune_kernels::compile::Arch;

use crate::cli::NPredict;
use crate::engine_opts::{gpu_status, Backend, CudaArgs};
use crate::exit::Exit;

#[derive(clap::Args)]
pub struct Args {
    /// Architecture of the compile report (the no-GPU demo).
    #[arg(long, default_value = "sm_90")]
    pub arch: String,
    /// Prompt of the engine run (the no-GPU demo).
    #[arg(short = 'p', long, default_value = "Hello")]
    pub prompt: String,
    /// Tokens the engine generates (the no-GPU demo).
    #[arg(short = 'n', long, default_value_t = 48, value_parser = crate::cli::count)]
    pub n_predict: usize,
    /// Seconds the compile report may spend compiling (the no-GPU demo); the
    /// define sets not reached are named, and the next run continues from
    /// the cubin cache.
    #[arg(long, default_value_t = 90, value_parser = crate::cli::count)]
    pub budget_s: usize,
    /// Run the no-GPU demo even where a GPU is present.
    #[arg(long)]
    pub cpu: bool,
}

pub fn run(a: Args) -> anyhow::Result<Exit> {
    let gpu = !a.cpu && gpu_status(0).is_ok();
    eprintln!("{}", first_line(gpu, &a));
    if gpu {
        gpu_demo()
    } else {
        cpu_demo(&a)
    }
}

/// What the demo runs on which backend and model, before any work.
fn first_line(gpu: bool, a: &Args) -> String {
    if gpu {
        "demo: GPU found: a gemv variant sweep, then the CUDA engine (profile main) on a \
         synthetic E4B Q8_0 model (random weights, written once into the scratch directory)"
            .to_string()
    } else {
        format!(
            "demo: {}: NVRTC compiles every kernel variant for {}, then the CPU engine runs the {}",
            if a.cpu { "--cpu" } else { "no GPU found" },
            a.arch,
            gemtune_engine::synth::builtin_model_description()
        )
    }
}

// ---------------------------------------------------------------------------
// With a GPU.

/// The family, shapes file and shape of the sweep.
const SWEEP: [&str; 12] = [
    "tune",
    "gemv",
    "--shapes",
    "decode",
    "--shape",
    "e4b.ffn_up",
    "--tokens",
    "1",
    "--no-reference",
    "--budget-ms",
    "100",
    "--out",
];

fn gpu_demo() -> anyhow::Result<Exit> {
    let exe = std::env::current_exe().context("locating the gemtune binary")?;
    let out = gemtune::scratch::default_out("demo");
    std::fs::create_dir_all(&out)?;
    let tune_dir = out.join("tune-gemv");
    eprintln!(
        "== 1/2 variant sweep: every gemv variant on the E4B ffn_up decode shape (1 x 10240 x 2560, Q8_0), \
         checked against the CPU oracle, then timed with the weights L2-resident and streamed from DRAM"
    );
    let tune = step(Command::new(&exe).args(SWEEP).arg(&tune_dir))?;
    match best_variant_table(&tune_dir.join("summary.md"), "gemv") {
        Some(t) => println!("{t}"),
        None => eprintln!("(no summary in {})", tune_dir.display()),
    }
    eprintln!("   full report: {}", tune_dir.display());
    eprintln!(
        "== 2/2 engine: prompt processing (pp512) and generation (tg64) on the synthetic E4B Q8_0 model, CUDA engine, profile main"
    );
    let bench = step(Command::new(&exe).args(["bench", "-p", "512", "-n", "64", "-r", "3"]))?;
    eprintln!(
        "next: `gemtune tune FAMILY --shapes FILE` sweeps any family, `gemtune ab --baseline main --candidate PROFILE` \
         asks whether a kernel win survives end to end"
    );
    Ok(worst(&[tune, bench]))
}

/// Runs a child gemtune command with inherited output; its exit as an `Exit`.
fn step(cmd: &mut Command) -> anyhow::Result<Exit> {
    let status = cmd.status().with_context(|| format!("starting {cmd:?}"))?;
    Ok(match status.code() {
        Some(0) => Exit::Pass,
        Some(1) => Exit::Regression,
        Some(2) => Exit::Ambiguous,
        Some(3) => Exit::Correctness,
        _ => Exit::Infra,
    })
}

fn worst(codes: &[Exit]) -> Exit {
    codes
        .iter()
        .copied()
        .max_by_key(|e| *e as u8)
        .unwrap_or(Exit::Pass)
}

/// The "best variant per shape" section of a tune summary.
fn best_variant_table(summary: &Path, family: &str) -> Option<String> {
    let text = std::fs::read_to_string(summary).ok()?;
    let head = format!("## {family}: best variant per shape");
    let start = text.find(&head)?;
    let rest = &text[start..];
    let end = rest[head.len()..]
        .find("\n## ")
        .map_or(rest.len(), |i| i + head.len());
    Some(rest[..end].trim_end().to_string())
}

// ---------------------------------------------------------------------------
// Without a GPU.

fn cpu_demo(a: &Args) -> anyhow::Result<Exit> {
    let compile = match gemtune_kernels::compile::nvrtc_version() {
        Err(e) => {
            eprintln!(
                "== 1/2 compile report: skipped, {e}\n   (with NVRTC, this step compiles every kernel variant and reports its registers, spills and shared memory)"
            );
            Exit::Pass
        }
        Ok(_) => compile_report(&a.arch, a.budget_s as u64)?,
    };
    eprintln!(
        "== 2/2 the CPU engine: chat prompt {:?}, greedy, {} tokens, on the {}",
        a.prompt,
        a.n_predict,
        gemtune_engine::synth::builtin_model_description()
    );
    let engine = crate::cmd::run::run(crate::cmd::run::Args {
        model: None,
        prompt: a.prompt.clone(),
        n_predict: NPredict(Some(a.n_predict)),
        temp: None,
        top_k: None,
        top_p: None,
        min_p: None,
        seed: 0,
        raw: false,
        system: None,
        backend: Backend::Cpu,
        batch: 128,
        ubatch: gemtune_engine::cuda::DEFAULT_UBATCH,
        ctx: None,
        verbose: false,
        cuda: CudaArgs {
            profile: "main".into(),
            kv_type: None,
            no_graph: false,
            profile_phases: false,
            tuned: None,
            device: None,
            full_work: false,
        },
    })?;
    eprintln!(
        "next: `gemtune run -m MODEL.gguf -p TEXT` runs a real Gemma 4 file; on a GPU host `gemtune demo` sweeps a kernel \
         family and benchmarks the CUDA engine"
    );
    Ok(worst(&[compile, engine]))
}

/// Set when the compile report's time budget runs out.
static BUDGET_SPENT: AtomicBool = AtomicBool::new(false);

/// Compiles every variant of every family for `arch` (within `budget_s`
/// seconds) and prints one line per family; the full table goes to
/// `check.csv` in the scratch directory.
fn compile_report(arch: &str, budget_s: u64) -> anyhow::Result<Exit> {
    let arch: Arch = match gemtune_kernels::compile::parse_target_arch(arch) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: --arch: {e}");
            return Ok(Exit::Infra);
        }
    };
    eprintln!(
        "== 1/2 compile report: every kernel variant of every family compiled for {arch} by NVRTC \
         (no GPU needed), with its registers, spill bytes and shared memory"
    );
    let vdir = gemtune::spec::variants_dir(None);
    let jobs =
        checker::load_jobs(&vdir, &[], &[], &[], &[], &[]).map_err(|e| anyhow::anyhow!("{e}"))?;
    let opts = CheckOptions {
        arch,
        target: arch.to_string(),
        compile_only: true,
        cache: gemtune_kernels::compile::default_cache_dir(),
        check_max_m: None,
        stop: Some(&BUDGET_SPENT),
    };
    // The timer outlives the report only by its sleep; it touches nothing
    // but the flag.
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(budget_s));
        BUDGET_SPENT.store(true, Ordering::SeqCst);
    });
    let outcome = checker::run_check(&jobs, None, &opts, crate::cmd::check::progress_printer());
    print_family_summary(&outcome.rows, arch);
    let skipped = outcome
        .rows
        .iter()
        .filter(|r| r.verdict == "skipped")
        .count();
    if skipped > 0 {
        eprintln!(
            "   {skipped} variant rows were not compiled within the {budget_s} s budget: `gemtune demo` again \
             continues from the cubin cache, `gemtune check --compile-only --arch {arch}` compiles them all"
        );
    }
    let out = gemtune::scratch::default_out("demo");
    std::fs::create_dir_all(&out)?;
    let csv = out.join("check.csv");
    write_csv(&csv, &outcome.rows)?;
    eprintln!(
        "   every variant: {} (`gemtune check --compile-only --arch {arch}` prints the table)",
        csv.display()
    );
    Ok(crate::cmd::check::verdict(&outcome))
}

/// Per family: variants compiled, the range of registers, the worst spill
/// and shared memory, and what did not compile or spilled where forbidden.
#[derive(Default)]
struct FamilyLine {
    variants: std::collections::BTreeSet<String>,
    regs: Option<(u32, u32)>,
    spill: u32,
    smem: u32,
    errors: usize,
    forbidden_spills: usize,
    not_compiled: usize,
}

fn print_family_summary(rows: &[CheckRow], arch: Arch) {
    let mut fams: BTreeMap<&str, FamilyLine> = BTreeMap::new();
    for r in rows {
        let f = fams.entry(r.family.as_str()).or_default();
        match r.verdict.as_str() {
            "compiled" | "spills" => {
                f.variants.insert(r.variant.clone());
                if let Some(g) = r.registers {
                    f.regs = Some(f.regs.map_or((g, g), |(lo, hi)| (lo.min(g), hi.max(g))));
                }
                f.spill = f.spill.max(r.spill_bytes.unwrap_or(0));
                f.smem = f
                    .smem
                    .max(r.static_smem.unwrap_or(0) + r.dyn_smem.unwrap_or(0));
                if r.verdict == "spills" {
                    f.forbidden_spills += 1;
                }
            }
            "compile-error" => f.errors += 1,
            "skipped" => f.not_compiled += 1,
            _ => {}
        }
    }
    println!(
        "{:<14} {:>8} {:>11} {:>11} {:>12}  notes ({arch})",
        "family", "variants", "registers", "max spill", "max smem"
    );
    for (name, f) in &fams {
        let regs = f
            .regs
            .map_or("-".to_string(), |(lo, hi)| format!("{lo}-{hi}"));
        let mut notes = Vec::new();
        if f.errors > 0 {
            notes.push(format!("{} failed to compile", f.errors));
        }
        if f.forbidden_spills > 0 {
            notes.push(format!("{} spill where forbidden", f.forbidden_spills));
        }
        if f.not_compiled > 0 {
            notes.push(format!("{} not reached in the budget", f.not_compiled));
        }
        println!(
            "{:<14} {:>8} {:>11} {:>9} B {:>10} B  {}",
            name,
            f.variants.len(),
            regs,
            f.spill,
            f.smem,
            notes.join(", ")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_variant_section_is_cut_at_the_next_heading() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("summary.md");
        std::fs::write(
            &p,
            "# t\n\n## Check\nx\n\n## gemv: best variant per shape\n\n| a |\n|---|\n| b |\n\n## gemv against the launch floor\ny\n",
        )
        .unwrap();
        assert_eq!(
            best_variant_table(&p, "gemv").as_deref(),
            Some("## gemv: best variant per shape\n\n| a |\n|---|\n| b |")
        );
        assert_eq!(best_variant_table(&p, "mmq"), None);
    }

    #[test]
    fn the_worst_exit_wins() {
        assert_eq!(worst(&[Exit::Pass, Exit::Correctness]) as u8, 3);
        assert_eq!(worst(&[Exit::Pass, Exit::Pass]) as u8, 0);
    }
}
