//! The family's CPU tests: tiles and validation, the check's routing and
//! inputs, the group report, the replays and the stage references.

use super::reference::gemm_routing;
use super::workloads::{canonical_group, group_report, split_rows};
use super::*;
use crate::compile::Arch;
use crate::families::moe_gemv::{expert_tensor, ExpertTensor};
use crate::oracle::MoeGrouping;
use crate::verdict::POISON_BITS;

fn mp(tokens: usize, experts: usize, used: usize, d: usize, ffn: usize, t: GgmlType) -> MoeProblem {
    MoeProblem {
        tokens,
        d_model: d,
        ffn,
        experts,
        used,
        wtype: t,
    }
}
fn prob(tokens: usize, experts: usize, used: usize, d: usize, ffn: usize, t: GgmlType) -> Problem {
    Problem::Moe(mp(tokens, experts, used, d, ffn, t))
}
fn with(d: &Defines, kv: &[(&str, DefineValue)]) -> Defines {
    let mut d = d.clone();
    for (k, v) in kv {
        d.insert((*k).into(), v.clone());
    }
    d
}

#[test]
fn validate_gives_every_stage_its_geometry() {
    let f = MoeGemm;
    let lim = DeviceLimits::for_arch(Arch(90));
    let d = f.default_defines(GgmlType::Q8_0);
    // 26B-A4B at pp2048: 16384 pairs, BM 64 -> 256 + 128 tiles.
    let p = prob(2048, 128, 8, 2816, 704, GgmlType::Q8_0);
    let g = f.validate(&d, &p, &lim).expect("gate_up");
    assert_eq!(g.kernel, "moe_gemm_gate_up");
    assert_eq!(g.grid, (11, 384, 1));
    assert_eq!(g.block, (256, 1, 1));
    // 3 stages x (64 x 320 + 128 x 80 + 128 x 4).
    assert_eq!(g.dyn_smem, 3 * (64 * 320 + 128 * 80 + 128 * 4));
    let g = f
        .validate(&with(&d, &[("STAGE", "DOWN".into())]), &p, &lim)
        .expect("down");
    assert_eq!(g.kernel, "moe_gemm_down");
    assert_eq!(g.grid, (22, 384, 1));
    let g = f
        .validate(&with(&d, &[("STAGE", "GROUP".into())]), &p, &lim)
        .expect("group");
    assert_eq!(
        (g.kernel.as_str(), g.grid, g.block),
        ("moe_gemm_group", (1, 1, 1), (1024, 1, 1))
    );
    let g = f
        .validate(&with(&d, &[("STAGE", "COMBINE".into())]), &p, &lim)
        .expect("combine");
    assert_eq!(
        (g.kernel.as_str(), g.grid, g.block),
        ("moe_gemm_combine", (3, 2048, 1), (256, 1, 1))
    );
    // BF16 operands and 128-row tiles.
    let g = f
        .validate(
            &with(&d, &[("BM", 128i64.into()), ("DQ_TYPE", "BF16".into())]),
            &p,
            &lim,
        )
        .expect("bm128");
    assert_eq!(g.grid, (11, 128 + 128, 1));
    // Q4_K GATE_UP: the side record (16 bytes) per row per stage.
    let k4 = f.default_defines(GgmlType::Q4K);
    let g = f
        .validate(&k4, &prob(512, 128, 8, 2816, 704, GgmlType::Q4K), &lim)
        .expect("q4k");
    assert_eq!(g.dyn_smem, 3 * (64 * 320 + 128 * 48 + 128 * 16));
    // SMEM_DQ: the converted tiles after the ring, pitch PAD16(2*BK).
    let ring = 3 * (64 * 320 + 128 * 80 + 128 * 4);
    let g = f
        .validate(&with(&d, &[("SMEM_DQ", 1i64.into())]), &p, &lim)
        .expect("sdq1");
    assert_eq!(g.dyn_smem, ring + 128 * 144);
    let g = f
        .validate(&with(&d, &[("SMEM_DQ", 2i64.into())]), &p, &lim)
        .expect("sdq2");
    assert_eq!(g.dyn_smem, ring + (64 + 128) * 144);
    let g = f
        .validate(
            &with(
                &d,
                &[
                    ("SMEM_DQ", 2i64.into()),
                    ("BK", 32i64.into()),
                    ("STAGES", 4i64.into()),
                ],
            ),
            &p,
            &lim,
        )
        .expect("sdq2 bk32");
    assert_eq!(
        g.dyn_smem,
        4 * (64 * 192 + 128 * 48 + 128 * 4) + (64 + 128) * 80
    );
    let g = f
        .validate(&with(&d, &[("SMEM_DQ", 3i64.into())]), &p, &lim)
        .expect("sdq3");
    assert_eq!(g.dyn_smem, ring + 2 * (64 + 128) * 144);
}

