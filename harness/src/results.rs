//! Result files: `check.csv` (one row per variant x shape) and
//! `results.csv` (one row per variant x shape x regime). Numbers are written
//! at full precision (shortest text that round-trips the f64); every row of
//! `results.csv` carries `schema_version` and the device and toolchain it
//! was measured on, so rows from different files can be concatenated.

use serde::{Deserialize, Serialize};
use std::path::Path;

/// Bumped whenever a column is added, removed or changes meaning.
pub const SCHEMA_VERSION: u32 = 1;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TuneRow {
    pub schema_version: u32,
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
    /// l2 | dram
    pub regime: String,
    /// What the regime did, e.g. "dram: 6 weight copies, 157286400 B rotated (>= 2x L2)".
    pub regime_label: String,
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
    /// Raw per-sample times, us, separated by ';'.
    pub samples_us: String,
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
