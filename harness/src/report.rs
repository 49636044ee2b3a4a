//! `summary.md` and the PNGs of a tune run, both built from `TuneRow`s only
//! (so a report can be redrawn from `results.csv`).
//!
//! Algorithms side by side: when one run holds two or more prefill GEMM
//! families (`tune mmq,gemm_dq,gemm_wgmma`), the summary adds a table with
//! each family's best variant per shape and regime next to each other, and
//! which one is fastest.
//!
//! Vendor references (`kind = reference` rows, e.g. cublas-bf16) are never
//! candidates for "best": each family's best variant is given as a speed
//! ratio to the fastest reference that applies to the family
//! (`gemtune_kernels::reference::references_for`) at the same problem and
//! regime, they get a table of their own, and the plots draw them dashed.
//!
//! Clocks: rows carry the SM clock range NVML sampled during their
//! measurement; a row whose lowest SM clock fell more than 5 %
//! (`clocks::THROTTLE_FRACTION`) below the run's highest is flagged.

use crate::plots::{self, Heat, Panel, Pt, Series};
use crate::results::{CheckRow, TuneRow};
use anyhow::Result;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Prefill GEMM algorithms compared side by side when two or more are present.
pub const PREFILL_FAMILIES: &[&str] = &["mmq", "gemm_dq", "gemm_wgmma"];

/// Most series per panel (the fastest variants plus the baseline).
pub const MAX_SERIES: usize = 8;

fn best_by<'a>(rows: impl Iterator<Item = &'a TuneRow>) -> Option<&'a TuneRow> {
    rows.filter(|r| r.is_timed())
        .min_by(|a, b| a.median_us.total_cmp(&b.median_us))
}

/// Rows of our own variants (references excluded), measured or not.
fn variants(rows: &[TuneRow]) -> impl Iterator<Item = &TuneRow> {
    rows.iter().filter(|r| !r.is_reference())
}

/// Same problem (m, n, k, weight type) and regime.
fn same_cell(a: &TuneRow, b: &TuneRow) -> bool {
    (a.m, a.n, a.k, &a.wtype, &a.regime) == (b.m, b.n, b.k, &b.wtype, &b.regime)
}

/// The reference rows that apply to variant row `r` of its family.
fn references_of<'a>(rows: &'a [TuneRow], r: &TuneRow) -> Vec<&'a TuneRow> {
    let names: Vec<&str> = gemtune_kernels::reference::references_for(&r.family)
        .iter()
        .map(|k| k.name())
        .collect();
    rows.iter()
        .filter(|x| x.is_reference() && names.contains(&x.variant.as_str()) && same_cell(x, r))
        .collect()
}

/// "0.42x cublas-bf16": the fastest applicable reference's median over the
/// row's median (below 1: slower than what a user would pick instead);
/// "-" without a reference, "- (cublas-bf16 unavailable)" when none was
/// measured.
pub fn vs_reference(rows: &[TuneRow], r: &TuneRow) -> String {
    let refs = references_of(rows, r);
    match best_by(refs.iter().copied()) {
        Some(x) => format!("{:.2}x {}", x.median_us / r.median_us, x.variant),
        None => match refs.first() {
            Some(x) => format!("- ({} {})", x.variant, x.verdict),
            None => "-".into(),
        },
    }
}

/// The highest SM clock sampled over the run's measured rows.
pub fn run_max_sm_mhz(rows: &[TuneRow]) -> Option<u32> {
    rows.iter()
        .filter(|r| r.is_timed())
        .filter_map(|r| r.sm_clock_max_mhz)
        .max()
}

/// The throttle note of one row against the run's highest SM clock, ""
/// when it stayed within `THROTTLE_FRACTION` (or was not sampled).
pub fn throttle_note(r: &TuneRow, run_max: Option<u32>) -> String {
    match (r.sm_clock_min_mhz, run_max) {
        (Some(lo), Some(hi)) if r.is_timed() && gemtune_kernels::clocks::throttled(lo, hi) => {
            format!(
                "SM clock fell to {lo} MHz, {:.1}% below the run's max {hi} MHz{}",
                100.0 * (1.0 - lo as f64 / hi as f64),
                if r.clock_reasons.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", r.clock_reasons)
                }
            )
        }
        _ => String::new(),
    }
}

