//! The family's CPU tests: validation and shared memory, the check's
//! routing, inputs, references and replays, and the byte counts.

use super::super::matmul_q8_replay;
use super::reference::check_routing;
use super::workload::count_mismatch;
use super::*;
use crate::compile::Arch;
use crate::families::{gelu_tanh_f64, q8_1_replay, rng_for};

fn prob(tokens: usize, experts: usize, used: usize, d: usize, ffn: usize, t: GgmlType) -> Problem {
    Problem::Moe(MoeProblem {
        tokens,
        d_model: d,
        ffn,
        experts,
        used,
        wtype: t,
    })
}

fn with(d: &Defines, kv: &[(&str, DefineValue)]) -> Defines {
    let mut d = d.clone();
    for (k, v) in kv {
        d.insert((*k).into(), v.clone());
    }
    d
}

/// main's two expert stages on the Q8_0 defaults `base`: GATE_UP on split
/// Q8 writing h as records, DOWN reading them (ALGO 3, split-K 4).
fn main_records_stages(base: &Defines) -> (Defines, Defines) {
    let gu = with(
        base,
        &[
            ("ALGO", 2i64.into()),
            ("ROWS", 4i64.into()),
            ("WARPS", 8i64.into()),
            ("H_RECORDS", 1i64.into()),
        ],
    );
    let down = with(
        base,
        &[
            ("STAGE", "DOWN".into()),
            ("ALGO", 3i64.into()),
            ("ROWS", 4i64.into()),
            ("WARPS", 8i64.into()),
            ("KSPLIT", 4i64.into()),
        ],
    );
    (gu, down)
}

#[test]
fn validate_gives_both_stages_their_geometry() {
    let f = MoeGemv;
    let lim = DeviceLimits::for_arch(Arch(90));
    let d = f.default_defines(GgmlType::Q8_0);
    let p = prob(8, 128, 8, 2816, 704, GgmlType::Q8_0);
    let g = f.validate(&d, &p, &lim).expect("gate_up");
    assert_eq!(g.kernel, "moe_gemv_gate_up_n8");
    assert_eq!(g.grid, (176, 64, 1));
    let down = with(&d, &[("STAGE", "DOWN".into()), ("ROWS", 2i64.into())]);
    let g = f.validate(&down, &p, &lim).expect("down");
    assert_eq!(g.kernel, "moe_gemv_down_n8");
    assert_eq!(g.grid, (352, 1, 1));
    // KSPLIT warps share each group of rows: 4 warps, 2 groups of 2.
    let split = with(&down, &[("KSPLIT", 2i64.into())]);
    let g = f.validate(&split, &p, &lim).expect("down, split");
    assert_eq!((g.grid, g.block), ((704, 1, 1), (128, 1, 1)));
    // Few experts: one group per expert at most.
    let g = f
        .validate(&d, &prob(8, 8, 2, 256, 96, GgmlType::Q8_0), &lim)
        .expect("tiny");
    assert_eq!(g.grid, (24, 8, 1));
}

