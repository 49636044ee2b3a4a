//! CPU tests of the strategies and the driver on synthetic objectives.

use super::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::cell::Cell;
use std::time::Duration;

/// The gemv `planes-dp4a` sweeps' axes, as one product (108 points).
fn gemv_like() -> Space {
    Space::grid(&[
        ("ROWS", &[1, 2, 4, 8]),
        ("WARPS", &[2, 4, 8]),
        ("KSPLIT", &[1, 2, 4]),
        ("UNROLL", &[1, 2, 4]),
    ])
}

/// attn_decode streaming axes (324 points).
fn attn_like() -> Space {
    Space::grid(&[
        ("BKV", &[16, 32, 64]),
        ("KW", &[1, 2, 4]),
        ("STAGES", &[2, 3, 4]),
        ("WD", &[1, 2, 4, 8]),
        ("BQ", &[8, 16, 32]),
    ])
}

/// A union of two sweeps over different axes, as a family with two
/// `[[sweep]]`s gives: a string define, and defines one sweep leaves unset.
fn union_like() -> Space {
    use gemtune_kernels::defines::DefineValue::{Int, Str};
    let mut pts = Vec::new();
    for x in [1, 2, 4, 8] {
        for y in [1, 2, 4] {
            for u in [1, 2] {
                let d = [
                    ("BASE", Str("a".into())),
                    ("X", Int(x)),
                    ("Y", Int(y)),
                    ("U", Int(u)),
                ];
                pts.push((
                    format!("a+X={x},Y={y},U={u}"),
                    d.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
                ));
            }
        }
    }
    for x in [1, 8, 16] {
        for z in [0, 1] {
            let d = [("BASE", Str("b".into())), ("X", Int(x)), ("Z", Int(z))];
            pts.push((
                format!("b+X={x},Z={z}"),
                d.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            ));
        }
    }
    let s = Space::from_defines(&pts);
    assert_eq!(s.len(), 30);
    s
}

/// A smooth objective with one known optimum: a time of 10 us at `opt`
/// (one rank per dimension, in the space's dimension order) growing
/// multiplicatively with the squared rank distance, each dimension with
/// its own weight, plus an interaction between the first two dimensions.
fn smooth(space: &Space, opt: &[usize], weights: &[f64]) -> Vec<f64> {
    (0..space.len())
        .map(|p| {
            let r: Vec<f64> = space
                .coords(p)
                .iter()
                .zip(space.dims())
                .map(|(&c, d)| c as f64 / (d.values.len() - 1) as f64)
                .collect();
            let o: Vec<f64> = opt
                .iter()
                .zip(space.dims())
                .map(|(&c, d)| c as f64 / (d.values.len() - 1) as f64)
                .collect();
            let e: f64 = r
                .iter()
                .zip(&o)
                .zip(weights)
                .map(|((a, b), w)| w * (a - b) * (a - b))
                .sum::<f64>()
                + 0.5 * ((r[0] - o[0]) - (r[1] - o[1])).powi(2);
            10.0 * e.exp()
        })
        .collect()
}

fn argmin(v: &[f64]) -> usize {
    (0..v.len())
        .min_by(|&a, &b| v[a].total_cmp(&v[b]))
        .expect("non-empty")
}

/// Evaluations until a point whose true value is within 3 % of the true
/// best is evaluated; `noise` is the relative sd of the value the strategy
/// sees (drawn per evaluation from a generator seeded with `seed`).
fn evals_to_target(
    space: &Space,
    truth: &[f64],
    kind: StrategyKind,
    seed: u64,
    noise: f64,
) -> usize {
    let target = truth[argmin(truth)] * 1.03;
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xa5a5);
    let mut reached = false;
    let mut s = kind.build(seed);
    let log = run(
        space,
        s.as_mut(),
        Budget::default(),
        &mut || Duration::ZERO,
        |p| {
            if reached {
                return Eval::Stop;
            }
            reached = truth[p] <= target;
            let z: f64 = (0..12).map(|_| rng.random::<f64>()).sum::<f64>() - 6.0;
            Eval::Value(truth[p] * (1.0 + noise * z))
        },
    )
    .expect("a valid search");
    log.trials.len()
}

