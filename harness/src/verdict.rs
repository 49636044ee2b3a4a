//! The verdict of an end-to-end A/B run: is the candidate faster, slower,
//! the same, or can the run not tell, and which phases moved.
//!
//! The arms run interleaved in ABBA blocks (`A B B A`, then the next
//! block), so each block holds two reps of each arm. Per block the speed
//! ratio is the geometric mean of the two adjacent pairs,
//! `b = (ln(B1/A1) + ln(B2/A2)) / 2` (t/s of the candidate over the
//! baseline). A drift that is linear in time adds `+e` to the first pair's
//! log ratio and `-e` to the second's, so it cancels inside every block;
//! what is left of a slower drift is noise between blocks, which widens the
//! interval instead of biasing it.
//!
//! - Ratio: `exp(mean(b))` over the blocks used.
//! - Interval: the expanded percentile bootstrap of that mean over blocks
//!   (blocks resampled with replacement, the interval read further into
//!   the tails for few blocks), widened where it is narrower to Student's t
//!   interval (`stats::mean_ci`: with six blocks the bootstrap alone
//!   covers about 93 % at a nominal 95 %).
//! - Verdict, with a minimum effect `d` (default 1 %) and the band
//!   `[1/(1+d), 1+d]`:
//!   FAST when the interval lies above 1 and the ratio is at least `1+d`;
//!   SLOW when it lies below 1 and the ratio is at most `1/(1+d)`;
//!   SAME when the whole interval lies inside the band;
//!   AMBIGUOUS otherwise (the run cannot rule a change of `d` in or out:
//!   rerun with more reps), and when fewer than `MIN_BLOCKS` blocks are
//!   usable.
//! - Throttling: a rep is throttled when the worker reports a hardware or
//!   thermal clock-event reason (`HARD_REASONS`), or its mean SM clock fell
//!   more than `clocks::THROTTLE_FRACTION` below the best rep's of the run
//!   (both arms). A block with a throttled rep is dropped as a whole (the
//!   pairing needs all four) unless `keep_throttled`; the judgement says how
//!   many were dropped. `sw_power_cap` alone is recorded, not dropped: a
//!   long prefill on an H100 sits at its power cap in every rep of both arms.
//! - Stalls: a rep slower than its arm's median by more than
//!   `STALL_SIGMAS` robust standard deviations (1.4826 x the median absolute
//!   deviation of ln t/s over the arm's unthrottled reps) and by at least
//!   `STALL_FLOOR` is a stall: the host or the device paused the run (a
//!   2-25 ms hiccup in one prefill of an otherwise steady arm). Its block is
//!   dropped like a throttled one and counted. The rule is one-sided and per
//!   arm, so a consistent change of either arm is never taken for a stall;
//!   an arm that is slow in many reps widens its own MAD instead.
//! - Drift is estimated (a common log-linear slope over the sequence with an
//!   intercept per arm) and reported; the unpaired ratio of medians is
//!   reported beside the paired one, to show what the interleaving removed.
//! - Attribution: per phase, the block mean of the paired differences
//!   candidate - baseline (ms) with the same interval; what the phases do
//!   not account for of the total's difference is `unexplained`.

use crate::stats;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// Fewer usable blocks than this give AMBIGUOUS.
pub const MIN_BLOCKS: usize = 3;

/// A rep this many robust standard deviations below its arm's median
/// (and at least `STALL_FLOOR` below it) is a stall.
pub const STALL_SIGMAS: f64 = 5.0;
/// The least slow-down that counts as a stall (0.02 = 2 % below the arm's
/// median), so that arms with almost no spread do not drop ordinary reps.
pub const STALL_FLOOR: f64 = 0.02;
/// Stalls are only looked for in arms with at least this many reps.
const STALL_MIN_REPS: usize = 4;

/// Clock-event reasons that mark a rep throttled on their own (NVML names,
/// as `gemtune_kernels::clocks::reason_names` writes them).
pub const HARD_REASONS: &[&str] = &["hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"];

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verdict {
    Fast,
    Slow,
    Same,
    Ambiguous,
}

