//! GPU checks of every family over shapes with partial tiles, and timing
//! probes that print numbers. All `#[ignore = "needs a CUDA GPU"]`; without a
//! GPU they panic with the reason instead of passing.

use gemtune_kernels::compile::default_cache_dir;
use gemtune_kernels::defines::{DefineValue, Defines};
use gemtune_kernels::family::{family, Family, Problem};
use gemtune_kernels::quant::GgmlType;
use gemtune_kernels::{check_variant, Gpu};

mod common;

use common::{build, gpu, i, s, with};

/// Checks `d` on every shape; returns the failures as lines.
fn check_all(gpu: &Gpu, f: &dyn Family, d: &Defines, shapes: &[Problem]) -> Vec<String> {
    let cv = build(gpu, f, d);
    let mut bad = Vec::new();
    for p in shapes {
        let tol = f.default_tolerance(d, p);
        match check_variant(gpu, f, &cv, d, p, 7, &tol) {
            Ok(r) => {
                println!(
                    "{:14} {:60} {:?}: {} rms_rel {:.2e} replay {:?} max_rel {:.2e}",
                    f.name(),
                    gemtune_kernels::defines::canonical(d),
                    p,
                    if r.passed { "PASS" } else { "FAIL" },
                    r.rms_rel,
                    r.replay_rms_rel,
                    r.max_rel
                );
                if !r.passed {
                    bad.push(format!(
                        "{} {} {:?}: {}",
                        f.name(),
                        gemtune_kernels::defines::canonical(d),
                        p,
                        r.detail
                    ));
                }
            }
            Err(e) => bad.push(format!("{} {:?}: error {e}", f.name(), p)),
        }
    }
    bad
}

