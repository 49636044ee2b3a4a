//! `gemtune report`: two result files of one kind joined row by row, each
//! change judged against the rows' own noise.
//!
//! Kinds (told apart by their header) and the key rows are joined on:
//!
//! | kind | file | key | judged |
//! |---|---|---|---|
//! | tune | `results.csv` of `tune` | kind, family, variant, shape, regime | median us (lower is better), the verdict |
//! | check | `check.csv` | family, variant, shape, arch | the verdict; registers, spills, shared memory |
//! | bench | `bench.csv` | test, model, profile, backend | t/s (higher is better) |
//! | ab | `results.csv` of `ab` | test, model, profile, backend, arm | t/s of the used reps |
//! | compile | `compile.csv` | family, variant, arch | the verdict; registers, spills, shared memory |
//!
//! Timing rows regress when they are slower by more than their noise band:
//! the two rows' relative interval half-widths added (the 95 % bootstrap
//! interval of the median that tune writes; for bench and ab rows, the same
//! interval computed from their raw samples), never less than the floor
//! (`--floor`, 2 %). Resources regress on any new or larger spill, on
//! registers growing by more than `--resource-floor` (5 %) and at least
//! `MIN_REGISTER_GROWTH` registers, and on shared memory growing by more
//! than `--resource-floor`. A verdict that goes from good (pass, compiled,
//! timed) to bad (fail, spills, compile-error, error, or no longer timed)
//! is a regression. A row of the baseline that the current file lacks is a
//! regression (`--allow-missing` lists it only); a row only the current
//! file has is listed as new. Nothing is joined on anything but its full
//! key, and a key that appears twice in one file is an input error.

use crate::results::{self, AbRow, BenchRow, CheckRow, CompileRow, TuneRow};
use crate::stats;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Registers must grow by at least this many to count, whatever the floor.
pub const MIN_REGISTER_GROWTH: u32 = 4;
/// Seed of the intervals computed from raw samples (bench and ab rows).
pub const SAMPLE_CI_SEED: u64 = 0x5eed;

#[derive(Debug, Error)]
pub enum CompareError {
    #[error("{path}: {msg}")]
    Read { path: PathBuf, msg: String },
    #[error(
        "{path}: not a result file gemtune report knows (tune results.csv, check.csv, bench.csv, ab results.csv or compile.csv); header: {header}"
    )]
    UnknownKind { path: PathBuf, header: String },
    #[error("the files are of different kinds: baseline {base} is {base_kind}, current {cur} is {cur_kind}")]
    KindMismatch {
        base: PathBuf,
        base_kind: Kind,
        cur: PathBuf,
        cur_kind: Kind,
    },
    #[error("{path}: {n} keys appear more than once (rows are joined on the full key only), e.g. {first}")]
    Duplicate {
        path: PathBuf,
        n: usize,
        first: String,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Tune,
    Check,
    Bench,
    Ab,
    Compile,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Tune => "tune",
            Kind::Check => "check",
            Kind::Bench => "bench",
            Kind::Ab => "ab",
            Kind::Compile => "compile",
        }
    }
    /// The columns rows are joined on.
    pub fn key_columns(self) -> &'static [&'static str] {
        match self {
            Kind::Tune => &["kind", "family", "variant", "shape", "regime"],
            Kind::Check => &["family", "variant", "shape", "arch"],
            Kind::Bench => &["test", "model", "profile", "backend"],
            Kind::Ab => &["test", "model", "profile", "backend", "arm"],
            Kind::Compile => &["family", "variant", "arch"],
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The kind of a result file, from the columns of its header.
pub fn detect_kind(path: &Path) -> Result<Kind, CompareError> {
    let mut r = csv::Reader::from_path(path).map_err(|e| CompareError::Read {
        path: path.to_path_buf(),
        msg: format!("cannot read: {e}"),
    })?;
    let h = r.headers().map_err(|e| CompareError::Read {
        path: path.to_path_buf(),
        msg: format!("no CSV header: {e}"),
    })?;
    let has = |c: &str| h.iter().any(|x| x == c);
    let kind = if has("define_sets") {
        Kind::Compile
    } else if has("arm") && has("tps") {
        Kind::Ab
    } else if has("tps_mean") {
        Kind::Bench
    } else if has("median_us") {
        Kind::Tune
    } else if has("contract") && has("verdict") {
        Kind::Check
    } else {
        return Err(CompareError::UnknownKind {
            path: path.to_path_buf(),
            header: crate::util::clip(&h.iter().collect::<Vec<_>>().join(","), 160),
        });
    };
    Ok(kind)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Worse beyond the band (or a worse verdict).
    Regression,
    /// In the baseline, not in the current file.
    Missing,
    /// Better beyond the band.
    Improvement,
    /// Different, but neither better nor worse by the rules (a verdict
    /// change between neutral states, a row that became rejected).
    Changed,
    /// Only in the current file.
    New,
    /// Within the band.
    Same,
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::Regression => "regression",
            Status::Missing => "missing",
            Status::Improvement => "improvement",
            Status::Changed => "changed",
            Status::New => "new",
            Status::Same => "same",
        }
    }
}