impl Verdict {
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Fast => "FAST",
            Verdict::Slow => "SLOW",
            Verdict::Same => "SAME",
            Verdict::Ambiguous => "AMBIGUOUS",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct VerdictConfig {
    /// Minimum effect size: changes smaller than this fraction do not
    /// count (0.01 = 1 %).
    pub min_effect: f64,
    /// Confidence level of the intervals.
    pub level: f64,
    pub resamples: usize,
    pub seed: u64,
    /// Judge throttled blocks too instead of dropping them.
    pub keep_throttled: bool,
}

impl Default for VerdictConfig {
    fn default() -> Self {
        VerdictConfig {
            min_effect: 0.01,
            level: 0.95,
            resamples: stats::MEAN_RESAMPLES,
            seed: 0xab_5eed,
            keep_throttled: false,
        }
    }
}

/// One measured rep of one arm, for one test (prefill or decode).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RepSample {
    /// Position in the run's sequence of reps (both arms, warm-ups
    /// included), for the drift estimate.
    pub seq: usize,
    /// Tokens per second (higher is better).
    pub tps: f64,
    /// Time of the test, ms (a prefill; one decode step).
    pub ms: f64,
    /// Per-phase GPU time, ms, in the same unit as `ms` (open map).
    pub phases: BTreeMap<String, f64>,
    /// Why the rep counts as throttled ("" when it does not).
    pub throttle: String,
}

/// One ABBA block: `a[0] b[0] b[1] a[1]` in time order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Block {
    pub a: [RepSample; 2],
    pub b: [RepSample; 2],
}

impl Block {
    pub fn throttled(&self) -> bool {
        self.a
            .iter()
            .chain(self.b.iter())
            .any(|r| !r.throttle.is_empty())
    }
    /// Drift-cancelling log speed ratio of the block (candidate / baseline).
    pub fn log_ratio(&self) -> f64 {
        0.5 * ((self.b[0].tps / self.a[0].tps).ln() + (self.b[1].tps / self.a[1].tps).ln())
    }
    /// Drift-cancelling difference candidate - baseline of `f`.
    pub fn diff(&self, f: impl Fn(&RepSample) -> f64) -> f64 {
        0.5 * ((f(&self.b[0]) - f(&self.a[0])) + (f(&self.b[1]) - f(&self.a[1])))
    }
}

/// A drift estimate: the common per-rep slope of ln(t/s) over the run.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Drift {
    /// Fractional change per rep step (0.001 = +0.1 % per rep).
    pub per_rep: f64,
    /// Fractional change from the first measured rep to the last.
    pub over_run: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Judgement {
    pub verdict: Verdict,
    /// Candidate t/s over baseline t/s (above 1: the candidate is faster).
    pub ratio: f64,
    pub ci: (f64, f64),
    /// The minimum effect and level it was judged with.
    pub min_effect: f64,
    pub level: f64,
    pub blocks_total: usize,
    pub blocks_used: usize,
    /// Blocks dropped because a rep in them was throttled.
    pub blocks_dropped: usize,
    /// Blocks dropped because a rep in them stalled (and was not throttled).
    pub blocks_stalled: usize,
    /// Throttled reps per arm (baseline, candidate), dropped or kept.
    pub throttled_reps: (usize, usize),
    pub drift: Drift,
    /// Median candidate t/s over median baseline t/s, unpaired, over the
    /// same reps: what a comparison without interleaving would report.
    pub unpaired_ratio: f64,
    /// Medians of the used reps, t/s.
    pub baseline_tps: f64,
    pub candidate_tps: f64,
    /// Were the arms identical, how often a run with this interval width
    /// would not come out SAME (`aa_not_same_probability`).
    pub p_not_same_if_equal: f64,
    /// One sentence: why this verdict.
    pub reason: String,
}

impl Judgement {
    /// The ratio as a signed percentage change of speed.
    pub fn pct(&self) -> f64 {
        100.0 * (self.ratio - 1.0)
    }
}

