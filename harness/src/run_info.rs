//! `run.json` of a `check` or `tune` report directory: what its rows can be
//! combined with. `gemtune merge` joins directories only when their
//! command, mode, target, NVRTC version, options, kernel source hashes,
//! device models and drivers agree (models may differ with
//! `--allow-mixed`).

use crate::cells::Shard;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use thiserror::Error;

pub const RUN_FILE: &str = "run.json";

/// One GPU a run used.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DeviceEntry {
    /// CUDA ordinal on its host.
    pub index: usize,
    pub name: String,
    /// CUDA driver version.
    pub driver: i32,
    pub pci_bus_id: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    /// check | tune
    pub command: String,
    pub compile_only: bool,
    /// Target architecture of the rows ("sm_90").
    pub target: String,
    pub nvrtc: String,
    /// The options that change results (`results_cache::RunKey::params`).
    pub params: String,
    /// Family -> sha256 of its resolved kernel source.
    pub source_sha256: BTreeMap<String, String>,
    /// GPUs of the run (none for compile-only); a merge lists every shard's.
    pub devices: Vec<DeviceEntry>,
    /// The shard this directory holds (none: every cell); a merge lists the
    /// shards it joined.
    pub shards: Vec<Shard>,
    /// Cells of the run, and how many of them finished.
    pub cells: usize,
    pub finished: usize,
}

#[derive(Debug, Error)]
pub enum RunInfoError {
    #[error("{0}: cannot read: {1}")]
    Read(String, std::io::Error),
    #[error("{0}: not a run.json of this gemtune: {1}")]
    Parse(String, serde_json::Error),
    #[error("{0}: cannot write: {1}")]
    Write(String, std::io::Error),
}

impl RunInfo {
    pub fn read(dir: &Path) -> Result<RunInfo, RunInfoError> {
        let p = dir.join(RUN_FILE);
        let text = std::fs::read_to_string(&p)
            .map_err(|e| RunInfoError::Read(p.display().to_string(), e))?;
        serde_json::from_str(&text).map_err(|e| RunInfoError::Parse(p.display().to_string(), e))
    }

    pub fn write(&self, dir: &Path) -> Result<(), RunInfoError> {
        let p = dir.join(RUN_FILE);
        let text = serde_json::to_string_pretty(self).unwrap_or_default();
        std::fs::write(&p, text + "\n").map_err(|e| RunInfoError::Write(p.display().to_string(), e))
    }

    /// Device models of the run, each once.
    pub fn models(&self) -> Vec<String> {
        let mut m: Vec<String> = self.devices.iter().map(|d| d.name.clone()).collect();
        m.sort();
        m.dedup();
        m
    }

    /// Why `other`'s rows cannot join this run's, if they cannot.
    pub fn mismatch(&self, other: &RunInfo, allow_mixed: bool) -> Option<String> {
        let differ = |what: &str, a: &str, b: &str| {
            (a != b).then(|| format!("{what} differs: {a:?} vs {b:?}"))
        };
        if let Some(m) = differ("command", &self.command, &other.command)
            .or_else(|| {
                differ(
                    "mode",
                    if self.compile_only {
                        "compile-only"
                    } else {
                        "gpu"
                    },
                    if other.compile_only {
                        "compile-only"
                    } else {
                        "gpu"
                    },
                )
            })
            .or_else(|| differ("target", &self.target, &other.target))
            .or_else(|| differ("NVRTC version", &self.nvrtc, &other.nvrtc))
            .or_else(|| differ("options", &self.params, &other.params))
        {
            return Some(m);
        }
        for (fam, h) in &self.source_sha256 {
            if let Some(o) = other.source_sha256.get(fam) {
                if o != h {
                    return Some(format!("kernel source hash of {fam} differs: {h} vs {o}"));
                }
            }
        }
        let mut drivers: Vec<i32> = self
            .devices
            .iter()
            .chain(&other.devices)
            .map(|d| d.driver)
            .collect();
        drivers.sort();
        drivers.dedup();
        if drivers.len() > 1 {
            return Some(format!("GPU drivers differ: {drivers:?}"));
        }
        let mut models = self.models();
        models.extend(other.models());
        models.sort();
        models.dedup();
        if models.len() > 1 && !allow_mixed {
            return Some(format!(
                "device models differ: {} (--allow-mixed joins them)",
                models.join(" vs ")
            ));
        }
        None
    }
}