/// One judged metric of one joined key (or a key present on one side).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Finding {
    pub kind: Kind,
    /// The key's values, " | "-separated, in `Kind::key_columns` order.
    pub key: String,
    pub status: Status,
    /// median_us | tps | verdict | registers | spill_bytes | smem_bytes | row
    pub metric: String,
    pub baseline: Option<f64>,
    pub baseline_lo: Option<f64>,
    pub baseline_hi: Option<f64>,
    pub current: Option<f64>,
    pub current_lo: Option<f64>,
    pub current_hi: Option<f64>,
    /// current / baseline - 1.
    pub change: Option<f64>,
    /// The relative band the change was judged against.
    pub band: Option<f64>,
    pub note: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct CompareConfig {
    /// Smallest relative timing change that counts (0.02 = 2 %).
    pub floor: f64,
    /// Smallest relative register or shared-memory growth that counts.
    pub resource_floor: f64,
    /// Rows missing from the current file are listed, not regressions.
    pub allow_missing: bool,
}

impl Default for CompareConfig {
    fn default() -> Self {
        CompareConfig {
            floor: 0.02,
            resource_floor: 0.05,
            allow_missing: false,
        }
    }
}

/// A measured value with its interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Measure {
    pub value: f64,
    pub lo: f64,
    pub hi: f64,
}

impl Measure {
    /// Relative half-width of the interval (0 when it has none).
    fn half_width(&self) -> f64 {
        let w = (self.hi - self.lo) / 2.0 / self.value.abs();
        if w.is_finite() && w > 0.0 {
            w
        } else {
            0.0
        }
    }
}

/// Median and 95 % bootstrap interval of raw samples.
pub fn measure_samples(samples: &[f64]) -> Option<Measure> {
    let s = stats::summarize(samples, SAMPLE_CI_SEED);
    (s.n > 0).then_some(Measure {
        value: s.median,
        lo: s.ci_lo,
        hi: s.ci_hi,
    })
}

/// What a side of the comparison holds per key: the metrics judged and the
/// row's verdict (for the good -> bad rule).
#[derive(Clone, Debug, Default)]
struct Entry {
    /// Timing measure (None when the row holds none) and whether higher is
    /// better.
    timing: Option<(Measure, bool)>,
    timing_name: &'static str,
    /// The row's own verdict and its reason, when the kind has one.
    verdict: Option<(String, String)>,
    registers: Option<u32>,
    spill_bytes: Option<u32>,
    smem_bytes: Option<u32>,
    /// Toolchain / device identity, to note mismatches.
    provenance: String,
}

/// A loaded result file, by key.
pub struct Side {
    pub path: PathBuf,
    pub kind: Kind,
    pub rows: usize,
    entries: BTreeMap<String, Entry>,
}

fn read<T: for<'de> serde::Deserialize<'de>>(path: &Path) -> Result<Vec<T>, CompareError> {
    results::read_csv(path).map_err(|e| CompareError::Read {
        path: path.to_path_buf(),
        msg: format!("{e:#}"),
    })
}

fn key_of(parts: &[&str]) -> String {
    parts.join(" | ")
}

fn good_verdict(v: &str) -> bool {
    matches!(v, "pass" | "compiled" | "timed")
}

fn bad_verdict(v: &str) -> bool {
    matches!(
        v,
        "fail" | "spills" | "compile-error" | "error" | "unsupported" | "unavailable"
    )
}

