//! `gemtune tune` end to end on a GPU: vendor reference rows next to the
//! variants in both regimes, sampled clocks on every measured row, and
//! `--no-reference`. `#[ignore = "needs a CUDA GPU"]`; without a GPU,
//! libcublas.so.13 or NVML they fail with the reason.

mod common;

use gemtune::results::{read_csv, CheckRow, TuneRow};
use std::path::Path;

fn tune(out: &Path, extra: &[&str]) -> (Option<i32>, String) {
    let o = common::gemtune()
        .current_dir(common::repo_root())
        .args([
            "tune",
            "mmq,gemm_dq",
            "--shapes",
            "edge.toml",
            "--shape",
            "edge.partial",
        ])
        .args([
            "--variant",
            "baseline",
            "--budget-ms",
            "20",
            "--min-reps",
            "10",
        ])
        .args(["--max-reps", "40", "--check-max-m", "113", "--out"])
        .arg(out)
        .args(extra)
        .output()
        .expect("run gemtune");
    (
        o.status.code(),
        format!(
            "{}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn tune_writes_reference_rows_and_clocks() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r");
    let (code, log) = tune(&out, &["--tokens", "3,113", "--regime", "both"]);
    assert_eq!(
        code,
        Some(0),
        "gemtune tune failed (exit 4 with 'no CUDA GPU': no GPU here):\n{log}"
    );
    let rows: Vec<TuneRow> = read_csv(&out.join("results.csv")).expect("results.csv");
    let refs: Vec<&TuneRow> = rows.iter().filter(|r| r.is_reference()).collect();
    for kind in ["cublas-bf16", "cublas-int8"] {
        for regime in ["l2", "dram"] {
            for m in [3usize, 113] {
                let r = refs
                    .iter()
                    .find(|r| r.variant == kind && r.regime == regime && r.m == m)
                    .unwrap_or_else(|| panic!("no {kind} {regime} m={m} row:\n{log}"));
                assert_eq!(r.family, "cublas");
                assert_eq!((r.n, r.k), (1000, 2592));
                // cuBLAS may decline int8 at these unaligned token counts;
                // the row must then say so (kernels/tests/gpu_reference.rs
                // requires int8 to run on aligned shapes).
                if kind == "cublas-int8" && r.verdict == "unsupported" {
                    println!("{kind} {regime} m={m}: unsupported ({})", r.reason);
                    assert!(r.reason.contains("CUBLAS_STATUS"), "{}", r.reason);
                    continue;
                }
                assert!(
                    r.is_timed(),
                    "{kind} {regime} m={m}: {} ({}); for 'unavailable' put nvidia/cu13/lib of the \
                     nvidia-cublas wheel on LD_LIBRARY_PATH",
                    r.verdict,
                    r.reason
                );
                if regime == "dram" {
                    assert!(r.weight_copies > 1, "{kind} dram: {}", r.regime_label);
                }
            }
        }
    }
    // Exactly one row per (reference, problem, regime), though two families
    // share the shapes (`edge.partial` selects the Q8_0 and the Q4_0 shape).
    let problems: std::collections::BTreeSet<(usize, usize, usize, String)> = rows
        .iter()
        .filter(|r| !r.is_reference())
        .map(|r| (r.m, r.n, r.k, r.wtype.clone()))
        .collect();
    assert_eq!(problems.len(), 2 * 2, "{problems:?}");
    assert_eq!(refs.len(), problems.len() * 2 * 2);
    for fam in ["mmq", "gemm_dq"] {
        assert!(
            rows.iter()
                .any(|r| !r.is_reference() && r.family == fam && r.is_timed()),
            "no measured {fam} row"
        );
    }
    for r in rows.iter().filter(|r| r.is_timed()) {
        assert!(
            r.sm_clock_min_mhz.is_some_and(|v| v > 0) && r.clock_samples > 0,
            "{} {} {} {}: no sampled clock (NVML missing?)",
            r.family,
            r.variant,
            r.shape,
            r.regime
        );
    }
    let checks: Vec<CheckRow> = read_csv(&out.join("check.csv")).expect("check.csv");
    for kind in ["cublas-bf16", "cublas-int8"] {
        assert!(
            checks
                .iter()
                .any(|c| c.family == "cublas" && c.variant == kind && c.verdict == "pass"),
            "no passing {kind} check"
        );
    }
    let md = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(md.contains("x cublas-bf16 |"), "{md}");
    assert!(md.contains("## Vendor references"), "{md}");
    assert!(md.contains("## Clocks\n\n| clock |"), "{md}");
    assert!(md.contains("| vendor references | cuBLAS "), "{md}");
    assert!(out.join("time.png").exists() && out.join("roofline.png").exists());

    let out2 = dir.path().join("n");
    let (code, log) = tune(
        &out2,
        &["--tokens", "3", "--regime", "l2", "--no-reference"],
    );
    assert_eq!(code, Some(0), "{log}");
    let rows: Vec<TuneRow> = read_csv(&out2.join("results.csv")).expect("results.csv");
    assert!(!rows.is_empty() && rows.iter().all(|r| !r.is_reference()));
    let md = std::fs::read_to_string(out2.join("summary.md")).unwrap();
    assert!(md.contains("off (--no-reference)"), "{md}");
}

/// `--launches graph` and `--launches chained` time each sample's calls
/// replayed from a CUDA graph: every timed row records its mode and the
/// mode's launch floor, the summary names the mode, and a resumed run in
/// another mode does not reuse the first mode's timings.
#[test]
#[ignore = "needs a CUDA GPU"]
fn tune_records_its_launch_mode() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r");
    let run = |mode: &str| {
        let o = common::gemtune()
            .current_dir(common::repo_root())
            .args([
                "tune",
                "gemv",
                "--shapes",
                "edge.toml",
                "--shape",
                "edge.partial",
            ])
            .args(["--variant", "baseline", "--tokens", "1", "--regime", "dram"])
            .args(["--budget-ms", "20", "--min-reps", "10", "--max-reps", "40"])
            .args(["--no-reference", "--launches", mode, "--out"])
            .arg(&out)
            .output()
            .expect("run gemtune");
        let log = common::log(&o);
        assert_eq!(o.status.code(), Some(0), "tune --launches {mode}:\n{log}");
        let rows: Vec<TuneRow> = read_csv(&out.join("results.csv")).expect("results.csv");
        let timed: Vec<&TuneRow> = rows.iter().filter(|r| r.is_timed()).collect();
        assert!(!timed.is_empty(), "--launches {mode}: no timed row:\n{log}");
        for r in &timed {
            assert_eq!(r.launches, mode, "{} {}", r.variant, r.shape);
            assert!(
                r.launch_floor_us > 0.0,
                "{mode}: launch floor {}",
                r.launch_floor_us
            );
            assert!(r.median_us > 0.0 && r.median_us.is_finite());
        }
        let md = std::fs::read_to_string(out.join("summary.md")).expect("summary.md");
        assert!(md.contains(&format!("launches: {mode}")), "{md}");
        timed
            .iter()
            .map(|r| r.samples_us.clone())
            .collect::<Vec<_>>()
    };
    let graph = run("graph");
    let chained = run("chained");
    assert_ne!(
        graph, chained,
        "the chained run reused the graph run's samples"
    );
}
