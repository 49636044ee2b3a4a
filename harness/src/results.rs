//! Result files: `check.csv` (one row per variant x shape) and
//! `results.csv` (one row per variant x shape x regime). Numbers are written
//! at full precision (shortest text that round-trips the f64); every row of
//! `results.csv` carries `schema_version` and the device and toolchain it
//! was measured on, so rows from different files can be concatenated.

use serde::{Deserialize, Serialize};
use std::path::Path;

/// Bumped whenever a column is added, removed or changes meaning.
/// 2: `kind`, `verdict`, `reason` (vendor reference rows, rows that could
/// not be timed) and the sampled-clock columns.
/// 3: `problem` (every dimension of the shape, for attention and row-wise
/// shapes whose m/n/k/wtype columns carry only part of it).
/// 4: `device_index` (the GPU a row ran on; several per run with
/// `--devices`) and, in `results.csv`, `pci_bus_id`.
pub const SCHEMA_VERSION: u32 = 4;

/// `kind` of a row measuring one of our kernel variants.
pub const KIND_VARIANT: &str = "variant";
/// `kind` of a row measuring a vendor library (`family` names the library,
/// `variant` the reference, e.g. cublas / cublas-bf16).
pub const KIND_REFERENCE: &str = "reference";
/// `verdict` of a row that holds a measurement.
pub const VERDICT_TIMED: &str = "timed";

fn default_launches() -> String {
    "stream".to_string()
}

fn default_kind() -> String {
    KIND_VARIANT.to_string()
}

fn default_verdict() -> String {
    VERDICT_TIMED.to_string()
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckRow {
    pub schema_version: u32,
    pub family: String,
    pub variant: String,
    pub hash: String,
    pub shape: String,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub wtype: String,
    /// `Problem::describe` of the shape (schema 3).
    #[serde(default)]
    pub problem: String,
    pub arch: String,
    /// pass | fail | rejected | compile-error | spills | compiled | duplicate
    pub verdict: String,
    pub reason: String,
    pub contract: String,
    pub rms_rel: Option<f64>,
    pub max_rel: Option<f64>,
    pub max_abs: Option<f64>,
    pub outliers: Option<usize>,
    pub replay_rms_rel: Option<f64>,
    pub unwritten: Option<usize>,
    pub non_finite: Option<usize>,
    pub registers: Option<u32>,
    pub spill_bytes: Option<u32>,
    pub static_smem: Option<u32>,
    pub dyn_smem: Option<u32>,
    pub seed: Option<u64>,
    pub defines: String,
    pub nvrtc_version: String,
    /// CUDA ordinal of the GPU the cell was checked on (schema 4); empty
    /// for compile-only rows.
    #[serde(default)]
    pub device_index: Option<usize>,
}

/// One row of `results.csv`. Columns added after schema 1 default when
/// missing, so schema-1 files still read (as variant rows, all timed).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TuneRow {
    pub schema_version: u32,
    /// variant | reference
    #[serde(default = "default_kind")]
    pub kind: String,
    pub family: String,
    pub variant: String,
    pub hash: String,
    pub base: String,
    pub defines: String,
    pub shape: String,
    pub shape_base: String,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub wtype: String,
    /// `Problem::describe` of the shape (schema 3).
    #[serde(default)]
    pub problem: String,
    /// l2 | dram
    pub regime: String,
    /// What the regime did, e.g. "dram: 6 weight copies, 157286400 B rotated (>= 2x L2)".
    pub regime_label: String,
    /// timed | unavailable | unsupported | fail | error | skipped: a row that is not
    /// `timed` holds no measurement (NaN statistics) and says why in `reason`.
    #[serde(default = "default_verdict")]
    pub verdict: String,
    #[serde(default)]
    pub reason: String,
    pub weight_copies: usize,
    pub rotated_bytes: u64,
    pub samples: usize,
    pub median_us: f64,
    pub p10_us: f64,
    pub p90_us: f64,
    pub min_us: f64,
    pub mean_us: f64,
    pub ci_lo_us: f64,
    pub ci_hi_us: f64,
    pub bytes_per_call: u64,
    pub ops_per_call: u64,
    /// flop | intop
    pub op_kind: String,
    pub gbps: f64,
    /// 1e12 ops/s: TFLOP/s for flop, TOPS for intop.
    pub tops: f64,
    pub roof: String,
    pub roof_time_us: f64,
    pub pct_of_roof: f64,
    pub intensity: f64,
    pub roof_why: String,
    pub hbm_gbps: f64,
    pub l2_gbps: f64,
    /// The device's measured launch-latency floor in the row's launch mode
    /// (`launches`), us per launch (0 in files written before it was
    /// measured).
    #[serde(default)]
    pub launch_floor_us: f64,
    pub registers: u32,
    pub spill_bytes: u32,
    pub static_smem: u32,
    pub dyn_smem: u32,
    pub launches_per_sample: usize,
    /// Resident blocks per SM the driver reports for the launch.
    pub blocks_per_sm: u32,
    /// How the sample's launches were enqueued: stream | graph | chained
    /// (`timing::Launches`; files written before the column: stream).
    #[serde(default = "default_launches")]
    pub launches: String,
    pub device: String,
    pub cc: String,
    pub sm_count: u32,
    pub l2_bytes: u64,
    pub clock_mhz: u32,
    pub mem_clock_mhz: u32,
    pub driver_version: i32,
    pub nvrtc_version: String,
    pub spec_sha256: String,
    pub source_sha256: String,
    pub timing_note: String,
    /// SM and memory clocks sampled through NVML during the measured samples
    /// (empty when NVML could not be loaded), MHz.
    #[serde(default)]
    pub sm_clock_min_mhz: Option<u32>,
    #[serde(default)]
    pub sm_clock_max_mhz: Option<u32>,
    #[serde(default)]
    pub sm_clock_mean_mhz: Option<f64>,
    #[serde(default)]
    pub mem_clock_min_mhz: Option<u32>,
    #[serde(default)]
    pub mem_clock_max_mhz: Option<u32>,
    #[serde(default)]
    pub temp_max_c: Option<u32>,
    #[serde(default)]
    pub power_max_w: Option<f64>,
    /// NVML samples the clock columns are reduced from.
    #[serde(default)]
    pub clock_samples: usize,
    /// NVML clock-event reasons seen during the samples ("sw_power_cap+...").
    #[serde(default)]
    pub clock_reasons: String,
    /// Set when the row's lowest SM clock fell more than 5% below the
    /// highest SM clock of the run (written with the final results.csv).
    #[serde(default)]
    pub clock_note: String,
    /// Raw per-sample times, us, separated by ';'.
    pub samples_us: String,
    /// CUDA ordinal and PCI bus id of the GPU the row was measured on
    /// (schema 4).
    #[serde(default)]
    pub device_index: Option<usize>,
    #[serde(default)]
    pub pci_bus_id: String,
}