#[test]
fn validate_rejects_bad_points_with_reasons() {
    let f = MoeGemm;
    let lim = DeviceLimits::for_arch(Arch(90));
    let bad = |d: &Defines, p: Problem, want: &str| {
        let e = f.validate(d, &p, &lim).expect_err(want);
        assert!(e.contains(want), "{e}");
    };
    let d = f.default_defines(GgmlType::Q8_0);
    let p = prob(64, 128, 8, 2816, 704, GgmlType::Q8_0);
    bad(
        &d,
        prob(4097, 128, 8, 2816, 704, GgmlType::Q8_0),
        "up to 4096 tokens",
    );
    bad(
        &d,
        prob(8, 300, 8, 2816, 704, GgmlType::Q8_0),
        "at most 256",
    );
    bad(&d, prob(8, 64, 40, 2816, 704, GgmlType::Q8_0), "at most 32");
    bad(
        &d,
        prob(8, 16, 4, 2816, 700, GgmlType::Q8_0),
        "multiples of 32",
    );
    // Q8_0 / Q4_0 need k % 64 (scale words); 2848 = 89 * 32.
    bad(
        &d,
        prob(8, 16, 4, 2848, 704, GgmlType::Q8_0),
        "not a multiple of 64",
    );
    let down = with(&d, &[("STAGE", "DOWN".into())]);
    bad(
        &down,
        prob(8, 16, 4, 2816, 736, GgmlType::Q8_0),
        "down (k = ffn)",
    );
    // Q4_K down at 704: not whole super-blocks.
    let k4 = f.default_defines(GgmlType::Q4K);
    bad(
        &with(&k4, &[("STAGE", "DOWN".into())]),
        prob(8, 128, 8, 2816, 704, GgmlType::Q4K),
        "256-element q4_K block",
    );
    bad(&with(&d, &[("LAYOUT", 0i64.into())]), p, "LAYOUT=1");
    bad(&with(&d, &[("STAGE", "UP".into())]), p, "STAGE=UP");
    bad(&with(&d, &[("DQ_TYPE", "F32".into())]), p, "DQ_TYPE=F32");
    bad(&with(&d, &[("BK", 16i64.into())]), p, "BK");
    bad(&with(&d, &[("STAGES", 1i64.into())]), p, "STAGES");
    bad(&with(&d, &[("SMEM_DQ", 4i64.into())]), p, "SMEM_DQ=4");
    bad(
        &with(&d, &[("SMEM_DQ", "ON".into())]),
        p,
        "SMEM_DQ=ON must be an integer",
    );
    bad(&with(&d, &[("BM", 48i64.into())]), p, "16*WARPS_M");
    bad(&with(&d, &[("BN", 96i64.into())]), p, "gate and an up half");
    // DOWN takes BN in 8-column units per warp.
    f.validate(
        &with(&down, &[("BN", 96i64.into()), ("WARPS_N", 4i64.into())]),
        &p,
        &lim,
    )
    .expect("down BN=96");
    bad(
        &with(&d, &[("BM", 128i64.into()), ("BN", 256i64.into())]),
        p,
        "> 64",
    );
    bad(
        &with(&d, &[("BK", 128i64.into()), ("BM", 128i64.into())]),
        p,
        "BK=128",
    );
    let k6 = f.default_defines(GgmlType::Q6K);
    bad(
        &with(&k6, &[("WARPS_M", 1i64.into())]),
        prob(8, 8, 2, 512, 256, GgmlType::Q6K),
        "64-row warp tiles",
    );
    bad(
        &with(
            &k6,
            &[
                ("BM", 128i64.into()),
                ("BN", 256i64.into()),
                ("WARPS_M", 4i64.into()),
                ("WARPS_N", 4i64.into()),
                ("BK", 32i64.into()),
            ],
        ),
        prob(8, 8, 2, 512, 256, GgmlType::Q6K),
        "128-register cap",
    );
    bad(&with(&d, &[("WTYPE", "Q4_0".into())]), p, "does not match");
    bad(
        &d,
        Problem::matmul(1, 8, 64, GgmlType::Q8_0),
        "runs on moe shapes",
    );
    // Every legal type at its edge sizes validates in both GEMM stages.
    for (t, dm, ff) in [
        (GgmlType::Q8_0, 128, 64),
        (GgmlType::Q4_0, 256, 128),
        (GgmlType::Q4K, 512, 256),
        (GgmlType::Q5K, 256, 256),
        (GgmlType::Q6K, 512, 256),
        (GgmlType::F16, 96, 160),
        (GgmlType::Bf16, 224, 96),
    ] {
        for st in ["GATE_UP", "DOWN"] {
            let dd = with(&f.default_defines(t), &[("STAGE", st.into())]);
            f.validate(&dd, &prob(33, 8, 2, dm, ff, t), &lim)
                .unwrap_or_else(|e| panic!("{t:?} {st}: {e}"));
        }
    }
}

