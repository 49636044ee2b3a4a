//! GPU checks of the mixture-of-experts families: `moe_route`, `moe_gemv`
//! and `moe_gemm` against their oracles on real and edge shapes, the
//! router's tie rule on forced ties, the expert GEMV's bytes read (only the
//! chosen experts, each once however many tokens share it), and the prefill
//! chain (GROUP, GATE_UP, DOWN, COMBINE through `bind::moe`) against
//! `oracle::moe_ffn`. All
//! `#[ignore = "needs a CUDA GPU"]`; without a GPU they panic with the
//! reason instead of passing.

use gemtune_kernels::bind::moe::{
    moe_gemm_scratch, ExpertWeights, MoeCombineArgs, MoeDownArgs, MoeGateUpArgs, MoeGemmDownArgs,
    MoeGemmGateUpArgs, MoeGroupArgs, MoeRouteArgs,
};
use gemtune_kernels::bind::NULL;
use gemtune_kernels::defines::Defines;
use gemtune_kernels::family::{family, Family, MoeProblem, Problem};
use gemtune_kernels::quant::GgmlType;
use gemtune_kernels::{check_variant, Gpu};

mod common;

use common::{build, build_for, gpu, i, s, with};
use rayon::prelude::*;

fn moe(
    tokens: usize,
    experts: usize,
    used: usize,
    d_model: usize,
    ffn: usize,
    wtype: GgmlType,
) -> Problem {
    Problem::Moe(MoeProblem {
        tokens,
        d_model,
        ffn,
        experts,
        used,
        wtype,
    })
}

/// Checks `d` on every shape the variant validates on; returns the
/// failures as lines and counts the checked cells.
fn check_all(gpu: &Gpu, f: &dyn Family, d: &Defines, shapes: &[Problem]) -> (Vec<String>, usize) {
    check_many(gpu, f, vec![(d.clone(), shapes.to_vec())])
}

