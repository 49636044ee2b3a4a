//! `summary.md` and the PNGs of a tune run, both built from `TuneRow`s only
//! (so a report can be redrawn from `results.csv`).
//!
//! Algorithms side by side: when one run holds both prefill GEMM families
//! (`tune mmq,gemm_dq`), the summary adds a table with each family's best
//! variant per shape and regime next to each other, and their ratio.

use crate::plots::{self, Heat, Panel, Pt, Series};
use crate::results::{CheckRow, TuneRow};
use anyhow::Result;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Families compared side by side when both are present.
pub const PREFILL_PAIR: (&str, &str) = ("mmq", "gemm_dq");

/// Most series per panel (the fastest variants plus the baseline).
pub const MAX_SERIES: usize = 8;

fn best_by<'a>(rows: impl Iterator<Item = &'a TuneRow>) -> Option<&'a TuneRow> {
    rows.min_by(|a, b| a.median_us.total_cmp(&b.median_us))
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
    let families: BTreeSet<&str> = inp.rows.iter().map(|r| r.family.as_str()).collect();
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
            "| shape | regime | best | median us | 95% CI | GB/s | rate | roof | % of roof | tie band | baseline us | speed-up | why |\n|---|---|---|---:|---|---:|---:|---|---:|---:|---:|---:|---|"
        );
        let mut keys: Vec<(String, usize, String, String)> = inp
            .rows
            .iter()
            .filter(|r| r.family == *fam)
            .map(|r| (r.shape_base.clone(), r.m, r.regime.clone(), r.shape.clone()))
            .collect();
        keys.sort();
        keys.dedup();
        for (_, _, regime, shape) in &keys {
            let g: Vec<&TuneRow> = inp
                .rows
                .iter()
                .filter(|r| r.family == *fam && &r.shape == shape && &r.regime == regime)
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
                "| {shape} | {regime} | `{}` | {:.2} | [{:.2}, {:.2}] | {:.0} | {:.1} {} | {} | {:.1} | {band} | {bus} | {speed} | {} |",
                b.variant,
                b.median_us,
                b.ci_lo_us,
                b.ci_hi_us,
                b.gbps,
                b.tops,
                rate_unit(b),
                b.roof,
                b.pct_of_roof,
                b.roof_why
            );
        }
        let _ = writeln!(s);
    }
    let (a, b) = PREFILL_PAIR;
    if families.contains(a) && families.contains(b) {
        let _ = writeln!(s, "## {a} vs {b} (best of each, same shape and regime)\n");
        let _ = writeln!(
            s,
            "| shape | regime | {a} best | {a} us | {a} rate | {a} % roof | {b} best | {b} us | {b} rate | {b} % roof | {a}/{b} time |\n|---|---|---|---:|---:|---:|---|---:|---:|---:|---:|"
        );
        let mut keys: Vec<(String, usize, String, String)> = inp
            .rows
            .iter()
            .filter(|r| r.family == a)
            .map(|r| (r.shape_base.clone(), r.m, r.regime.clone(), r.shape.clone()))
            .collect();
        keys.sort();
        keys.dedup();
        for (_, _, regime, shape) in keys {
            let pick = |f: &str| {
                best_by(
                    inp.rows
                        .iter()
                        .filter(|r| r.family == f && r.shape == shape && r.regime == regime),
                )
            };
            if let (Some(x), Some(y)) = (pick(a), pick(b)) {
                let _ = writeln!(
                    s,
                    "| {shape} | {regime} | `{}` | {:.2} | {:.1} {} | {:.1} | `{}` | {:.2} | {:.1} {} | {:.1} | {:.2} |",
                    x.variant, x.median_us, x.tops, rate_unit(x), x.pct_of_roof,
                    y.variant, y.median_us, y.tops, rate_unit(y), y.pct_of_roof,
                    x.median_us / y.median_us
                );
            }
        }
        let _ = writeln!(s);
    }
    let _ = writeln!(
        s,
        "Rates are 2*m*n*k / median time (TOPS for int8 MMA and dp4a, TFLOP/s otherwise); GB/s is the call's minimum traffic (weights once, activations, outputs) / median time. `% of roof` compares with the binding roof: HBM or L2 read bandwidth measured on this device, or the register-only peak of the instruction (see roof column). Every row and its raw samples are in results.csv; check.csv has every variant x shape incl. rejected points."
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
    let mut time_panels = Vec::new();
    let mut roof_panels = Vec::new();
    let mut groups: BTreeMap<(String, String, String), Vec<&TuneRow>> = BTreeMap::new();
    for r in rows {
        groups
            .entry((r.family.clone(), r.shape_base.clone(), r.regime.clone()))
            .or_default()
            .push(r);
    }
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
                points: pts
                    .iter()
                    .map(|r| Pt {
                        x: r.m as f64,
                        y: r.median_us,
                        lo: r.p10_us,
                        hi: r.p90_us,
                    })
                    .collect(),
            });
            rs.push(Series {
                label: v.clone(),
                points: pts
                    .iter()
                    .map(|r| {
                        // % of roof at the p90 and p10 times.
                        let at = |t: f64| r.roof_time_us / t * 100.0;
                        Pt {
                            x: r.m as f64,
                            y: r.pct_of_roof,
                            lo: at(r.p90_us),
                            hi: at(r.p10_us),
                        }
                    })
                    .collect(),
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
    let fr: Vec<&TuneRow> = rows.iter().filter(|r| r.family == fam).collect();
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