fn pct(x: f64) -> String {
    format!("{:+.2}%", 100.0 * (x - 1.0))
}

/// The throttle reason of every rep (both arms of one run, any order):
/// "" for a clean rep. `reasons[i]` are the clock-event reasons the worker
/// reported ("sw_power_cap,hw_slowdown"; '+' separates as well) and
/// `sm_mean[i]` its mean SM clock in MHz (None when not sampled).
pub fn throttle_flags(reasons: &[&str], sm_mean: &[Option<f64>]) -> Vec<String> {
    let best = sm_mean
        .iter()
        .flatten()
        .copied()
        .filter(|x| x.is_finite() && *x > 0.0)
        .fold(f64::NAN, f64::max);
    let frac = gemtune_kernels::clocks::THROTTLE_FRACTION;
    reasons
        .iter()
        .zip(sm_mean.iter().chain(std::iter::repeat(&None)))
        .map(|(r, m)| {
            let hard: Vec<&str> = r
                .split([',', '+'])
                .map(str::trim)
                .filter(|x| HARD_REASONS.contains(x))
                .collect();
            let mut why = Vec::new();
            if !hard.is_empty() {
                why.push(hard.join("+"));
            }
            if let Some(m) = m {
                if best.is_finite() && *m < (1.0 - frac) * best {
                    why.push(format!(
                        "SM clock mean {m:.0} MHz, {:.1}% below the run's best {best:.0} MHz",
                        100.0 * (1.0 - m / best)
                    ));
                }
            }
            why.join("; ")
        })
        .collect()
}

/// Drift: ln(t/s) regressed on the sequence position with one intercept per
/// arm and a common slope.
pub fn drift(blocks: &[&Block]) -> Drift {
    let mut num = 0.0;
    let mut den = 0.0;
    let (mut lo, mut hi) = (usize::MAX, 0usize);
    for arm in 0..2 {
        let reps: Vec<&RepSample> = blocks
            .iter()
            .flat_map(|b| if arm == 0 { b.a.iter() } else { b.b.iter() })
            .filter(|r| r.tps > 0.0 && r.tps.is_finite())
            .collect();
        if reps.len() < 2 {
            continue;
        }
        let sx = reps.iter().map(|r| r.seq as f64).sum::<f64>() / reps.len() as f64;
        let sy = reps.iter().map(|r| r.tps.ln()).sum::<f64>() / reps.len() as f64;
        for r in &reps {
            num += (r.seq as f64 - sx) * (r.tps.ln() - sy);
            den += (r.seq as f64 - sx).powi(2);
            lo = lo.min(r.seq);
            hi = hi.max(r.seq);
        }
    }
    if den <= 0.0 {
        return Drift::default();
    }
    let beta = num / den;
    Drift {
        per_rep: beta.exp() - 1.0,
        over_run: (beta * (hi - lo) as f64).exp() - 1.0,
    }
}

/// Were the two arms identical, the probability that a run whose interval
/// (of the ratio) has the width of `ci`, from `n` blocks, would not come
/// out SAME at minimum effect `d`: the estimate of an A/A run is roughly
/// normal around 1 with the standard error the interval implies (its
/// half-width over Student's t quantile), and SAME needs |estimate| +
/// half-width <= ln(1 + d) (all in logs).
pub fn aa_not_same_probability(ci: (f64, f64), n: usize, level: f64, d: f64) -> f64 {
    if n < 2 || !(ci.0 > 0.0 && ci.1 >= ci.0) {
        return 1.0;
    }
    let half = 0.5 * (ci.1.ln() - ci.0.ln());
    if half <= 0.0 {
        return 0.0;
    }
    let a = (1.0 - level) / 2.0;
    let se = half / stats::t_quantile(1.0 - a, n as f64 - 1.0);
    let room = (1.0 + d).ln() - half;
    if room <= 0.0 {
        return 1.0;
    }
    2.0 * stats::normal_cdf(-room / se)
}