fn matmul_shapes(wt: GgmlType) -> Vec<Problem> {
    let mut v = Vec::new();
    for m in [1usize, 3, 8, 77, 256] {
        for n in [64usize, 200, 1024] {
            // 32 and 2592: a partial last 64-k tile, and (split-K) a slice
            // with no tile and an odd tile count split in two.
            for k in [32usize, 256, 2560, 2592] {
                v.push(Problem::matmul(m, n, k, wt));
            }
        }
    }
    v
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn quantize_q8_1_is_bitexact() {
    let gpu = gpu();
    let f = family("quantize_q8_1").unwrap();
    let d = f.default_defines(GgmlType::Q8_0);
    let shapes: Vec<Problem> = [(1usize, 256usize), (3, 2560), (77, 2560), (256, 10240)]
        .iter()
        .map(|&(m, k)| Problem::matmul(m, 1, k, GgmlType::Q8_0))
        .collect();
    let bad = check_all(&gpu, f, &d, &shapes);
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gemv_variants_pass() {
    let gpu = gpu();
    let f = family("gemv").unwrap();
    let mut bad = Vec::new();
    for wt in [GgmlType::Q8_0, GgmlType::Q4_0] {
        let shapes: Vec<Problem> = [1usize, 2, 3, 5, 8]
            .iter()
            .flat_map(|&m| {
                [(200usize, 256usize), (1024, 2560), (77, 2560)]
                    .map(|(n, k)| Problem::matmul(m, n, k, wt))
            })
            .collect();
        let base = f.default_defines(wt);
        for (algo, layout, rows, warps, fuse, ksplit, unroll) in [
            (0, 1, 2, 4, 0, 1, 1),
            (1, 1, 2, 4, 0, 1, 2),
            (0, 0, 1, 4, 0, 2, 1),
            (1, 0, 4, 2, 0, 1, 4),
            (0, 1, 2, 4, 1, 4, 2),
            (1, 1, 3, 4, 1, 2, 1),
            (1, 1, 1, 8, 0, 8, 4),
        ] {
            let d = with(
                base.clone(),
                &[
                    ("ALGO", i(algo)),
                    ("LAYOUT", i(layout)),
                    ("ROWS", i(rows)),
                    ("WARPS", i(warps)),
                    ("FUSE", i(fuse)),
                    ("KSPLIT", i(ksplit)),
                    ("UNROLL", i(unroll)),
                ],
            );
            bad.extend(check_all(&gpu, f, &d, &shapes));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// The Q6_K GEMV (the tied head of Q4_0 files: GGUF super-blocks, f32
/// activations, fp contract) on one and two super-blocks per row (most
/// lanes idle), odd row counts, a real head width, and the split-K and
/// unroll paths; rows per block that do not divide n.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gemv_q6k_variants_pass() {
    let gpu = gpu();
    let f = family("gemv").unwrap();
    let wt = GgmlType::Q6K;
    let shapes: Vec<Problem> = [1usize, 2, 3, 5, 8]
        .iter()
        .flat_map(|&m| {
            [(1001usize, 256usize), (37, 512), (1024, 2560), (77, 1536)]
                .map(|(n, k)| Problem::matmul(m, n, k, wt))
        })
        .collect();
    let mut bad = Vec::new();
    for (rows, warps, ksplit, unroll) in [
        (2, 4, 1, 1),
        (1, 4, 1, 1),
        (4, 2, 1, 2),
        (1, 8, 2, 4),
        (3, 8, 8, 1),
    ] {
        let d = with(
            f.default_defines(wt),
            &[
                ("ROWS", i(rows)),
                ("WARPS", i(warps)),
                ("KSPLIT", i(ksplit)),
                ("UNROLL", i(unroll)),
            ],
        );
        bad.extend(check_all(&gpu, f, &d, &shapes));
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// The k-quant GEMVs on their planes (Q4_K, Q5_K, Q6_K: f32 FMA, the fp
/// contract, and dp4a on Q8_1, approx with a tight replay) and the 16-bit
/// ones (F16, BF16: f32 FMA): one, three and ten super-blocks per row (most
/// lanes idle, a partial last lane round), F16/BF16 rows that are not whole
/// 32-value rounds, odd row counts, and the fused, split-K and unroll paths.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gemv_new_types_pass() {
    let gpu = gpu();
    let f = family("gemv").unwrap();
    let mut bad = Vec::new();
    for wt in [
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::F16,
        GgmlType::Bf16,
    ] {
        let sizes: &[(usize, usize)] = if matches!(wt, GgmlType::F16 | GgmlType::Bf16) {
            &[(1001, 96), (77, 2568), (1024, 2560)]
        } else {
            &[(1001, 256), (37, 768), (77, 2560), (1024, 2560)]
        };
        let shapes: Vec<Problem> = [1usize, 2, 3, 5, 8]
            .iter()
            .flat_map(|&m| {
                sizes
                    .iter()
                    .map(move |&(n, k)| Problem::matmul(m, n, k, wt))
            })
            .collect();
        let algos: &[i64] = if matches!(wt, GgmlType::F16 | GgmlType::Bf16) {
            &[0]
        } else {
            &[0, 1]
        };
        for &algo in algos {
            for (rows, warps, fuse, ksplit, unroll) in [
                (2, 4, 0, 1, 1),
                (1, 2, 0, 1, 2),
                (1, 4, 1, 1, 1),
                (3, 8, 0, 2, 1),
                (1, 8, 0, 8, 4),
            ] {
                let d = with(
                    f.default_defines(wt),
                    &[
                        ("ALGO", i(algo)),
                        ("LAYOUT", i(1)),
                        ("ROWS", i(rows)),
                        ("WARPS", i(warps)),
                        ("FUSE", i(fuse)),
                        ("KSPLIT", i(ksplit)),
                        ("UNROLL", i(unroll)),
                    ],
                );
                bad.extend(check_all(&gpu, f, &d, &shapes));
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

fn gemm_variants(name: &str) -> Vec<Vec<(&'static str, DefineValue)>> {
    if name == "gemm_wgmma" {
        return vec![
            vec![],
            vec![("BM", i(64)), ("WG", i(1)), ("STAGES", i(3))],
            vec![("BM", i(128)), ("MW", i(2))],
            vec![("BM", i(192)), ("WG", i(3)), ("STAGES", i(3))],
            vec![("BM", i(128)), ("WG", i(1)), ("STAGES", i(6))],
            vec![("DQ_TYPE", s("BF16"))],
            vec![("KSPLIT", i(2))],
            vec![("KSPLIT", i(2)), ("BM", i(192)), ("WG", i(1))],
        ];
    }
    let mut v = vec![
        vec![],
        vec![
            ("STAGES", i(1)),
            ("CP_ASYNC", i(0)),
            ("BM", i(64)),
            ("BN", i(64)),
            ("WARPS_M", i(2)),
            ("WARPS_N", i(2)),
        ],
        vec![
            ("BK", i(32)),
            ("STAGES", i(4)),
            ("BN", i(256)),
            ("WARPS_N", i(4)),
        ],
        vec![("BK", i(128)), ("STAGES", i(2)), ("CP_ASYNC", i(0))],
    ];
    if name == "mmq" {
        v.push(vec![("EPI", i(0))]);
    } else {
        v.push(vec![("DQ_TYPE", s("BF16"))]);
    }
    v
}

/// The prefill GEMM shapes of the k-quants (k whole super-blocks: one, and
/// ten with a partial last 64-k tile of none) and the 16-bit types (k a
/// multiple of 32 with a partial last 64- and 128-k tile), partial token and
/// feature tiles.
fn new_type_shapes(wt: GgmlType) -> Vec<Problem> {
    let ks: &[usize] = if matches!(wt, GgmlType::F16 | GgmlType::Bf16) {
        &[32, 2592]
    } else {
        &[256, 2560]
    };
    let mut v = Vec::new();
    for m in [1usize, 77, 256] {
        for n in [64usize, 200, 1024] {
            for &k in ks {
                v.push(Problem::matmul(m, n, k, wt));
            }
        }
    }
    v
}

fn gemm_family_passes(name: &str) {
    let gpu = gpu();
    let f = family(name).unwrap();
    let mut bad = Vec::new();
    for wt in [GgmlType::Q8_0, GgmlType::Q4_0] {
        for extra in gemm_variants(name) {
            let d = with(f.default_defines(wt), &extra);
            bad.extend(check_all(&gpu, f, &d, &matmul_shapes(wt)));
        }
    }
    // mmq reads per-32 int8 quants only.
    if name != "mmq" {
        for wt in [
            GgmlType::Q4K,
            GgmlType::Q5K,
            GgmlType::Q6K,
            GgmlType::F16,
            GgmlType::Bf16,
        ] {
            for extra in gemm_variants(name) {
                let d = with(f.default_defines(wt), &extra);
                bad.extend(check_all(&gpu, f, &d, &new_type_shapes(wt)));
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn mmq_variants_pass() {
    gemm_family_passes("mmq");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gemm_dq_variants_pass() {
    gemm_family_passes("gemm_dq");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gemm_wgmma_variants_pass() {
    gemm_family_passes("gemm_wgmma");
}

/// With the argument check on (debug builds, the test profile, or
/// `GEMTUNE_CHECK_ARGS=1`) a launch whose arguments do not pack
/// to the kernel's parameter buffer is refused before it is enqueued, by
/// `Gpu::launch` and by a resolved `runtime::Kernel`, with the kernel named;
/// the right list still launches.
#[test]
#[ignore = "needs a CUDA GPU"]
fn debug_launches_refuse_wrong_argument_lists() {
    use gemtune_kernels::bind::rows::SoftcapArgs;
    use gemtune_kernels::family::RowsProblem;
    use gemtune_kernels::gpu::{GpuError, KArg};
    use gemtune_kernels::runtime::KernelCache;
    if !gemtune_kernels::gpu::launch_args_checked() {
        panic!(
            "the argument check is on in debug builds or with GEMTUNE_CHECK_ARGS=1: run this test \
             without --release or with that variable set"
        );
    }
    let g = gpu();
    let f = family("softcap").unwrap();
    let d = f.default_defines(GgmlType::F32);
    let p = Problem::Rows(RowsProblem {
        rows: 4,
        width: 256,
        dtype: GgmlType::F32,
        aux: 0,
    });
    let geo = f.validate(&d, &p, &g.limits()).expect("softcap geometry");
    let x = g.upload(&vec![0.5f32; 4 * 256]).unwrap();
    let right = SoftcapArgs {
        x: x.ptr(),
        rows: 4,
        width: 256,
        cap: 30.0,
    }
    .kargs();
    let mut wrong = right.clone();
    wrong[1] = KArg::U64(4);
    let module = g.load(&build(&g, f, &d)).unwrap();
    g.launch(&module, &geo, &right)
        .expect("the right list launches");
    match g.launch(&module, &geo, &wrong) {
        Err(GpuError::Args { kernel, .. }) => assert_eq!(kernel, geo.kernel),
        other => panic!("Gpu::launch took a wrong list: {other:?}"),
    }
    let cache = KernelCache::new(default_cache_dir());
    let k = cache.kernel(&g, f, &d, geo.clone()).unwrap();
    k.launch(&g, &right).expect("the right list launches");
    match k.launch(&g, &wrong[..3]) {
        Err(GpuError::Args { kernel, .. }) => assert_eq!(kernel, geo.kernel),
        other => panic!("Kernel::launch took a wrong list: {other:?}"),
    }
    g.synchronize().unwrap();
}