fn mean_evals(space: &Space, truth: &[f64], kind: StrategyKind, seeds: u64, noise: f64) -> f64 {
    (0..seeds)
        .map(|s| evals_to_target(space, truth, kind, s, noise) as f64)
        .sum::<f64>()
        / seeds as f64
}

const SEEDED: [StrategyKind; 3] = [
    StrategyKind::Random,
    StrategyKind::Evolutionary,
    StrategyKind::Bayes,
];

#[test]
fn every_strategy_stops_at_max_evals() {
    let space = gemv_like();
    let truth = smooth(&space, &[2, 1, 0, 1], &[2.0, 1.0, 1.5, 0.3]);
    for kind in StrategyKind::ALL {
        for seed in 0..3 {
            let mut calls = 0;
            let mut s = kind.build(seed);
            let budget = Budget {
                max_evals: Some(17),
                time_limit: None,
            };
            let log = run(&space, s.as_mut(), budget, &mut || Duration::ZERO, |p| {
                calls += 1;
                Eval::Value(truth[p])
            })
            .expect("valid");
            assert_eq!(log.trials.len(), 17, "{kind}");
            assert_eq!(calls, 17, "{kind}");
            assert_eq!(log.stop, Stop::MaxEvals, "{kind}");
        }
    }
}

#[test]
fn every_strategy_starts_no_evaluation_after_the_time_limit() {
    let space = attn_like();
    let truth = smooth(&space, &[1, 1, 2, 3, 0], &[1.0, 1.0, 0.5, 2.0, 1.0]);
    for kind in StrategyKind::ALL {
        // Each evaluation takes 1.5 s of a fake clock; the limit is 10 s:
        // evaluations start at 0, 1.5, ..., 9 s (7 of them), and the one
        // that would start at 10.5 s does not.
        let now = Cell::new(Duration::ZERO);
        let mut s = kind.build(7);
        let budget = Budget {
            max_evals: Some(100),
            time_limit: Some(Duration::from_secs(10)),
        };
        let log = run(&space, s.as_mut(), budget, &mut || now.get(), |p| {
            assert!(now.get() < Duration::from_secs(10), "{kind} started late");
            now.set(now.get() + Duration::from_millis(1500));
            Eval::Value(truth[p])
        })
        .expect("valid");
        assert_eq!(log.trials.len(), 7, "{kind}");
        assert_eq!(log.stop, Stop::TimeLimit, "{kind}");
        assert_eq!(log.elapsed, Duration::from_millis(10_500));
    }
}

#[test]
fn strategies_are_deterministic_under_a_seed_and_differ_across_seeds() {
    let space = gemv_like();
    let truth = smooth(&space, &[3, 2, 1, 0], &[1.0, 2.0, 1.0, 0.5]);
    let order = |kind: StrategyKind, seed: u64, noise: bool| -> Vec<usize> {
        let mut s = kind.build(seed);
        let budget = Budget {
            max_evals: Some(40),
            time_limit: None,
        };
        let mut i = 0u32;
        run(&space, s.as_mut(), budget, &mut || Duration::ZERO, |p| {
            i += 1;
            // Every 5th evaluation fails, to exercise that path too.
            if noise && i % 5 == 0 {
                Eval::Failed
            } else {
                Eval::Value(truth[p])
            }
        })
        .expect("valid")
        .trials
        .iter()
        .map(|t| t.point)
        .collect()
    };
    for kind in StrategyKind::ALL {
        for failures in [false, true] {
            assert_eq!(
                order(kind, 11, failures),
                order(kind, 11, failures),
                "{kind}"
            );
        }
    }
    for kind in SEEDED {
        assert_ne!(order(kind, 1, false), order(kind, 2, false), "{kind}");
    }
    // Exhaustive is spec order whatever the seed.
    assert_eq!(
        order(StrategyKind::Exhaustive, 1, false),
        (0..40).collect::<Vec<_>>()
    );
}