impl Side {
    /// Reads a result file of any known kind.
    pub fn load(path: &Path) -> Result<Side, CompareError> {
        let kind = detect_kind(path)?;
        let mut list: Vec<(String, Entry)> = Vec::new();
        let rows;
        match kind {
            Kind::Tune => {
                let v: Vec<TuneRow> = read(path)?;
                rows = v.len();
                for r in &v {
                    let timing = r.is_timed().then_some((
                        Measure {
                            value: r.median_us,
                            lo: r.ci_lo_us,
                            hi: r.ci_hi_us,
                        },
                        false,
                    ));
                    list.push((
                        key_of(&[&r.kind, &r.family, &r.variant, &r.shape, &r.regime]),
                        Entry {
                            timing,
                            timing_name: "median_us",
                            verdict: Some((r.verdict.clone(), r.reason.clone())),
                            provenance: format!(
                                "{} / NVRTC {} / {} launches",
                                r.device, r.nvrtc_version, r.launches
                            ),
                            ..Entry::default()
                        },
                    ));
                }
            }
            Kind::Check => {
                let v: Vec<CheckRow> = read(path)?;
                rows = v.len();
                for r in &v {
                    list.push((
                        key_of(&[&r.family, &r.variant, &r.shape, &r.arch]),
                        Entry {
                            verdict: Some((r.verdict.clone(), r.reason.clone())),
                            registers: r.registers,
                            spill_bytes: r.spill_bytes,
                            smem_bytes: match (r.static_smem, r.dyn_smem) {
                                (None, None) => None,
                                (s, d) => Some(s.unwrap_or(0) + d.unwrap_or(0)),
                            },
                            provenance: format!("NVRTC {}", r.nvrtc_version),
                            ..Entry::default()
                        },
                    ));
                }
            }
            Kind::Compile => {
                let v: Vec<CompileRow> = read(path)?;
                rows = v.len();
                for r in &v {
                    list.push((
                        key_of(&[&r.family, &r.variant, &r.arch]),
                        Entry {
                            verdict: Some((r.verdict.clone(), r.reason.clone())),
                            registers: r.registers,
                            spill_bytes: r.spill_bytes,
                            smem_bytes: r.smem_bytes,
                            provenance: if r.nvrtc_version.is_empty() {
                                String::new()
                            } else {
                                format!("NVRTC {}", r.nvrtc_version)
                            },
                            ..Entry::default()
                        },
                    ));
                }
            }
            Kind::Bench => {
                let v: Vec<BenchRow> = read(path)?;
                rows = v.len();
                for r in &v {
                    let samples = results::split_samples(&r.samples);
                    let m = measure_samples(&samples).or_else(|| {
                        // No raw samples: mean +/- 1.96 standard errors.
                        let se = r.tps_sd / (r.reps.max(1) as f64).sqrt();
                        let se = if se.is_finite() { se } else { 0.0 };
                        r.tps_mean.is_finite().then_some(Measure {
                            value: r.tps_mean,
                            lo: r.tps_mean - 1.96 * se,
                            hi: r.tps_mean + 1.96 * se,
                        })
                    });
                    list.push((
                        key_of(&[&r.test, &r.model, &r.profile, &r.backend]),
                        Entry {
                            timing: m.map(|m| (m, true)),
                            timing_name: "tps",
                            provenance: r.gpu.clone(),
                            ..Entry::default()
                        },
                    ));
                }
            }
            Kind::Ab => {
                let v: Vec<AbRow> = read(path)?;
                rows = v.len();
                let mut groups: BTreeMap<String, (Vec<f64>, Vec<f64>, String)> = BTreeMap::new();
                for r in &v {
                    let g = groups
                        .entry(key_of(&[&r.test, &r.model, &r.profile, &r.backend, &r.arm]))
                        .or_insert_with(|| (Vec::new(), Vec::new(), r.gpu.clone()));
                    if r.used {
                        g.0.push(r.tps);
                    } else if !r.warmup {
                        g.1.push(r.tps);
                    }
                }
                for (k, (used, unused, gpu)) in groups {
                    // The reps the verdict used; all measured reps when a
                    // run dropped every block.
                    let s = if used.is_empty() { unused } else { used };
                    list.push((
                        k,
                        Entry {
                            timing: measure_samples(&s).map(|m| (m, true)),
                            timing_name: "tps",
                            provenance: gpu,
                            ..Entry::default()
                        },
                    ));
                }
            }
        }
        let mut entries = BTreeMap::new();
        let mut dups = Vec::new();
        for (k, e) in list {
            match entries.entry(k) {
                std::collections::btree_map::Entry::Occupied(o) => dups.push(o.key().clone()),
                std::collections::btree_map::Entry::Vacant(v) => {
                    v.insert(e);
                }
            }
        }
        if let Some(first) = dups.first() {
            return Err(CompareError::Duplicate {
                path: path.to_path_buf(),
                n: dups.len(),
                first: first.clone(),
            });
        }
        Ok(Side {
            path: path.to_path_buf(),
            kind,
            rows,
            entries,
        })
    }