/// Fills every row's `clock_note` from the run's clock range.
pub fn flag_throttled(rows: &mut [TuneRow]) {
    let hi = run_max_sm_mhz(rows);
    for r in rows.iter_mut() {
        r.clock_note = throttle_note(r, hi);
    }
}

/// "1755-1980" (or "1980") MHz of a row, "-" when not sampled; a trailing
/// " !" marks a throttled row.
fn sm_cell(r: &TuneRow, run_max: Option<u32>) -> String {
    let flag = if throttle_note(r, run_max).is_empty() {
        ""
    } else {
        " !"
    };
    match (r.sm_clock_min_mhz, r.sm_clock_max_mhz) {
        (Some(a), Some(b)) if a == b => format!("{a}{flag}"),
        (Some(a), Some(b)) => format!("{a}-{b}{flag}"),
        _ => "-".into(),
    }
}

fn clocks_section(s: &mut String, rows: &[TuneRow]) {
    let timed: Vec<&TuneRow> = rows.iter().filter(|r| r.is_timed()).collect();
    if timed.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "## Clocks
"
    );
    let sampled: Vec<&TuneRow> = timed
        .iter()
        .copied()
        .filter(|r| r.sm_clock_min_mhz.is_some())
        .collect();
    if sampled.is_empty() {
        let _ = writeln!(
            s,
            "Not sampled (NVML could not be loaded; see the device table): rows carry no clock columns.\n"
        );
        return;
    }
    let range = |f: &dyn Fn(&TuneRow) -> Option<u32>, g: &dyn Fn(&TuneRow) -> Option<u32>| {
        let lo = sampled.iter().filter_map(|r| f(r)).min();
        let hi = sampled.iter().filter_map(|r| g(r)).max();
        match (lo, hi) {
            (Some(a), Some(b)) if a == b => format!("{a} MHz"),
            (Some(a), Some(b)) => format!("{a}-{b} MHz"),
            _ => "-".into(),
        }
    };
    let samples: usize = sampled.iter().map(|r| r.clock_samples).sum();
    let hi = run_max_sm_mhz(rows);
    let _ = writeln!(s, "| clock | over the run's measured samples |\n|---|---|");
    let _ = writeln!(
        s,
        "| SM | {} |",
        range(&|r| r.sm_clock_min_mhz, &|r| r.sm_clock_max_mhz)
    );
    let _ = writeln!(
        s,
        "| memory | {} |",
        range(&|r| r.mem_clock_min_mhz, &|r| r.mem_clock_max_mhz)
    );
    if let Some(t) = sampled.iter().filter_map(|r| r.temp_max_c).max() {
        let _ = writeln!(s, "| temperature (max) | {t} C |");
    }
    if let Some(p) = sampled
        .iter()
        .filter_map(|r| r.power_max_w)
        .fold(None, |a: Option<f64>, p| Some(a.map_or(p, |a| a.max(p))))
    {
        let _ = writeln!(s, "| power (max) | {p:.0} W |");
    }
    let _ = writeln!(
        s,
        "| samples | {samples} NVML polls over {} rows |\n",
        sampled.len()
    );
    let flagged: Vec<(&TuneRow, String)> = sampled
        .iter()
        .map(|&r| (r, throttle_note(r, hi)))
        .filter(|(_, n)| !n.is_empty())
        .collect();
    if flagged.is_empty() {
        let _ = writeln!(
            s,
            "Throttling: none; every row's lowest SM clock stayed within {:.0}% of the run's max.\n",
            100.0 * gemtune_kernels::clocks::THROTTLE_FRACTION
        );
    } else {
        let _ = writeln!(
            s,
            "Throttling: {} rows fell more than {:.0}% below the run's max SM clock (marked `!` below; `clock_note` in results.csv); the first 20:\n",
            flagged.len(),
            100.0 * gemtune_kernels::clocks::THROTTLE_FRACTION
        );
        for (r, n) in flagged.iter().take(20) {
            let _ = writeln!(
                s,
                "- {} `{}` {} {}: {n}",
                r.family, r.variant, r.shape, r.regime
            );
        }
        let _ = writeln!(s);
    }
}