#[test]
fn no_strategy_evaluates_a_point_twice_and_an_unlimited_search_covers_the_space() {
    for space in [gemv_like(), union_like()] {
        let truth = smooth(
            &space,
            &vec![1; space.dims().len()],
            &vec![1.0; space.dims().len()],
        );
        for kind in StrategyKind::ALL {
            let mut s = kind.build(3);
            let mut seen = vec![0u32; space.len()];
            let log = run(
                &space,
                s.as_mut(),
                Budget::default(),
                &mut || Duration::ZERO,
                |p| {
                    seen[p] += 1;
                    if p % 7 == 0 {
                        Eval::Failed
                    } else {
                        Eval::Value(truth[p])
                    }
                },
            )
            .expect("no repeated or out-of-range point");
            assert_eq!(log.stop, Stop::Exhausted, "{kind}");
            assert_eq!(log.trials.len(), space.len(), "{kind}");
            assert!(seen.iter().all(|&n| n == 1), "{kind}: {seen:?}");
        }
    }
}

/// A strategy that repeats itself is stopped by the driver, not run twice.
#[test]
fn the_driver_refuses_a_repeated_point() {
    struct Stuck;
    impl Strategy for Stuck {
        fn next(&mut self, _: &Space, _: &[Trial]) -> Option<usize> {
            Some(0)
        }
    }
    let space = gemv_like();
    let mut calls = 0;
    let r = run(
        &space,
        &mut Stuck,
        Budget::default(),
        &mut || Duration::ZERO,
        |_| {
            calls += 1;
            Eval::Value(1.0)
        },
    );
    assert_eq!(r.err(), Some(SearchError::Repeated { point: 0 }));
    assert_eq!(calls, 1);
}

#[test]
fn model_based_and_evolutionary_beat_random_on_a_smooth_objective() {
    let space = gemv_like();
    let truth = smooth(&space, &[2, 1, 0, 1], &[2.0, 1.0, 1.5, 0.3]);
    let seeds = 24;
    let random = mean_evals(&space, &truth, StrategyKind::Random, seeds, 0.0);
    let evo = mean_evals(&space, &truth, StrategyKind::Evolutionary, seeds, 0.0);
    let bayes = mean_evals(&space, &truth, StrategyKind::Bayes, seeds, 0.0);
    assert!(bayes <= 0.5 * random, "bayes {bayes} vs random {random}");
    assert!(evo <= 0.8 * random, "evolutionary {evo} vs random {random}");
}

#[test]
fn bayes_and_evolutionary_beat_random_on_a_noisy_objective() {
    let space = attn_like();
    let truth = smooth(&space, &[1, 2, 1, 2, 0], &[1.0, 1.5, 0.5, 2.0, 1.0]);
    let seeds = 16;
    let random = mean_evals(&space, &truth, StrategyKind::Random, seeds, 0.03);
    let evo = mean_evals(&space, &truth, StrategyKind::Evolutionary, seeds, 0.03);
    let bayes = mean_evals(&space, &truth, StrategyKind::Bayes, seeds, 0.03);
    assert!(bayes <= 0.5 * random, "bayes {bayes} vs random {random}");
    assert!(evo <= 0.6 * random, "evolutionary {evo} vs random {random}");
}