    pub fn keys(&self) -> usize {
        self.entries.len()
    }

    /// The distinct provenance strings of the rows (device, toolchain).
    pub fn provenance(&self) -> BTreeSet<String> {
        self.entries
            .values()
            .map(|e| e.provenance.clone())
            .filter(|p| !p.is_empty())
            .collect()
    }
}

/// The outcome of a comparison.
pub struct Comparison {
    pub kind: Kind,
    pub findings: Vec<Finding>,
    pub config: CompareConfig,
    pub notes: Vec<String>,
}

impl Comparison {
    pub fn count(&self, s: Status) -> usize {
        self.keys_with(s).len()
    }
    /// Keys with at least one finding of status `s`.
    pub fn keys_with(&self, s: Status) -> BTreeSet<&str> {
        self.findings
            .iter()
            .filter(|f| f.status == s)
            .map(|f| f.key.as_str())
            .collect()
    }
    /// Regressions (and missing rows unless allowed) fail the comparison.
    pub fn failed(&self) -> bool {
        self.count(Status::Regression) > 0
            || (!self.config.allow_missing && self.count(Status::Missing) > 0)
    }
}

fn finding(kind: Kind, key: &str, status: Status, metric: &str, note: String) -> Finding {
    Finding {
        kind,
        key: key.to_string(),
        status,
        metric: metric.to_string(),
        baseline: None,
        baseline_lo: None,
        baseline_hi: None,
        current: None,
        current_lo: None,
        current_hi: None,
        change: None,
        band: None,
        note,
    }
}

/// Judges a timing measure (lower or higher better) against its band.
fn judge_timing(
    kind: Kind,
    key: &str,
    metric: &str,
    b: Measure,
    c: Measure,
    higher_better: bool,
    floor: f64,
) -> Finding {
    let change = c.value / b.value - 1.0;
    let noise = b.half_width() + c.half_width();
    let band = floor.max(noise);
    let worse = if higher_better { -change } else { change };
    let status = if !change.is_finite() {
        Status::Changed
    } else if worse > band {
        Status::Regression
    } else if -worse > band {
        Status::Improvement
    } else {
        Status::Same
    };
    let dir = if worse > 0.0 { "slower" } else { "faster" };
    let note = match status {
        Status::Regression | Status::Improvement => format!(
            "{:.1}% {dir}, beyond the {:.1}% band ({})",
            100.0 * worse.abs(),
            100.0 * band,
            if noise > floor {
                "the rows' interval half-widths"
            } else {
                "the floor"
            }
        ),
        Status::Same => format!(
            "{:.1}% {dir}, within the {:.1}% band",
            100.0 * worse.abs(),
            100.0 * band
        ),
        _ => "not a finite ratio".to_string(),
    };
    Finding {
        baseline: Some(b.value),
        baseline_lo: Some(b.lo),
        baseline_hi: Some(b.hi),
        current: Some(c.value),
        current_lo: Some(c.lo),
        current_hi: Some(c.hi),
        change: Some(change),
        band: Some(band),
        ..finding(kind, key, status, metric, note)
    }
}

