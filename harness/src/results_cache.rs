//! The results log of a report directory (`cells.jsonl`): one JSON line per
//! finished cell stage, appended and flushed to disk as soon as the stage
//! finishes, so a run killed at any point loses no finished cell. A rerun
//! into the same directory (or `--resume DIR`) reads it back and skips the
//! cell stages whose record matches the run: same device model, driver,
//! NVRTC version, target, options that change results, kernel source hash,
//! defines and shape.
//!
//! A kill can leave the last line half-written: `open` drops an unterminated
//! last line (and truncates the file to the last complete one, so the next
//! append starts a fresh line). A complete line that does not parse (a
//! record of another gemtune version) is ignored and counted. One run
//! writes a directory at a time.

use crate::cells::CellId;
use crate::results::{CheckRow, TuneRow};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// The log's file name inside a report directory.
pub const LOG_FILE: &str = "cells.jsonl";

#[derive(Debug, Error)]
pub enum CacheError {
    #[error("{path}: {what}: {source}")]
    Io {
        path: String,
        what: &'static str,
        source: std::io::Error,
    },
}

/// What every record of one run shares, beyond the cell itself.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RunKey {
    /// Device model ("NVIDIA H100 80GB HBM3"); empty for compile-only.
    pub device: String,
    /// CUDA driver version; empty for compile-only.
    pub driver: String,
    /// NVRTC version ("13.0").
    pub nvrtc: String,
    /// Target architecture as the rows record it ("sm_90").
    pub target: String,
    /// The mode and the options that change a cell's result
    /// ("compile-only", "check check_max_m=512", ...).
    pub params: String,
}

/// The stage of a cell a record holds: a compile-only check, a check
/// against the oracle, or a timing in one regime.
pub const STAGE_COMPILE: &str = "compile";
pub const STAGE_CHECK: &str = "check";

/// One finished cell stage.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub run: RunKey,
    pub cell: CellId,
    /// Canonical resolved defines of the cell.
    pub defines: String,
    /// sha256 of the family's resolved kernel source.
    pub source_sha256: String,
    /// compile | check | l2 | dram (`reference` cells: check | l2 | dram).
    pub stage: String,
    /// The GPU (CUDA ordinal) the stage ran on; none for compile-only.
    #[serde(default)]
    pub gpu: Option<usize>,
    #[serde(default)]
    pub check: Option<CheckRow>,
    #[serde(default)]
    pub tune: Option<TuneRow>,
}

/// The key a record answers for: (cell, stage).
pub type StageKey = (CellId, String);

/// An open results log.
pub struct ResultsLog {
    path: PathBuf,
    file: File,
    records: Vec<Record>,
    /// Bytes of an unterminated last line dropped at open (a killed write).
    pub dropped_tail: usize,
    /// Complete lines that did not parse.
    pub unreadable: usize,
}

fn io<'p>(path: &'p Path, what: &'static str) -> impl FnOnce(std::io::Error) -> CacheError + 'p {
    move |source| CacheError::Io {
        path: path.display().to_string(),
        what,
        source,
    }
}

impl ResultsLog {
    /// Opens (creating it when missing) the log at `path` and reads its
    /// records.
    pub fn open(path: &Path) -> Result<ResultsLog, CacheError> {
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(path)
            .map_err(io(path, "cannot open"))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)
            .map_err(io(path, "cannot read"))?;
        let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let dropped_tail = bytes.len() - complete;
        if dropped_tail > 0 {
            file.set_len(complete as u64)
                .map_err(io(path, "cannot drop the unterminated last line"))?;
        }
        let mut records = Vec::new();
        let mut unreadable = 0;
        for line in bytes[..complete].split(|&b| b == b'\n') {
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            match serde_json::from_slice::<Record>(line) {
                Ok(r) => records.push(r),
                Err(_) => unreadable += 1,
            }
        }
        Ok(ResultsLog {
            path: path.to_path_buf(),
            file,
            records,
            dropped_tail,
            unreadable,
        })
    }

    /// Opens `<dir>/cells.jsonl`.
    pub fn open_in(dir: &Path) -> Result<ResultsLog, CacheError> {
        Self::open(&dir.join(LOG_FILE))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every record read at open or appended since, in order.
    pub fn records(&self) -> &[Record] {
        &self.records
    }

    /// The latest record of each (cell, stage) that `keep` accepts.
    pub fn finished(&self, keep: impl Fn(&Record) -> bool) -> HashMap<StageKey, Record> {
        let mut out = HashMap::new();
        for r in self.records.iter().filter(|r| keep(r)) {
            out.insert((r.cell.clone(), r.stage.clone()), r.clone());
        }
        out
    }

    /// Appends one record as a line and makes it durable before returning.
    pub fn append(&mut self, r: &Record) -> Result<(), CacheError> {
        let mut line = serde_json::to_vec(r).map_err(|e| CacheError::Io {
            path: self.path.display().to_string(),
            what: "cannot encode a record",
            source: std::io::Error::other(e),
        })?;
        line.push(b'\n');
        let path = self.path.clone();
        self.file
            .write_all(&line)
            .map_err(io(&path, "cannot append"))?;
        self.file.flush().map_err(io(&path, "cannot flush"))?;
        self.file.sync_data().map_err(io(&path, "cannot sync"))?;
        self.records.push(r.clone());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(shape: &str) -> Record {
        Record {
            run: RunKey {
                nvrtc: "13.0".into(),
                target: "sm_90".into(),
                params: "compile-only".into(),
                ..Default::default()
            },
            cell: CellId {
                family: "gemv".into(),
                variant: "baseline".into(),
                shape: shape.into(),
            },
            defines: "WTYPE=Q8_0".into(),
            source_sha256: "ab".into(),
            stage: STAGE_COMPILE.into(),
            gpu: None,
            check: Some(CheckRow {
                verdict: "compiled".into(),
                ..Default::default()
            }),
            tune: None,
        }
    }

    #[test]
    fn a_truncated_last_line_is_dropped_and_appends_continue() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(LOG_FILE);
        {
            let mut log = ResultsLog::open(&p).unwrap();
            log.append(&rec("a")).unwrap();
            log.append(&rec("b")).unwrap();
        }
        // A kill in the middle of the third line.
        let full = std::fs::read(&p).unwrap();
        let mut cut = full.clone();
        let third = serde_json::to_vec(&rec("c")).unwrap();
        cut.extend_from_slice(&third[..third.len() / 2]);
        std::fs::write(&p, &cut).unwrap();
        let mut log = ResultsLog::open(&p).unwrap();
        assert_eq!(log.dropped_tail, third.len() / 2);
        assert_eq!(log.records().len(), 2);
        log.append(&rec("c")).unwrap();
        drop(log);
        let log = ResultsLog::open(&p).unwrap();
        assert_eq!(log.dropped_tail, 0);
        assert_eq!(log.unreadable, 0);
        let shapes: Vec<&str> = log
            .records()
            .iter()
            .map(|r| r.cell.shape.as_str())
            .collect();
        assert_eq!(shapes, ["a", "b", "c"]);
        let done = log.finished(|r| r.cell.shape != "b");
        assert_eq!(done.len(), 2);
    }
}