/// The blocks a verdict is judged on, and how many were dropped why.
struct Usable<'a> {
    used: Vec<&'a Block>,
    /// Dropped for a throttled rep.
    throttled: usize,
    /// Dropped for a stalled rep (and no throttled one).
    stalled: usize,
}

fn usable<'a>(blocks: &'a [Block], cfg: &VerdictConfig) -> Usable<'a> {
    let stalls = stalled_blocks(blocks, cfg);
    let mut u = Usable {
        used: Vec::new(),
        throttled: 0,
        stalled: 0,
    };
    for ((b, stall), used) in blocks
        .iter()
        .zip(&stalls)
        .zip(used_with(blocks, &stalls, cfg))
    {
        if used {
            u.used.push(b);
        } else if !cfg.keep_throttled && b.throttled() {
            u.throttled += 1;
        } else if *stall {
            u.stalled += 1;
        }
    }
    u
}

/// Per block: does the verdict use it (not dropped for a throttled or a
/// stalled rep, and a finite ratio)? What `judge` and `attribute` read.
pub fn used_blocks(blocks: &[Block], cfg: &VerdictConfig) -> Vec<bool> {
    used_with(blocks, &stalled_blocks(blocks, cfg), cfg)
}

fn used_with(blocks: &[Block], stalls: &[bool], cfg: &VerdictConfig) -> Vec<bool> {
    blocks
        .iter()
        .zip(stalls)
        .map(|(b, &stall)| {
            (cfg.keep_throttled || !b.throttled()) && !stall && b.log_ratio().is_finite()
        })
        .collect()
}

/// Per block: does it hold a stalled rep (see the module comment)? The
/// arms' medians and spreads come from the reps the verdict may use (not
/// throttled, or all with `keep_throttled`).
pub fn stalled_blocks(blocks: &[Block], cfg: &VerdictConfig) -> Vec<bool> {
    let counts = |b: &Block| cfg.keep_throttled || !b.throttled();
    let threshold = |arm: usize| -> Option<f64> {
        let v: Vec<f64> = blocks
            .iter()
            .filter(|b| counts(b))
            .flat_map(|b| if arm == 0 { b.a.iter() } else { b.b.iter() })
            .map(|r| r.tps.ln())
            .filter(|x| x.is_finite())
            .collect();
        if v.len() < STALL_MIN_REPS {
            return None;
        }
        let med = stats::median(&v);
        let dev: Vec<f64> = v.iter().map(|x| (x - med).abs()).collect();
        let sigma = 1.4826 * stats::median(&dev);
        Some(med - (STALL_SIGMAS * sigma).max((1.0 + STALL_FLOOR).ln()))
    };
    let (ta, tb) = (threshold(0), threshold(1));
    // A throttled rep the caller chose to keep is judged, never a stall.
    let slow =
        |r: &RepSample, t: Option<f64>| r.throttle.is_empty() && t.is_some_and(|t| r.tps.ln() < t);
    blocks
        .iter()
        .map(|b| counts(b) && (b.a.iter().any(|r| slow(r, ta)) || b.b.iter().any(|r| slow(r, tb))))
        .collect()
}