impl TuneRow {
    pub fn is_reference(&self) -> bool {
        self.kind == KIND_REFERENCE
    }
    /// Holds a measurement (statistics are numbers).
    pub fn is_timed(&self) -> bool {
        self.verdict == VERDICT_TIMED && self.median_us.is_finite()
    }
}

pub fn join_samples(s: &[f64]) -> String {
    s.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(";")
}

pub fn split_samples(s: &str) -> Vec<f64> {
    s.split(';').filter_map(|x| x.trim().parse().ok()).collect()
}

pub fn write_csv<T: Serialize>(path: &Path, rows: &[T]) -> anyhow::Result<()> {
    let mut w = csv::Writer::from_path(path)
        .map_err(|e| anyhow::anyhow!("{}: cannot write: {e}", path.display()))?;
    for r in rows {
        w.serialize(r)?;
    }
    w.flush()?;
    Ok(())
}

pub fn read_csv<T: for<'de> Deserialize<'de>>(path: &Path) -> anyhow::Result<Vec<T>> {
    let mut r = csv::Reader::from_path(path)
        .map_err(|e| anyhow::anyhow!("{}: cannot read: {e}", path.display()))?;
    let mut out = Vec::new();
    for (i, row) in r.deserialize().enumerate() {
        out.push(row.map_err(|e| anyhow::anyhow!("{}: row {}: {e}", path.display(), i + 2))?);
    }
    Ok(out)
}

