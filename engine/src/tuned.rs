//! Tuned tables (`variants/tuned/sm_XX.toml`): the per-shape winners that
//! `gemtune tune --promote` writes and the CUDA engine reads to choose a
//! variant's defines for a slot at a shape.
//!
//! The engine looks entries up by numbers, never by shape names:
//! `TunedFile::lookup(family, m, n, k, wtype)` returns the entry of that
//! family and (n, k, weight type) whose token count is the smallest one at
//! or above `m` (the bucket `m` falls in), else the largest below it.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

pub const TUNED_SCHEMA_VERSION: u32 = 1;

pub const TIE_BREAK_RULE: &str =
    "tie band = variants whose 95% CI of the median overlaps the fastest one's; pick fewest registers, then least smem, then lower median, then hash";

/// A define value as the table stores it (integer or macro name).
pub use gemtune_kernels::defines::DefineValue as TunedDefine;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    pub spec_sha256: String,
    pub source_sha256: String,
    pub device: String,
    pub cc: String,
    pub driver_version: i32,
    pub nvrtc_version: String,
    pub regime_label: String,
    /// "median 12.3 us, 95% CI [12.1, 12.6], p10 12.0, p90 12.9, 40 samples"
    pub measured: String,
    pub median_us: f64,
    pub ci_lo_us: f64,
    pub ci_hi_us: f64,
    /// The report directory the measurement came from.
    pub run: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TunedEntry {
    pub family: String,
    pub shape: String,
    pub shape_base: String,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub wtype: String,
    pub regime: String,
    pub variant: String,
    pub hash: String,
    pub defines: BTreeMap<String, TunedDefine>,
    /// Ids of every variant in the tie band (the winner included).
    pub tie_band: Vec<String>,
    /// Fastest median in the band.
    pub best_median_us: f64,
    pub provenance: Provenance,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TunedFile {
    pub schema_version: u32,
    pub arch: String,
    pub tie_break: String,
    #[serde(default, rename = "entry")]
    pub entries: Vec<TunedEntry>,
}

impl TunedFile {
    /// Parses a tuned table (`path` names it in errors, with the line of
    /// the offending entry): its schema version, and for every entry a
    /// registered family and defines its source declares.
    pub fn parse(path: &str, text: &str) -> Result<TunedFile, TunedError> {
        let f: TunedFile = toml::from_str(text).map_err(|e| TunedError {
            path: match e.span() {
                Some(s) => format!("{path}:{}", line_of(text, s.start)),
                None => path.to_string(),
            },
            msg: e.message().trim().to_string(),
        })?;
        if f.schema_version != TUNED_SCHEMA_VERSION {
            return Err(TunedError {
                path: path.to_string(),
                msg: format!(
                    "schema_version {} (this build reads {TUNED_SCHEMA_VERSION})",
                    f.schema_version
                ),
            });
        }
        // `[[entry]]` headers in file order: entry i starts on line heads[i].
        let heads: Vec<usize> = text
            .lines()
            .enumerate()
            .filter(|(_, l)| l.trim() == "[[entry]]")
            .map(|(i, _)| i + 1)
            .collect();
        for (i, e) in f.entries.iter().enumerate() {
            let at = match heads.get(i) {
                Some(l) => format!("{path}:{l}"),
                None => path.to_string(),
            };
            let err = |msg: String| TunedError {
                path: at.clone(),
                msg: format!("entry {} ({} {}): {msg}", i + 1, e.family, e.shape),
            };
            let Some(fam) = gemtune_kernels::family::family(&e.family) else {
                let known: Vec<&str> = gemtune_kernels::family::families()
                    .iter()
                    .map(|f| f.name())
                    .collect();
                return Err(err(format!(
                    "family '{}' is not a kernel family (families: {})",
                    e.family,
                    known.join(", ")
                )));
            };
            let declared = fam.declared_defines();
            if let Some(d) = e.defines.keys().find(|d| !declared.contains(d)) {
                return Err(err(format!(
                    "define {d} is not declared by {} (its defines: {})",
                    fam.source_file(),
                    declared.join(", ")
                )));
            }
        }
        Ok(f)
    }

    /// The entry serving `family` at `m` tokens of an (n, k, wtype) matmul:
    /// the smallest entry token count >= m, else the largest one. Entries of
    /// the dram regime are preferred (what a model's weights see).
    pub fn lookup(
        &self,
        family: &str,
        m: usize,
        n: usize,
        k: usize,
        wtype: &str,
    ) -> Option<&TunedEntry> {
        let mut cands: Vec<&TunedEntry> = self
            .entries
            .iter()
            .filter(|e| {
                e.family == family && e.n == n && e.k == k && e.wtype.eq_ignore_ascii_case(wtype)
            })
            .collect();
        if cands.iter().any(|e| e.regime == "dram") {
            cands.retain(|e| e.regime == "dram");
        }
        cands
            .iter()
            .filter(|e| e.m >= m)
            .min_by_key(|e| e.m)
            .or_else(|| cands.iter().max_by_key(|e| e.m))
            .copied()
    }
}

/// 1-based line of a byte offset.
fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset).unwrap_or(text).matches('\n').count() + 1
}

/// A tuned table that could not be read.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {msg}")]
pub struct TunedError {
    pub path: String,
    pub msg: String,
}

/// Reads and parses the tuned table at `path`.
pub fn read(path: &Path) -> Result<TunedFile, TunedError> {
    let text = std::fs::read_to_string(path).map_err(|e| TunedError {
        path: path.display().to_string(),
        msg: format!("cannot read: {e}"),
    })?;
    TunedFile::parse(&path.display().to_string(), &text)
}