#[test]
fn routing_has_empty_single_multi_tile_experts_and_skipped_pairs() {
    let p = mp(133, 16, 4, 512, 256, GgmlType::Q8_0);
    let mut rng = rng_for("moe-gemm-routing-test", &[1], 1);
    let (ids, w) = gemm_routing(&mut rng, &p);
    let g = group_by_expert(&ids, 16, 64);
    // Expert 15 holds exactly the first pair.
    assert_eq!(g.counts[15], 1);
    assert_eq!(ids[0], 15);
    // The skew gives some experts several 64-row tiles; and the
    // skipped pairs use every invalid id form.
    assert!(
        g.counts.iter().filter(|&&c| c > 64).count() >= 2,
        "{:?}",
        g.counts
    );
    let skipped: Vec<i32> = ids.iter().copied().filter(|&e| !valid_id(e, 16)).collect();
    assert!(
        skipped.len() > 20 && skipped.len() < 80,
        "{}",
        skipped.len()
    );
    for bad in [-1, -7, i32::MAX, 16] {
        assert!(skipped.contains(&bad), "{bad}");
    }
    for t in 0..133 {
        let row: Vec<i32> = ids[4 * t..4 * t + 4]
            .iter()
            .copied()
            .filter(|&e| valid_id(e, 16))
            .collect();
        let mut u = row.clone();
        u.sort_unstable();
        u.dedup();
        assert_eq!(u.len(), row.len(), "token {t}: {row:?}");
        let s: f32 = w[4 * t..4 * t + 4].iter().sum();
        assert!((s - 1.0).abs() < 1e-5);
    }
    // Few tokens over many experts: empty experts.
    let p = mp(5, 128, 8, 2816, 704, GgmlType::Q8_0);
    let (ids, _) = gemm_routing(&mut rng, &p);
    let g = group_by_expert(&ids, 128, 64);
    assert!(g.counts.iter().filter(|&&c| c == 0).count() > 80);
    assert_eq!(g.counts[127], 1);
    // Every expert chosen by every token: nothing reserved.
    let p = mp(3, 4, 4, 128, 64, GgmlType::Q8_0);
    let (ids, _) = gemm_routing(&mut rng, &p);
    assert_eq!(ids[..4].iter().filter(|&&e| valid_id(e, 4)).count(), 4);
}

#[test]
fn group_report_accepts_any_order_inside_a_group_and_names_errors() {
    let ids = [2, 0, 4, 2, -1, 0, 2, 0, 5, 2, 1, 0];
    let want = group_by_expert(&ids, 5, 2);
    let flat = |g: &MoeGrouping, sorted: Vec<i32>| -> Vec<i32> {
        canonical_group(
            g.counts.clone(),
            g.offsets.clone(),
            sorted,
            g.tiles.iter().flat_map(|t| [t[0], t[1]]).collect(),
            g,
        )
    };
    // Expert 0's and 2's pairs reversed, and poison past the valid count.
    let mut s = want.sorted.clone();
    s[0..4].reverse();
    s[5..9].reverse();
    s.extend([POISON_BITS as i32; 2]);
    let rep = group_report(&flat(&want, s.clone()), &want);
    assert!(rep.passed, "{}", rep.detail);
    // A pair moved into another expert's group fails.
    let mut s2 = s.clone();
    s2.swap(3, 4);
    let rep = group_report(&flat(&want, s2), &want);
    assert!(!rep.passed);
    assert!(rep.detail.contains("sorted["), "{}", rep.detail);
    // A wrong tile entry and an unwritten count are named.
    let mut w2 = want.clone();
    w2.tiles[1] = [0, 3];
    w2.counts[3] = POISON_BITS as i32;
    let got = canonical_group(
        w2.counts.clone(),
        w2.offsets.clone(),
        s,
        w2.tiles.iter().flat_map(|t| [t[0], t[1]]).collect(),
        &want,
    );
    let rep = group_report(&got, &want);
    assert!(!rep.passed);
    assert_eq!(rep.unwritten, 1);
    assert!(
        rep.detail.contains("tiles[3] = 3 (want 2)"),
        "{}",
        rep.detail
    );
    assert!(rep.detail.contains("counts[3]"), "{}", rep.detail);
}

#[test]
fn combine_replay_is_the_oracle_in_f32_and_skips_nan_rows() {
    let p = mp(7, 6, 3, 64, 32, GgmlType::Q8_0);
    let inp = gemm_inputs(&p, Stage::Combine, None, 3).expect("inputs");
    assert!(inp.ids.iter().any(|&e| !valid_id(e, 6)));
    let r = combine_replay(&inp.act, &inp.ids, &inp.weights, &p);
    let o = combine_experts(&inp.act, &inp.ids, &inp.weights, 7, 64, 6, 3);
    assert!(r.iter().all(|v| v.is_finite()));
    for (a, b) in r.iter().zip(&o) {
        assert!(
            (*a as f64 - b).abs() <= 1e-5 * (1.0 + b.abs()),
            "{a} vs {b}"
        );
    }
}