/// Judges an integer resource (registers, smem, spills): growth beyond the
/// band regresses.
fn judge_resource(
    kind: Kind,
    key: &str,
    metric: &str,
    b: u32,
    c: u32,
    rel: f64,
    min_abs: u32,
) -> Finding {
    let change = if b > 0 {
        c as f64 / b as f64 - 1.0
    } else if c > 0 {
        f64::INFINITY
    } else {
        0.0
    };
    let allowed = ((rel * b as f64).floor() as u32).max(min_abs);
    let status = if c > b + allowed {
        Status::Regression
    } else if b > c + allowed {
        Status::Improvement
    } else {
        Status::Same
    };
    let note = if metric == "spill_bytes" && b == 0 && c > 0 {
        format!("new spill: {c} bytes")
    } else if b != c {
        format!(
            "{b} -> {c} ({:+}), band {allowed}{}",
            c as i64 - b as i64,
            if status == Status::Same {
                ": within"
            } else {
                ""
            }
        )
    } else {
        String::new()
    };
    Finding {
        baseline: Some(b as f64),
        current: Some(c as f64),
        change: change.is_finite().then_some(change),
        band: (b > 0).then_some(allowed as f64 / b as f64),
        ..finding(kind, key, status, metric, note)
    }
}

/// Joins and judges two loaded sides of the same kind.
pub fn compare(base: &Side, cur: &Side, cfg: &CompareConfig) -> Result<Comparison, CompareError> {
    if base.kind != cur.kind {
        return Err(CompareError::KindMismatch {
            base: base.path.clone(),
            base_kind: base.kind,
            cur: cur.path.clone(),
            cur_kind: cur.kind,
        });
    }
    let kind = base.kind;
    let mut out = Vec::new();
    let mut notes = Vec::new();
    let (pb, pc) = (base.provenance(), cur.provenance());
    if !pb.is_empty() && !pc.is_empty() && pb != pc {
        notes.push(format!(
            "the files come from different machines or toolchains: baseline {}; current {}",
            pb.iter().cloned().collect::<Vec<_>>().join(", "),
            pc.iter().cloned().collect::<Vec<_>>().join(", ")
        ));
    }
    for (k, b) in &base.entries {
        let Some(c) = cur.entries.get(k) else {
            out.push(finding(
                kind,
                k,
                Status::Missing,
                "row",
                "in the baseline only".into(),
            ));
            continue;
        };
        let mut found = Vec::new();
        // The verdict: good -> bad regresses, bad -> good improves.
        if let (Some((vb, _)), Some((vc, rc))) = (&b.verdict, &c.verdict) {
            if vb != vc {
                let status = if good_verdict(vb) && bad_verdict(vc) {
                    Status::Regression
                } else if bad_verdict(vb) && good_verdict(vc) {
                    Status::Improvement
                } else {
                    Status::Changed
                };
                found.push(finding(
                    kind,
                    k,
                    status,
                    "verdict",
                    format!(
                        "{vb} -> {vc}{}",
                        if rc.is_empty() {
                            String::new()
                        } else {
                            format!(": {}", crate::util::clip(rc, 160))
                        }
                    ),
                ));
            }
        }
        match (b.timing, c.timing) {
            (Some((mb, hb)), Some((mc, _))) => {
                found.push(judge_timing(kind, k, b.timing_name, mb, mc, hb, cfg.floor))
            }
            (Some(_), None) if b.verdict.is_none() => found.push(finding(
                kind,
                k,
                Status::Regression,
                b.timing_name,
                "measured in the baseline, no measurement now".into(),
            )),
            _ => {}
        }
        if let (Some(sb), Some(sc)) = (b.spill_bytes, c.spill_bytes) {
            found.push(judge_resource(kind, k, "spill_bytes", sb, sc, 0.0, 0));
        }
        if let (Some(rb), Some(rc)) = (b.registers, c.registers) {
            found.push(judge_resource(
                kind,
                k,
                "registers",
                rb,
                rc,
                cfg.resource_floor,
                MIN_REGISTER_GROWTH,
            ));
        }
        if let (Some(sb), Some(sc)) = (b.smem_bytes, c.smem_bytes) {
            found.push(judge_resource(
                kind,
                k,
                "smem_bytes",
                sb,
                sc,
                cfg.resource_floor,
                0,
            ));
        }
        if found.is_empty() {
            found.push(finding(kind, k, Status::Same, "row", String::new()));
        }
        out.extend(found);
    }
    for k in cur.entries.keys() {
        if !base.entries.contains_key(k) {
            out.push(finding(
                kind,
                k,
                Status::New,
                "row",
                "in the current file only".into(),
            ));
        }
    }
    Ok(Comparison {
        kind,
        findings: out,
        config: cfg.clone(),
        notes,
    })
}