/// Schema of `bench.csv` (`BenchRow`), `ab`'s `results.csv` (`AbRow`) and
/// `compile.csv` (`CompileRow`): each kind has its own version, bumped when
/// one of its columns is added, removed or changes meaning.
pub const BENCH_SCHEMA_VERSION: u32 = 3;
pub const AB_SCHEMA_VERSION: u32 = 1;
pub const COMPILE_SCHEMA_VERSION: u32 = 1;

/// `kind` of the rows of `gemtune bench -o csv`.
pub const KIND_BENCH: &str = "bench";
/// `kind` of the rows of `gemtune ab`'s results.csv.
pub const KIND_AB: &str = "ab";
/// `kind` of the rows of a compile report (`check --compile-report`).
pub const KIND_COMPILE: &str = "compile";

/// One row of `gemtune bench -o csv`: one test (`pp512`, `tg128`,
/// `pp4096@d4096`) of one model, profile and backend, over `reps` reps.
/// `gemtune report` joins bench files on (test, model, profile, backend)
/// and takes each row's interval from its raw `samples`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BenchRow {
    pub schema_version: u32,
    /// Always "bench".
    pub kind: String,
    /// Model name as the engine reports it (e.g. "e4b", or the file stem).
    pub model: String,
    pub model_bytes: u64,
    pub params: u64,
    /// Weight type of the model ("Q8_0").
    pub wtype: String,
    /// cpu | cuda
    pub backend: String,
    pub profile: String,
    /// Device name ("NVIDIA H100 80GB HBM3"; the CPU model for cpu).
    pub gpu: String,
    /// pp<N> (prefill of N tokens), tg<N> (N decode steps), with
    /// "@d<depth>" when `depth` tokens were in the cache first.
    pub test: String,
    pub n_prompt: usize,
    pub n_gen: usize,
    pub depth: usize,
    /// Tokens per forward chunk the engine ran (`--ubatch`, capped at the
    /// positions the bench needs).
    pub ubatch: usize,
    pub reps: usize,
    /// Tokens per second over the reps: mean, sample standard deviation,
    /// min and max.
    pub tps_mean: f64,
    pub tps_sd: f64,
    pub tps_min: f64,
    pub tps_max: f64,
    /// Raw t/s per rep, ';'-separated.
    pub samples: String,
    /// tg rows (schema 2): the bytes one decode step must move, the mean
    /// over the row's steps (`gemtune_engine::step_bytes`: weights used,
    /// KV read and written, logits written), as the backend stores the
    /// model. Empty on pp rows.
    #[serde(default)]
    pub step_bytes: Option<u64>,
    /// The KV cache's part of `step_bytes` (grows with the depth).
    #[serde(default)]
    pub step_kv_bytes: Option<u64>,
    /// The memory rate the floor is taken at, GB/s (1e9 B/s): the device's
    /// HBM read rate measured at bench start, or `--hbm-gbps`. Empty when
    /// neither (the CPU backend without `--hbm-gbps`).
    #[serde(default)]
    pub hbm_gbps: Option<f64>,
    /// `step_bytes` at `hbm_gbps`: the least time a step can take, ms.
    #[serde(default)]
    pub floor_ms: Option<f64>,
    /// `floor_ms` over the measured mean step time (1000 / `tps_mean`
    /// ms), percent: the share of the memory floor the decode reaches.
    #[serde(default)]
    pub floor_pct: Option<f64>,
    /// Schema 3: the rows the layers after the last KV-writing layer ran:
    /// "trimmed" (only those whose logits are wanted, the default) or
    /// "full" (`--full-work`: every layer over every row). Empty in older
    /// files.
    #[serde(default)]
    pub row_work: String,
    /// Schema 3: GFLOP per token the engine computed for this test
    /// (`gemtune_engine::work`: weight matmuls of the rows each layer ran,
    /// attention over the keys each query sees, the head for the wanted
    /// rows), so t/s of engines that did different work can be compared.
    #[serde(default)]
    pub gflop_per_token: Option<f64>,
}

/// The `test` name of a bench or ab row: "pp512", "tg128", "pp4096@d4096".
pub fn test_name(prefix: &str, n: usize, depth: usize) -> String {
    if depth > 0 {
        format!("{prefix}{n}@d{depth}")
    } else {
        format!("{prefix}{n}")
    }
}