#[test]
fn validate_rejects_bad_points_with_reasons() {
    let f = MoeGemv;
    let lim = DeviceLimits::for_arch(Arch(90));
    let bad = |d: &Defines, p: Problem, want: &str| {
        let e = f.validate(d, &p, &lim).expect_err(want);
        assert!(e.contains(want), "{e}");
    };
    let d = f.default_defines(GgmlType::Q8_0);
    let p = prob(1, 128, 8, 2816, 704, GgmlType::Q8_0);
    bad(
        &d,
        prob(9, 128, 8, 2816, 704, GgmlType::Q8_0),
        "1..8 tokens",
    );
    bad(&d, prob(1, 64, 40, 2816, 704, GgmlType::Q8_0), "at most 32");
    bad(&d, prob(1, 8, 9, 2816, 704, GgmlType::Q8_0), "used = 9");
    bad(
        &d,
        prob(1, 8, 2, 2832 + 8, 704, GgmlType::Q8_0),
        "gate_up (k = d_model)",
    );
    let down = with(&d, &[("STAGE", "DOWN".into())]);
    bad(
        &down,
        prob(1, 8, 2, 2816, 700, GgmlType::Q8_0),
        "down (k = ffn)",
    );
    // Q4_K on the 26B-A4B down projection: 704 is not whole super-blocks
    // (llama.cpp stores that tensor in another type).
    let k4 = f.default_defines(GgmlType::Q4K);
    f.validate(&k4, &prob(1, 128, 8, 2816, 704, GgmlType::Q4K), &lim)
        .expect("Q4_K gate_up");
    bad(
        &with(&k4, &[("STAGE", "DOWN".into())]),
        prob(1, 128, 8, 2816, 704, GgmlType::Q4K),
        "256-element q4_K block",
    );
    bad(
        &with(&k4, &[("LAYOUT", 0i64.into())]),
        prob(1, 128, 8, 2816, 704, GgmlType::Q4K),
        "need LAYOUT=1",
    );
    let f16 = f.default_defines(GgmlType::F16);
    bad(
        &with(&f16, &[("STAGE", "DOWN".into())]),
        prob(1, 8, 2, 64, 36, GgmlType::F16),
        "multiple of 8",
    );
    bad(&with(&d, &[("STAGE", "UP".into())]), p, "STAGE=UP");
    bad(&with(&d, &[("ROWS", 3i64.into())]), p, "ROWS=3");
    bad(&with(&d, &[("WARPS", 16i64.into())]), p, "WARPS=16");
    bad(&with(&d, &[("UNROLL", 3i64.into())]), p, "UNROLL=3");
    bad(&with(&d, &[("KSPLIT", 2i64.into())]), p, "applies to DOWN");
    let down = with(&d, &[("STAGE", "DOWN".into())]);
    bad(&with(&down, &[("KSPLIT", 3i64.into())]), p, "KSPLIT=3");
    bad(
        &with(&down, &[("KSPLIT", 8i64.into())]),
        p,
        "does not divide WARPS=4",
    );
    bad(
        &with(&d, &[("ROWS", 4i64.into()), ("UNROLL", 4i64.into())]),
        p,
        "register budget",
    );
    bad(
        &with(&k4, &[("ROWS", 2i64.into()), ("UNROLL", 2i64.into())]),
        prob(1, 128, 8, 2816, 704, GgmlType::Q4K),
        "k-quant gate_up",
    );
    bad(
        &with(&d, &[("COUNT_BYTES", 2i64.into())]),
        p,
        "COUNT_BYTES=2",
    );
    bad(&with(&d, &[("WTYPE", "Q4_0".into())]), p, "does not match");
    bad(
        &with(&d, &[("WTYPE", "F32".into())]),
        prob(1, 8, 2, 64, 32, GgmlType::F32),
        "implement",
    );
    bad(
        &d,
        Problem::matmul(1, 8, 64, GgmlType::Q8_0),
        "runs on moe shapes",
    );
}