/// Judges one test (prefill or decode) from its ABBA blocks.
pub fn judge(blocks: &[Block], cfg: &VerdictConfig) -> Judgement {
    let throttled_reps = (
        blocks
            .iter()
            .flat_map(|b| b.a.iter())
            .filter(|r| !r.throttle.is_empty())
            .count(),
        blocks
            .iter()
            .flat_map(|b| b.b.iter())
            .filter(|r| !r.throttle.is_empty())
            .count(),
    );
    let Usable {
        used,
        throttled: dropped,
        stalled,
    } = usable(blocks, cfg);
    let logs: Vec<f64> = used.iter().map(|b| b.log_ratio()).collect();
    let med = |arm: usize| {
        let v: Vec<f64> = used
            .iter()
            .flat_map(|b| if arm == 0 { b.a.iter() } else { b.b.iter() })
            .map(|r| r.tps)
            .collect();
        stats::median(&v)
    };
    let (base, cand) = (med(0), med(1));
    let drift = drift(&used);
    let d = cfg.min_effect;
    let mut j = Judgement {
        verdict: Verdict::Ambiguous,
        ratio: f64::NAN,
        ci: (f64::NAN, f64::NAN),
        min_effect: d,
        level: cfg.level,
        blocks_total: blocks.len(),
        blocks_used: used.len(),
        blocks_dropped: dropped,
        blocks_stalled: stalled,
        throttled_reps,
        drift,
        unpaired_ratio: cand / base,
        baseline_tps: base,
        candidate_tps: cand,
        p_not_same_if_equal: 1.0,
        reason: String::new(),
    };
    if used.len() < MIN_BLOCKS {
        j.reason = if dropped > 0 && blocks.len() >= MIN_BLOCKS {
            format!(
                "only {} of {} ABBA blocks are free of throttling (at least {MIN_BLOCKS} needed): \
                 the GPU throttled during the run; let it cool, check its power and clocks, or judge \
                 the throttled reps too with --keep-throttled",
                used.len(),
                blocks.len()
            )
        } else if stalled > 0 && blocks.len() >= MIN_BLOCKS {
            format!(
                "only {} of {} ABBA blocks are free of stalls (at least {MIN_BLOCKS} needed): \
                 something else is using the GPU or the host; rerun on a quiet machine",
                used.len(),
                blocks.len()
            )
        } else {
            format!(
                "{} usable ABBA blocks, at least {MIN_BLOCKS} needed: raise --reps",
                used.len()
            )
        };
        if !logs.is_empty() {
            j.ratio = stats::mean(&logs).exp();
        }
        return j;
    }
    let m = stats::mean(&logs);
    let (lo, hi) = stats::mean_ci(&logs, cfg.level, cfg.resamples, cfg.seed);
    j.ratio = m.exp();
    j.ci = (lo.exp(), hi.exp());
    j.p_not_same_if_equal = aa_not_same_probability(j.ci, used.len(), cfg.level, d);
    let (rlo, rhi) = j.ci;
    let band = (1.0 / (1.0 + d), 1.0 + d);
    let ci_txt = format!(
        "ratio {:.4} ({}), {:.0}% CI [{}, {}]",
        j.ratio,
        pct(j.ratio),
        100.0 * cfg.level,
        pct(rlo),
        pct(rhi)
    );
    let band_txt = format!("+/-{:.1}%", 100.0 * d);
    if rlo > 1.0 && j.ratio >= band.1 {
        j.verdict = Verdict::Fast;
        j.reason = format!("{ci_txt}: above 1 and past the {band_txt} minimum effect");
    } else if rhi < 1.0 && j.ratio <= band.0 {
        j.verdict = Verdict::Slow;
        j.reason = format!("{ci_txt}: below 1 and past the {band_txt} minimum effect");
    } else if rlo >= band.0 && rhi <= band.1 {
        j.verdict = Verdict::Same;
        j.reason = format!("{ci_txt}: inside the {band_txt} band");
    } else {
        j.verdict = Verdict::Ambiguous;
        j.reason = format!(
            "{ci_txt}: neither inside the {band_txt} band nor clear of it; rerun with more --reps \
             (the interval narrows with the square root of the blocks)"
        );
    }
    j
}

/// One phase's share of the end-to-end difference.
#[derive(Clone, Debug, PartialEq)]
pub struct PhaseDelta {
    pub phase: String,
    /// Mean baseline time of the phase over the used blocks, ms.
    pub baseline_ms: f64,
    /// Candidate - baseline, ms (negative: the candidate is faster there).
    pub delta_ms: f64,
    pub ci: (f64, f64),
    /// delta_ms over the total's delta (NaN when the total did not move).
    pub share: f64,
    /// The interval excludes zero.
    pub significant: bool,
}