/// One rep of one arm of `gemtune ab` for one test (a `bench` request gives
/// a prefill row and a decode row). Warm-up reps are kept, marked.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AbRow {
    pub schema_version: u32,
    /// Always "ab".
    pub kind: String,
    /// baseline | candidate
    pub arm: String,
    /// The arm as given on the command line ("main", "git:main", a path).
    pub spec: String,
    /// What the worker reported: profile, git revision, model, device.
    pub profile: String,
    pub git: String,
    pub model: String,
    pub wtype: String,
    pub backend: String,
    pub gpu: String,
    /// "pp2048", "tg128" (with "@d<depth>" when depth > 0).
    pub test: String,
    pub n_prompt: usize,
    pub n_gen: usize,
    pub depth: usize,
    /// Position in the run's request sequence (both arms, warm-ups included).
    pub seq: usize,
    /// ABBA block of a measured rep (empty for warm-ups).
    pub block: Option<usize>,
    pub warmup: bool,
    /// Tokens per second, and the time of the test: the prefill, or one
    /// decode step (ms).
    pub tps: f64,
    pub ms: f64,
    /// Whether the rep entered the verdict (false for warm-ups and for the
    /// reps of dropped, throttled blocks).
    pub used: bool,
    /// Why the rep counts as throttled ("" when it does not).
    pub throttle: String,
    pub sm_mhz_min: Option<f64>,
    pub sm_mhz_mean: Option<f64>,
    pub mem_mhz: Option<f64>,
    pub temp_c_max: Option<f64>,
    pub power_w_mean: Option<f64>,
    /// Clock-event reasons the worker reported for the rep.
    pub clock_reasons: String,
    /// Per-phase GPU time, "name=ms;name=ms" (ms per prefill, or per decode
    /// step, as `ms`).
    pub phases: String,
}

/// "a=1.5;b=2" from a phase map.
pub fn join_phases(p: &std::collections::BTreeMap<String, f64>) -> String {
    p.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(";")
}

/// The phase map of "a=1.5;b=2" (entries that do not parse are skipped).
pub fn split_phases(s: &str) -> std::collections::BTreeMap<String, f64> {
    s.split(';')
        .filter_map(|kv| kv.split_once('='))
        .filter_map(|(k, v)| Some((k.trim().to_string(), v.trim().parse().ok()?)))
        .collect()
}

/// One row of a compile report: one variant of one family compiled for one
/// architecture, with the worst resources over the shapes it was compiled
/// for (registers, spills and shared memory of the entry its cells
/// launch). Built from `check` rows by `compile_rows`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CompileRow {
    pub schema_version: u32,
    /// Always "compile".
    pub kind: String,
    pub family: String,
    pub variant: String,
    pub arch: String,
    /// compiled | spills (spilled where the spec forbids it) |
    /// compile-error | rejected (no shape accepted on this arch) |
    /// duplicate (same defines as another variant)
    pub verdict: String,
    pub registers: Option<u32>,
    pub spill_bytes: Option<u32>,
    pub static_smem: Option<u32>,
    pub dyn_smem: Option<u32>,
    /// Largest static + dynamic shared memory of one launch, bytes.
    pub smem_bytes: Option<u32>,
    /// Distinct define sets compiled (one per weight type, typically).
    pub define_sets: usize,
    /// Shapes accepted and shapes rejected on this arch.
    pub shapes: usize,
    pub rejected_shapes: usize,
    /// The first compile error, rejection reason or duplicate note.
    pub reason: String,
    pub hash: String,
    pub nvrtc_version: String,
}

