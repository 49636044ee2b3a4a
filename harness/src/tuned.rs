//! `variants/tuned/sm_XX.toml`: per-shape winners written by
//! `tune --promote`, read by the engine.
//!
//! Winner selection is statistically honest: every variant whose 95 %
//! bootstrap interval of the median overlaps the fastest variant's interval
//! is in the tie band, and the promoted variant is picked from the band by a
//! deterministic rule (fewest registers, then least shared memory, then the
//! lower median, then the variant hash), so re-running on a noisy machine
//! does not flip winners among statistically equal variants.

use crate::results::TuneRow;
use crate::stats::overlaps;
use anyhow::{anyhow, Context, Result};
use std::collections::BTreeMap;
use std::path::Path;

pub use gemtune_engine::tuned::{
    read, Provenance, TunedDefine, TunedEntry, TunedFile, TIE_BREAK_RULE, TUNED_SCHEMA_VERSION,
};

fn parse_defines(canon: &str) -> BTreeMap<String, TunedDefine> {
    canon
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| {
            let val = v
                .parse::<i64>()
                .map(TunedDefine::Int)
                .unwrap_or_else(|_| TunedDefine::Str(v.to_string()));
            (k.to_string(), val)
        })
        .collect()
}

/// Winners per (family, shape, regime) from timing rows. Vendor reference
/// rows and rows without a measurement are never candidates.
pub fn select_winners(rows: &[TuneRow], run: &str) -> Vec<TunedEntry> {
    let mut groups: BTreeMap<(String, String, String), Vec<&TuneRow>> = BTreeMap::new();
    for r in rows.iter().filter(|r| !r.is_reference() && r.is_timed()) {
        groups
            .entry((r.family.clone(), r.shape.clone(), r.regime.clone()))
            .or_default()
            .push(r);
    }
    let mut out = Vec::new();
    for (_, g) in groups {
        let Some(best) = g
            .iter()
            .copied()
            .filter(|r| r.median_us.is_finite())
            .min_by(|a, b| a.median_us.total_cmp(&b.median_us))
        else {
            continue;
        };
        let mut band: Vec<&TuneRow> = g
            .iter()
            .copied()
            .filter(|r| overlaps((r.ci_lo_us, r.ci_hi_us), (best.ci_lo_us, best.ci_hi_us)))
            .collect();
        band.sort_by(|a, b| {
            a.registers
                .cmp(&b.registers)
                .then((a.static_smem + a.dyn_smem).cmp(&(b.static_smem + b.dyn_smem)))
                .then(a.median_us.total_cmp(&b.median_us))
                .then(a.hash.cmp(&b.hash))
        });
        let w = band[0];
        let mut tie_band: Vec<String> = band.iter().map(|r| r.variant.clone()).collect();
        tie_band.sort();
        out.push(TunedEntry {
            family: w.family.clone(),
            shape: w.shape.clone(),
            shape_base: w.shape_base.clone(),
            m: w.m,
            n: w.n,
            k: w.k,
            wtype: w.wtype.clone(),
            regime: w.regime.clone(),
            variant: w.variant.clone(),
            hash: w.hash.clone(),
            defines: parse_defines(&w.defines),
            tie_band,
            best_median_us: best.median_us,
            provenance: Provenance {
                spec_sha256: w.spec_sha256.clone(),
                source_sha256: w.source_sha256.clone(),
                device: w.device.clone(),
                cc: w.cc.clone(),
                driver_version: w.driver_version,
                nvrtc_version: w.nvrtc_version.clone(),
                regime_label: w.regime_label.clone(),
                measured: format!(
                    "median {:.3} us, 95% CI [{:.3}, {:.3}], p10 {:.3}, p90 {:.3}, {} samples",
                    w.median_us, w.ci_lo_us, w.ci_hi_us, w.p10_us, w.p90_us, w.samples
                ),
                median_us: w.median_us,
                ci_lo_us: w.ci_lo_us,
                ci_hi_us: w.ci_hi_us,
                run: run.to_string(),
            },
        });
    }
    out
}

pub fn write(path: &Path, f: &TunedFile) -> Result<()> {
    let mut text = String::from(
        "# Per-shape kernel winners written by `gemtune tune --promote`; read by the engine.\n\
         # Each entry keeps its tie band and provenance; re-promoting replaces entries\n\
         # with the same (family, shape, regime) and keeps the others.\n",
    );
    text.push_str(&toml::to_string(f).map_err(|e| anyhow!("serializing {}: {e}", path.display()))?);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, text).with_context(|| format!("{}: cannot write", path.display()))
}

/// Merges `new` into the file at `path` (created if missing): entries with
/// the same (family, shape, regime) are replaced; the result is sorted.
pub fn promote(path: &Path, arch: &str, new: Vec<TunedEntry>) -> Result<TunedFile> {
    let mut f = if path.exists() {
        read(path).map_err(|e| anyhow!("{e}"))?
    } else {
        TunedFile::default()
    };
    f.schema_version = TUNED_SCHEMA_VERSION;
    f.arch = arch.to_string();
    f.tie_break = TIE_BREAK_RULE.to_string();
    for e in new {
        f.entries
            .retain(|x| !(x.family == e.family && x.shape == e.shape && x.regime == e.regime));
        f.entries.push(e);
    }
    f.entries.sort_by(|a, b| {
        (
            a.family.as_str(),
            a.shape_base.as_str(),
            a.m,
            a.regime.as_str(),
        )
            .cmp(&(
                b.family.as_str(),
                b.shape_base.as_str(),
                b.m,
                b.regime.as_str(),
            ))
    });
    write(path, &f)?;
    Ok(f)
}