fn references_section(s: &mut String, rows: &[TuneRow]) {
    let refs: Vec<&TuneRow> = rows.iter().filter(|r| r.is_reference()).collect();
    if refs.is_empty() {
        return;
    }
    let _ = writeln!(s, "## Vendor references\n");
    let mut kinds: Vec<&str> = refs.iter().map(|r| r.variant.as_str()).collect();
    kinds.sort();
    kinds.dedup();
    for k in &kinds {
        if let Some(kind) = gemtune_kernels::reference::RefKind::from_name(k) {
            let _ = writeln!(s, "- `{k}`: {}.", kind.note());
        }
    }
    let _ = writeln!(
        s,
        "\n| shape | regime | reference | verdict | median us | 95% CI | GB/s | rate | roof | % of roof | SM MHz | note or reason |\n|---|---|---|---|---:|---|---:|---:|---|---:|---:|---|"
    );
    let hi = run_max_sm_mhz(rows);
    let mut sorted = refs.clone();
    sorted.sort_by(|a, b| {
        (&a.shape_base, a.m, &a.regime, &a.variant).cmp(&(
            &b.shape_base,
            b.m,
            &b.regime,
            &b.variant,
        ))
    });
    for r in sorted {
        if r.is_timed() {
            let _ = writeln!(
                s,
                "| {} | {} | `{}` | {} | {:.2} | [{:.2}, {:.2}] | {:.0} | {:.1} {} | {} | {:.1} | {} | {} |",
                r.shape,
                r.regime,
                r.variant,
                r.verdict,
                r.median_us,
                r.ci_lo_us,
                r.ci_hi_us,
                r.gbps,
                r.tops,
                rate_unit(r),
                r.roof,
                r.pct_of_roof,
                sm_cell(r, hi),
                r.timing_note
            );
        } else {
            let _ = writeln!(
                s,
                "| {} | {} | `{}` | {} | - | - | - | - | - | - | - | {} |",
                r.shape, r.regime, r.variant, r.verdict, r.reason
            );
        }
    }
    let _ = writeln!(s);
}

fn rate_unit(r: &TuneRow) -> &'static str {
    if r.op_kind == "intop" {
        "TOPS"
    } else {
        "TFLOP/s"
    }
}

pub struct SummaryInput<'a> {
    pub title: String,
    pub device_block: Vec<(String, String)>,
    pub rows: &'a [TuneRow],
    pub checks: &'a [CheckRow],
    pub notes: Vec<String>,
}

