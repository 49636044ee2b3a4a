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
pub const SCHEMA_VERSION: u32 = 3;

/// `kind` of a row measuring one of our kernel variants.
pub const KIND_VARIANT: &str = "variant";
/// `kind` of a row measuring a vendor library (`family` names the library,
/// `variant` the reference, e.g. cublas / cublas-bf16).
pub const KIND_REFERENCE: &str = "reference";
/// `verdict` of a row that holds a measurement.
pub const VERDICT_TIMED: &str = "timed";

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
}

/// One row of `results.csv`. Columns added after schema 1 default when
/// missing, so schema-1 files still read (as variant rows, all timed).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
    pub registers: u32,
    pub spill_bytes: u32,
    pub static_smem: u32,
    pub dyn_smem: u32,
    pub launches_per_sample: usize,
    /// Resident blocks per SM the driver reports for the launch.
    pub blocks_per_sm: u32,
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
