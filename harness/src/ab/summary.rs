//! What `ab` writes: results.csv (every rep, warm-ups included),
//! summary.md, verdict.json and three PNGs (tps.png: t/s per rep by arm;
//! ratio.png: each test's speed ratio with its interval against the
//! minimum-effect band; phases.png: the per-phase delta with intervals).

use super::session::{changed_slots, slots_of_phase, AbRun, TestResult};
use crate::plots::{self, Bar, BarClass, Panel, Pt, Series};
use crate::verdict::{self, Outcome, Verdict, TOTAL, UNEXPLAINED};
use serde::Serialize;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The run's exit decision: 3 when the numerics gate failed, otherwise
/// `verdict::combine` over the tests (any SLOW 1, any AMBIGUOUS 2, else 0).
pub fn exit_code(run: &AbRun) -> u8 {
    if run.gate_failed() {
        return 3;
    }
    let v: Vec<Verdict> = run.tests.iter().map(|t| t.judgement.verdict).collect();
    match verdict::combine(&v) {
        Outcome::Pass => 0,
        Outcome::Regression => 1,
        Outcome::Ambiguous => 2,
    }
}

fn pct(x: f64) -> String {
    format!("{:+.2}%", 100.0 * (x - 1.0))
}

fn ms(x: f64) -> String {
    if x.abs() >= 100.0 {
        format!("{x:.1}")
    } else if x.abs() >= 1.0 {
        format!("{x:.3}")
    } else {
        format!("{x:.4}")
    }
}

