//! `gemtune check [FAMILY...]`: every variant of every family on every shape
//! against the CPU oracle (or, with `--compile-only`, compiled for an arch
//! with its registers, spills and shared memory). Prints a table, writes
//! `check.csv`, exits 0 pass / 3 correctness failure / 4 infrastructure.

use crate::exit::Exit;
use gemtune::checker::{self, CheckOptions, CheckOutcome};
use gemtune::results::{write_csv, CheckRow};
use gemtune::util::{clip, sci};
use gemtune_kernels::compile::Arch;
use gemtune_kernels::gpu::Gpu;
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
    let gpu = if a.compile_only {
        None
    } else {
        match Gpu::new(0) {
            Ok(g) => Some(g),
            Err(e) => {
                eprintln!("error: {e} (use --compile-only to compile without a GPU)");
                return Ok(Exit::Infra);
            }
        }
    };
    let arch = match (&gpu, arch_arg) {
        (Some(g), Some(x)) if g.arch() != x => {
            eprintln!("error: --arch {x} but the GPU is {}", g.arch());
            return Ok(Exit::Infra);
        }
        (Some(g), _) => g.arch(),
        (None, x) => x.unwrap_or(Arch(90)),
    };
    // Rows and messages name the target as asked (`sm_90a`), or the GPU's.
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
    let outcome = checker::run_check(&jobs, gpu.as_ref(), &opts, progress_printer());
    let out = a
        .out
        .unwrap_or_else(|| gemtune::scratch::default_out("check"));
    std::fs::create_dir_all(&out)?;
    print_table(&outcome.rows);
    let csv = out.join("check.csv");
    write_csv(&csv, &outcome.rows)?;
    eprintln!("wrote {}", csv.display());
    if let Some(path) = &a.compile_report {
        gemtune::results::update_compile_report(path, &outcome.rows)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(verdict(&outcome))
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