/// Accepted shapes of a compile-only check row: its `shape` reads
/// "Q8_0: 33 shapes"; a GPU check row is one shape.
fn accepted_shapes(r: &CheckRow) -> usize {
    r.shape
        .split_once(": ")
        .and_then(|(_, n)| n.strip_suffix(" shapes"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(1)
}

/// Rejected shapes of a rejected check row: its `shape` lists them,
/// comma-separated.
fn rejected_shapes(r: &CheckRow) -> usize {
    r.shape.split(',').filter(|s| !s.is_empty()).count().max(1)
}

/// Aggregates `check` rows (compile-only or GPU) into one compile row per
/// (family, variant, arch): the maximum of each resource over the rows
/// that compiled, and the worst verdict (compile-error, then spills, then
/// compiled, then rejected, then duplicate). Sorted by family, variant,
/// arch.
pub fn compile_rows(checks: &[CheckRow]) -> Vec<CompileRow> {
    use std::collections::BTreeMap;
    let mut groups: BTreeMap<(String, String, String), Vec<&CheckRow>> = BTreeMap::new();
    for r in checks {
        groups
            .entry((r.family.clone(), r.variant.clone(), r.arch.clone()))
            .or_default()
            .push(r);
    }
    let rank = |v: &str| match v {
        "compile-error" => 0,
        "spills" => 1,
        "rejected" => 3,
        "duplicate" => 4,
        _ => 2,
    };
    let mut out = Vec::new();
    for ((family, variant, arch), rows) in groups {
        let built: Vec<&&CheckRow> = rows
            .iter()
            .filter(|r| r.registers.is_some() && rank(&r.verdict) <= 2)
            .collect();
        let worst = rows
            .iter()
            .min_by_key(|r| rank(&r.verdict))
            .map(|r| r.verdict.as_str())
            .unwrap_or("rejected");
        let verdict = match rank(worst) {
            0 | 1 | 3 | 4 => worst.to_string(),
            _ => "compiled".to_string(),
        };
        let max = |f: &dyn Fn(&CheckRow) -> Option<u32>| built.iter().filter_map(|r| f(r)).max();
        let reason = rows
            .iter()
            .find(|r| r.verdict == worst && !r.reason.is_empty())
            .map(|r| r.reason.clone())
            .unwrap_or_default();
        let define_sets: std::collections::BTreeSet<&str> =
            built.iter().map(|r| r.defines.as_str()).collect();
        out.push(CompileRow {
            schema_version: COMPILE_SCHEMA_VERSION,
            kind: KIND_COMPILE.to_string(),
            family,
            variant,
            arch,
            verdict,
            registers: max(&|r| r.registers),
            spill_bytes: max(&|r| r.spill_bytes),
            static_smem: max(&|r| r.static_smem),
            dyn_smem: max(&|r| r.dyn_smem),
            smem_bytes: max(&|r| match (r.static_smem, r.dyn_smem) {
                (None, None) => None,
                (s, d) => Some(s.unwrap_or(0) + d.unwrap_or(0)),
            }),
            define_sets: define_sets.len(),
            shapes: built.iter().map(|r| accepted_shapes(r)).sum(),
            rejected_shapes: rows
                .iter()
                .filter(|r| r.verdict == "rejected")
                .map(|r| rejected_shapes(r))
                .sum(),
            reason,
            hash: rows.first().map(|r| r.hash.clone()).unwrap_or_default(),
            nvrtc_version: built
                .iter()
                .map(|r| r.nvrtc_version.clone())
                .find(|v| !v.is_empty())
                .unwrap_or_default(),
        });
    }
    out
}

/// Merges freshly aggregated compile rows into an existing compile report:
/// the rows of every (family, arch) present in `new` replace the old rows
/// of that (family, arch); everything else is kept. So one `check` per
/// architecture (or per family) refreshes its part of the file.
pub fn merge_compile_rows(old: Vec<CompileRow>, new: Vec<CompileRow>) -> Vec<CompileRow> {
    let fresh: std::collections::BTreeSet<(String, String)> = new
        .iter()
        .map(|r| (r.family.clone(), r.arch.clone()))
        .collect();
    let mut rows: Vec<CompileRow> = old
        .into_iter()
        .filter(|r| !fresh.contains(&(r.family.clone(), r.arch.clone())))
        .chain(new)
        .collect();
    rows.sort_by(|a, b| (&a.family, &a.variant, &a.arch).cmp(&(&b.family, &b.variant, &b.arch)));
    rows
}

/// Writes the compile rows of `checks` into the compile report at `path`,
/// merged with the rows already there (`merge_compile_rows`).
pub fn update_compile_report(path: &Path, checks: &[CheckRow]) -> anyhow::Result<()> {
    let old: Vec<CompileRow> = if path.exists() {
        read_csv(path)?
    } else {
        Vec::new()
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| anyhow::anyhow!("{}: cannot create: {e}", dir.display()))?;
    }
    write_csv(path, &merge_compile_rows(old, compile_rows(checks)))
}