pub fn summary_md(inp: &SummaryInput<'_>) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# {}\n", inp.title);
    let _ = writeln!(s, "## Device\n");
    let _ = writeln!(s, "| key | value |\n|---|---|");
    for (k, v) in &inp.device_block {
        let _ = writeln!(s, "| {k} | {v} |");
    }
    let _ = writeln!(s);
    clocks_section(&mut s, inp.rows);
    for n in &inp.notes {
        let _ = writeln!(s, "- {n}");
    }
    if !inp.notes.is_empty() {
        let _ = writeln!(s);
    }
    // Check outcome per family.
    let mut verdicts: BTreeMap<(String, String), usize> = BTreeMap::new();
    for c in inp.checks {
        *verdicts
            .entry((c.family.clone(), c.verdict.clone()))
            .or_default() += 1;
    }
    if !verdicts.is_empty() {
        let _ = writeln!(s, "## Check\n");
        let _ = writeln!(s, "| family | verdict | cells |\n|---|---|---:|");
        for ((f, v), n) in &verdicts {
            let _ = writeln!(s, "| {f} | {v} | {n} |");
        }
        let fails: Vec<&CheckRow> = inp
            .checks
            .iter()
            .filter(|c| {
                matches!(
                    c.verdict.as_str(),
                    "fail" | "spills" | "compile-error" | "error"
                )
            })
            .take(20)
            .collect();
        if !fails.is_empty() {
            let _ = writeln!(s, "\nFailures (first 20; all in check.csv):\n");
            for c in fails {
                let _ = writeln!(
                    s,
                    "- {} `{}` {}: {} ({})",
                    c.family, c.variant, c.shape, c.verdict, c.reason
                );
            }
        }
        let _ = writeln!(s);
    }
    let families: BTreeSet<&str> = variants(inp.rows).map(|r| r.family.as_str()).collect();
    let run_max = run_max_sm_mhz(inp.rows);
    if !inp.rows.is_empty() {
        let _ = writeln!(
            s,
            "Regime the engine meets: `dram` for every weight matrix here. A whole model's weights are many times the L2 size, so the layers run between two uses of one matrix evict it; `l2` is what an isolated probe sees and bounds what caching could give.\n"
        );
    }
    for fam in &families {
        let _ = writeln!(s, "## {fam}: best variant per shape\n");
        let _ = writeln!(
            s,
            "| shape | regime | best | median us | 95% CI | GB/s | rate | roof | % of roof | tie band | baseline us | speed-up | vs reference | SM MHz | why |\n|---|---|---|---:|---|---:|---:|---|---:|---:|---:|---:|---|---:|---|"
        );
        let mut keys: Vec<(String, usize, String, String)> = variants(inp.rows)
            .filter(|r| r.family == *fam)
            .map(|r| (r.shape_base.clone(), r.m, r.regime.clone(), r.shape.clone()))
            .collect();
        keys.sort();
        keys.dedup();
        for (_, _, regime, shape) in &keys {
            let g: Vec<&TuneRow> = variants(inp.rows)
                .filter(|r| {
                    r.family == *fam && &r.shape == shape && &r.regime == regime && r.is_timed()
                })
                .collect();
            let Some(b) = best_by(g.iter().copied()) else {
                continue;
            };
            let band = g
                .iter()
                .filter(|r| {
                    crate::stats::overlaps((r.ci_lo_us, r.ci_hi_us), (b.ci_lo_us, b.ci_hi_us))
                })
                .count();
            let base = g.iter().find(|r| r.variant == "baseline");
            let (bus, speed) = match base {
                Some(x) => (
                    format!("{:.2}", x.median_us),
                    format!("{:.2}x", x.median_us / b.median_us),
                ),
                None => ("-".into(), "-".into()),
            };
            let _ = writeln!(
                s,
                "| {shape} | {regime} | `{}` | {:.2} | [{:.2}, {:.2}] | {:.0} | {:.1} {} | {} | {:.1} | {band} | {bus} | {speed} | {} | {} | {} |",
                b.variant,
                b.median_us,
                b.ci_lo_us,
                b.ci_hi_us,
                b.gbps,
                b.tops,
                rate_unit(b),
                b.roof,
                b.pct_of_roof,
                vs_reference(inp.rows, b),
                sm_cell(b, run_max),
                b.roof_why
            );
        }
        let _ = writeln!(s);
    }
    let present: Vec<&str> = PREFILL_FAMILIES
        .iter()
        .copied()
        .filter(|f| families.contains(f))
        .collect();
    if present.len() >= 2 {
        let _ = writeln!(
            s,
            "## {} (best of each, same shape and regime)\n",
            present.join(" vs ")
        );
        let mut head = String::from("| shape | regime |");
        let mut rule = String::from("|---|---|");
        for f in &present {
            head.push_str(&format!(" {f} best | {f} us | {f} rate | {f} % roof |"));
            rule.push_str("---|---:|---:|---:|");
        }
        head.push_str(" fastest |");
        rule.push_str("---|");
        let _ = writeln!(s, "{head}\n{rule}");
        let mut keys: Vec<(String, usize, String, String)> = variants(inp.rows)
            .filter(|r| present.contains(&r.family.as_str()))
            .map(|r| (r.shape_base.clone(), r.m, r.regime.clone(), r.shape.clone()))
            .collect();
        keys.sort();
        keys.dedup();
        for (_, _, regime, shape) in keys {
            let picks: Vec<Option<&TuneRow>> = present
                .iter()
                .map(|f| {
                    best_by(
                        variants(inp.rows)
                            .filter(|r| r.family == *f && r.shape == shape && r.regime == regime),
                    )
                })
                .collect();
            let mut line = format!("| {shape} | {regime} |");
            for p in &picks {
                match p {
                    Some(x) => line.push_str(&format!(
                        " `{}` | {:.2} | {:.1} {} | {:.1} |",
                        x.variant,
                        x.median_us,
                        x.tops,
                        rate_unit(x),
                        x.pct_of_roof
                    )),
                    None => line.push_str(" - | - | - | - |"),
                }
            }
            let fastest = best_by(picks.iter().flatten().copied())
                .map(|x| x.family.clone())
                .unwrap_or_else(|| "-".into());
            line.push_str(&format!(" {fastest} |"));
            let _ = writeln!(s, "{line}");
        }
        let _ = writeln!(s);
    }
    crate::attn_summary::section(&mut s, inp.rows);
    references_section(&mut s, inp.rows);
    let _ = writeln!(
        s,
        "Rates are 2*m*n*k / median time (TOPS for int8 MMA and dp4a, TFLOP/s otherwise); GB/s is the call's minimum traffic (weights once, activations, outputs) / median time. `% of roof` compares with the binding roof: HBM or L2 read bandwidth measured on this device, or the instruction's peak (see roof column): a register-only loop's for mma.sync and dp4a, the datasheet dense tensor rate (tc.bf16, tc.s8) for wgmma and for the vendor reference rows. `vs reference` is the fastest applicable vendor reference's median over the best variant's (below 1: slower than what a user would pick instead). `SM MHz` is the SM clock NVML sampled during the row's measurement (`!`: more than 5% below the run's max). Every row and its raw samples are in results.csv; check.csv has every variant x shape incl. rejected points and the references' own checks."
    );
    s
}

