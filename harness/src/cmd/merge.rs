//! `gemtune merge DIR... --out DIR`: joins the report directories of the
//! shards of one sweep (`check` or `tune` with `--shard I/N`, or runs on
//! several hosts) into one report with the files a single run writes:
//! check.csv, results.csv, summary.md and plots (tune), run.json and the
//! joined results log cells.jsonl.
//!
//! The directories must agree on everything that makes their rows
//! comparable (`RunInfo::mismatch`: command, mode, target, NVRTC version,
//! options, kernel source hashes, GPU driver and device model, the last
//! unless `--allow-mixed`); otherwise nothing is written and merge exits 4.
//! A cell found in several directories is kept once when its rows are
//! identical (the rejected and duplicate rows every shard lists) and
//! refused when they differ (overlapping shards). Rows keep the order of
//! the directories as given.

use crate::exit::Exit;
use gemtune::results::{read_csv, write_csv, CheckRow, TuneRow};
use gemtune::results_cache::LOG_FILE;
use gemtune::run_info::RunInfo;
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct Args {
    /// Report directories to join (each with the run.json a check or tune writes).
    #[arg(required = true)]
    pub dirs: Vec<PathBuf>,
    /// Directory of the joined report.
    #[arg(long)]
    pub out: PathBuf,
    /// Join reports measured on different device models.
    #[arg(long)]
    pub allow_mixed: bool,
}

/// Rows of several directories joined by key; identical repeats are kept
/// once, differing ones are refused.
struct Joined<T> {
    rows: Vec<T>,
    seen: HashMap<String, (String, usize)>,
}

impl<T: serde::Serialize> Joined<T> {
    fn new() -> Self {
        Joined {
            rows: Vec::new(),
            seen: HashMap::new(),
        }
    }

    fn add(&mut self, key: String, row: T, from: &Path) -> Result<(), String> {
        // Serialized, so NaN statistics compare equal to themselves.
        let text = serde_json::to_string(&row).unwrap_or_default();
        match self.seen.get(&key) {
            Some((t, _)) if *t == text => Ok(()),
            Some(_) => Err(format!(
                "{key}: {} holds a different result for a cell another directory holds too; the shards overlap",
                from.display()
            )),
            None => {
                self.seen.insert(key, (text, self.rows.len()));
                self.rows.push(row);
                Ok(())
            }
        }
    }
}

fn check_key(r: &CheckRow) -> String {
    format!(
        "check {} {} {} {} [{}]",
        r.family, r.variant, r.shape, r.arch, r.defines
    )
}

fn tune_key(r: &TuneRow) -> String {
    format!(
        "{} {} {} {} {}",
        r.kind, r.family, r.variant, r.shape, r.regime
    )
}

pub fn run(a: Args) -> anyhow::Result<Exit> {
    match merge(&a) {
        Ok(()) => Ok(Exit::Pass),
        Err(e) => {
            eprintln!("error: merge: {e}");
            Ok(Exit::Infra)
        }
    }
}

fn merge(a: &Args) -> Result<(), String> {
    let mut infos = Vec::new();
    for d in &a.dirs {
        infos.push(RunInfo::read(d).map_err(|e| e.to_string())?);
    }
    let mut merged = infos[0].clone();
    for (i, info) in infos.iter().enumerate().skip(1) {
        if let Some(why) = merged.mismatch(info, a.allow_mixed) {
            return Err(format!(
                "cannot join {} and {}: {why}",
                a.dirs[0].display(),
                a.dirs[i].display()
            ));
        }
        merged.devices.extend(info.devices.iter().cloned());
        merged.shards.extend(info.shards.iter().copied());
        merged.cells += info.cells;
        merged.finished += info.finished;
        for (f, h) in &info.source_sha256 {
            merged.source_sha256.insert(f.clone(), h.clone());
        }
    }
    merged.devices.sort();
    merged.devices.dedup();

    let mut checks = Joined::new();
    let mut results = Joined::new();
    let mut any_results = false;
    for d in &a.dirs {
        let rows: Vec<CheckRow> = read_csv(&d.join("check.csv")).map_err(|e| e.to_string())?;
        for r in rows {
            checks.add(check_key(&r), r, d)?;
        }
        let p = d.join("results.csv");
        if p.is_file() {
            any_results = true;
            let rows: Vec<TuneRow> = read_csv(&p).map_err(|e| e.to_string())?;
            for r in rows {
                results.add(tune_key(&r), r, d)?;
            }
        }
    }
    std::fs::create_dir_all(&a.out).map_err(|e| format!("{}: {e}", a.out.display()))?;
    let err = |e: anyhow::Error| e.to_string();
    write_csv(&a.out.join("check.csv"), &checks.rows).map_err(err)?;
    join_logs(&a.dirs, &a.out.join(LOG_FILE))?;
    if any_results {
        let mut rows = results.rows;
        gemtune::report::flag_throttled(&mut rows);
        write_csv(&a.out.join("results.csv"), &rows).map_err(err)?;
        let md = gemtune::report::summary_md(&gemtune::report::SummaryInput {
            title: format!("gemtune merge of {} reports", a.dirs.len()),
            device_block: device_block(&merged, &a.dirs),
            rows: &rows,
            checks: &checks.rows,
            notes: Vec::new(),
        });
        std::fs::write(a.out.join("summary.md"), md).map_err(|e| e.to_string())?;
        if let Err(e) = gemtune::report::write_plots(&a.out, &rows, &[]) {
            eprintln!("warning: plots: {e:#}");
        }
    }
    merged.write(&a.out).map_err(|e| e.to_string())?;
    eprintln!(
        "merged {} directories ({} check rows{}) into {}",
        a.dirs.len(),
        checks.rows.len(),
        if any_results {
            format!(", {} result rows", results.seen.len())
        } else {
            String::new()
        },
        a.out.display()
    );
    Ok(())
}

fn device_block(m: &RunInfo, dirs: &[PathBuf]) -> Vec<(String, String)> {
    vec![
        ("device".to_string(), m.models().join(", ")),
        (
            "GPUs".into(),
            m.devices
                .iter()
                .map(|d| format!("{} ({}, driver {})", d.index, d.pci_bus_id, d.driver))
                .collect::<Vec<_>>()
                .join("; "),
        ),
        ("NVRTC".into(), m.nvrtc.clone()),
        ("target".into(), m.target.clone()),
        ("options".into(), m.params.clone()),
        (
            "shards".into(),
            m.shards
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join(", "),
        ),
        (
            "joined".into(),
            dirs.iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        ),
        (
            "ceilings".into(),
            "per row (hbm_gbps, l2_gbps, launch_floor_us), measured on each row's GPU".into(),
        ),
    ]
}

/// The joined results log: every directory's complete lines, in order, so
/// `--resume` on the joined directory skips what any shard finished.
fn join_logs(dirs: &[PathBuf], to: &Path) -> Result<(), String> {
    let mut out = std::fs::File::create(to).map_err(|e| format!("{}: {e}", to.display()))?;
    for d in dirs {
        let Ok(bytes) = std::fs::read(d.join(LOG_FILE)) else {
            continue;
        };
        let end = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        out.write_all(&bytes[..end])
            .map_err(|e| format!("{}: {e}", to.display()))?;
    }
    Ok(())
}
