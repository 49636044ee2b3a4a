//! `gemtune report` on planted regressions (a slower row, a new spill, a
//! register growth, a failed check, a missing row) and on identical files,
//! for every kind of result file; plus the compile report built from check
//! rows and the committed compile baseline.

mod common;

use gemtune::compare::{self, CompareConfig, Kind, Side, Status};
use gemtune::results::{self, AbRow, BenchRow, CheckRow, CompileRow, TuneRow};
use std::path::{Path, PathBuf};

struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    dir: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Out {
    fn log(&self) -> String {
        format!(
            "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
    fn rows(&self) -> Vec<(String, String, String)> {
        let mut r = csv::Reader::from_path(self.dir.join("report.csv")).expect("report.csv");
        r.records()
            .map(|x| {
                let x = x.unwrap();
                (x[1].to_string(), x[2].to_string(), x[3].to_string())
            })
            .collect()
    }
    fn summary(&self) -> String {
        std::fs::read_to_string(self.dir.join("summary.md")).expect("summary.md")
    }
}

fn report(base: &Path, cur: &Path, extra: &[&str]) -> Out {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("r");
    let o = common::gemtune()
        .args(["report", "--baseline"])
        .arg(base)
        .arg("--current")
        .arg(cur)
        .arg("--out")
        .arg(&dir)
        .args(extra)
        .output()
        .expect("run gemtune");
    Out {
        code: o.status.code(),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        dir,
        _tmp: tmp,
    }
}

/// A committed tune results.csv (schema 2) and a writable copy.
fn tune_rows() -> Vec<TuneRow> {
    let p = common::repo_root().join("reports/h100-2026-11-22-wgmma/prefill-ffn-2048/results.csv");
    results::read_csv(&p).expect("committed results.csv")
}

fn write<T: serde::Serialize>(dir: &Path, name: &str, rows: &[T]) -> PathBuf {
    let p = dir.join(name);
    results::write_csv(&p, rows).unwrap();
    p
}

#[test]
fn identical_tune_files_pass() {
    let d = tempfile::tempdir().unwrap();
    let rows = tune_rows();
    let b = write(d.path(), "b.csv", &rows);
    let o = report(&b, &b, &[]);
    assert_eq!(o.code, Some(0), "{}", o.log());
    assert!(o.rows().iter().all(|(_, s, _)| s == "same"), "{}", o.log());
    assert!(o.summary().contains("**PASS**: 0 regressed, 0 missing"));
    for f in ["report.csv", "summary.md", "change.png"] {
        assert!(o.dir.join(f).is_file(), "{f}");
    }
}

/// A row's median and interval times `f`.
fn scale(r: &mut TuneRow, f: f64) {
    r.median_us *= f;
    r.ci_lo_us *= f;
    r.ci_hi_us *= f;
}

#[test]
fn a_slower_tune_row_regresses_and_noise_does_not() {
    let d = tempfile::tempdir().unwrap();
    let rows = tune_rows();
    let b = write(d.path(), "b.csv", &rows);
    let mut cur = rows.clone();
    let i = cur.iter().position(|r| r.is_timed()).unwrap();
    // 20 % slower, interval moved along.
    scale(&mut cur[i], 1.2);
    // 1 % slower: inside the 2 % floor.
    let j = cur.iter().rposition(|r| r.is_timed()).unwrap();
    cur[j].median_us *= 1.01;
    // Faster by 30 %.
    let k = cur.iter().skip(i + 1).position(|r| r.is_timed()).unwrap() + i + 1;
    scale(&mut cur[k], 0.7);
    let c = write(d.path(), "c.csv", &cur);
    let o = report(&b, &c, &[]);
    assert_eq!(o.code, Some(1), "{}", o.log());
    let key = |r: &TuneRow| {
        format!(
            "{} | {} | {} | {} | {}",
            r.kind, r.family, r.variant, r.shape, r.regime
        )
    };
    let rows = o.rows();
    let status = |k: &str| {
        rows.iter()
            .find(|(key, _, m)| key == k && m == "median_us")
            .map(|x| x.1.clone())
    };
    assert_eq!(status(&key(&cur[i])).as_deref(), Some("regression"));
    assert_eq!(status(&key(&cur[j])).as_deref(), Some("same"));
    assert_eq!(status(&key(&cur[k])).as_deref(), Some("improvement"));
    assert_eq!(
        rows.iter().filter(|r| r.1 == "regression").count(),
        1,
        "{rows:?}"
    );
    assert!(o.stdout.contains("20.0% slower"), "{}", o.log());
    assert!(o.summary().contains("## Regressions (1)"));
    // A wide interval absorbs the same 20 %: the band is the rows' own noise.
    let mut wide = cur.clone();
    wide[i].ci_lo_us = wide[i].median_us * 0.7;
    wide[i].ci_hi_us = wide[i].median_us * 1.3;
    let c = write(d.path(), "w.csv", &wide);
    let o = report(&b, &c, &[]);
    assert_eq!(o.code, Some(0), "{}", o.log());
}

#[test]
fn a_missing_row_fails_unless_allowed_and_a_new_row_is_listed() {
    let d = tempfile::tempdir().unwrap();
    let rows = tune_rows();
    let b = write(d.path(), "b.csv", &rows);
    let mut cur = rows.clone();
    let gone = cur.remove(3);
    let mut extra = cur[0].clone();
    extra.variant = "brand-new".into();
    cur.push(extra);
    let c = write(d.path(), "c.csv", &cur);
    let o = report(&b, &c, &[]);
    assert_eq!(o.code, Some(1), "{}", o.log());
    let rows = o.rows();
    assert!(rows
        .iter()
        .any(|(k, s, _)| s == "missing" && k.contains(&gone.variant) && k.contains(&gone.shape)));
    assert!(rows
        .iter()
        .any(|(k, s, _)| s == "new" && k.contains("brand-new")));
    let o = report(&b, &c, &["--allow-missing"]);
    assert_eq!(o.code, Some(0), "{}", o.log());
}

fn compile_row(variant: &str, arch: &str, regs: u32, spill: u32, smem: u32) -> CompileRow {
    CompileRow {
        schema_version: results::COMPILE_SCHEMA_VERSION,
        kind: results::KIND_COMPILE.into(),
        family: "mmq".into(),
        variant: variant.into(),
        arch: arch.into(),
        verdict: "compiled".into(),
        registers: Some(regs),
        spill_bytes: Some(spill),
        static_smem: Some(smem),
        dyn_smem: Some(0),
        smem_bytes: Some(smem),
        define_sets: 1,
        shapes: 33,
        rejected_shapes: 0,
        reason: String::new(),
        hash: "00".into(),
        nvrtc_version: "13.0".into(),
    }
}

#[test]
fn compile_report_flags_spills_and_growth_and_names_the_variant() {
    let d = tempfile::tempdir().unwrap();
    let base = vec![
        compile_row("a", "sm_90", 128, 0, 32768),
        compile_row("b", "sm_90", 64, 0, 16384),
        compile_row("c", "sm_90", 40, 0, 8192),
        compile_row("d", "sm_90", 96, 0, 0),
        compile_row("e", "sm_80", 96, 0, 0),
    ];
    let b = write(d.path(), "b.csv", &base);
    let o = report(&b, &b, &[]);
    assert_eq!(o.code, Some(0), "{}", o.log());
    let mut cur = base.clone();
    cur[0].spill_bytes = Some(24); // a new spill
    cur[1].registers = Some(72); // +8: beyond max(5 %, 4)
    cur[2].registers = Some(42); // +2: within the band
    cur[3].smem_bytes = Some(4096); // from nothing
    cur[4].verdict = "compile-error".into();
    cur[4].reason = "mmq.cu(12): error: expected a ;".into();
    let c = write(d.path(), "c.csv", &cur);
    let o = report(&b, &c, &[]);
    assert_eq!(o.code, Some(1), "{}", o.log());
    let rows = o.rows();
    let has = |k: &str, s: &str, m: &str| rows.iter().any(|r| r.0 == k && r.1 == s && r.2 == m);
    assert!(
        has("mmq | a | sm_90", "regression", "spill_bytes"),
        "{rows:?}"
    );
    assert!(
        has("mmq | b | sm_90", "regression", "registers"),
        "{rows:?}"
    );
    assert!(has("mmq | c | sm_90", "same", "registers"), "{rows:?}");
    assert!(
        has("mmq | d | sm_90", "regression", "smem_bytes"),
        "{rows:?}"
    );
    assert!(has("mmq | e | sm_80", "regression", "verdict"), "{rows:?}");
    let s = o.summary();
    assert!(s.contains("new spill: 24 bytes"), "{s}");
    assert!(
        s.contains("mmq \\| b \\| sm_90 | registers | 64 | 72 | +12.5%"),
        "{s}"
    );
    assert!(s.contains("scripts/compile-report.sh --update"), "{s}");
    assert!(o.stdout.contains("refresh the baseline"), "{}", o.log());
}

fn check_row(variant: &str, shape: &str, verdict: &str, regs: Option<u32>) -> CheckRow {
    CheckRow {
        schema_version: results::SCHEMA_VERSION,
        family: "gemv".into(),
        variant: variant.into(),
        shape: shape.into(),
        arch: "sm_90".into(),
        verdict: verdict.into(),
        registers: regs,
        spill_bytes: regs.map(|_| 0),
        static_smem: regs.map(|_| 0),
        dyn_smem: regs.map(|_| 512),
        defines: format!("V={variant} WTYPE={}", shape.get(..4).unwrap_or(shape)),
        nvrtc_version: "13.0".into(),
        ..CheckRow::default()
    }
}

#[test]
fn check_verdicts_regress_from_pass_to_fail() {
    let d = tempfile::tempdir().unwrap();
    let base = vec![
        check_row("x", "e4b.ffn_up@m=1", "pass", Some(40)),
        check_row("y", "e4b.ffn_up@m=1", "fail", Some(40)),
        check_row("z", "e4b.ffn_up@m=1", "rejected", None),
    ];
    let b = write(d.path(), "b.csv", &base);
    let mut cur = base.clone();
    cur[0].verdict = "fail".into();
    cur[0].reason = "rms_rel 3e-2 above 1e-3".into();
    cur[1].verdict = "pass".into();
    let c = write(d.path(), "c.csv", &cur);
    let o = report(&b, &c, &[]);
    assert_eq!(o.code, Some(1), "{}", o.log());
    let rows = o.rows();
    assert!(rows.contains(&(
        "gemv | x | e4b.ffn_up@m=1 | sm_90".into(),
        "regression".into(),
        "verdict".into()
    )));
    assert!(rows.contains(&(
        "gemv | y | e4b.ffn_up@m=1 | sm_90".into(),
        "improvement".into(),
        "verdict".into()
    )));
    assert!(o
        .summary()
        .contains("pass -> fail: rms_rel 3e-2 above 1e-3"));
}

fn bench_row(test: &str, profile: &str, samples: &[f64]) -> BenchRow {
    let mean = gemtune::stats::mean(samples);
    BenchRow {
        schema_version: results::BENCH_SCHEMA_VERSION,
        kind: results::KIND_BENCH.into(),
        model: "e4b".into(),
        model_bytes: 8_000_000_000,
        params: 7_520_000_000,
        wtype: "Q8_0".into(),
        backend: "cuda".into(),
        profile: profile.into(),
        gpu: "NVIDIA H100 80GB HBM3".into(),
        test: test.into(),
        n_prompt: 512,
        n_gen: 0,
        depth: 0,
        ubatch: 512,
        reps: samples.len(),
        tps_mean: mean,
        tps_sd: gemtune::stats::sd(samples),
        tps_min: samples.iter().copied().fold(f64::INFINITY, f64::min),
        tps_max: samples.iter().copied().fold(0.0, f64::max),
        samples: results::join_samples(samples),
        ..BenchRow::default()
    }
}

#[test]
fn bench_rows_join_on_test_model_profile_backend() {
    let d = tempfile::tempdir().unwrap();
    let tight = |c: f64| -> Vec<f64> {
        (0..10)
            .map(|i| c * (1.0 + 0.001 * (i % 3) as f64))
            .collect()
    };
    let noisy = |c: f64| -> Vec<f64> {
        (0..10)
            .map(|i| c * (1.0 + 0.08 * ((i % 5) as f64 - 2.0)))
            .collect()
    };
    let base = vec![
        bench_row("pp512", "main", &tight(10000.0)),
        bench_row("tg128", "main", &tight(200.0)),
        bench_row("pp512", "flash-swa", &noisy(10000.0)),
    ];
    let b = write(d.path(), "b.csv", &base);
    let o = report(&b, &b, &[]);
    assert_eq!(o.code, Some(0), "{}", o.log());
    let cur = vec![
        bench_row("pp512", "main", &tight(9500.0)), // 5 % fewer t/s, tight: regression
        bench_row("tg128", "main", &tight(200.5)),  // +0.25 %: same
        bench_row("pp512", "flash-swa", &noisy(9500.0)), // 5 % within its own noise
    ];
    let c = write(d.path(), "c.csv", &cur);
    let o = report(&b, &c, &[]);
    assert_eq!(o.code, Some(1), "{}", o.log());
    let rows = o.rows();
    assert!(rows.contains(&(
        "pp512 | e4b | main | cuda".into(),
        "regression".into(),
        "tps".into()
    )));
    assert!(rows.contains(&(
        "tg128 | e4b | main | cuda".into(),
        "same".into(),
        "tps".into()
    )));
    assert!(rows.contains(&(
        "pp512 | e4b | flash-swa | cuda".into(),
        "same".into(),
        "tps".into()
    )));
}

fn ab_rows(arm: &str, profile: &str, tps: &[f64]) -> Vec<AbRow> {
    tps.iter()
        .enumerate()
        .map(|(i, &t)| AbRow {
            schema_version: results::AB_SCHEMA_VERSION,
            kind: results::KIND_AB.into(),
            arm: arm.into(),
            spec: profile.into(),
            profile: profile.into(),
            model: "e4b".into(),
            backend: "cuda".into(),
            test: "pp2048".into(),
            n_prompt: 2048,
            seq: i,
            block: (i > 0).then_some(i / 4),
            warmup: i == 0,
            tps: t,
            ms: 2048e3 / t,
            used: i > 0,
            ..AbRow::default()
        })
        .collect()
}

#[test]
fn ab_results_join_per_arm_on_the_used_reps() {
    let d = tempfile::tempdir().unwrap();
    // The warm-up (first value) is far off and must not count.
    let reps = |c: f64| -> Vec<f64> {
        std::iter::once(c * 0.5)
            .chain((0..8).map(|i| c * (1.0 + 0.001 * (i % 2) as f64)))
            .collect()
    };
    let mut base = ab_rows("baseline", "main", &reps(20000.0));
    base.extend(ab_rows("candidate", "flash-swa", &reps(22000.0)));
    let b = write(d.path(), "b.csv", &base);
    let o = report(&b, &b, &[]);
    assert_eq!(o.code, Some(0), "{}", o.log());
    let mut cur = ab_rows("baseline", "main", &reps(20010.0));
    cur.extend(ab_rows("candidate", "flash-swa", &reps(20000.0)));
    let c = write(d.path(), "c.csv", &cur);
    let o = report(&b, &c, &[]);
    assert_eq!(o.code, Some(1), "{}", o.log());
    let rows = o.rows();
    assert!(rows.contains(&(
        "pp2048 | e4b | flash-swa | cuda | candidate".into(),
        "regression".into(),
        "tps".into()
    )));
    assert!(rows.contains(&(
        "pp2048 | e4b | main | cuda | baseline".into(),
        "same".into(),
        "tps".into()
    )));
}

#[test]
fn bad_input_is_exit_4() {
    let d = tempfile::tempdir().unwrap();
    let junk = d.path().join("junk.csv");
    std::fs::write(&junk, "a,b,c\n1,2,3\n").unwrap();
    let t = write(d.path(), "t.csv", &tune_rows());
    let comp = write(d.path(), "c.csv", &[compile_row("a", "sm_90", 1, 0, 0)]);
    let o = report(&junk, &t, &[]);
    assert_eq!(o.code, Some(4), "{}", o.log());
    assert!(o.stderr.contains("not a result file"), "{}", o.log());
    let o = report(&t, &comp, &[]);
    assert_eq!(o.code, Some(4), "{}", o.log());
    assert!(o.stderr.contains("different kinds"), "{}", o.log());
    let o = report(&t, &d.path().join("nope.csv"), &[]);
    assert_eq!(o.code, Some(4), "{}", o.log());
    // The same key twice: never silently joined.
    let dup = write(
        d.path(),
        "d.csv",
        &[
            compile_row("a", "sm_90", 1, 0, 0),
            compile_row("a", "sm_90", 2, 0, 0),
        ],
    );
    let o = report(&dup, &comp, &[]);
    assert_eq!(o.code, Some(4), "{}", o.log());
    assert!(o.stderr.contains("mmq | a | sm_90"), "{}", o.log());
    let o = report(&t, &t, &["--floor", "2"]);
    assert_eq!(o.code, Some(4), "{}", o.log());
}

#[test]
fn kinds_are_told_apart_by_their_header() {
    let d = tempfile::tempdir().unwrap();
    let cases: Vec<(PathBuf, Kind)> = vec![
        (write(d.path(), "t.csv", &tune_rows()), Kind::Tune),
        (
            write(
                d.path(),
                "k.csv",
                &[check_row("x", "Q8_0: 3 shapes", "compiled", Some(1))],
            ),
            Kind::Check,
        ),
        (
            write(d.path(), "b.csv", &[bench_row("pp512", "main", &[1.0])]),
            Kind::Bench,
        ),
        (
            write(d.path(), "a.csv", &ab_rows("baseline", "main", &[1.0, 2.0])),
            Kind::Ab,
        ),
        (
            write(d.path(), "c.csv", &[compile_row("a", "sm_90", 1, 0, 0)]),
            Kind::Compile,
        ),
    ];
    for (p, k) in cases {
        assert_eq!(compare::detect_kind(&p).unwrap(), k, "{}", p.display());
        let side = Side::load(&p).unwrap();
        let c = compare::compare(&side, &side, &CompareConfig::default()).unwrap();
        assert!(!c.failed());
        assert!(c.findings.iter().all(|f| f.status == Status::Same));
    }
}

#[test]
fn compile_rows_take_the_worst_over_shapes_and_merge_per_family_and_arch() {
    let mut a = check_row("v", "Q8_0: 33 shapes", "compiled", Some(40));
    a.family = "mmq".into();
    let mut b = check_row("v", "Q4_0: 12 shapes", "compiled", Some(56));
    b.family = "mmq".into();
    b.spill_bytes = Some(8);
    b.dyn_smem = Some(2048);
    let mut r = check_row("v", "e4b.a@m=1,e4b.b@m=1", "rejected", None);
    r.family = "mmq".into();
    r.reason = "BM does not divide".into();
    let mut only_rejected = r.clone();
    only_rejected.variant = "w".into();
    let mut dup = check_row("u", "*", "duplicate", None);
    dup.family = "mmq".into();
    dup.reason = "same defines as v".into();
    let rows = results::compile_rows(&[a, b, r, only_rejected, dup]);
    assert_eq!(rows.len(), 3);
    let v = rows.iter().find(|x| x.variant == "v").unwrap();
    assert_eq!(v.verdict, "compiled");
    assert_eq!(
        (v.registers, v.spill_bytes, v.dyn_smem, v.smem_bytes),
        (Some(56), Some(8), Some(2048), Some(2048))
    );
    assert_eq!((v.define_sets, v.shapes, v.rejected_shapes), (2, 45, 2));
    let w = rows.iter().find(|x| x.variant == "w").unwrap();
    assert_eq!((w.verdict.as_str(), w.registers), ("rejected", None));
    assert_eq!(w.reason, "BM does not divide");
    let u = rows.iter().find(|x| x.variant == "u").unwrap();
    assert_eq!(u.verdict, "duplicate");
    // Merge: the fresh rows of (mmq, sm_90) replace the old ones; others stay.
    let old = vec![
        compile_row("old-variant", "sm_90", 1, 0, 0),
        compile_row("a", "sm_80", 1, 0, 0),
    ];
    let mut other = compile_row("g", "sm_90", 1, 0, 0);
    other.family = "gemv".into();
    let merged = results::merge_compile_rows(
        old.into_iter().chain(std::iter::once(other)).collect(),
        rows,
    );
    let keys: Vec<String> = merged
        .iter()
        .map(|r| format!("{}/{}/{}", r.family, r.variant, r.arch))
        .collect();
    assert_eq!(
        keys,
        [
            "gemv/g/sm_90",
            "mmq/a/sm_80",
            "mmq/u/sm_90",
            "mmq/v/sm_90",
            "mmq/w/sm_90"
        ]
    );
}

/// The committed compile baseline reads, covers every family on sm_80,
/// sm_89 and sm_90 and was made with the pinned NVRTC.
#[test]
fn committed_compile_baseline_is_complete() {
    let p = common::repo_root().join("reports/baseline/compile.csv");
    let rows: Vec<CompileRow> = results::read_csv(&p).expect("reports/baseline/compile.csv");
    for f in gemtune_kernels::family::families() {
        for arch in ["sm_80", "sm_89", "sm_90"] {
            assert!(
                rows.iter().any(|r| r.family == f.name() && r.arch == arch),
                "no {} rows for {arch} in {}: refresh it with scripts/compile-report.sh --update",
                f.name(),
                p.display()
            );
        }
    }
    for r in rows.iter().filter(|r| r.verdict == "compiled") {
        assert_eq!(r.nvrtc_version, "13.0", "{r:?}");
        assert!(r.registers.unwrap_or(0) > 0, "{r:?}");
    }
    assert!(rows.iter().all(|r| r.verdict != "compile-error"));
}
