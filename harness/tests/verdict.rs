//! The A/B verdict on synthetic sample sets: a clear win, a clear loss,
//! pure noise, a slow drift across reps, a throttled arm; the attribution
//! to phases; and the A/A false-alarm rate against what the interval width
//! predicts.

use gemtune::verdict::{
    self, aa_not_same_probability, attribute, judge, throttle_flags, Block, RepSample, Verdict,
    VerdictConfig,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;

/// How a synthetic run behaves.
struct Sim {
    blocks: usize,
    /// Baseline t/s.
    base: f64,
    /// Candidate speed over baseline.
    effect: f64,
    /// sd of the log-normal noise per rep.
    noise: f64,
    /// Multiplicative change per request of the run (both arms).
    drift: f64,
    /// Throttled (arm 0 baseline, 1 candidate; request index) -> slow-down.
    throttle: fn(usize, usize) -> Option<f64>,
    /// Stalled, unflagged (arm, request index) -> slow-down.
    stall: fn(usize, usize) -> Option<f64>,
    seed: u64,
}

impl Default for Sim {
    fn default() -> Self {
        Sim {
            blocks: 6,
            base: 1000.0,
            effect: 1.0,
            noise: 0.003,
            drift: 0.0,
            throttle: |_, _| None,
            stall: |_, _| None,
            seed: 1,
        }
    }
}

fn normal(rng: &mut ChaCha8Rng) -> f64 {
    let u1: f64 = rng.random_range(1e-12..1.0);
    let u2: f64 = rng.random_range(0.0..1.0);
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

impl Sim {
    /// ABBA blocks after one warm-up round (requests 0 and 1).
    fn run(&self) -> Vec<Block> {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        let mut rep = |arm: usize, seq: usize| {
            let mut tps = self.base
                * if arm == 1 { self.effect } else { 1.0 }
                * (self.noise * normal(&mut rng)).exp()
                * (1.0 + self.drift).powi(seq as i32);
            let mut throttle = String::new();
            if let Some(slow) = (self.throttle)(arm, seq) {
                tps *= slow;
                throttle = "hw_slowdown".into();
            }
            if let Some(slow) = (self.stall)(arm, seq) {
                tps *= slow;
            }
            // Two phases: "a" is 70 % of the baseline's time and carries
            // the whole effect, "b" 30 %.
            let ms = 1000.0 / tps;
            let scale = 1000.0 / (self.base * (1.0 + self.drift).powi(seq as i32));
            let b_ms = 0.3 * scale;
            let mut phases = BTreeMap::new();
            phases.insert("a".to_string(), ms - b_ms);
            phases.insert("b".to_string(), b_ms);
            RepSample {
                seq,
                tps,
                ms,
                phases,
                throttle,
            }
        };
        (0..self.blocks)
            .map(|j| {
                let s = 2 + 4 * j;
                let a0 = rep(0, s);
                let b0 = rep(1, s + 1);
                let b1 = rep(1, s + 2);
                let a1 = rep(0, s + 3);
                Block {
                    a: [a0, a1],
                    b: [b0, b1],
                }
            })
            .collect()
    }
}

fn cfg() -> VerdictConfig {
    VerdictConfig::default()
}

#[test]
fn clear_win_is_fast() {
    let j = judge(
        &Sim {
            effect: 1.05,
            ..Sim::default()
        }
        .run(),
        &cfg(),
    );
    assert_eq!(j.verdict, Verdict::Fast, "{}", j.reason);
    assert!((j.ratio - 1.05).abs() < 0.005, "{}", j.ratio);
    assert!(
        j.ci.0 > 1.0 && j.ci.0 <= 1.05 && 1.05 <= j.ci.1,
        "{:?}",
        j.ci
    );
    assert_eq!((j.blocks_used, j.blocks_dropped), (6, 0));
}

#[test]
fn clear_loss_is_slow() {
    let j = judge(
        &Sim {
            effect: 0.96,
            ..Sim::default()
        }
        .run(),
        &cfg(),
    );
    assert_eq!(j.verdict, Verdict::Slow, "{}", j.reason);
    assert!(j.ci.1 < 1.0);
    assert!((j.ratio - 0.96).abs() < 0.005);
}

#[test]
fn a_small_but_real_change_below_the_minimum_effect_is_not_fast() {
    // 0.4 % faster with 0.1 % noise: real, but under the 1 % minimum.
    let j = judge(
        &Sim {
            effect: 1.004,
            noise: 0.001,
            ..Sim::default()
        }
        .run(),
        &cfg(),
    );
    assert!(j.ci.0 > 1.0, "the change is resolved: {:?}", j.ci);
    assert_eq!(j.verdict, Verdict::Same, "{}", j.reason);
    // With a 0.2 % minimum effect it counts.
    let j = judge(
        &Sim {
            effect: 1.004,
            noise: 0.001,
            ..Sim::default()
        }
        .run(),
        &VerdictConfig {
            min_effect: 0.002,
            ..cfg()
        },
    );
    assert_eq!(j.verdict, Verdict::Fast, "{}", j.reason);
}

#[test]
fn pure_noise_is_same_when_small_and_ambiguous_when_not() {
    let j = judge(&Sim::default().run(), &cfg());
    assert_eq!(j.verdict, Verdict::Same, "{}", j.reason);
    assert!(j.p_not_same_if_equal < 0.05, "{}", j.p_not_same_if_equal);
    // 4 % noise per rep: the interval cannot rule a 1 % change in or out,
    // so the answer is AMBIGUOUS; a false FAST or SLOW needs the interval
    // to exclude 1, which pure noise does at about 1 - confidence.
    let runs = 200;
    let mut counts: BTreeMap<Verdict, usize> = BTreeMap::new();
    for seed in 0..runs {
        let j = judge(
            &Sim {
                noise: 0.04,
                seed,
                ..Sim::default()
            }
            .run(),
            &VerdictConfig {
                resamples: 4000,
                ..cfg()
            },
        );
        *counts.entry(j.verdict).or_default() += 1;
    }
    println!("4% noise, 200 A/A runs: {counts:?}");
    let get = |v| counts.get(&v).copied().unwrap_or(0) as f64 / runs as f64;
    assert_eq!(get(Verdict::Same), 0.0);
    assert!(get(Verdict::Ambiguous) >= 0.9, "{counts:?}");
    assert!(
        get(Verdict::Fast) + get(Verdict::Slow) <= 0.08,
        "{counts:?}"
    );
    // At 99 % confidence, false FAST/SLOW are rarer still.
    let strict = (0..runs)
        .filter(|&seed| {
            let j = judge(
                &Sim {
                    noise: 0.04,
                    seed,
                    ..Sim::default()
                }
                .run(),
                &VerdictConfig {
                    level: 0.99,
                    resamples: 4000,
                    ..cfg()
                },
            );
            matches!(j.verdict, Verdict::Fast | Verdict::Slow)
        })
        .count();
    assert!(strict as f64 / runs as f64 <= 0.03, "{strict} of {runs}");
}

#[test]
fn a_slow_drift_cancels_in_abba_blocks() {
    // Both arms lose 0.5 % per request (12 % over the run), no effect.
    let sim = Sim {
        drift: -0.005,
        noise: 0.001,
        ..Sim::default()
    };
    let blocks = sim.run();
    let j = judge(&blocks, &cfg());
    assert_eq!(j.verdict, Verdict::Same, "{}", j.reason);
    assert!((j.ratio - 1.0).abs() < 0.002, "{}", j.ratio);
    assert!(
        (j.drift.per_rep + 0.005).abs() < 0.0005,
        "drift estimate {:?}",
        j.drift
    );
    assert!(j.drift.over_run < -0.1);
    // What interleaving buys: the same arms run one after the other
    // (all baseline reps, then all candidate reps) see the drift as a 6 %
    // slow-down.
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let n = 12;
    let seq_tps = |arm: usize, i: usize, rng: &mut ChaCha8Rng| {
        1000.0 * (1.0f64 - 0.005).powi((arm * n + i) as i32) * (0.001 * normal(rng)).exp()
    };
    let a: Vec<f64> = (0..n).map(|i| seq_tps(0, i, &mut rng)).collect();
    let b: Vec<f64> = (0..n).map(|i| seq_tps(1, i, &mut rng)).collect();
    let naive = gemtune::stats::median(&b) / gemtune::stats::median(&a);
    assert!(naive < 0.95, "sequential runs would call it SLOW: {naive}");
}

#[test]
fn a_drift_does_not_hide_a_real_effect() {
    let j = judge(
        &Sim {
            drift: 0.004,
            effect: 1.03,
            ..Sim::default()
        }
        .run(),
        &cfg(),
    );
    assert_eq!(j.verdict, Verdict::Fast, "{}", j.reason);
    assert!((j.ratio - 1.03).abs() < 0.004);
}

#[test]
fn a_throttled_arm_is_dropped_not_judged() {
    // Every candidate rep throttled and 10 % slow: no block is usable.
    let sim = Sim {
        throttle: |arm, _| (arm == 1).then_some(0.9),
        ..Sim::default()
    };
    let j = judge(&sim.run(), &cfg());
    assert_eq!(j.verdict, Verdict::Ambiguous);
    assert_eq!((j.blocks_used, j.blocks_dropped), (0, 6));
    assert_eq!(j.throttled_reps, (0, 12));
    assert!(j.reason.contains("throttl"), "{}", j.reason);
    // Kept, the throttling reads as a regression.
    let k = judge(
        &sim.run(),
        &VerdictConfig {
            keep_throttled: true,
            ..cfg()
        },
    );
    assert_eq!(k.verdict, Verdict::Slow, "{}", k.reason);
}

#[test]
fn throttled_blocks_are_dropped_and_the_rest_judged() {
    // Requests 7 and 12 (blocks 1 and 2) throttled 15 % slow, an A/A run.
    let sim = Sim {
        throttle: |_, seq| (seq == 7 || seq == 12).then_some(0.85),
        ..Sim::default()
    };
    let j = judge(&sim.run(), &cfg());
    assert_eq!(j.verdict, Verdict::Same, "{}", j.reason);
    assert_eq!((j.blocks_used, j.blocks_dropped), (4, 2));
    let k = judge(
        &sim.run(),
        &VerdictConfig {
            keep_throttled: true,
            ..cfg()
        },
    );
    assert_ne!(
        k.verdict,
        Verdict::Same,
        "kept, the two throttled reps spoil the interval: {}",
        k.reason
    );
}

#[test]
fn throttle_flags_follow_reasons_and_clocks() {
    let f = throttle_flags(
        &[
            "",
            "sw_power_cap",
            "sw_power_cap,hw_slowdown",
            "",
            "sw_thermal+gpu_idle",
        ],
        &[Some(1980.0), Some(1950.0), Some(1970.0), Some(1700.0), None],
    );
    assert_eq!(f[0], "");
    assert_eq!(f[1], "", "a power cap alone does not drop a rep");
    assert_eq!(f[2], "hw_slowdown");
    assert!(
        f[3].contains("1700 MHz") && f[3].contains("14.1% below"),
        "{}",
        f[3]
    );
    assert_eq!(f[4], "sw_thermal");
    assert_eq!(throttle_flags(&["", ""], &[]), vec!["", ""]);
}

#[test]
fn a_stalled_rep_is_dropped_with_its_block() {
    // An A/A run whose baseline paused once for 6 % of a prefill (request 6,
    // block 1): the block is dropped and the rest judged SAME.
    let sim = Sim {
        stall: |arm, seq| (arm == 0 && seq == 6).then_some(0.94),
        ..Sim::default()
    };
    let j = judge(&sim.run(), &cfg());
    assert_eq!(j.verdict, Verdict::Same, "{}", j.reason);
    assert_eq!(
        (j.blocks_used, j.blocks_stalled, j.blocks_dropped),
        (5, 1, 0)
    );
    assert_eq!(
        verdict::stalled_blocks(&sim.run(), &cfg()),
        vec![false, true, false, false, false, false]
    );
    // A pause below the 2 % floor is noise, not a stall.
    let small = Sim {
        stall: |arm, seq| (arm == 0 && seq == 6).then_some(0.99),
        ..Sim::default()
    };
    assert_eq!(judge(&small.run(), &cfg()).blocks_stalled, 0);
}

#[test]
fn a_real_change_is_never_taken_for_stalls() {
    // A consistent 5 % loss: every candidate rep is slow, none is a stall.
    let sim = Sim {
        effect: 0.95,
        ..Sim::default()
    };
    let j = judge(&sim.run(), &cfg());
    assert_eq!(j.verdict, Verdict::Slow, "{}", j.reason);
    assert_eq!(j.blocks_stalled, 0);
    // A candidate slow by 5 % in every other request: its spread is its own,
    // so nothing is dropped and the run is not called SAME.
    let sim = Sim {
        stall: |arm, seq| (arm == 1 && seq % 2 == 0).then_some(0.95),
        ..Sim::default()
    };
    let j = judge(&sim.run(), &cfg());
    assert_eq!(j.blocks_stalled, 0, "{}", j.reason);
    assert_ne!(j.verdict, Verdict::Same, "{}", j.reason);
    assert_ne!(j.verdict, Verdict::Fast, "{}", j.reason);
}

#[test]
fn too_few_blocks_are_ambiguous() {
    let j = judge(
        &Sim {
            blocks: 2,
            effect: 1.2,
            ..Sim::default()
        }
        .run(),
        &cfg(),
    );
    assert_eq!(j.verdict, Verdict::Ambiguous);
    assert!(j.reason.contains("--reps"), "{}", j.reason);
}

#[test]
fn attribution_finds_the_phase_that_moved() {
    let blocks = Sim {
        effect: 1.10,
        noise: 0.002,
        ..Sim::default()
    }
    .run();
    let rows = attribute(&blocks, &cfg());
    let names: Vec<&str> = rows.iter().map(|r| r.phase.as_str()).collect();
    assert_eq!(names, ["a", "b", verdict::UNEXPLAINED, verdict::TOTAL]);
    let a = &rows[0];
    let total = rows.last().unwrap();
    // 1 ms per token at 1000 t/s; 10 % faster saves 0.0909 ms, all in "a".
    assert!((total.delta_ms + 0.0909).abs() < 0.002, "{total:?}");
    assert!(a.significant && (a.share - 1.0).abs() < 0.02, "{a:?}");
    assert!(!rows[1].significant, "b did not move: {:?}", rows[1]);
    let movers = verdict::movers(&rows, 0.01);
    assert_eq!(
        movers.iter().map(|m| m.phase.as_str()).collect::<Vec<_>>(),
        ["a"]
    );
}

#[test]
fn verdicts_combine_into_one_exit_decision() {
    use gemtune::verdict::{combine, Outcome};
    use Verdict::*;
    assert_eq!(combine(&[Same, Fast]), Outcome::Pass);
    assert_eq!(combine(&[Fast, Slow]), Outcome::Regression);
    assert_eq!(combine(&[Ambiguous, Slow]), Outcome::Regression);
    assert_eq!(combine(&[Ambiguous, Fast]), Outcome::Ambiguous);
    assert_eq!(combine(&[]), Outcome::Ambiguous);
}

/// The A/A self-test in simulation: over many runs of identical arms, how
/// often the verdict is not SAME matches what each run's interval width
/// predicts (`p_not_same_if_equal`), and FAST/SLOW (false regressions) stay
/// rare.
#[test]
fn aa_false_alarm_rate_matches_the_interval_width() {
    let runs = 300;
    let mut not_same = 0;
    let mut fast_or_slow = 0;
    let mut predicted = 0.0;
    for seed in 0..runs {
        let j = judge(
            &Sim {
                noise: 0.006,
                seed: 1000 + seed,
                ..Sim::default()
            }
            .run(),
            &VerdictConfig {
                resamples: 4000,
                ..cfg()
            },
        );
        if j.verdict != Verdict::Same {
            not_same += 1;
        }
        if matches!(j.verdict, Verdict::Fast | Verdict::Slow) {
            fast_or_slow += 1;
        }
        predicted += j.p_not_same_if_equal;
    }
    let observed = not_same as f64 / runs as f64;
    let predicted = predicted / runs as f64;
    println!(
        "A/A at 0.6% noise, 6 blocks: not SAME {observed:.3} (predicted {predicted:.3}), FAST/SLOW {:.3}",
        fast_or_slow as f64 / runs as f64
    );
    assert!(
        (observed - predicted).abs() < 0.08,
        "observed {observed}, predicted {predicted}"
    );
    assert!(observed > 0.02 && observed < 0.5, "{observed}");
    assert!(
        fast_or_slow as f64 / runs as f64 <= 0.02,
        "{fast_or_slow} false FAST/SLOW of {runs}"
    );
}

#[test]
fn aa_probability_from_the_interval() {
    // An interval far inside the band: practically never other than SAME.
    assert!(aa_not_same_probability((0.999, 1.001), 6, 0.95, 0.01) < 1e-6);
    // An interval as wide as the band: always.
    assert_eq!(aa_not_same_probability((0.98, 1.02), 6, 0.95, 0.01), 1.0);
    // Half-width 0.7 %: standard error 0.7 % / 2.57 (t, six blocks),
    // 0.3 % of room to the band's edge: 2 * Phi(-1.08), about 28 %.
    let mid = aa_not_same_probability((0.993, 1.007), 6, 0.95, 0.01);
    assert!((mid - 0.28).abs() < 0.03, "{mid}");
}