#[test]
fn space_drops_constant_defines_and_maps_children_onto_listed_points() {
    use gemtune_kernels::defines::{defines, DefineValue};
    let pts = vec![
        (
            "a".to_string(),
            defines([
                ("X", DefineValue::Int(1)),
                ("W", DefineValue::Str("Q8_0".into())),
            ]),
        ),
        (
            "b".to_string(),
            defines([
                ("X", DefineValue::Int(4)),
                ("W", DefineValue::Str("Q8_0".into())),
            ]),
        ),
        (
            "c".to_string(),
            defines([
                ("X", DefineValue::Int(2)),
                ("W", DefineValue::Str("Q8_0".into())),
            ]),
        ),
        // Same defines as "a": not a second point.
        (
            "a2".to_string(),
            defines([
                ("X", DefineValue::Int(1)),
                ("W", DefineValue::Str("Q8_0".into())),
            ]),
        ),
    ];
    let s = Space::from_defines(&pts);
    assert_eq!(s.len(), 3);
    assert_eq!(s.dims().len(), 1, "W is constant");
    assert_eq!(s.dims()[0].kind, DimKind::Ordinal);
    // Ranks: X=1 -> 0, X=2 -> 1, X=4 -> 2, whatever the listing order.
    assert_eq!(s.coords(1), &[2]);
    assert_eq!(s.features(2), &[0.5]);
    assert_eq!(s.find(&[1]), Some(2));
    assert_eq!(s.int_value(1, "X"), Some(4));
}

/// An integer define numbered 0, 1, .., n-1 (n >= 3) is a list of modes
/// (gemv's ALGO): equal or different, not near or far. Other integer axes,
/// and two-valued ones, stay ordinal.
#[test]
fn numbered_modes_are_categorical() {
    use gemtune_kernels::defines::{defines, DefineValue};
    let pt = |a: i64, r: i64, s: i64| {
        (
            format!("A{a}R{r}S{s}"),
            defines([
                ("ALGO", DefineValue::Int(a)),
                ("ROWS", DefineValue::Int(r)),
                ("STAGES", DefineValue::Int(s)),
            ]),
        )
    };
    let s = Space::from_defines(&[pt(0, 1, 2), pt(1, 2, 3), pt(2, 4, 4), pt(3, 8, 2)]);
    let kind = |n: &str| s.dims().iter().find(|d| d.name == n).map(|d| d.kind);
    assert_eq!(kind("ALGO"), Some(DimKind::Categorical));
    assert_eq!(kind("ROWS"), Some(DimKind::Ordinal));
    assert_eq!(
        kind("STAGES"),
        Some(DimKind::Ordinal),
        "2, 3, 4 does not start at 0"
    );
    // Only ALGO varies: ALGO 0 is as far from 3 as from 1.
    let algo = Space::from_defines(&[pt(0, 1, 2), pt(1, 1, 2), pt(2, 1, 2), pt(3, 1, 2)]);
    let d2 = |a: usize, b: usize| -> f64 {
        algo.features(a)
            .iter()
            .zip(algo.features(b))
            .map(|(x, y)| (x - y) * (x - y))
            .sum()
    };
    assert!((d2(0, 1) - 1.0).abs() < 1e-12 && (d2(0, 3) - 1.0).abs() < 1e-12);
    let two = Space::from_defines(&[pt(0, 1, 2), pt(1, 1, 2)]);
    assert_eq!(
        two.dims()[0].kind,
        DimKind::Ordinal,
        "two modes: either kind measures alike"
    );
}

