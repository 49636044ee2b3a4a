//! CPU-only checks of validation, launch geometry, the Q8_1 replay rule,
//! weight repacking and the no-GPU error. No NVRTC or GPU needed.

use gemtune_kernels::compile::Arch;
use gemtune_kernels::defines::DefineValue;
use gemtune_kernels::families::{q8_1_replay, to_planes};
use gemtune_kernels::family::{family, DeviceLimits, Problem, WType};
use gemtune_kernels::quant::{quantize_row, GgmlType};
use gemtune_kernels::{Gpu, GpuError};

fn h100() -> DeviceLimits {
    DeviceLimits::for_arch(Arch(90))
}

fn set(d: &mut gemtune_kernels::Defines, k: &str, v: i64) {
    d.insert(k.to_string(), DefineValue::Int(v));
}

#[test]
fn gemv_geometry_and_rejections() {
    let f = family("gemv").unwrap();
    let mut d = f.default_defines(GgmlType::Q8_0);
    set(&mut d, "ROWS", 2);
    set(&mut d, "WARPS", 8);
    set(&mut d, "KSPLIT", 2);
    let g = f
        .validate(&d, &Problem::matmul(3, 1000, 2560, GgmlType::Q8_0), &h100())
        .unwrap();
    assert_eq!(g.kernel, "gemv_n3");
    assert_eq!(g.block, (256, 1, 1));
    // 4 row groups of 2 rows = 8 rows per block.
    assert_eq!(g.grid, (125, 1, 1));
    let e = f
        .validate(&d, &Problem::matmul(9, 1000, 2560, GgmlType::Q8_0), &h100())
        .unwrap_err();
    assert_eq!(e, "gemv handles 1..8 tokens, not m=9");
    let e = f
        .validate(&d, &Problem::matmul(1, 1000, 2560, GgmlType::Q4_0), &h100())
        .unwrap_err();
    assert!(
        e.contains("does not match the problem's weight type q4_0"),
        "{e}"
    );
    let e = f
        .validate(&d, &Problem::matmul(1, 1000, 2500, GgmlType::Q8_0), &h100())
        .unwrap_err();
    assert!(e.contains("k=2500 is not a positive multiple"), "{e}");
    set(&mut d, "KSPLIT", 3);
    let e = f
        .validate(&d, &Problem::matmul(1, 1000, 2560, GgmlType::Q8_0), &h100())
        .unwrap_err();
    assert_eq!(e, "KSPLIT=3 is not one of [1, 2, 4, 8]");
    set(&mut d, "KSPLIT", 1);
    set(&mut d, "WARPS", 33);
    let e = f
        .validate(&d, &Problem::matmul(1, 1000, 2560, GgmlType::Q8_0), &h100())
        .unwrap_err();
    assert_eq!(e, "WARPS=33 is outside 1..=32");
    d.insert("WTYPE".into(), DefineValue::Str("q8_0".into()));
    let e = f
        .validate(&d, &Problem::matmul(1, 1000, 2560, GgmlType::Q8_0), &h100())
        .unwrap_err();
    assert!(e.contains("write it in upper case (Q8_0)"), "{e}");
}

#[test]
fn gemm_geometry_smem_and_rejections() {
    let f = family("gemm_dq").unwrap();
    let d = f.default_defines(GgmlType::Q8_0);
    let p = Problem::matmul(2048, 10240, 2560, GgmlType::Q8_0);
    let g = f.validate(&d, &p, &h100()).unwrap();
    assert_eq!(g.grid, (16, 80, 1));
    assert_eq!(g.block, (256, 1, 1));
    // 3 stages x (128 rows x 144 B activations + 128 x 80 B quants + 128 x 2 scales x 4 B).
    assert_eq!(g.dyn_smem, 3 * (128 * 144 + 128 * 80 + 128 * 2 * 4));
    // Partial tiles are fine: ceil-divided grid.
    let g = f
        .validate(&d, &Problem::matmul(77, 200, 256, GgmlType::Q8_0), &h100())
        .unwrap();
    assert_eq!(g.grid, (1, 2, 1));
    // A 128x256 tile needs more than an sm_89 block may have.
    let mut wide = d.clone();
    set(&mut wide, "BN", 256);
    assert!(f.validate(&wide, &p, &h100()).is_ok());
    let e = f
        .validate(&wide, &p, &DeviceLimits::for_arch(Arch(89)))
        .unwrap_err();
    assert_eq!(
        e,
        "needs 122880 bytes of shared memory, the sm_89 limit is 101376"
    );
    let mut bad = d.clone();
    set(&mut bad, "BM", 80);
    let e = f.validate(&bad, &p, &h100()).unwrap_err();
    assert_eq!(e, "BM=80 is not a multiple of 16*WARPS_M = 32");
    let mut bad = d.clone();
    set(&mut bad, "WARPS_M", 8);
    set(&mut bad, "WARPS_N", 8);
    set(&mut bad, "BM", 128);
    set(&mut bad, "BN", 128);
    let e = f.validate(&bad, &p, &h100()).unwrap_err();
    assert!(e.contains("2048 threads > 1024"), "{e}");
    let mut bad = d.clone();
    set(&mut bad, "BM", 256);
    set(&mut bad, "BN", 256);
    let e = f.validate(&bad, &p, &h100()).unwrap_err();
    assert!(e.contains("accumulators per thread (> 128)"), "{e}");
    let mut bad = d.clone();
    bad.insert("DQ_TYPE".into(), DefineValue::Str("FP8".into()));
    assert_eq!(
        f.validate(&bad, &p, &h100()).unwrap_err(),
        "DQ_TYPE=FP8: must be F16 or BF16"
    );
    let m = family("mmq").unwrap();
    let mut dm = m.default_defines(GgmlType::Q4_0);
    set(&mut dm, "BK", 48);
    let e = m
        .validate(&dm, &Problem::matmul(64, 64, 256, GgmlType::Q4_0), &h100())
        .unwrap_err();
    assert_eq!(e, "BK=48 is not one of [32, 64, 128]");
}