/// ALGO 1 asks for the Q8_1 activations in dynamic shared memory (x of
/// every token for GATE_UP, h of every pair for DOWN), is the approx
/// contract, and refuses the weights its dp4a products cannot read and
/// activations beyond the device's shared memory.
#[test]
fn dp4a_points_size_their_shared_memory_and_refuse_what_they_cannot_read() {
    let f = MoeGemv;
    let lim = DeviceLimits::for_arch(Arch(90));
    let d = with(&f.default_defines(GgmlType::Q8_0), &[("ALGO", 1i64.into())]);
    assert_eq!(f.contract(&d), Contract::Approx);
    assert_eq!(f.contract(&f.default_defines(GgmlType::Q8_0)), Contract::Fp);
    let p = prob(8, 128, 8, 2816, 704, GgmlType::Q8_0);
    let g = f.validate(&d, &p, &lim).expect("gate_up");
    assert_eq!(g.dyn_smem, 8 * 2816 + 8 * 2816 / 32 * 8);
    let down = with(&d, &[("STAGE", "DOWN".into())]);
    let g = f.validate(&down, &p, &lim).expect("down");
    assert_eq!(g.dyn_smem, 8 * 8 * 704 * 5 / 4);
    let g = f
        .validate(&down, &prob(1, 128, 8, 2816, 704, GgmlType::Q8_0), &lim)
        .expect("down, one token");
    assert_eq!(g.dyn_smem, 8 * 704 * 5 / 4);
    // The FMA form takes none.
    let fma = f.default_defines(GgmlType::Q8_0);
    assert_eq!(f.validate(&fma, &p, &lim).expect("fma").dyn_smem, 0);
    let tol = f.default_tolerance(&down, &p);
    assert_eq!(tol.rms_rel, 1e-2);
    assert!(tol.replay_rms_rel < 1e-4, "{tol:?}");
    assert!(f.default_tolerance(&d, &p).rms_rel > tol.rms_rel);
    let bad = |d: &Defines, p: Problem, want: &str| {
        let e = f.validate(d, &p, &lim).expect_err(want);
        assert!(e.contains(want), "{e}");
    };
    let f16 = with(&f.default_defines(GgmlType::F16), &[("ALGO", 1i64.into())]);
    bad(&f16, prob(3, 6, 3, 264, 40, GgmlType::F16), "not F16");
    let q6 = with(
        &f.default_defines(GgmlType::Q6K),
        &[("ALGO", 1i64.into()), ("LAYOUT", 0i64.into())],
    );
    bad(&q6, prob(1, 8, 2, 512, 256, GgmlType::Q6K), "LAYOUT=0");
    bad(&with(&d, &[("ALGO", 3i64.into())]), p, "ALGO=3");
    // ALGO 2: an 80-byte split record per 32 values, the approx
    // contract at the split's bound.
    let split = with(&down, &[("ALGO", 2i64.into())]);
    assert_eq!(f.contract(&split), Contract::Approx);
    let g = f.validate(&split, &p, &lim).expect("down, split");
    assert_eq!(g.dyn_smem, 8 * 8 * 704 / 32 * 80);
    assert_eq!(f.default_tolerance(&split, &p).rms_rel, 1e-4);
    // sm_89's 99 KB hold no 8-token DOWN split of 26B-A4B (110 KB).
    let e = f
        .validate(&split, &p, &DeviceLimits::for_arch(Arch(89)))
        .expect_err("sm_89");
    assert!(e.contains("ALGO=2 at 8 tokens"), "{e}");
    // 8 tokens x 8 experts of a wide expert FFN: h does not fit.
    bad(
        &down,
        prob(8, 128, 8, 2816, 4096, GgmlType::Q8_0),
        "exceed the device's",
    );
}

/// H_RECORDS=1 (GATE_UP writes h as split records) needs blocks of whole
/// 32-row records and an ffn of whole records; DOWN's ALGO 3 reads them
/// from global memory (no dynamic shared memory), on planes only. Both
/// are the approx contract at the split's bound, GATE_UP's widened by the
/// records' own rounding.
#[test]
fn records_points_need_whole_records_and_planes() {
    let f = MoeGemv;
    let lim = DeviceLimits::for_arch(Arch(90));
    let p = prob(8, 128, 8, 2816, 704, GgmlType::Q8_0);
    let base = f.default_defines(GgmlType::Q8_0);
    assert!(!h_records(&base));
    let gu = with(
        &base,
        &[
            ("ALGO", 2i64.into()),
            ("ROWS", 4i64.into()),
            ("WARPS", 8i64.into()),
            ("H_RECORDS", 1i64.into()),
        ],
    );
    assert!(h_records(&gu));
    assert_eq!(f.contract(&gu), Contract::Approx);
    let g = f.validate(&gu, &p, &lim).expect("gate_up writing records");
    assert_eq!(g.grid, (22, 64, 1));
    let plain = with(&gu, &[("H_RECORDS", 0i64.into())]);
    assert!(
        f.default_tolerance(&gu, &p).replay_rms_rel
            > f.default_tolerance(&plain, &p).replay_rms_rel
    );
    // The FMA form writing records is approx too (the records' rounding).
    let fma = with(&gu, &[("ALGO", 0i64.into())]);
    assert_eq!(f.contract(&fma), Contract::Approx);
    let bad = |d: &Defines, p: &Problem, want: &str| {
        let e = f.validate(d, p, &lim).expect_err(want);
        assert!(e.contains(want), "{e}");
    };
    bad(
        &with(&gu, &[("ROWS", 2i64.into())]),
        &p,
        "not a multiple of 32",
    );
    bad(
        &gu,
        &prob(3, 6, 3, 256, 40, GgmlType::Q8_0),
        "ffn=40 is not a multiple of 32",
    );
    let down = with(
        &base,
        &[
            ("STAGE", "DOWN".into()),
            ("ALGO", 3i64.into()),
            ("ROWS", 4i64.into()),
            ("WARPS", 8i64.into()),
            ("KSPLIT", 4i64.into()),
        ],
    );
    assert_eq!(f.contract(&down), Contract::Approx);
    let g = f.validate(&down, &p, &lim).expect("down on records");
    assert_eq!(g.dyn_smem, 0);
    assert_eq!(g.grid, (352, 1, 1));
    assert_eq!(f.default_tolerance(&down, &p).rms_rel, 1e-4);
    bad(
        &with(&down, &[("H_RECORDS", 1i64.into())]),
        &p,
        "H_RECORDS=1 is GATE_UP's",
    );
    bad(&with(&down, &[("LAYOUT", 0i64.into())]), &p, "LAYOUT=1");
    bad(
        &with(
            &f.default_defines(GgmlType::F16),
            &[("STAGE", "DOWN".into()), ("ALGO", 3i64.into())],
        ),
        &prob(3, 6, 3, 264, 64, GgmlType::F16),
        "not F16",
    );
}