/// The family's `validate` runs when the space is built: on a shape where
/// it rejects cells, no strategy ever hands one to the evaluator (which
/// stands for compile + check + time and counts both).
#[test]
fn restrictions_are_applied_before_any_compile_or_evaluation() {
    use crate::spec;
    use gemtune_kernels::defines::canonical;
    let vdir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../variants");
    let (s, family) = spec::load_family(&vdir, "gemv").expect("gemv spec");
    let points = spec::expand(&s);
    let shapes = spec::ShapesFile::parse(
        "t.toml",
        "[shapes]\nq6 = { m = 2, n = 64, k = 256, wtype = \"Q6_K\" }\n",
    )
    .expect("shape")
    .expand();
    let lim = gemtune_kernels::family::DeviceLimits::for_arch(gemtune_kernels::compile::Arch(90));
    let ss = cells::shape_space(family, &points, &shapes[0], &lim);
    let live = points.iter().filter(|p| p.duplicate_of.is_none()).count();
    assert_eq!(ss.accepted.len() + ss.rejected.len(), live);
    assert!(
        !ss.rejected.is_empty() && !ss.accepted.is_empty(),
        "Q6_K rejects some gemv points, not all"
    );
    assert_eq!(ss.space.len(), ss.accepted.len());
    let rejected: std::collections::BTreeSet<String> =
        ss.rejected.iter().map(|c| canonical(&c.defines)).collect();
    for kind in StrategyKind::ALL {
        for budget in [
            Budget::default(),
            Budget {
                max_evals: Some(4),
                time_limit: None,
            },
        ] {
            let mut compiled = std::collections::BTreeSet::new();
            let mut evaluations = 0usize;
            let mut st = kind.build(5);
            let log = run(
                &ss.space,
                st.as_mut(),
                budget,
                &mut || Duration::ZERO,
                |p| {
                    let cell = &ss.accepted[p];
                    let key = canonical(&cell.defines);
                    assert!(
                        !rejected.contains(&key),
                        "{kind}: a rejected cell reached the evaluator"
                    );
                    assert!(family
                        .validate(&cell.defines, &shapes[0].problem(), &lim)
                        .is_ok());
                    compiled.insert(key);
                    evaluations += 1;
                    Eval::Value(1.0 + p as f64)
                },
            )
            .expect("valid");
            let want = budget.max_evals.unwrap_or(ss.accepted.len());
            assert_eq!(evaluations, want, "{kind}");
            assert_eq!(
                compiled.len(),
                want,
                "{kind}: one compile per evaluated cell"
            );
            assert_eq!(log.trials.len(), want, "{kind}");
        }
    }
}

fn row(
    shape: &str,
    regime: &str,
    variant: &str,
    defines: &str,
    median: f64,
) -> crate::results::TuneRow {
    crate::results::TuneRow {
        kind: crate::results::KIND_VARIANT.into(),
        family: "f".into(),
        variant: variant.into(),
        defines: defines.into(),
        shape: shape.into(),
        regime: regime.into(),
        verdict: crate::results::VERDICT_TIMED.into(),
        median_us: median,
        ..Default::default()
    }
}

/// A replay groups rows by (family, shape, regime), keeps timed variant
/// rows only, and counts evaluations up to the first point within the
/// tolerance of the best.
#[test]
fn replay_groups_rows_and_counts_evaluations_to_the_target() {
    let mut rows = Vec::new();
    // 10 points; values 20, 19, ..., 11 except point 6 at 10.2 (within 3 %
    // of the best, point 8 at 10.0).
    for i in 0..10 {
        let v = match i {
            6 => 10.2,
            8 => 10.0,
            _ => 20.0 - i as f64,
        };
        rows.push(row(
            "s",
            "dram",
            &format!("v{i}"),
            &format!("A={i} WTYPE=Q8_0"),
            v,
        ));
    }
    rows.push(row("s", "l2", "v0", "A=0 WTYPE=Q8_0", 5.0));
    let mut reference = row("s", "dram", "cublas", "", 1.0);
    reference.kind = crate::results::KIND_REFERENCE.into();
    rows.push(reference);
    let mut failed = row("s", "dram", "v10", "A=10 WTYPE=Q8_0", f64::NAN);
    failed.verdict = "error".into();
    rows.push(failed);
    let groups = replay::groups(&rows, 2);
    assert_eq!(
        groups.len(),
        1,
        "the l2 group has one point, below the minimum"
    );
    let g = &groups[0];
    assert_eq!((g.space.len(), g.best()), (10, 10.0));
    assert_eq!(g.space.dims().len(), 1, "WTYPE is constant");
    // Exhaustive walks file order: point 6 is the first within 3 %.
    assert_eq!(
        replay::evals_to_target(g, StrategyKind::Exhaustive, 0, 0.03),
        Ok(7)
    );
    // Within 1 %, only point 8 counts.
    assert_eq!(
        replay::evals_to_target(g, StrategyKind::Exhaustive, 0, 0.01),
        Ok(9)
    );
    for kind in StrategyKind::ALL {
        let e = replay::evals_to_target(g, kind, 3, 0.03).expect("valid");
        assert!((1..=10).contains(&e), "{kind}: {e}");
    }
}