#[test]
fn q8_1_replay_rule() {
    let mut x = vec![0f32; 64];
    x[0] = 1.27;
    x[1] = -0.635;
    x[2] = 0.005;
    x[3] = 0.015;
    // Second block all zero: d = 0, q = 0.
    let (q, ds) = q8_1_replay(&x);
    let d = 1.27f32 / 127.0;
    assert_eq!(ds[0][0], d);
    assert_eq!(q[0], 127);
    assert_eq!(q[1], (-0.635f32 / d).round() as i8);
    assert_eq!(q[1], -64, "round half away from zero");
    assert_eq!(q[2], (0.005f32 / d).round() as i8);
    assert_eq!(ds[0][1], q[..32].iter().map(|&v| v as f32).sum::<f32>());
    assert_eq!(ds[1], [0.0, 0.0]);
    assert!(q[32..].iter().all(|&v| v == 0));
}

#[test]
fn planes_split_quants_and_scales() {
    let src: Vec<f32> = (0..64).map(|i| (i as f32 - 31.5) / 8.0).collect();
    for wt in [WType::Q8_0, WType::Q4_0] {
        let ty = wt.ggml();
        let mut blocks = vec![0u8; ty.type_size() * 2];
        quantize_row(ty, &src, &mut blocks).unwrap();
        let (q, d) = to_planes(wt, &blocks, 1, 64);
        let qb = wt.quant_bytes_per_block();
        assert_eq!(q.len(), 2 * qb);
        assert_eq!(d.len(), 2);
        for b in 0..2 {
            let blk = &blocks[b * ty.type_size()..(b + 1) * ty.type_size()];
            assert_eq!(d[b], u16::from_le_bytes([blk[0], blk[1]]));
            assert_eq!(&q[b * qb..(b + 1) * qb], &blk[2..2 + qb]);
        }
    }
}

#[test]
fn missing_gpu_is_a_typed_error() {
    // On a GPU machine this opens the device; elsewhere it must be NoGpu,
    // never a panic.
    match Gpu::new(0) {
        Ok(g) => assert!(g.info().sm_count > 0),
        Err(GpuError::NoGpu(msg)) => assert!(!msg.is_empty()),
        Err(e) => panic!("expected NoGpu, got {e}"),
    }
    match Gpu::new(4096) {
        Ok(_) => panic!("device 4096 cannot exist"),
        Err(e) => assert!(e.to_string().starts_with("no CUDA GPU: "), "{e}"),
    }
}

/// Launch decisions come from the family (`Family::launch_sequence`), not
/// from a name: decode attention is a programmatic dependent with the
/// combine after every tensor-core ALGO, every other family (prefill
/// attention included) one plain launch.
#[test]
fn launch_sequences_come_from_the_family() {
    use gemtune_kernels::family::{families, LaunchSequence};
    for f in families() {
        for wt in [GgmlType::Q8_0, GgmlType::Q4_0] {
            let seq = f.launch_sequence(&f.default_defines(wt)).unwrap();
            let want = if f.name() == "attn_decode" {
                LaunchSequence::Decode { combine: true }
            } else {
                LaunchSequence::Single
            };
            assert_eq!(seq, want, "{} {}", f.name(), wt.name());
        }
    }
    let dec = family("attn_decode").unwrap();
    for (algo, combine) in [(0, false), (1, true), (2, true), (3, true)] {
        let mut d = dec.default_defines(GgmlType::Q8_0);
        set(&mut d, "ALGO", algo);
        assert_eq!(
            dec.launch_sequence(&d).unwrap(),
            LaunchSequence::Decode { combine },
            "ALGO={algo}"
        );
    }
    let mut d = dec.default_defines(GgmlType::Q8_0);
    d.remove("ALGO");
    assert!(dec.launch_sequence(&d).unwrap_err().contains("ALGO"));
}