/// "attn_swa -38.9 ms [-40.1, -37.6] (94%; slot attn_prefill_swa: a -> b)".
fn mover_sentence(t: &TestResult, run: &AbRun) -> String {
    let changed = changed_slots(&run.arms[0].ready, &run.arms[1].ready);
    let names: Vec<String> = changed.iter().map(|c| c.0.clone()).collect();
    let movers = verdict::movers(&t.attribution, t.judgement.min_effect);
    if movers.is_empty() {
        return "no phase moved beyond its interval".into();
    }
    movers
        .iter()
        .map(|m| {
            let slots = if m.phase == UNEXPLAINED {
                " (time outside the named phases: launch gaps, overlap, host work)".to_string()
            } else {
                let s = slots_of_phase(&m.phase, t.phase, &names);
                if s.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; {}",
                        s.iter()
                            .map(|n| {
                                let c = changed.iter().find(|c| &c.0 == *n);
                                match c {
                                    Some((n, a, b)) => format!("slot {n}: {a} -> {b}"),
                                    None => format!("slot {n}"),
                                }
                            })
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                }
            };
            format!(
                "`{}` {} ms [{}, {}]{}{}",
                m.phase,
                ms(m.delta_ms),
                ms(m.ci.0),
                ms(m.ci.1),
                if m.share.is_finite() {
                    format!(" ({:.0}% of the change)", 100.0 * m.share)
                } else {
                    String::new()
                },
                slots
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// summary.md.
pub fn summary_md(run: &AbRun, title: &str, method: &str) -> String {
    let mut s = String::new();
    let code = exit_code(run);
    let _ = writeln!(s, "# {title}\n");
    if run.gate_failed() {
        let _ = writeln!(s, "**Numerics gate FAILED (exit 3): no timing ran.**\n");
    } else {
        let parts: Vec<String> = run
            .tests
            .iter()
            .map(|t| {
                format!(
                    "{} ({}) **{}** {}",
                    t.phase,
                    t.test,
                    t.judgement.verdict,
                    pct(t.judgement.ratio)
                )
            })
            .collect();
        let _ = writeln!(s, "Verdict: {} -> exit {code}\n", parts.join(", "));
    }
    let _ = writeln!(s, "## Arms\n");
    let _ = writeln!(
        s,
        "| | baseline | candidate |\n|---|---|---|\n| given as | `{}` | `{}` |",
        run.arms[0].spec, run.arms[1].spec
    );
    let row = |s: &mut String, name: &str, f: &dyn Fn(usize) -> String| {
        let _ = writeln!(s, "| {name} | {} | {} |", f(0), f(1));
    };
    row(&mut s, "binary", &|i| {
        let a = &run.arms[i];
        match &a.build {
            Some(b) => format!(
                "`{}` (git {} = {}, {})",
                a.bin.display(),
                b.reference,
                &b.sha[..12.min(b.sha.len())],
                if b.cached {
                    "cached".to_string()
                } else {
                    format!("built in {:.0} s", b.seconds)
                }
            ),
            None => format!("`{}`", a.bin.display()),
        }
    });
    row(&mut s, "worker", &|i| {
        format!("`{}`", run.arms[i].args.join(" "))
    });
    row(&mut s, "version / git", &|i| {
        let r = &run.arms[i].ready;
        format!(
            "{} / {}",
            r.version,
            if r.git.is_empty() { "?" } else { &r.git }
        )
    });
    row(&mut s, "profile", &|i| run.arms[i].ready.profile.clone());
    row(&mut s, "model", &|i| {
        let m = &run.arms[i].ready.model;
        format!(
            "{} {} ({} B, {} params) `{}`",
            m.name, m.wtype, m.bytes, m.params, m.path
        )
    });
    row(&mut s, "backend", &|i| run.arms[i].ready.backend.clone());
    row(&mut s, "device", &|i| {
        let g = &run.arms[i].ready.gpu;
        format!("{} (driver {}, {} SMs)", g.name, g.driver, g.sm_count)
    });
    let changed = changed_slots(&run.arms[0].ready, &run.arms[1].ready);
    let _ = writeln!(s);
    if changed.is_empty() {
        let _ = writeln!(s, "Slots: the arms report the same kernel in every slot.\n");
    } else {
        let _ = writeln!(
            s,
            "Slots that differ:\n\n| slot | baseline | candidate |\n|---|---|---|"
        );
        for (k, a, b) in &changed {
            let _ = writeln!(s, "| {k} | `{a}` | `{b}` |");
        }
        let _ = writeln!(s);
    }
    for n in &run.notes {
        let _ = writeln!(s, "- note: {n}");
    }
    if !run.notes.is_empty() {
        let _ = writeln!(s);
    }
    let _ = writeln!(s, "## Numerics gate\n");
    match &run.gate {
        Some(g) => {
            let _ = writeln!(
                s,
                "Prompts of {:?} tokens (vocabulary {}): {} rows. Top-1 agreement {:.4} (at least {} needed), max |delta logit| {:.4} (at most {} allowed).\n\n{}\n",
                g.prompts,
                g.vocab,
                g.rows,
                g.agreement(),
                g.min_top1,
                g.max_delta,
                g.max_delta_allowed,
                g.message
            );
        }
        None => {
            let _ = writeln!(s, "Skipped (--no-gate).\n");
        }
    }
    for t in &run.tests {
        let j = &t.judgement;
        let _ = writeln!(s, "## {} ({}): {}\n", t.phase, t.test, j.verdict);
        let _ = writeln!(s, "{}.\n", j.reason);
        let _ = writeln!(s, "| | |\n|---|---|");
        let _ = writeln!(
            s,
            "| median t/s | baseline {:.2}, candidate {:.2} |",
            j.baseline_tps, j.candidate_tps
        );
        let _ = writeln!(
            s,
            "| ratio (paired, ABBA) | {:.4} [{:.4}, {:.4}] ({:.0}% CI) |",
            j.ratio,
            j.ci.0,
            j.ci.1,
            100.0 * j.level
        );
        let _ = writeln!(
            s,
            "| ratio of medians (unpaired) | {:.4} |",
            j.unpaired_ratio
        );
        let _ = writeln!(
            s,
            "| blocks | {} used of {} ({} dropped for throttling, {} for a stalled rep) |",
            j.blocks_used, j.blocks_total, j.blocks_dropped, j.blocks_stalled
        );
        let _ = writeln!(
            s,
            "| throttled reps | baseline {}, candidate {}{} |",
            j.throttled_reps.0,
            j.throttled_reps.1,
            if j.throttled_reps.0 + j.throttled_reps.1 > 0 {
                if j.blocks_dropped > 0 {
                    "; their blocks were dropped from the verdict"
                } else {
                    "; kept (--keep-throttled)"
                }
            } else {
                ""
            }
        );
        let _ = writeln!(
            s,
            "| drift | {:+.3}% per rep, {:+.2}% over the run (cancelled by the ABBA pairing) |",
            100.0 * j.drift.per_rep,
            100.0 * j.drift.over_run
        );
        let _ = writeln!(
            s,
            "| A/A false alarms | were the arms identical, a run this noisy would not come out SAME {:.1}% of the time |\n",
            100.0 * j.p_not_same_if_equal
        );
        if !t.attribution.is_empty() {
            let unit = if t.phase == "prefill" {
                "ms per prefill"
            } else {
                "ms per decode step"
            };
            let _ = writeln!(s, "Where it moved: {}.\n", mover_sentence(t, run));
            let _ = writeln!(
                s,
                "| phase | baseline {unit} | delta (candidate - baseline) | {:.0}% CI | share of the change |\n|---|---:|---:|---|---:|",
                100.0 * j.level
            );
            for p in &t.attribution {
                let name = if p.phase == TOTAL || p.phase == UNEXPLAINED {
                    format!("*{}*", p.phase)
                } else {
                    format!("`{}`", p.phase)
                };
                let _ = writeln!(
                    s,
                    "| {name} | {} | {}{} | [{}, {}] | {} |",
                    ms(p.baseline_ms),
                    ms(p.delta_ms),
                    if p.significant { " *" } else { "" },
                    ms(p.ci.0),
                    ms(p.ci.1),
                    if p.share.is_finite() && p.phase != TOTAL {
                        format!("{:.0}%", 100.0 * p.share + 0.0)
                    } else {
                        "-".into()
                    }
                );
            }
            let _ = writeln!(s, "\n`*`: the interval excludes zero.\n");
        }
    }
    let throttled: Vec<&crate::results::AbRow> = run
        .rows
        .iter()
        .filter(|r| !r.throttle.is_empty() && r.test.starts_with("pp"))
        .collect();
    if !throttled.is_empty() {
        let _ = writeln!(s, "## Throttled reps\n");
        for r in throttled {
            let _ = writeln!(
                s,
                "- rep {} ({}, block {}): {}",
                r.seq,
                r.arm,
                r.block.map_or("-".into(), |b| b.to_string()),
                r.throttle
            );
        }
        let _ = writeln!(s);
    }
    let _ = writeln!(s, "## Method\n\n{method}\n");
    s
}

/// The method paragraph of the summary.
pub fn method_text(
    reps: usize,
    warmup: usize,
    min_effect: f64,
    level: f64,
    keep_throttled: bool,
) -> String {
    format!(
        "{warmup} warm-up round(s) of each arm (discarded), then {} ABBA blocks ({reps} reps per arm); each rep is one `bench` request (prefill, then the decode steps). Per block the speed ratio is the geometric mean of its two adjacent pairs, which cancels a linear drift; the ratio is the mean over blocks and its {:.0}% interval the expanded percentile bootstrap over blocks, never narrower than Student's t interval. FAST: the interval is above 1 and the ratio at least {}; SLOW: below 1 and at most {:.4}; SAME: the interval inside [{:.4}, {:.4}]; otherwise AMBIGUOUS (and with fewer than {} usable blocks). A rep is throttled when the worker reports a hardware or thermal clock reason or its mean SM clock fell more than 5% below the run's best; {}. Exit: 3 numerics gate failed, 1 any test SLOW, 2 any AMBIGUOUS, 0 otherwise (SAME or FAST); 4 infrastructure or bad input.",
        reps / 2,
        100.0 * level,
        1.0 + min_effect,
        1.0 / (1.0 + min_effect),
        1.0 / (1.0 + min_effect),
        1.0 + min_effect,
        verdict::MIN_BLOCKS,
        if keep_throttled {
            "throttled blocks were judged too (--keep-throttled)"
        } else {
            "a block with a throttled rep is dropped"
        }
    )
}

#[derive(Serialize)]
struct JsonTest<'a> {
    test: &'a str,
    phase: &'a str,
    verdict: &'a str,
    ratio: f64,
    ci: (f64, f64),
    blocks_used: usize,
    blocks_total: usize,
    blocks_dropped: usize,
    blocks_stalled: usize,
    drift_over_run: f64,
    unpaired_ratio: f64,
    p_not_same_if_equal: f64,
    reason: &'a str,
    phases: Vec<JsonPhase<'a>>,
}

#[derive(Serialize)]
struct JsonPhase<'a> {
    phase: &'a str,
    baseline_ms: f64,
    delta_ms: f64,
    ci: (f64, f64),
    significant: bool,
}

#[derive(Serialize)]
struct JsonRun<'a> {
    exit: u8,
    baseline: &'a str,
    candidate: &'a str,
    gate: Option<&'a super::gate::GateResult>,
    tests: Vec<JsonTest<'a>>,
}