/// MINB (the one-token entry's blocks per SM) and HOIST (the prologue's
/// order under ALGO 1 and 2) change neither the launch nor the contract;
/// MINB takes 1..4, HOIST=1 only where the block quantizes activations.
#[test]
fn minb_and_hoist_keep_the_launch_and_refuse_what_they_cannot_do() {
    let f = MoeGemv;
    let lim = DeviceLimits::for_arch(Arch(90));
    let base = f.default_defines(GgmlType::Q8_0);
    assert_eq!(base.get("MINB"), Some(&DefineValue::Int(1)));
    assert_eq!(base.get("HOIST"), Some(&DefineValue::Int(0)));
    let (gu, down) = main_records_stages(&base);
    for tokens in [1, 8] {
        let p = prob(tokens, 128, 8, 2816, 704, GgmlType::Q8_0);
        for d in [&gu, &down] {
            let g = f.validate(d, &p, &lim).expect("base point");
            for minb in 1..=4i64 {
                let m = with(d, &[("MINB", minb.into())]);
                assert_eq!(f.validate(&m, &p, &lim).expect("MINB"), g);
                assert_eq!(f.contract(&m), f.contract(d));
            }
        }
        let hoisted = with(&gu, &[("HOIST", 1i64.into())]);
        let g = f.validate(&gu, &p, &lim).expect("gate_up");
        assert_eq!(f.validate(&hoisted, &p, &lim).expect("HOIST=1"), g);
        assert_eq!(f.contract(&hoisted), Contract::Approx);
    }
    // The one-token grids MINB is for: 22 x 8 GATE_UP blocks of 8 warps,
    // 352 DOWN blocks.
    let p = prob(1, 128, 8, 2816, 704, GgmlType::Q8_0);
    assert_eq!(f.validate(&gu, &p, &lim).expect("gate_up").grid, (22, 8, 1));
    assert_eq!(f.validate(&down, &p, &lim).expect("down").grid, (352, 1, 1));
    let bad = |d: &Defines, want: &str| {
        let e = f.validate(d, &p, &lim).expect_err(want);
        assert!(e.contains(want), "{e}");
    };
    for minb in [0i64, 5, 8] {
        bad(
            &with(&gu, &[("MINB", minb.into())]),
            &format!("MINB={minb}"),
        );
    }
    let mut missing = gu.clone();
    missing.remove("MINB");
    bad(&missing, "define MINB is required");
    bad(&with(&gu, &[("HOIST", 2i64.into())]), "HOIST=2");
    // ALGO 0 and 3 quantize nothing the weight loads could overlap.
    bad(&with(&base, &[("HOIST", 1i64.into())]), "HOIST=1 overlaps");
    bad(&with(&down, &[("HOIST", 1i64.into())]), "not ALGO=3");
    let split_down = with(&down, &[("ALGO", 2i64.into()), ("HOIST", 1i64.into())]);
    f.validate(&split_down, &p, &lim)
        .expect("DOWN ALGO 2 hoisted");
    let q8_1 = with(&gu, &[("ALGO", 1i64.into()), ("HOIST", 1i64.into())]);
    f.validate(&q8_1, &p, &lim).expect("GATE_UP ALGO 1 hoisted");
}

