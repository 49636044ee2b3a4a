//! `gemtune tune --strategy` and `gemtune search-replay` end to end. The
//! tune tests need a GPU (`#[ignore = "needs a CUDA GPU"]`; without one
//! they fail with the reason); the replay runs on CPU on a committed H100
//! tune result.

mod common;

use gemtune::results::{read_csv, CheckRow, TuneRow};
use std::collections::BTreeMap;
use std::path::Path;

/// Rows of a CSV as maps from column to value.
fn records(path: &Path) -> Vec<BTreeMap<String, String>> {
    let mut r = csv::Reader::from_path(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let head = r.headers().expect("header").clone();
    r.records()
        .map(|rec| {
            let rec = rec.expect("record");
            head.iter()
                .zip(rec.iter())
                .map(|(h, v)| (h.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

fn tune_search(out: &Path, strategy: &str, evals: &str) -> (Option<i32>, String) {
    let o = common::gemtune()
        .current_dir(common::repo_root())
        .args([
            "tune",
            "gemv",
            "--shapes",
            "decode.toml",
            "--shape",
            "e4b.attn_k",
        ])
        .args(["--tokens", "1,8", "--regime", "both", "--no-reference"])
        .args(["--budget-ms", "10", "--min-reps", "5", "--max-reps", "20"])
        .args(["--strategy", strategy, "--max-evals", evals, "--out"])
        .arg(out)
        .output()
        .expect("run gemtune");
    (o.status.code(), common::log(&o))
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn tune_searches_each_shape_and_regime_within_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bayes");
    let (code, log) = tune_search(&out, "bayes", "4");
    assert_eq!(
        code,
        Some(0),
        "gemtune tune --strategy bayes failed:\n{log}"
    );
    let searches = records(&out.join("search.csv"));
    // 2 shapes (m = 1, 8) x 2 regimes.
    assert_eq!(searches.len(), 4, "{searches:?}");
    for s in &searches {
        assert_eq!(s["strategy"], "bayes");
        let evals: usize = s["evaluations"].parse().expect("evaluations");
        let space: usize = s["space"].parse().expect("space");
        assert_eq!(evals, 4, "{s:?}");
        assert!(space > 4, "{s:?}");
        assert_eq!(s["stop"], "max evaluations", "{s:?}");
    }
    let rows: Vec<TuneRow> = read_csv(&out.join("results.csv")).expect("results.csv");
    let mut per: BTreeMap<(String, String), usize> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.is_timed()) {
        *per.entry((r.shape.clone(), r.regime.clone())).or_default() += 1;
    }
    assert_eq!(per.len(), 4, "{per:?}");
    assert!(per.values().all(|&n| n <= 4), "{per:?}");
    let checks: Vec<CheckRow> = read_csv(&out.join("check.csv")).expect("check.csv");
    let skipped = checks.iter().filter(|c| c.verdict == "skipped").count();
    let checked = checks
        .iter()
        .filter(|c| {
            matches!(
                c.verdict.as_str(),
                "pass" | "fail" | "spills" | "compile-error" | "error"
            )
        })
        .count();
    assert!(skipped > 0, "cells no search chose are listed as skipped");
    // A cell is checked once, before its first timing; the two regimes of
    // a shape search separately and may choose different cells, so at
    // most 4 per shape and regime (2 x 2 x 4), and at least one search's
    // worth.
    let evaluated: usize = searches
        .iter()
        .map(|s| s["evaluations"].parse::<usize>().expect("evaluations"))
        .sum();
    assert!(
        (4..=evaluated).contains(&checked),
        "between 4 and {evaluated} cells checked (one per evaluated cell): {checked}"
    );
    let md = std::fs::read_to_string(out.join("summary.md")).expect("summary.md");
    assert!(md.contains("## Search"), "{md}");
    assert!(
        md.contains("| search | bayes (seed 0x5eed), budget 4 evaluations"),
        "{md}"
    );

    // Random search does not depend on the measured values: two runs with
    // the same seed evaluate the same cells in the same order.
    let order = |name: &str| -> Vec<(String, String, String)> {
        let o = dir.path().join(name);
        let (code, log) = tune_search(&o, "random", "3");
        assert_eq!(code, Some(0), "{log}");
        let rows: Vec<TuneRow> = read_csv(&o.join("results.csv")).expect("results.csv");
        rows.iter()
            .map(|r| (r.shape.clone(), r.regime.clone(), r.variant.clone()))
            .collect()
    };
    let a = order("r1");
    assert_eq!(a.len(), 12);
    assert_eq!(a, order("r2"));
}

#[test]
fn search_replay_measures_every_strategy_on_a_committed_tune() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs.csv");
    let o = common::gemtune()
        .current_dir(common::repo_root())
        .args([
            "search-replay",
            "reports/h100-2026-11-22-wgmma/promote-gemv/results.csv",
            "--seeds",
            "3",
            "--csv",
        ])
        .arg(&runs)
        .output()
        .expect("run gemtune");
    let log = common::log(&o);
    assert_eq!(o.status.code(), Some(0), "{log}");
    let out = common::text(&o.stdout);
    for kind in ["exhaustive", "random", "evolutionary", "bayes"] {
        assert!(
            out.contains(&format!("| {kind} |")),
            "{kind} missing:\n{out}"
        );
    }
    let rows = records(&runs);
    // 16 shapes of 33 timed variants each: exhaustive once, 3 seeds of the
    // three seeded strategies.
    assert_eq!(rows.len(), 16 * (1 + 3 * 3));
    for r in &rows {
        let n: usize = r["evaluations"].parse().expect("evaluations");
        assert_eq!(r["points"], "33");
        assert!((1..=33).contains(&n), "{r:?}");
    }

    let missing = common::gemtune()
        .args(["search-replay", "no/such/results.csv"])
        .output()
        .expect("run gemtune");
    assert_eq!(missing.status.code(), Some(4), "{}", common::log(&missing));
}