/// The variants drawn for one family: the fastest (by geometric mean of the
/// median over the family's rows) up to `MAX_SERIES - 1`, plus the baseline.
fn chosen_variants(rows: &[&TuneRow]) -> Vec<String> {
    let mut acc: BTreeMap<&str, (f64, usize)> = BTreeMap::new();
    for r in rows {
        let e = acc.entry(r.variant.as_str()).or_insert((0.0, 0));
        e.0 += r.median_us.max(1e-9).ln();
        e.1 += 1;
    }
    let max_n = acc.values().map(|v| v.1).max().unwrap_or(0);
    let mut v: Vec<(&str, f64)> = acc
        .into_iter()
        .filter(|(_, (_, n))| *n == max_n)
        .map(|(k, (s, n))| (k, s / n as f64))
        .collect();
    v.sort_by(|a, b| a.1.total_cmp(&b.1));
    let mut out: Vec<String> = v
        .iter()
        .take(MAX_SERIES - 1)
        .map(|x| x.0.to_string())
        .collect();
    if !out.iter().any(|x| x == "baseline") && rows.iter().any(|r| r.variant == "baseline") {
        out.push("baseline".into());
    }
    out
}

/// The panels of time.png and roofline.png: one per (family, shape,
/// regime) with measured variants (at most 8), each with the chosen
/// variants' series and then the family's reference series
/// (`Series::reference`), which the plot draws dashed with cross markers.
pub fn panels(rows: &[TuneRow]) -> (Vec<Panel>, Vec<Panel>) {
    let mut time_panels = Vec::new();
    let mut roof_panels = Vec::new();
    let mut groups: BTreeMap<(String, String, String), Vec<&TuneRow>> = BTreeMap::new();
    for r in variants(rows).filter(|r| r.is_timed()) {
        groups
            .entry((r.family.clone(), r.shape_base.clone(), r.regime.clone()))
            .or_default()
            .push(r);
    }
    let time_pt = |r: &TuneRow| Pt {
        x: r.m as f64,
        y: r.median_us,
        lo: r.p10_us,
        hi: r.p90_us,
    };
    // % of roof at the p90 and p10 times.
    let roof_pt = |r: &TuneRow| {
        let at = |t: f64| r.roof_time_us / t * 100.0;
        Pt {
            x: r.m as f64,
            y: r.pct_of_roof,
            lo: at(r.p90_us),
            hi: at(r.p10_us),
        }
    };
    // Keep the figure readable: at most 8 panels each.
    for ((fam, base, regime), g) in groups.iter().take(8) {
        let chosen = chosen_variants(g);
        let mut ts = Vec::new();
        let mut rs = Vec::new();
        for v in &chosen {
            let mut pts: Vec<&&TuneRow> = g.iter().filter(|r| &r.variant == v).collect();
            pts.sort_by_key(|r| r.m);
            ts.push(Series {
                label: v.clone(),
                points: pts.iter().map(|r| time_pt(r)).collect(),
                reference: false,
            });
            rs.push(Series {
                label: v.clone(),
                points: pts.iter().map(|r| roof_pt(r)).collect(),
                reference: false,
            });
        }
        // The family's references at the same problems (a reference row is
        // shared by every family with that problem, whichever shape name it
        // was registered under) and regime.
        for kind in gemtune_kernels::reference::references_for(fam) {
            let mut pts: Vec<&TuneRow> = rows
                .iter()
                .filter(|r| {
                    r.is_reference()
                        && r.is_timed()
                        && r.variant == kind.name()
                        && g.iter().any(|v| same_cell(v, r))
                })
                .collect();
            if pts.is_empty() {
                continue;
            }
            pts.sort_by_key(|r| r.m);
            pts.dedup_by_key(|r| r.m);
            let label = format!("{} (reference)", kind.name());
            ts.push(Series {
                label: label.clone(),
                points: pts.iter().map(|r| time_pt(r)).collect(),
                reference: true,
            });
            rs.push(Series {
                label,
                points: pts.iter().map(|r| roof_pt(r)).collect(),
                reference: true,
            });
        }
        time_panels.push(Panel {
            title: format!("{fam} {base} [{regime}]"),
            x_label: "tokens (m)".into(),
            y_label: "median us (bars p10-p90)".into(),
            log_y: true,
            series: ts,
            hline: None,
        });
        roof_panels.push(Panel {
            title: format!("{fam} {base} [{regime}]"),
            x_label: "tokens (m)".into(),
            y_label: "% of binding roof".into(),
            log_y: false,
            series: rs,
            hline: Some(100.0),
        });
    }
    (time_panels, roof_panels)
}