/// PRELOAD (work on earlier grids' outputs before the chained launch's
/// wait) changes neither the launch nor the contract. DOWN takes it on
/// every ALGO; GATE_UP only where it quantizes x (ALGO 1, 2) without
/// HOIST, whose first loads need the ids its predecessor writes. Absent
/// is 0 (tables written before the define).
#[test]
fn preload_keeps_the_launch_and_refuses_what_it_cannot_do() {
    let f = MoeGemv;
    let lim = DeviceLimits::for_arch(Arch(90));
    let base = f.default_defines(GgmlType::Q8_0);
    assert_eq!(base.get("PRELOAD"), Some(&DefineValue::Int(0)));
    let (gu, down) = main_records_stages(&base);
    let down_split = with(&down, &[("ALGO", 2i64.into()), ("KSPLIT", 2i64.into())]);
    let down_fma = with(&down, &[("ALGO", 0i64.into())]);
    let down_q8_1 = with(
        &down_split,
        &[("ALGO", 1i64.into()), ("HOIST", 1i64.into())],
    );
    for tokens in [1, 3, 8] {
        let p = prob(tokens, 128, 8, 2816, 704, GgmlType::Q8_0);
        for d in [&gu, &down, &down_split, &down_fma, &down_q8_1] {
            let g = f.validate(d, &p, &lim).expect("PRELOAD=0");
            let pre = with(d, &[("PRELOAD", 1i64.into())]);
            assert_eq!(f.validate(&pre, &p, &lim).expect("PRELOAD=1"), g);
            assert_eq!(f.contract(&pre), f.contract(d));
            let mut absent = d.clone();
            absent.remove("PRELOAD");
            assert_eq!(f.validate(&absent, &p, &lim).expect("no PRELOAD"), g);
        }
    }
    let p = prob(1, 128, 8, 2816, 704, GgmlType::Q8_0);
    let bad = |d: &Defines, want: &str| {
        let e = f.validate(d, &p, &lim).expect_err(want);
        assert!(e.contains(want), "{e}");
    };
    bad(&with(&down, &[("PRELOAD", 2i64.into())]), "STAGE=DOWN");
    bad(&with(&down, &[("PRELOAD", 3i64.into())]), "PRELOAD=2 runs");
    // PRELOAD=2: GATE_UP's HOIST prologue before the wait; the same launch.
    let gu_hoist = with(&gu, &[("HOIST", 1i64.into())]);
    for tokens in [1, 3, 8] {
        let p = prob(tokens, 128, 8, 2816, 704, GgmlType::Q8_0);
        let g = f.validate(&gu_hoist, &p, &lim).expect("HOIST=1");
        let pre = with(&gu_hoist, &[("PRELOAD", 2i64.into())]);
        assert_eq!(f.validate(&pre, &p, &lim).expect("PRELOAD=2"), g);
        assert_eq!(f.contract(&pre), f.contract(&gu_hoist));
    }
    bad(&with(&gu, &[("PRELOAD", 2i64.into())]), "HOIST=0");
    // GATE_UP: FMA on f32 x (nothing to quantize), and HOIST.
    bad(&with(&base, &[("PRELOAD", 1i64.into())]), "not ALGO=0");
    bad(
        &with(&gu, &[("PRELOAD", 1i64.into()), ("HOIST", 1i64.into())]),
        "HOIST=1",
    );
}