/// The name of the total row of `attribute`.
pub const TOTAL: &str = "total";
/// The name of the remainder row of `attribute`.
pub const UNEXPLAINED: &str = "unexplained";

/// Per-phase attribution over the blocks `judge` used: one row per phase
/// (the union of the phase names; a phase a rep does not report counts 0),
/// sorted by |delta|, then `unexplained` (total minus the phases) and the
/// `total` itself (`RepSample::ms`).
pub fn attribute(blocks: &[Block], cfg: &VerdictConfig) -> Vec<PhaseDelta> {
    let used = usable(blocks, cfg).used;
    if used.is_empty() {
        return Vec::new();
    }
    let names: BTreeSet<String> = used
        .iter()
        .flat_map(|b| b.a.iter().chain(b.b.iter()))
        .flat_map(|r| r.phases.keys().cloned())
        .collect();
    let row = |name: &str, f: &dyn Fn(&RepSample) -> f64, seed: u64| {
        let diffs: Vec<f64> = used.iter().map(|b| b.diff(f)).collect();
        let base: Vec<f64> = used.iter().flat_map(|b| b.a.iter()).map(f).collect();
        let (lo, hi) = stats::mean_ci(&diffs, cfg.level, cfg.resamples, seed);
        PhaseDelta {
            phase: name.to_string(),
            baseline_ms: stats::mean(&base),
            delta_ms: stats::mean(&diffs),
            ci: (lo, hi),
            share: f64::NAN,
            significant: lo > 0.0 || hi < 0.0,
        }
    };
    let phase_sum = |r: &RepSample| r.phases.values().sum::<f64>();
    let total = row(TOTAL, &|r: &RepSample| r.ms, cfg.seed);
    let mut rows: Vec<PhaseDelta> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            row(
                n,
                &|r: &RepSample| r.phases.get(n).copied().unwrap_or(0.0),
                cfg.seed.wrapping_add(1 + i as u64),
            )
        })
        .collect();
    rows.sort_by(|a, b| b.delta_ms.abs().total_cmp(&a.delta_ms.abs()));
    if !names.is_empty() {
        rows.push(row(
            UNEXPLAINED,
            &|r: &RepSample| r.ms - phase_sum(r),
            cfg.seed.wrapping_add(0x7fff),
        ));
    }
    rows.push(total);
    let t = rows.last().map_or(f64::NAN, |t| t.delta_ms);
    for r in rows.iter_mut() {
        r.share = if t != 0.0 { r.delta_ms / t } else { f64::NAN };
    }
    rows
}

/// The phases that account for the change: significant, and at least 10 %
/// of the total's delta (or, when the total did not move, at least a
/// quarter of the minimum effect of the total time).
pub fn movers(rows: &[PhaseDelta], min_effect: f64) -> Vec<&PhaseDelta> {
    let Some(total) = rows.iter().find(|r| r.phase == TOTAL) else {
        return Vec::new();
    };
    rows.iter()
        .filter(|r| r.phase != TOTAL && r.significant)
        .filter(|r| {
            if total.significant {
                r.delta_ms.abs() >= 0.1 * total.delta_ms.abs()
            } else {
                r.delta_ms.abs() >= 0.25 * min_effect * total.baseline_ms.abs()
            }
        })
        .collect()
}

/// Both tests' verdicts into one exit decision: any SLOW is a regression
/// (1), else any AMBIGUOUS is ambiguous (2), else (SAME or FAST) a pass (0).
pub fn combine(verdicts: &[Verdict]) -> Outcome {
    if verdicts.contains(&Verdict::Slow) {
        Outcome::Regression
    } else if verdicts.contains(&Verdict::Ambiguous) || verdicts.is_empty() {
        Outcome::Ambiguous
    } else {
        Outcome::Pass
    }
}

/// What a set of verdicts means for the exit code (numbered as the exit
/// codes of every subcommand: 0 pass, 1 regression, 2 ambiguous).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Pass = 0,
    Regression = 1,
    Ambiguous = 2,
}