/// One row of the report's `report.csv`.
#[derive(Clone, Debug, Serialize)]
pub struct ReportRow<'a> {
    pub kind: &'a str,
    pub key: &'a str,
    pub status: &'a str,
    pub metric: &'a str,
    pub baseline: Option<f64>,
    pub baseline_lo: Option<f64>,
    pub baseline_hi: Option<f64>,
    pub current: Option<f64>,
    pub current_lo: Option<f64>,
    pub current_hi: Option<f64>,
    pub change: Option<f64>,
    pub band: Option<f64>,
    pub note: &'a str,
}

/// The findings as `report.csv` rows, worst first.
pub fn report_rows(c: &Comparison) -> Vec<ReportRow<'_>> {
    let mut v: Vec<&Finding> = c.findings.iter().collect();
    v.sort_by(|a, b| (a.status, &a.key, &a.metric).cmp(&(b.status, &b.key, &b.metric)));
    v.into_iter()
        .map(|f| ReportRow {
            kind: f.kind.name(),
            key: &f.key,
            status: f.status.name(),
            metric: &f.metric,
            baseline: f.baseline,
            baseline_lo: f.baseline_lo,
            baseline_hi: f.baseline_hi,
            current: f.current,
            current_lo: f.current_lo,
            current_hi: f.current_hi,
            change: f.change,
            band: f.band,
            note: &f.note,
        })
        .collect()
}

fn num(v: Option<f64>) -> String {
    match v {
        Some(x) if x.abs() >= 100.0 || x == x.trunc() => format!("{x:.0}"),
        Some(x) => format!("{x:.4}"),
        None => "-".into(),
    }
}

fn chg(v: Option<f64>) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{:+.1}%", 100.0 * x),
        Some(_) => "new".into(),
        None => "-".into(),
    }
}

/// The rule text of a kind, for the summary.
pub fn rule_text(kind: Kind, cfg: &CompareConfig) -> String {
    let timing = format!(
        "a timing row regresses when it is slower by more than its noise band: the two rows' relative 95% interval half-widths added, never less than the floor of {:.1}%",
        100.0 * cfg.floor
    );
    let res = format!(
        "a resource regresses on any new or larger spill, on registers growing by more than {:.0}% and at least {MIN_REGISTER_GROWTH}, and on shared memory growing by more than {:.0}%",
        100.0 * cfg.resource_floor,
        100.0 * cfg.resource_floor
    );
    let verdict = "a verdict regresses from pass, compiled or timed to fail, spills, compile-error, error or unavailable";
    let missing = if cfg.allow_missing {
        "rows missing from the current file are listed only (--allow-missing)"
    } else {
        "a row missing from the current file is a regression"
    };
    match kind {
        Kind::Tune => format!(
            "Key: {}. Rules: {timing}; {verdict}; {missing}.",
            kind.key_columns().join(" | ")
        ),
        Kind::Bench | Kind::Ab => format!(
            "Key: {}. Rules: {} (t/s: lower is slower); {missing}.",
            kind.key_columns().join(" | "),
            timing.replace("slower by", "slower (lower t/s) by")
        ),
        Kind::Check | Kind::Compile => format!(
            "Key: {}. Rules: {res}; {verdict}; {missing}.",
            kind.key_columns().join(" | ")
        ),
    }
}