/// ALGO 1's replay is each pair's dense Q8_1 replay
/// (`matmul_q8_replay`, the dense dp4a GEMV's) on the chosen expert's
/// rows: GATE_UP through gelu(g) * u, DOWN weighted and summed.
#[test]
fn q8_1_replay_is_the_dense_replay_per_pair() {
    let p = MoeProblem {
        tokens: 2,
        d_model: 64,
        ffn: 32,
        experts: 4,
        used: 2,
        wtype: GgmlType::Q8_0,
    };
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * (1.0 + b.abs());
    let gu = moe_inputs(&p, Stage::GateUp, WType::Q8_0, 3).expect("gate_up inputs");
    let got = replay_q8_1(&p, Stage::GateUp, &gu);
    let exact = reference(&p, Stage::GateUp, &gu);
    let (q, ds) = q8_1_replay(&gu.act);
    for pair in 0..p.tokens * p.used {
        let t = pair / p.used;
        let w = &gu.tensor.deq[&(gu.ids[pair] as usize)];
        let x = |v: &[i8]| v[t * 64..(t + 1) * 64].to_vec();
        let rows = matmul_q8_replay(w, &x(&q), &ds[t * 2..(t + 1) * 2], 1, 64, 64);
        for r in 0..32 {
            let want = gelu_tanh_f64(rows[r]) * rows[32 + r];
            assert!(close(got[pair * 32 + r], want), "{pair} {r}");
        }
    }
    assert_ne!(got, exact, "the replay is on the quantized activations");
    // ALGO 2: the same stage on the split records' values, far closer
    // to the exact activations than Q8_1.
    let split = replay_split(&p, Stage::GateUp, &gu);
    let err = |a: &[f64]| -> f64 {
        a.iter()
            .zip(&exact)
            .map(|(x, y)| (x - y).powi(2))
            .sum::<f64>()
            .sqrt()
    };
    assert!(
        err(&split) > 0.0 && err(&split) < 1e-2 * err(&got),
        "{} {}",
        err(&split),
        err(&got)
    );
    let dn = moe_inputs(&p, Stage::Down, WType::Q8_0, 3).expect("down inputs");
    let got = replay_q8_1(&p, Stage::Down, &dn);
    let (q, ds) = q8_1_replay(&dn.act);
    for t in 0..p.tokens {
        let mut want = [0f64; 64];
        for j in 0..p.used {
            let pair = t * p.used + j;
            let w = &dn.tensor.deq[&(dn.ids[pair] as usize)];
            let rows = matmul_q8_replay(
                w,
                &q[pair * 32..(pair + 1) * 32],
                &ds[pair..pair + 1],
                1,
                64,
                32,
            );
            for (o, v) in want.iter_mut().zip(rows) {
                *o += dn.weights[pair] as f64 * v;
            }
        }
        for r in 0..64 {
            assert!(close(got[t * 64 + r], want[r]), "{t} {r}");
        }
    }
}

#[test]
fn routing_is_distinct_per_token_and_grouping_keeps_first_appearance() {
    let p = MoeProblem {
        tokens: 8,
        d_model: 64,
        ffn: 32,
        experts: 8,
        used: 3,
        wtype: GgmlType::Q8_0,
    };
    let mut rng = rng_for("moe-routing-test", &[1], 1);
    let (ids, w) = check_routing(&mut rng, &p);
    for t in 0..8 {
        let row = &ids[3 * t..3 * t + 3];
        assert!(row.iter().all(|&e| (0..8).contains(&e)));
        assert!(
            row[0] != row[1] && row[1] != row[2] && row[0] != row[2],
            "{row:?}"
        );
        let s: f32 = w[3 * t..3 * t + 3].iter().sum();
        assert!((s - 1.0).abs() < 1e-5);
    }
    // 24 draws from 8 experts: tokens share.
    let u = distinct_experts(&ids);
    assert!(u.len() <= 8 && u.len() < ids.len());
    assert_eq!(distinct_experts(&[5, 2, 5, 7, 2, -1, 0]), vec![5, 2, 7, 0]);
}

