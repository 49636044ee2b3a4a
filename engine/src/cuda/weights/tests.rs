//! Layouts, host copies and their planned bytes, device types,
//! conversions and widenings, on the CPU.

use super::host::HostCopies;
use super::*;
use crate::synth::weights::{fill_tensor, Dist};
use gemtune_kernels::quant::GgmlType;

fn every_layout_set() -> Vec<Layouts> {
    (0..16u8)
        .map(|b| Layouts {
            planes_f16: b & 1 != 0,
            planes_f32: b & 2 != 0,
            blocks: b & 4 != 0,
            bf16: b & 8 != 0,
        })
        .collect()
}

/// The bytes the fit check plans for a matrix are the bytes its upload
/// builds, for every weight type and every set of layouts (the legal
/// ones: Q4_K/Q5_K have no GGUF-block kernel, but the sums hold anyway).
#[test]
fn planned_bytes_equal_the_host_copies() {
    let (n, k) = (5usize, 512usize);
    for wt in WType::ALL {
        let mut gguf = vec![0u8; n * wt.row_bytes(k)];
        fill_tensor(
            wt.ggml(),
            &Dist::Symmetric { std: 0.02 },
            n * k,
            7,
            wt as u64,
            &mut gguf,
        )
        .expect("fill");
        for l in every_layout_set() {
            let c = HostCopies::build(wt, &gguf, n, k, l).expect("copies");
            assert_eq!(
                c.bytes(),
                planned_bytes(wt, n, k, l),
                "{} {l:?}",
                wt.define()
            );
            assert_eq!(c.bytes() == 0, l == Layouts::default(), "{l:?}");
        }
    }
}

/// Read in its own type, a matrix takes its file's bytes in the GEMV's
/// layout (Q6_K: the side records' 6 padding bytes per super-block on
/// top), and the k-quants' prefill side words and Q8_0/Q4_0's f32
/// scales come on top when prefill reads them.
#[test]
fn native_layouts_take_about_the_file_bytes() {
    let (n, k) = (64usize, 2560usize);
    let gemv = Layouts {
        planes_f16: true,
        ..Default::default()
    };
    for wt in WType::ALL {
        let file = (n * wt.row_bytes(k)) as f64;
        let r = planned_bytes(wt, n, k, gemv) as f64 / file;
        let bound = if wt == WType::Q6K { 216.0 / 210.0 } else { 1.0 };
        assert!(
            (r - bound).abs() < 1e-12,
            "{}: {r} of the file's bytes",
            wt.define()
        );
    }
    assert_eq!(
        planned_bytes(
            WType::Q4K,
            n,
            k,
            Layouts {
                planes_f16: true,
                planes_f32: true,
                ..Default::default()
            }
        ),
        (n * k / 256 * (128 + 16 + 64)) as u64
    );
}

#[test]
fn device_type_keeps_uniform_matmul_types() {
    use GgmlType::*;
    assert_eq!(device_type(&[Q4K, Q4K, Q4K]), WType::Q4K);
    assert_eq!(device_type(&[Bf16]), WType::Bf16);
    assert_eq!(device_type(&[F16, F16]), WType::F16);
    assert_eq!(device_type(&[Q4K, Q4K, Q6K]), WType::Q8_0);
    assert_eq!(device_type(&[F32]), WType::Q8_0);
    assert_eq!(device_type(&[Q5_0]), WType::Q8_0);
    assert!(conversion(&[Q6K], WType::Q6K).is_none());
    let mixed = conversion(&[Q4K, Q4K, Q6K], WType::Q8_0).expect("converted");
    assert!(mixed.contains("differ"), "{mixed}");
    let f32 = conversion(&[F32], WType::Q8_0).expect("converted");
    assert!(f32.contains("no matmul kernel reads f32"), "{f32}");
}

/// Q5_0 (and Q4_0 beside Q8_0 or Q5_0) read as Q8_0 is a widening, not
/// a lossy conversion; a part with no exact Q8_0 form makes the whole
/// fused matrix a lossy conversion, as before.
#[test]
fn q8_0_widenings_are_not_lossy_conversions() {
    use GgmlType::*;
    for parts in [
        &[Q5_0][..],
        &[Q5_0, Q5_0, Q8_0],
        &[Q4_0, Q8_0],
        &[Q5_0, Q4_0],
    ] {
        let wt = device_type(parts);
        assert_eq!(wt, WType::Q8_0, "{parts:?}");
        assert!(conversion(parts, wt).is_none(), "{parts:?}");
        let w = widening(parts, wt.ggml()).expect("widened");
        assert!(w.contains("-> q8_0 planes, exact"), "{w}");
    }
    for parts in [&[Q8_0][..], &[Q4_0], &[Q4K]] {
        assert!(
            widening(parts, device_type(parts).ggml()).is_none(),
            "{parts:?}"
        );
    }
    for parts in [&[Q5_1][..], &[Q4_1], &[Q5_0, Q4K], &[Q5_0, F16], &[F32]] {
        let wt = device_type(parts);
        assert!(widening(parts, wt.ggml()).is_none(), "{parts:?}");
        assert!(conversion(parts, wt).is_some(), "{parts:?}");
    }
    assert!(exact_as(Q5_0, Q8_0) && exact_as(Q6K, Q6K));
    assert!(!exact_as(Q5_0, Q4_0) && !exact_as(Q8_0, Q5_0));
}