/// `summary.md` of a comparison. `update_hint` is printed under the
/// verdict when the comparison failed (how to refresh the baseline).
pub fn summary_md(c: &Comparison, base: &Side, cur: &Side, update_hint: Option<&str>) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# gemtune report ({})\n", c.kind);
    let _ = writeln!(
        s,
        "| | file | rows | keys |\n|---|---|---:|---:|\n| baseline | `{}` | {} | {} |\n| current | `{}` | {} | {} |\n",
        base.path.display(),
        base.rows,
        base.keys(),
        cur.path.display(),
        cur.rows,
        cur.keys()
    );
    let reg = c.count(Status::Regression);
    let miss = c.count(Status::Missing);
    let verdict = if c.failed() { "FAIL" } else { "PASS" };
    let _ = writeln!(
        s,
        "**{verdict}**: {reg} regressed, {miss} missing, {} improved, {} changed, {} new, {} same (keys).\n",
        c.count(Status::Improvement),
        c.count(Status::Changed),
        c.count(Status::New),
        c.keys_with(Status::Same)
            .iter()
            .filter(|k| {
                !c.findings
                    .iter()
                    .any(|f| &f.key.as_str() == *k && f.status != Status::Same)
            })
            .count()
    );
    if c.failed() {
        if let Some(h) = update_hint {
            let _ = writeln!(
                s,
                "If the change is intended, refresh the baseline: `{h}`\n"
            );
        }
    }
    let _ = writeln!(s, "{}\n", rule_text(c.kind, &c.config));
    for n in &c.notes {
        let _ = writeln!(s, "- note: {n}");
    }
    if !c.notes.is_empty() {
        let _ = writeln!(s);
    }
    let sections = [
        (Status::Regression, "Regressions"),
        (Status::Missing, "Missing from the current file"),
        (Status::Improvement, "Improvements"),
        (Status::Changed, "Changed (neither better nor worse)"),
        (Status::New, "New in the current file"),
    ];
    let cols = c.kind.key_columns().join(" \\| ");
    for (st, title) in sections {
        let rows: Vec<&Finding> = c.findings.iter().filter(|f| f.status == st).collect();
        if rows.is_empty() {
            continue;
        }
        let _ = writeln!(s, "## {title} ({})\n", rows.len());
        let _ = writeln!(
            s,
            "| {cols} | metric | baseline | current | change | band | note |\n|---|---|---:|---:|---:|---:|---|"
        );
        for f in rows.iter().take(200) {
            let iv = |v: Option<f64>, lo: Option<f64>, hi: Option<f64>| match (lo, hi) {
                (Some(l), Some(h)) if l != h => {
                    format!("{} [{}, {}]", num(v), num(Some(l)), num(Some(h)))
                }
                _ => num(v),
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} |",
                f.key.replace('|', "\\|"),
                f.metric,
                iv(f.baseline, f.baseline_lo, f.baseline_hi),
                iv(f.current, f.current_lo, f.current_hi),
                chg(f.change),
                f.band.map_or("-".into(), |b| format!("{:.1}%", 100.0 * b)),
                f.note.replace('|', "/")
            );
        }
        if rows.len() > 200 {
            let _ = writeln!(s, "\n{} more in report.csv.", rows.len() - 200);
        }
        let _ = writeln!(s);
    }
    let _ = writeln!(
        s,
        "Every finding (same ones included) is in report.csv; change.png draws the largest changes against their bands."
    );
    s
}

/// The bars of change.png: the findings with a finite change, largest
/// relative to their band first (at most `max`).
pub fn change_bars(c: &Comparison, max: usize) -> Vec<crate::plots::Bar> {
    let mut v: Vec<&Finding> = c
        .findings
        .iter()
        .filter(|f| f.change.is_some_and(f64::is_finite) && f.baseline.is_some())
        .collect();
    let score = |f: &Finding| {
        let ch = f.change.unwrap_or(0.0).abs();
        let band = f.band.unwrap_or(0.0).max(1e-9);
        let rank: f64 = match f.status {
            Status::Regression => 3.0,
            Status::Improvement => 2.0,
            _ => 1.0,
        };
        (rank, ch / band)
    };
    v.sort_by(|a, b| {
        let (ra, sa) = score(a);
        let (rb, sb) = score(b);
        rb.total_cmp(&ra).then(sb.total_cmp(&sa))
    });
    v.into_iter()
        .take(max)
        .map(|f| crate::plots::Bar {
            label: crate::util::clip(&format!("{} {}", f.key, f.metric), 70),
            value: 100.0 * f.change.unwrap_or(0.0),
            ci: None,
            band: f.band.map(|b| 100.0 * b),
            class: match f.status {
                Status::Regression => crate::plots::BarClass::Bad,
                Status::Improvement => crate::plots::BarClass::Good,
                _ => crate::plots::BarClass::Neutral,
            },
        })
        .collect()
}