/// The assembled tensor holds each chosen expert's own rows at its
/// offset in every buffer, and the decoy everywhere else; the exact
/// values are those rows' dequantization.
#[test]
fn expert_tensor_places_chosen_experts_and_the_decoy() {
    for wt in [WType::Q8_0, WType::Q4_0, WType::Q4K] {
        let (experts, rows, k) = (5usize, 3usize, 256usize);
        let t = expert_tensor("moe-tensor-test", &[1], wt, experts, rows, k, &[3, 1], 9)
            .expect("tensor");
        let rb = wt.row_bytes(k) * rows;
        let g = |e: usize| &t.all.gguf[e * rb..(e + 1) * rb];
        assert_ne!(g(3), g(1));
        assert_eq!(g(0), g(2));
        assert_eq!(g(0), g(4));
        assert_ne!(g(0), g(3));
        assert_eq!(t.deq.len(), 2);
        for e in [1usize, 3] {
            let mut v = vec![0f32; rows * k];
            crate::quant::dequantize_row(wt.ggml(), g(e), &mut v).expect("deq");
            assert_eq!(v, t.deq[&e]);
        }
        let qb = t.all.qplane.len() / experts;
        assert_eq!(qb * experts, t.all.qplane.len());
        assert_ne!(&t.all.qplane[qb..2 * qb], &t.all.qplane[..qb]);
        assert_eq!(&t.all.qplane[2 * qb..3 * qb], &t.all.qplane[..qb]);
    }
}

#[test]
fn count_mismatch_names_the_expert() {
    assert_eq!(count_mismatch(&[0, 10, 0], &[0, 10, 0]), None);
    let m = count_mismatch(&[0, 20, 0], &[0, 10, 0]).expect("double read");
    assert!(m.contains("expert 1: 20 bytes read, 10 expected"), "{m}");
    let m = count_mismatch(&[5, 10, 0], &[0, 10, 0]).expect("unchosen read");
    assert!(m.contains("expert 0: 5 bytes read, 0 expected"), "{m}");
}

/// The references of both stages agree with `oracle::moe_ffn` run on
/// the same dequantized experts (GATE_UP's h fed to DOWN).
#[test]
fn stage_references_compose_to_the_oracle() {
    let p = MoeProblem {
        tokens: 3,
        d_model: 64,
        ffn: 32,
        experts: 4,
        used: 2,
        wtype: GgmlType::Q8_0,
    };
    let gu = moe_inputs(&p, Stage::GateUp, WType::Q8_0, 5).expect("gate_up inputs");
    let h = reference(&p, Stage::GateUp, &gu);
    // DOWN on GATE_UP's h, with GATE_UP's routing and its own weights
    // for the same experts.
    let mut dn = moe_inputs(&p, Stage::Down, WType::Q8_0, 5).expect("down inputs");
    dn.ids = gu.ids.clone();
    dn.weights = gu.weights.clone();
    dn.act = h.iter().map(|&v| v as f32).collect();
    let chosen = distinct_experts(&dn.ids);
    dn.tensor = expert_tensor("moe-compose", &[2], WType::Q8_0, 4, 64, 32, &chosen, 5)
        .expect("down tensor");
    let y = reference(&p, Stage::Down, &dn);
    // The oracle on full dequantized tensors (decoy rows where unchosen).
    let full = |t: &ExpertTensor, rows: usize, k: usize| -> Vec<f32> {
        (0..4)
            .flat_map(|e| {
                t.deq
                    .get(&e)
                    .cloned()
                    .unwrap_or_else(|| vec![0f32; rows * k])
            })
            .collect()
    };
    let ids: Vec<usize> = gu.ids.iter().map(|&e| e as usize).collect();
    let mut out = vec![0f32; 3 * 64];
    crate::oracle::moe_ffn(
        &gu.act,
        &full(&gu.tensor, 64, 64),
        &full(&dn.tensor, 64, 32),
        &ids,
        &gu.weights,
        3,
        64,
        32,
        2,
        &mut out,
    );
    for (i, (&o, &r)) in out.iter().zip(&y).enumerate() {
        assert!(
            (o as f64 - r).abs() <= 1e-5 * (1.0 + r.abs()),
            "{i}: {o} vs {r}"
        );
    }
}
