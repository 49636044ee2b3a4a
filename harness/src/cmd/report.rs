//! `gemtune report --baseline FILE.csv --current FILE.csv [--out DIR]`: joins
//! two result files of one kind (tune, check, bench, ab, compile) on their
//! keys and flags every row that got worse beyond its noise band
//! (`gemtune::compare` has the rules). Writes report.csv, summary.md and
//! change.png; exits 0 when nothing regressed, 1 on a regression or a
//! missing row, 4 on unreadable or mismatched input.

use crate::exit::Exit;
use gemtune::compare::{self, CompareConfig, Kind, Side, Status};
use std::path::PathBuf;

/// The one command that refreshes the committed compile baseline.
pub const COMPILE_BASELINE_UPDATE: &str = "scripts/compile-report.sh --update";

#[derive(clap::Args)]
pub struct Args {
    /// The reference file (tune results.csv, check.csv, bench.csv, ab results.csv or compile.csv).
    #[arg(long)]
    pub baseline: PathBuf,
    /// The file to judge, of the same kind.
    #[arg(long)]
    pub current: PathBuf,
    /// Report directory (default target/gemtune/report-<timestamp> of the checkout).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Smallest relative timing change that counts, e.g. 0.02 for 2 %.
    #[arg(long, default_value_t = 0.02, value_parser = fraction)]
    pub floor: f64,
    /// Smallest relative register or shared-memory growth that counts.
    #[arg(long, default_value_t = 0.05, value_parser = fraction)]
    pub resource_floor: f64,
    /// List rows missing from the current file without failing.
    #[arg(long)]
    pub allow_missing: bool,
}

/// A fraction in [0, 1).
pub fn fraction(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("'{s}' is not a number (a fraction such as 0.02)"))?;
    if (0.0..1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{v} is not a fraction in [0, 1) (0.02 means 2%)"))
    }
}

pub fn run(a: Args) -> anyhow::Result<Exit> {
    let load = |p: &PathBuf| Side::load(p);
    let (base, cur) = match (load(&a.baseline), load(&a.current)) {
        (Ok(b), Ok(c)) => (b, c),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("error: {e}");
            return Ok(Exit::Infra);
        }
    };
    let cfg = CompareConfig {
        floor: a.floor,
        resource_floor: a.resource_floor,
        allow_missing: a.allow_missing,
    };
    let cmp = match compare::compare(&base, &cur, &cfg) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(Exit::Infra);
        }
    };
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| gemtune::scratch::default_out("report"));
    std::fs::create_dir_all(&out)
        .map_err(|e| anyhow::anyhow!("{}: cannot create: {e}", out.display()))?;
    gemtune::results::write_csv(&out.join("report.csv"), &compare::report_rows(&cmp))?;
    let hint = (cmp.kind == Kind::Compile).then_some(COMPILE_BASELINE_UPDATE);
    std::fs::write(
        out.join("summary.md"),
        compare::summary_md(&cmp, &base, &cur, hint),
    )?;
    let bars = compare::change_bars(&cmp, 40);
    if !bars.is_empty() {
        let title = format!(
            "{}: current vs baseline, largest changes (grey: the band)",
            cmp.kind
        );
        if let Err(e) =
            gemtune::plots::bars(&out.join("change.png"), &title, "change %", &bars, &[])
        {
            eprintln!("warning: change.png: {e:#}");
        }
    }
    // The console: the verdict and the failing rows.
    for n in &cmp.notes {
        eprintln!("note: {n}");
    }
    let bad: Vec<&compare::Finding> = cmp
        .findings
        .iter()
        .filter(|f| {
            f.status == Status::Regression || (f.status == Status::Missing && !cfg.allow_missing)
        })
        .collect();
    for f in bad.iter().take(40) {
        println!(
            "{:<11} {} [{}] {}",
            f.status.name(),
            f.key,
            f.metric,
            f.note
        );
    }
    if bad.len() > 40 {
        println!(
            "... {} more in {}",
            bad.len() - 40,
            out.join("report.csv").display()
        );
    }
    println!(
        "report {}: {} ({} regressed, {} missing, {} improved, {} new; {} vs {})",
        cmp.kind,
        if cmp.failed() { "FAIL" } else { "PASS" },
        cmp.count(Status::Regression),
        cmp.count(Status::Missing),
        cmp.count(Status::Improvement),
        cmp.count(Status::New),
        base.path.display(),
        cur.path.display()
    );
    if let (true, Some(h)) = (cmp.failed(), hint) {
        println!("if the change is intended, refresh the baseline: {h}");
    }
    eprintln!("wrote {}", out.display());
    Ok(if cmp.failed() {
        Exit::Regression
    } else {
        Exit::Pass
    })
}