/// verdict.json: the machine-readable verdict.
pub fn verdict_json(run: &AbRun) -> String {
    let j = JsonRun {
        exit: exit_code(run),
        baseline: &run.arms[0].spec,
        candidate: &run.arms[1].spec,
        gate: run.gate.as_ref(),
        tests: run
            .tests
            .iter()
            .map(|t| JsonTest {
                test: &t.test,
                phase: t.phase,
                verdict: t.judgement.verdict.name(),
                ratio: t.judgement.ratio,
                ci: t.judgement.ci,
                blocks_used: t.judgement.blocks_used,
                blocks_total: t.judgement.blocks_total,
                blocks_dropped: t.judgement.blocks_dropped,
                blocks_stalled: t.judgement.blocks_stalled,
                drift_over_run: t.judgement.drift.over_run,
                unpaired_ratio: t.judgement.unpaired_ratio,
                p_not_same_if_equal: t.judgement.p_not_same_if_equal,
                reason: &t.judgement.reason,
                phases: t
                    .attribution
                    .iter()
                    .map(|p| JsonPhase {
                        phase: &p.phase,
                        baseline_ms: p.baseline_ms,
                        delta_ms: p.delta_ms,
                        ci: p.ci,
                        significant: p.significant,
                    })
                    .collect(),
            })
            .collect(),
    };
    serde_json::to_string_pretty(&j).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// Writes tps.png, ratio.png and phases.png; returns the files written.
pub fn write_plots(dir: &Path, run: &AbRun) -> anyhow::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    if run.tests.is_empty() {
        return Ok(written);
    }
    // t/s per rep by arm, one panel per test.
    let mut panels = Vec::new();
    let pt = |r: &crate::results::AbRow| Pt {
        x: r.seq as f64,
        y: r.tps,
        lo: r.tps,
        hi: r.tps,
    };
    for t in &run.tests {
        let mut series = Vec::new();
        for arm in ["baseline", "candidate"] {
            let pts: Vec<Pt> = run
                .rows
                .iter()
                .filter(|r| r.test == t.test && r.arm == arm && !r.warmup)
                .map(pt)
                .collect();
            series.push(Series {
                label: arm.to_string(),
                points: pts,
                reference: false,
            });
        }
        let dropped: Vec<Pt> = run
            .rows
            .iter()
            .filter(|r| r.test == t.test && !r.warmup && !r.used)
            .map(pt)
            .collect();
        if !dropped.is_empty() {
            series.push(Series {
                label: "dropped (throttled or stalled block)".into(),
                points: dropped,
                reference: true,
            });
        }
        panels.push(Panel {
            title: format!("{} {}: {}", t.phase, t.test, t.judgement.verdict),
            x_label: "request in the run (ABBA order)".into(),
            y_label: "tokens/s".into(),
            log_y: false,
            series,
            hline: None,
        });
    }
    let p = dir.join("tps.png");
    plots::line_panels_linear(&p, "t/s per rep by arm", &panels)?;
    written.push(p);

    // Ratio with its interval, against the band.
    let d = run.tests[0].judgement.min_effect;
    let bars: Vec<Bar> = run
        .tests
        .iter()
        .filter(|t| t.judgement.ratio.is_finite())
        .map(|t| {
            let j = &t.judgement;
            Bar {
                label: format!("{} {} {}", t.phase, t.test, j.verdict),
                value: 100.0 * (j.ratio - 1.0),
                ci: Some((100.0 * (j.ci.0 - 1.0), 100.0 * (j.ci.1 - 1.0))),
                band: Some(100.0 * d),
                class: match j.verdict {
                    Verdict::Fast => BarClass::Good,
                    Verdict::Slow => BarClass::Bad,
                    _ => BarClass::Neutral,
                },
            }
        })
        .collect();
    if !bars.is_empty() {
        let p = dir.join("ratio.png");
        plots::bars(
            &p,
            &format!(
                "candidate vs baseline speed, {:.0}% CI (grey: +/-{:.1}% minimum effect)",
                100.0 * run.tests[0].judgement.level,
                100.0 * d
            ),
            "speed change %",
            &bars,
            &[],
        )?;
        written.push(p);
    }

    // Per-phase deltas, as % of the baseline's time of the test (so the
    // prefill's and one decode step's phases share an axis).
    let bars: Vec<Bar> = run
        .tests
        .iter()
        .flat_map(|t| {
            let total = t
                .attribution
                .iter()
                .find(|p| p.phase == TOTAL)
                .map_or(f64::NAN, |p| p.baseline_ms);
            let pc = move |x: f64| 100.0 * x / total;
            t.attribution.iter().map(move |p| Bar {
                label: format!("{} {} ({} ms)", t.phase, p.phase, ms(p.delta_ms)),
                value: pc(p.delta_ms),
                ci: Some((pc(p.ci.0), pc(p.ci.1))),
                band: None,
                class: if !p.significant {
                    BarClass::Neutral
                } else if p.delta_ms < 0.0 {
                    BarClass::Good
                } else {
                    BarClass::Bad
                },
            })
        })
        .collect();
    if !bars.is_empty() {
        let p = dir.join("phases.png");
        plots::bars(
            &p,
            "per-phase delta, candidate - baseline, with its CI",
            "delta, % of the baseline's time of the test (negative: candidate faster)",
            &bars,
            &[],
        )?;
        written.push(p);
    }
    Ok(written)
}