/// `check_all` over several define sets: every set with a shape it
/// validates on is compiled first, all of them at once on the host's cores
/// (a cold NVRTC compile of one set takes seconds), then each is checked on
/// its shapes in turn.
fn check_many(
    gpu: &Gpu,
    f: &dyn Family,
    jobs: Vec<(Defines, Vec<Problem>)>,
) -> (Vec<String>, usize) {
    let limits = gpu.limits();
    let mut runnable = Vec::new();
    for (d, shapes) in jobs {
        let mut valid = Vec::new();
        for p in shapes {
            match f.validate(&d, &p, &limits) {
                Ok(_) => valid.push(p),
                Err(why) => println!("skip {} {p:?}: {why}", f.name()),
            }
        }
        // A define set the family refuses on every shape (LAYOUT=0 on
        // Q4_K) is never compiled: its source rejects it with an #error,
        // as validate does.
        if !valid.is_empty() {
            runnable.push((d, valid));
        }
    }
    let arch = gpu.arch();
    let compiled: Vec<_> = runnable
        .par_iter()
        .map(|(d, _)| build_for(arch, f, d))
        .collect();
    let mut bad = Vec::new();
    let mut checked = 0;
    for ((d, valid), cv) in runnable.iter().zip(&compiled) {
        for p in valid {
            checked += 1;
            let tol = f.default_tolerance(d, p);
            match check_variant(gpu, f, cv, d, p, 7, &tol) {
                Ok(r) => {
                    println!(
                        "{:10} {:50} {}: {} {}",
                        f.name(),
                        gemtune_kernels::defines::canonical(d),
                        p.describe(),
                        if r.passed { "PASS" } else { "FAIL" },
                        r.detail
                    );
                    if !r.passed {
                        bad.push(format!(
                            "{} {} {}: {}",
                            f.name(),
                            gemtune_kernels::defines::canonical(d),
                            p.describe(),
                            r.detail
                        ));
                    }
                }
                Err(e) => bad.push(format!("{} {}: error {e}", f.name(), p.describe())),
            }
        }
    }
    (bad, checked)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_route_variants_pass() {
    let gpu = gpu();
    let f = family("moe_route").expect("registered");
    let mut bad = Vec::new();
    let mut checked = 0;
    for t in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Bf16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
    ] {
        let mut shapes = Vec::new();
        for m in [1, 3, 8] {
            shapes.push(moe(m, 128, 8, 2816, 704, t));
            shapes.push(moe(m, 8, 2, 256, 96, t));
        }
        shapes.push(moe(5, 130, 6, 2592, 96, t));
        shapes.push(moe(2, 256, 32, 512, 96, t));
        for over in [
            vec![],
            vec![("WARPS", i(8))],
            vec![("ROWS", i(2))],
            vec![("ROWS", i(4)), ("WARPS", i(2))],
            vec![("WARPS", i(1))],
        ] {
            let d = with(f.default_defines(t), &over);
            let (b, n) = check_all(&gpu, f, &d, &shapes);
            bad.extend(b);
            checked += n;
        }
    }
    assert!(checked >= 60, "only {checked} cells checked");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// Every router row identical: all logits tie, so the ids are 0..K-1 in
/// order and the weights are 1/K times the scales; then one row nudged up
/// by one step ranks first and the rest keep the index order.
#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_route_ties_rank_the_lower_expert_first() {
    let gpu = gpu();
    let f = family("moe_route").expect("registered");
    let (tokens, e, k, d) = (3usize, 40usize, 6usize, 256usize);
    let p = moe(tokens, e, k, d, 96, GgmlType::F32);
    for rows in [1i64, 2, 4] {
        let defs = with(f.default_defines(GgmlType::F32), &[("ROWS", i(rows))]);
        let geo = f.validate(&defs, &p, &gpu.limits()).expect("valid");
        let module = gpu.load(&build(&gpu, f, &defs)).expect("load");
        let row: Vec<f32> = (0..d)
            .map(|c| ((c * 37 % 17) as f32 - 8.0) / 16.0)
            .collect();
        // Positive inputs: raising a weight raises every token's logit.
        let z: Vec<f32> = (0..tokens * d)
            .map(|c| ((c * 11 % 13) as f32 + 1.0) / 8.0)
            .collect();
        let scale: Vec<f32> = (0..e).map(|x| 1.0 + x as f32 / 64.0).collect();
        for nudge in [None, Some(29usize)] {
            let mut w: Vec<f32> = (0..e).flat_map(|_| row.clone()).collect();
            if let Some(n) = nudge {
                w[n * d] += 0.25;
            }
            let wb = gpu.upload(&w).expect("w");
            let zb = gpu.upload(&z).expect("z");
            let sb = gpu.upload(&scale).expect("scale");
            let logits = gpu.alloc(tokens * e * 4).expect("logits");
            let ids = gpu.alloc(tokens * k * 4).expect("ids");
            let weights = gpu.alloc(tokens * k * 4).expect("weights");
            let counter = gpu.upload(&[0u32]).expect("counter");
            let args = MoeRouteArgs {
                w: wb.ptr(),
                z: zb.ptr(),
                scale: sb.ptr(),
                logits: logits.ptr(),
                ids: ids.ptr(),
                weights: weights.ptr(),
                counter: counter.ptr(),
                d,
                n_experts: e,
                n_used: k,
            };
            // Twice: the counter must come back to zero for the second.
            for run in 0..2 {
                gpu.launch(&module, &geo, &args.kargs()).expect("launch");
                gpu.synchronize().expect("sync");
                let l: Vec<f32> = gpu.download(&logits).expect("logits");
                let got: Vec<i32> = gpu.download(&ids).expect("ids");
                let wt: Vec<f32> = gpu.download(&weights).expect("weights");
                let c: Vec<u32> = gpu.download(&counter).expect("counter");
                assert_eq!(c, vec![0], "the counter is reset");
                for t in 0..tokens {
                    let lt = &l[t * e..(t + 1) * e];
                    for x in (1..e).filter(|&x| Some(x) != nudge) {
                        assert_eq!(
                            lt[x].to_bits(),
                            lt[0].to_bits(),
                            "ROWS={rows} run {run} token {t}: identical rows, identical logits"
                        );
                    }
                    // Ties in index order, after the nudged row if any.
                    let want: Vec<i32> = match nudge {
                        None => (0..k as i32).collect(),
                        Some(n) => {
                            assert!(lt[n] > lt[0], "the nudged row leads");
                            std::iter::once(n as i32).chain(0..k as i32 - 1).collect()
                        }
                    };
                    assert_eq!(
                        &got[t * k..(t + 1) * k],
                        &want[..],
                        "ROWS={rows} nudge {nudge:?} run {run} token {t}"
                    );
                    if nudge.is_none() {
                        for j in 0..k {
                            let w_want = scale[j] / k as f32;
                            let w_got = wt[t * k + j];
                            assert!(
                                (w_got - w_want).abs() <= 1e-6 * w_want,
                                "token {t} rank {j}: {w_got} vs {w_want}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_gemv_variants_pass() {
    let gpu = gpu();
    let f = family("moe_gemv").expect("registered");
    let mut jobs = Vec::new();
    for t in [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4K, GgmlType::F16] {
        let mut shapes = vec![
            moe(1, 128, 8, 2816, 704, t),
            moe(8, 128, 8, 2816, 704, t),
            moe(3, 8, 2, 256, 96, t),
            moe(8, 12, 8, 512, 128, t),
            moe(2, 5, 2, 512, 256, t),
        ];
        if t == GgmlType::F16 {
            shapes.push(moe(3, 6, 3, 264, 40, t));
        }
        for stage in ["GATE_UP", "DOWN"] {
            for over in [
                vec![],
                vec![("ROWS", i(2))],
                vec![("ROWS", i(4)), ("WARPS", i(8))],
                vec![("LAYOUT", i(0))],
                vec![("COUNT_BYTES", i(1))],
                vec![("WARPS", i(1))],
                // The dp4a forms (refused on F16 stacks): Q8_1 and split
                // Q8 activations made per block in shared memory.
                vec![("ALGO", i(1))],
                vec![("ALGO", i(2))],
                vec![("ALGO", i(2)), ("ROWS", i(4)), ("WARPS", i(8))],
            ] {
                let mut d = with(f.default_defines(t), &over);
                d.insert("STAGE".into(), s(stage));
                jobs.push((d, shapes.clone()));
            }
        }
    }
    let (bad, checked) = check_many(&gpu, f, jobs);
    assert!(checked >= 150, "only {checked} cells checked");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// Eight tokens that all choose experts 3 and 6 (slots in both orders) out
/// of 16: both stages read exactly those two experts' bytes, once, and no
/// byte of any other expert. Zero weights (valid Q8_0 blocks): only the
/// counters matter here; `moe_gemv_variants_pass` checks the values.
#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_gemv_reads_only_the_chosen_experts_once() {
    let gpu = gpu();
    let f = family("moe_gemv").expect("registered");
    let (tokens, e, k, d, ffn) = (8usize, 16usize, 2usize, 512usize, 128usize);
    let p = moe(tokens, e, k, d, ffn, GgmlType::Q8_0);
    let ids: Vec<i32> = (0..tokens)
        .flat_map(|t| if t % 2 == 0 { [3, 6] } else { [6, 3] })
        .collect();
    let idb = gpu.upload(&ids).expect("ids");
    let wts = gpu.upload(&vec![0.5f32; tokens * k]).expect("weights");
    let x = gpu.upload(&vec![1.0f32; tokens * d]).expect("x");
    let h = gpu.upload(&vec![1.0f32; tokens * k * ffn]).expect("h");
    let y = gpu.alloc(tokens * d * 4).expect("y");
    let count = gpu.alloc(e * 8).expect("count");
    for (layout, algo) in [(0i64, 0i64), (1, 0), (1, 2)] {
        for stage in ["GATE_UP", "DOWN"] {
            for (rows, warps) in [(1i64, 4i64), (2, 2), (4, 8)] {
                let defs = with(
                    f.default_defines(GgmlType::Q8_0),
                    &[
                        ("STAGE", s(stage)),
                        ("LAYOUT", i(layout)),
                        ("ALGO", i(algo)),
                        ("ROWS", i(rows)),
                        ("WARPS", i(warps)),
                        ("COUNT_BYTES", i(1)),
                    ],
                );
                let geo = f.validate(&defs, &p, &gpu.limits()).expect("valid");
                let module = gpu.load(&build(&gpu, f, &defs)).expect("load");
                let (nrows, k_in) = if stage == "GATE_UP" {
                    (2 * ffn, d)
                } else {
                    (d, ffn)
                };
                // Bytes per row in the layout: GGUF blocks, or int8 quants
                // and f16 scales.
                let row_bytes = if layout == 0 {
                    k_in / 32 * 34
                } else {
                    k_in + k_in / 32 * 2
                };
                let (wq, wd) = if layout == 0 {
                    (gpu.alloc(e * nrows * row_bytes).expect("w"), None)
                } else {
                    (
                        gpu.alloc(e * nrows * k_in).expect("wq"),
                        Some(gpu.alloc(e * nrows * k_in / 32 * 2).expect("wd")),
                    )
                };
                gpu.fill_u32(&wq, 0).expect("zero");
                if let Some(b) = &wd {
                    gpu.fill_u32(b, 0).expect("zero");
                }
                gpu.fill_u32(&count, 0).expect("zero");
                let w = ExpertWeights {
                    q: wq.ptr(),
                    d: wd.as_ref().map_or(NULL, |b| b.ptr()),
                };
                let args = if stage == "GATE_UP" {
                    MoeGateUpArgs {
                        w,
                        x: x.ptr(),
                        ids: idb.ptr(),
                        h: y.ptr(),
                        count: count.ptr(),
                        d,
                        ffn,
                        n_experts: e,
                        n_used: k,
                    }
                    .kargs()
                } else {
                    MoeDownArgs {
                        w,
                        h: h.ptr(),
                        ids: idb.ptr(),
                        weights: wts.ptr(),
                        y: y.ptr(),
                        count: count.ptr(),
                        d,
                        ffn,
                        n_experts: e,
                        n_used: k,
                    }
                    .kargs()
                };
                gpu.launch(&module, &geo, &args).expect("launch");
                gpu.synchronize().expect("sync");
                let got: Vec<u64> = gpu.download(&count).expect("count");
                let want: Vec<u64> = (0..e)
                    .map(|x| {
                        if x == 3 || x == 6 {
                            (nrows * row_bytes) as u64
                        } else {
                            0
                        }
                    })
                    .collect();
                assert_eq!(
                    got, want,
                    "{stage} LAYOUT={layout} ROWS={rows} WARPS={warps}: bytes read per expert"
                );
            }
        }
    }
}

/// moe_gemm's check shapes (variants/shapes/moe_prefill.toml) of one
/// weight type, and the edge shapes every type shares.
fn gemm_shapes(t: GgmlType) -> Vec<Problem> {
    let mut v = Vec::new();
    match t {
        GgmlType::Q8_0 => {
            v.push(moe(5, 128, 8, 2816, 704, t));
            v.push(moe(20, 128, 8, 2816, 704, t));
            v.push(moe(67, 16, 4, 512, 256, t));
            v.push(moe(133, 16, 4, 512, 256, t));
            v.push(moe(3, 4, 4, 128, 64, t));
            v.push(moe(9, 256, 32, 128, 64, t));
        }
        GgmlType::Q4_0 => {
            v.push(moe(9, 128, 8, 2816, 704, t));
            v.push(moe(70, 12, 3, 256, 128, t));
        }
        GgmlType::Q4K => {
            v.push(moe(9, 128, 8, 2816, 704, t));
            v.push(moe(45, 10, 4, 512, 256, t));
        }
        GgmlType::Q5K => v.push(moe(33, 8, 2, 256, 256, t)),
        GgmlType::Q6K => v.push(moe(33, 8, 2, 512, 256, t)),
        GgmlType::F16 => v.push(moe(29, 6, 3, 96, 160, t)),
        _ => v.push(moe(21, 5, 2, 224, 96, t)),
    }
    v
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_gemm_variants_pass() {
    let gpu = gpu();
    let f = family("moe_gemm").expect("registered");
    let mut jobs = Vec::new();
    for t in [
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::F16,
        GgmlType::Bf16,
    ] {
        let shapes = gemm_shapes(t);
        for stage in ["GATE_UP", "DOWN"] {
            for over in [
                vec![],
                vec![("DQ_TYPE", s("BF16"))],
                vec![("BM", i(128))],
                vec![("BM", i(32)), ("WARPS_M", i(1))],
                vec![("BN", i(64)), ("BK", i(32)), ("STAGES", i(4))],
                vec![
                    ("BK", i(128)),
                    ("WARPS_M", i(4)),
                    ("WARPS_N", i(2)),
                    ("STAGES", i(2)),
                ],
                // The shared-tile operand paths (SMEM_DQ): weight tile
                // only, both tiles, bf16, a k step of 32 (one scale word
                // per stage), odd 8-column blocks per warp (ldmatrix x2,
                // DOWN only), 64-row warp tiles, the double-buffered
                // tiles at 2 and 3 stages and the 16-warp 128 x 256 tile.
                vec![("SMEM_DQ", i(1))],
                vec![("SMEM_DQ", i(2))],
                vec![("SMEM_DQ", i(2)), ("DQ_TYPE", s("BF16"))],
                vec![("SMEM_DQ", i(2)), ("BK", i(32)), ("STAGES", i(4))],
                vec![("SMEM_DQ", i(2)), ("BN", i(96)), ("WARPS_N", i(4))],
                vec![("SMEM_DQ", i(2)), ("BM", i(64)), ("WARPS_M", i(1))],
                vec![("SMEM_DQ", i(3)), ("BK", i(32)), ("STAGES", i(4))],
                vec![("SMEM_DQ", i(3)), ("STAGES", i(2))],
                vec![
                    ("SMEM_DQ", i(3)),
                    ("BM", i(128)),
                    ("BN", i(256)),
                    ("WARPS_M", i(4)),
                    ("WARPS_N", i(4)),
                    ("BK", i(32)),
                    ("STAGES", i(3)),
                ],
            ] {
                let mut over = over.clone();
                over.push(("STAGE", s(stage)));
                jobs.push((with(f.default_defines(t), &over), shapes.clone()));
            }
        }
    }
    // GROUP and COMBINE do not read the weights: the Q8_0 shapes, at
    // several BM for GROUP's tile table.
    let shapes = gemm_shapes(GgmlType::Q8_0);
    for over in [
        vec![("STAGE", s("GROUP"))],
        vec![("STAGE", s("GROUP")), ("BM", i(16)), ("WARPS_M", i(1))],
        vec![("STAGE", s("GROUP")), ("BM", i(128))],
        vec![("STAGE", s("COMBINE"))],
    ] {
        jobs.push((
            with(f.default_defines(GgmlType::Q8_0), &over),
            shapes.clone(),
        ));
    }
    let (bad, checked) = check_many(&gpu, f, jobs);
    assert!(checked >= 150, "only {checked} cells checked");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// Random Q8_0 experts: (plane buffers' host bytes, dequantized values)
/// of `rows` rows of `k`.
fn q8_experts(rows: usize, k: usize, seed: u64) -> (Vec<u8>, Vec<u16>, Vec<f32>) {
    let mut s = seed;
    let vals: Vec<f32> = (0..rows * k)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect();
    let q = gemtune_kernels::quant::quantize_to_vec(GgmlType::Q8_0, &vals).expect("quantize");
    let deq = gemtune_kernels::quant::dequantize_to_vec(GgmlType::Q8_0, &q, rows * k).expect("deq");
    let (qp, dp) =
        gemtune_kernels::families::to_planes(gemtune_kernels::family::WType::Q8_0, &q, rows, k);
    (qp, dp, deq)
}

/// The prefill chain through `bind::moe` on one stream, twice (GROUP
/// leaves nothing to reset): GROUP, GATE_UP, DOWN and COMBINE against
/// `oracle::moe_ffn` on the dequantized experts, skipped pairs included.
#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_gemm_chain_matches_the_oracle() {
    let gpu = gpu();
    let f = family("moe_gemm").expect("registered");
    let (tokens, experts, k, d, ffn) = (77usize, 16usize, 4usize, 256usize, 128usize);
    let mut ids: Vec<i32> = (0..tokens * k)
        .map(|q| {
            let (t, j) = (q / k, q % k);
            ((t * 5 + j * 3 + (t * j) % 7) % experts) as i32
        })
        .collect();
    // Distinct per token: slot j of token t, shifted until unique.
    for t in 0..tokens {
        for j in 0..k {
            while ids[t * k..t * k + j].contains(&ids[t * k + j]) {
                ids[t * k + j] = (ids[t * k + j] + 1) % experts as i32;
            }
        }
    }
    ids[5] = -1;
    ids[42] = experts as i32;
    let weights: Vec<f32> = (0..tokens * k)
        .map(|q| 0.1 + (q % 9) as f32 / 10.0)
        .collect();
    let x: Vec<f32> = (0..tokens * d)
        .map(|c| ((c * 37 % 101) as f32 - 50.0) / 64.0)
        .collect();
    let (gq, gd, gdeq) = q8_experts(experts * 2 * ffn, d, 3);
    let (dq, dd, ddeq) = q8_experts(experts * d, ffn, 4);
    let base = f.default_defines(GgmlType::Q8_0);
    let p = moe(tokens, experts, k, d, ffn, GgmlType::Q8_0);
    let stage = |st: &str| {
        let dfs = with(base.clone(), &[("STAGE", s(st))]);
        let geo = f.validate(&dfs, &p, &gpu.limits()).expect("geometry");
        let m = gpu.load(&build(&gpu, f, &dfs)).expect("load");
        (m, geo)
    };
    let (mg, geo_g) = stage("GROUP");
    let (mu, geo_u) = stage("GATE_UP");
    let (md, geo_d) = stage("DOWN");
    let (mc, geo_c) = stage("COMBINE");
    let bm = 64;
    let sc = moe_gemm_scratch(tokens, k, experts, d, ffn, bm);
    let buf = |n: usize| gpu.alloc(n).expect("alloc");
    let (counts, offsets, sorted, tiles, h, yp) = (
        buf(sc.counts),
        buf(sc.offsets),
        buf(sc.sorted),
        buf(sc.tiles),
        buf(sc.h),
        buf(sc.yp),
    );
    let ids_b = gpu.upload(&ids).expect("ids");
    let w_b = gpu.upload(&weights).expect("weights");
    let x_b = gpu.upload(&x).expect("x");
    let y = buf(4 * tokens * d);
    let (gq_b, gd_b, dq_b, dd_b) = (
        gpu.upload(&gq).expect("gq"),
        gpu.upload(&gd).expect("gd"),
        gpu.upload(&dq).expect("dq"),
        gpu.upload(&dd).expect("dd"),
    );
    let ids_u: Vec<usize> = ids.iter().map(|&e| e.max(0) as usize % experts).collect();
    // The oracle with skipped pairs weighted 0 (they add nothing).
    let w_oracle: Vec<f32> = weights
        .iter()
        .zip(&ids)
        .map(|(&w, &e)| {
            if e >= 0 && (e as usize) < experts {
                w
            } else {
                0.0
            }
        })
        .collect();
    let mut want = vec![0f32; tokens * d];
    gemtune_kernels::oracle::moe_ffn(
        &x, &gdeq, &ddeq, &ids_u, &w_oracle, tokens, d, ffn, k, &mut want,
    );
    for run in 0..2 {
        gpu.fill_u32(&y, 0x7fc0_dead).expect("poison");
        let g = MoeGroupArgs {
            ids: ids_b.ptr(),
            counts: counts.ptr(),
            offsets: offsets.ptr(),
            sorted: sorted.ptr(),
            tiles: tiles.ptr(),
            n_tokens: tokens,
            n_experts: experts,
            n_used: k,
            bm,
        };
        gpu.launch(&mg, &geo_g, &g.kargs()).expect("group");
        let u = MoeGemmGateUpArgs {
            w: ExpertWeights {
                q: gq_b.ptr(),
                d: gd_b.ptr(),
            },
            x: x_b.ptr(),
            sorted: sorted.ptr(),
            tiles: tiles.ptr(),
            offsets: offsets.ptr(),
            h: h.ptr(),
            d,
            ffn,
            n_used: k,
        };
        gpu.launch(&mu, &geo_u, &u.kargs()).expect("gate_up");
        let dn = MoeGemmDownArgs {
            w: ExpertWeights {
                q: dq_b.ptr(),
                d: dd_b.ptr(),
            },
            h: h.ptr(),
            sorted: sorted.ptr(),
            tiles: tiles.ptr(),
            offsets: offsets.ptr(),
            yp: yp.ptr(),
            d,
            ffn,
        };
        gpu.launch(&md, &geo_d, &dn.kargs()).expect("down");
        let c = MoeCombineArgs {
            yp: yp.ptr(),
            ids: ids_b.ptr(),
            weights: w_b.ptr(),
            y: y.ptr(),
            n_tokens: tokens,
            d,
            n_experts: experts,
            n_used: k,
        };
        gpu.launch(&mc, &geo_c, &c.kargs()).expect("combine");
        gpu.synchronize().expect("sync");
        let got: Vec<f32> = gpu.download(&y).expect("y");
        let (mut e2, mut r2) = (0f64, 0f64);
        for (&g, &w) in got.iter().zip(&want) {
            assert!(g.is_finite(), "run {run}: non-finite output");
            e2 += (g as f64 - w as f64).powi(2);
            r2 += (w as f64).powi(2);
        }
        let rel = (e2 / r2).sqrt();
        // f16 operands in two chained GEMMs.
        assert!(rel < 4e-3, "run {run}: rms_rel {rel:.3e} against moe_ffn");
    }
}