/// Writes time.png, roofline.png and (when a family has a two-axis sweep
/// among its rows) heatmap-<family>.png. Returns the files written.
pub fn write_plots(
    dir: &Path,
    rows: &[TuneRow],
    heat_axes: &[(String, String, String)],
) -> Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    if rows.is_empty() {
        return Ok(written);
    }
    let (time_panels, roof_panels) = panels(rows);
    if time_panels.is_empty() {
        return Ok(written);
    }
    let p = dir.join("time.png");
    plots::line_panels(&p, "time by variant per shape", &time_panels)?;
    written.push(p);
    let p = dir.join("roofline.png");
    plots::line_panels(
        &p,
        "% of the binding roof (HBM, L2 or instruction peak)",
        &roof_panels,
    )?;
    written.push(p);
    for (fam, ax, ay) in heat_axes {
        if let Some(h) = heat_for(rows, fam, ax, ay) {
            let p = dir.join(format!("heatmap-{fam}.png"));
            plots::heatmap(&p, &h)?;
            written.push(p);
        }
    }
    Ok(written)
}

fn define_of(canon: &str, name: &str) -> Option<String> {
    canon
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
}

/// Best median over the other axes for each (ax, ay) cell, at the shape with
/// the most work measured for the family (dram regime preferred).
pub fn heat_for(rows: &[TuneRow], fam: &str, ax: &str, ay: &str) -> Option<Heat> {
    let fr: Vec<&TuneRow> = variants(rows)
        .filter(|r| r.family == fam && r.is_timed())
        .collect();
    let regime = if fr.iter().any(|r| r.regime == "dram") {
        "dram"
    } else {
        "l2"
    };
    let target = fr
        .iter()
        .filter(|r| r.regime == regime)
        .max_by_key(|r| (r.ops_per_call, r.shape.clone()))?
        .shape
        .clone();
    let cell_rows: Vec<&TuneRow> = fr
        .iter()
        .copied()
        .filter(|r| r.regime == regime && r.shape == target)
        .collect();
    let num_sort = |v: &mut Vec<String>| {
        v.sort_by(|a, b| match (a.parse::<i64>(), b.parse::<i64>()) {
            (Ok(x), Ok(y)) => x.cmp(&y),
            _ => a.cmp(b),
        });
        v.dedup();
    };
    let mut xs: Vec<String> = cell_rows
        .iter()
        .filter_map(|r| define_of(&r.defines, ax))
        .collect();
    let mut ys: Vec<String> = cell_rows
        .iter()
        .filter_map(|r| define_of(&r.defines, ay))
        .collect();
    num_sort(&mut xs);
    num_sort(&mut ys);
    if xs.len() < 2 || ys.len() < 2 {
        return None;
    }
    let mut cells = vec![vec![None; xs.len()]; ys.len()];
    for r in &cell_rows {
        let (Some(x), Some(y)) = (define_of(&r.defines, ax), define_of(&r.defines, ay)) else {
            continue;
        };
        let xi = xs.iter().position(|v| *v == x)?;
        let yi = ys.iter().position(|v| *v == y)?;
        let c: &mut Option<f64> = &mut cells[yi][xi];
        *c = Some(c.map_or(r.median_us, |old: f64| old.min(r.median_us)));
    }
    Some(Heat {
        title: format!("{fam} {target} [{regime}]: best median us over other axes"),
        x_name: ax.to_string(),
        y_name: ay.to_string(),
        x_vals: xs,
        y_vals: ys,
        cells,
        unit: "us".into(),
    })
}