#[test]
fn split_rows_takes_valid_rows_and_counts_writes_elsewhere() {
    let poison = f32::from_bits(POISON_BITS);
    let out = [1.0, 2.0, poison, poison, 5.0, 6.0, poison, 7.0];
    let (rows, written) = split_rows(&out, &[0, 2], 4, 2);
    assert_eq!(rows, vec![1.0, 2.0, 5.0, 6.0]);
    assert_eq!(written, 1);
}

/// GATE_UP's reference fed to DOWN's, weighted by COMBINE's oracle,
/// equals `oracle::moe_ffn` on the same experts (skipped pairs at
/// weight 0); the replays with rounded operands stay within the
/// tolerance the family gives the GPU.
#[test]
fn stage_references_compose_to_the_oracle() {
    let p = mp(9, 6, 3, 128, 64, GgmlType::Q8_0);
    let gu = gemm_inputs(&p, Stage::GateUp, Some(WType::Q8_0), 5).expect("gate_up");
    let valid: Vec<usize> = (0..27).filter(|&q| valid_id(gu.ids[q], 6)).collect();
    let h = gemm_reference(&p, Stage::GateUp, &gu, &valid, None);
    let h_rp = gemm_reference(&p, Stage::GateUp, &gu, &valid, Some(false));
    let rel = |a: &[f64], b: &[f64]| -> f64 {
        let e: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
        let r: f64 = b.iter().map(|y| y * y).sum();
        (e / r).sqrt()
    };
    let f = MoeGemm;
    let d = f.default_defines(GgmlType::Q8_0);
    let tol = f.default_tolerance(&d, &Problem::Moe(p));
    assert!(rel(&h_rp, &h) < tol.rms_rel, "{}", rel(&h_rp, &h));
    // DOWN on GATE_UP's h (skipped rows NaN) with the same routing.
    let mut dn = gemm_inputs(&p, Stage::Down, Some(WType::Q8_0), 5).expect("down");
    dn.ids = gu.ids.clone();
    dn.weights = gu.weights.clone();
    let mut hv = vec![f32::NAN; 27 * 64];
    for (i, &q) in valid.iter().enumerate() {
        for r in 0..64 {
            hv[q * 64 + r] = h[i * 64 + r] as f32;
        }
    }
    dn.act = hv;
    let chosen = distinct_experts(&valid.iter().map(|&q| gu.ids[q]).collect::<Vec<_>>());
    dn.tensor = Some(
        expert_tensor(
            "moe-gemm-compose",
            &[2],
            WType::Q8_0,
            6,
            128,
            64,
            &chosen,
            5,
        )
        .expect("down tensor"),
    );
    let yp = gemm_reference(&p, Stage::Down, &dn, &valid, None);
    let mut ypf = vec![f32::NAN; 27 * 128];
    for (i, &q) in valid.iter().enumerate() {
        for r in 0..128 {
            ypf[q * 128 + r] = yp[i * 128 + r] as f32;
        }
    }
    let y = combine_experts(&ypf, &gu.ids, &gu.weights, 9, 128, 6, 3);
    let full = |t: &ExpertTensor, rows: usize, k: usize| -> Vec<f32> {
        (0..6)
            .flat_map(|e| {
                t.deq
                    .get(&e)
                    .cloned()
                    .unwrap_or_else(|| vec![0f32; rows * k])
            })
            .collect()
    };
    let ids: Vec<usize> = gu
        .ids
        .iter()
        .map(|&e| if valid_id(e, 6) { e as usize } else { 0 })
        .collect();
    let w0: Vec<f32> = gu
        .weights
        .iter()
        .zip(&gu.ids)
        .map(|(&w, &e)| if valid_id(e, 6) { w } else { 0.0 })
        .collect();
    let mut out = vec![0f32; 9 * 128];
    let gt = gu.tensor.as_ref().expect("gate_up tensor");
    let dt = dn.tensor.as_ref().expect("down tensor");
    crate::oracle::moe_ffn(
        &gu.act,
        &full(gt, 128, 128),
        &full(dt, 128, 64),
        &ids,
        &w0,
        9,
        128,
        64,
        3,
        &mut out,
    );
    for (i, (&o, &r)) in out.iter().zip(&y).enumerate() {
        assert!(
            (o as f64 - r).abs() <= 1e-5 * (1.0 + r.abs()),
            "{i}: {o} vs {r}"
        );
    }
}
