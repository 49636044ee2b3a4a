//! Reference ops checked against values worked out by hand or by an
//! independent closed form.

use gemtune_kernels::oracle::{
    attention, gated_ffn, gelu_tanh, matmul, matmul_quant, proportional_freq_factors, rms_norm,
    rope_neox, softcap, softmax, AttnParams,
};
use gemtune_kernels::quant::GgmlType;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn close(a: f32, b: f64, tol: f64) -> bool {
    (a as f64 - b).abs() <= tol
}

fn random(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

// ------------------------------------------------------------------ norm

#[test]
fn rms_norm_of_3_4() {
    // mean(x²) = (9 + 16) / 2 = 12.5, √12.5 = 5/√2, so x / rms = (3√2/5, 4√2/5).
    let r2 = 2f64.sqrt();
    let mut out = [0f32; 2];
    rms_norm(&[3.0, 4.0], None, 0.0, &mut out);
    assert_eq!(out, [(3.0 * r2 / 5.0) as f32, (4.0 * r2 / 5.0) as f32]);
    // Weighted: w = (2, 0.5) used as is (no 1 + w).
    rms_norm(&[3.0, 4.0], Some(&[2.0, 0.5]), 0.0, &mut out);
    assert_eq!(out, [(6.0 * r2 / 5.0) as f32, (2.0 * r2 / 5.0) as f32]);
    // eps enters under the square root: 3 / √(12.5 + 0.5) = 3 / √13.
    rms_norm(&[3.0, 4.0], None, 0.5, &mut out);
    assert_eq!(out[0], (3.0 / 13f64.sqrt()) as f32);
}

#[test]
fn rms_norm_output_has_unit_rms() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let x = random(&mut rng, 256);
    let mut out = vec![0f32; 256];
    rms_norm(&x, None, 1e-6, &mut out);
    let ms: f64 = out.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / 256.0;
    assert!((ms - 1.0).abs() < 1e-5, "{ms}");
}

#[test]
#[should_panic(expected = "rms_norm weight has 3 elements, expected 2")]
fn rms_norm_rejects_wrong_weight_length() {
    rms_norm(&[1.0, 2.0], Some(&[1.0, 1.0, 1.0]), 1e-6, &mut [0.0; 2]);
}

// ------------------------------------------------------------------ rope

#[test]
fn rope_proportional_pos1_pair1_angle() {
    // Full-layer proportional RoPE: 512 dims, base 1e6, pair (1, 257) at
    // pos 1 rotates by 1e6^(-2/512) = exp(-ln(1e6)/256) = 0.9474635256553754 rad.
    let ff = proportional_freq_factors(512, 64);
    let mut head = vec![0f32; 512];
    head[1] = 1.0;
    rope_neox(&mut head, 1, 1e6, 512, Some(&ff));
    let theta = 0.947_463_525_655_375_4f64;
    assert!(close(head[1], theta.cos(), 1e-7), "{}", head[1]);
    assert!(close(head[257], theta.sin(), 1e-7), "{}", head[257]);
    assert!(close(head[1], 0.583_744_423_6, 1e-7));
    assert!(close(head[257], 0.811_937_465_5, 1e-7));
    let angle = (head[257] as f64).atan2(head[1] as f64);
    assert!((angle - 0.947_464).abs() < 1e-6, "{angle}");
}

#[test]
fn rope_proportional_pass_through_dims_untouched() {
    let ff = proportional_freq_factors(512, 64);
    assert_eq!(ff.len(), 256);
    assert!(ff[..64].iter().all(|&f| f == 1.0));
    assert!(ff[64..].iter().all(|&f| f == 1e30));
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    for pos in [1usize, 17, 511, 131_071] {
        let orig = random(&mut rng, 512);
        let mut head = orig.clone();
        rope_neox(&mut head, pos, 1e6, 512, Some(&ff));
        // Dims 64..256 and 320..512 pass through bit for bit.
        for i in (64..256).chain(320..512) {
            assert_eq!(head[i].to_bits(), orig[i].to_bits(), "pos {pos} dim {i}");
        }
        // Dims 0..64 paired with 256..320 rotate (norm of each pair kept).
        for i in 0..64 {
            let n0 = (orig[i] as f64).hypot(orig[i + 256] as f64);
            let n1 = (head[i] as f64).hypot(head[i + 256] as f64);
            assert!((n0 - n1).abs() < 1e-6, "pair {i}");
        }
        // Pair 0 has θ = pos exactly.
        let (s, c) = (pos as f64).sin_cos();
        let want0 = orig[0] as f64 * c - orig[256] as f64 * s;
        assert!(close(head[0], want0, 1e-6), "pos {pos}");
    }
}

#[test]
fn rope_default_swa_known_angles() {
    // SWA: 256 dims, base 1e4. At pos 3, pair 0 rotates by 3 rad and pair 64
    // by 3 · 1e4^(-128/256) = 3 / 100 = 0.03 rad.
    let mut head = vec![0f32; 256];
    head[0] = 1.0;
    head[64] = 2.0;
    head[128 + 64] = -1.0;
    rope_neox(&mut head, 3, 1e4, 256, None);
    assert!(close(head[0], 3f64.cos(), 1e-7));
    assert!(close(head[128], 3f64.sin(), 1e-7));
    let (s, c) = 0.03f64.sin_cos();
    assert!(close(head[64], 2.0 * c + s, 1e-7));
    assert!(close(head[192], 2.0 * s - c, 1e-7));
}

#[test]
fn rope_pos0_is_identity_and_partial_dims_pass_through() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let orig = random(&mut rng, 256);
    let mut head = orig.clone();
    rope_neox(&mut head, 0, 1e4, 256, None);
    assert_eq!(head, orig);
    // Rotating only the first 128 dims leaves 128..256 alone.
    let mut head = orig.clone();
    rope_neox(&mut head, 5, 1e4, 128, None);
    assert_eq!(head[128..], orig[128..]);
    assert_ne!(head[..128], orig[..128]);
}

// ------------------------------------------------------------ activations

#[test]
fn gelu_known_points() {
    assert_eq!(gelu_tanh(0.0), 0.0);
    // 0.5 (1 + tanh(√(2/π) · 1.044715)) = 0.8411919906
    assert!(close(gelu_tanh(1.0), 0.841_191_990_608_276_8, 1e-7));
    assert!(close(gelu_tanh(-1.0), -0.158_808_009_391_723_24, 1e-7));
    assert!(close(gelu_tanh(2.0), 1.954_597_694_087_775, 1e-7));
    assert_eq!(gelu_tanh(20.0), 20.0);
    assert!(gelu_tanh(-20.0).abs() < 1e-30);
}

#[test]
fn softcap_known_points() {
    // 30 · tanh(1)
    assert!(close(softcap(30.0, 30.0), 22.847_824_678_672_946, 1e-5));
    assert_eq!(softcap(0.0, 30.0), 0.0);
    assert_eq!(softcap(-30.0, 30.0), -softcap(30.0, 30.0));
    assert_eq!(softcap(1e6, 30.0), 30.0);
}

#[test]
fn softmax_known_values() {
    let mut out = [0f32; 1];
    softmax(&[123.0], &mut out);
    assert_eq!(out, [1.0]);
    let mut out = [0f32; 2];
    softmax(&[0.0, 3f32.ln()], &mut out);
    assert!(
        close(out[0], 0.25, 1e-7) && close(out[1], 0.75, 1e-7),
        "{out:?}"
    );
    let mut out = [0f32; 3];
    softmax(&[f32::NEG_INFINITY, 1000.0, 1000.0], &mut out);
    assert_eq!(out, [0.0, 0.5, 0.5]);
    softmax(&[f32::NEG_INFINITY; 3], &mut out);
    assert_eq!(out, [0.0; 3]);
}

// ------------------------------------------------------------ matmul, ffn

#[test]
fn matmul_hand_values() {
    // x = [[1,2,3],[4,5,6]], w rows (output features) [1,0,-1] and [.5,.5,.5].
    let x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    let w = [1.0, 0.0, -1.0, 0.5, 0.5, 0.5];
    let mut out = [0f32; 4];
    matmul(&w, &x, 2, 2, 3, &mut out);
    assert_eq!(out, [-2.0, 3.0, -2.0, 7.5]);
}

#[test]
fn matmul_quant_uses_dequantized_rows() {
    // Two Q8_0 rows of 32: row 0 d = 0.5 with quants 2 (value 1), row 1
    // d = 2 with quants -1 (value -2). x = 0..32: Σ = 496.
    let mut w = vec![0x00, 0x38];
    w.extend([2u8; 32]);
    w.extend([0x00, 0x40]);
    w.extend([0xffu8; 32]);
    let x: Vec<f32> = (0..32).map(|i| i as f32).collect();
    let mut out = [0f32; 2];
    matmul_quant(GgmlType::Q8_0, &w, &x, 1, 2, 32, &mut out).expect("valid weights");
    assert_eq!(out, [496.0, -992.0]);
    // A weight buffer of the wrong size is an error, not a panic.
    assert!(matmul_quant(GgmlType::Q8_0, &w[..34], &x, 1, 2, 32, &mut out).is_err());
    assert!(matmul_quant(GgmlType::Q8_0, &w, &x[..16], 1, 2, 16, &mut out).is_err());
}

#[test]
fn gated_ffn_hand_values() {
    // x = (1, -1); gate = I -> g = (1, -1); up rows (2, 0), (1, 1) -> u = (2, 0);
    // h = (2 gelu(1), 0); down rows (1, 0), (0.5, 3) -> out = (2 gelu(1), gelu(1)).
    let c = (2.0 / std::f64::consts::PI).sqrt();
    let g1 = 0.5 * (1.0 + (c * 1.044_715f64).tanh());
    let mut out = [0f32; 2];
    gated_ffn(
        &[1.0, -1.0],
        &[1.0, 0.0, 0.0, 1.0],
        &[2.0, 0.0, 1.0, 1.0],
        &[1.0, 0.0, 0.5, 3.0],
        2,
        2,
        &mut out,
    );
    assert!(close(out[0], 2.0 * g1, 1e-6), "{out:?}");
    assert!(close(out[1], g1, 1e-6), "{out:?}");
}

#[test]
fn gated_ffn_rectangular_matches_composition() {
    // d = 8, ff = 24: the FFN equals matmul -> gelu ⊙ -> matmul done by hand in f64.
    let (d, ff) = (8usize, 24usize);
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let (x, gate, up, down) = (
        random(&mut rng, d),
        random(&mut rng, ff * d),
        random(&mut rng, ff * d),
        random(&mut rng, d * ff),
    );
    let mut out = vec![0f32; d];
    gated_ffn(&x, &gate, &up, &down, d, ff, &mut out);
    let c = (2.0 / std::f64::consts::PI).sqrt();
    let dot = |w: &[f32], v: &[f64]| -> f64 { w.iter().zip(v).map(|(&a, &b)| a as f64 * b).sum() };
    let xd: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let h: Vec<f64> = (0..ff)
        .map(|j| {
            let g = dot(&gate[j * d..(j + 1) * d], &xd);
            let u = dot(&up[j * d..(j + 1) * d], &xd);
            0.5 * g * (1.0 + (c * (g + 0.044715 * g * g * g)).tanh()) * u
        })
        .collect();
    for i in 0..d {
        let want = dot(&down[i * ff..(i + 1) * ff], &h);
        assert!(close(out[i], want, 1e-5), "out[{i}] {} vs {want}", out[i]);
    }
}

// ------------------------------------------------------------ attention

fn params(nq: usize, nkv: usize, hd: usize, window: Option<usize>) -> AttnParams {
    AttnParams {
        n_heads: nq,
        n_kv_heads: nkv,
        head_dim: hd,
        scale: 1.0,
        window,
    }
}

#[test]
fn one_visible_key_returns_its_value() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    for hd in [256usize, 512] {
        let q = random(&mut rng, hd);
        let k = random(&mut rng, hd);
        let v = random(&mut rng, hd);
        let mut out = vec![0f32; hd];
        attention(&q, &[7], &k, &v, &[7], &params(1, 1, hd, None), &mut out);
        assert_eq!(out, v, "hd {hd}");
    }
}

/// Values that name their key: v of key s is s in every dimension, so the
/// output of a query with equal scores is the mean of the visible positions.
fn uniform_window_case(window: Option<usize>, q_pos: usize, n_keys: usize) -> f32 {
    let hd = 4;
    let q = vec![0f32; hd]; // all scores 0 -> uniform over visible keys
    let k = vec![1f32; n_keys * hd];
    let v: Vec<f32> = (0..n_keys).flat_map(|s| [s as f32; 4]).collect();
    let kp: Vec<usize> = (0..n_keys).collect();
    let mut out = vec![0f32; hd];
    attention(
        &q,
        &[q_pos],
        &k,
        &v,
        &kp,
        &params(1, 1, hd, window),
        &mut out,
    );
    out[0]
}

#[test]
fn window_rule_key_exactly_w_back_is_masked() {
    // q at 10, W = 3: visible keys 8, 9, 10 (10 - 8 = 2 < 3); key 7 (10 - 7 = 3) masked.
    assert!(close(uniform_window_case(Some(3), 10, 11), 9.0, 1e-6));
    // W = 4 brings key 7 in: mean of 7..=10 = 8.5.
    assert!(close(uniform_window_case(Some(4), 10, 11), 8.5, 1e-6));
    // W = 1: only the query's own position.
    assert!(close(uniform_window_case(Some(1), 10, 11), 10.0, 1e-6));
    // No window: causal over 0..=10, mean 5; keys after the query are masked.
    assert!(close(uniform_window_case(None, 10, 16), 5.0, 1e-6));
}

#[test]
fn window_rule_perturbation() {
    // Changing the value of a key exactly W back leaves the output unchanged;
    // changing the one W - 1 back changes it.
    let (hd, w, qp) = (8usize, 5usize, 12usize);
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let n = qp + 1;
    let q = random(&mut rng, hd);
    let k = random(&mut rng, n * hd);
    let v = random(&mut rng, n * hd);
    let kp: Vec<usize> = (0..n).collect();
    let p = params(1, 1, hd, Some(w));
    let run = |v: &[f32]| {
        let mut out = vec![0f32; hd];
        attention(&q, &[qp], &k, v, &kp, &p, &mut out);
        out
    };
    let base = run(&v);
    let mut v_far = v.clone();
    v_far[(qp - w) * hd] += 100.0;
    assert_eq!(run(&v_far), base, "key exactly W back must be masked");
    let mut v_near = v.clone();
    v_near[(qp - w + 1) * hd] += 100.0;
    assert_ne!(run(&v_near), base, "key W-1 back must be visible");
}

#[test]
fn gqa_contiguous_groups() {
    // 4 q heads, 2 kv heads: q heads 0,1 read kv head 0 and 2,3 read kv head 1.
    let hd = 256;
    let q = vec![0.01f32; 4 * hd];
    let k = vec![0.5f32; 2 * hd];
    let v: Vec<f32> = [10f32, 20.0].iter().flat_map(|&x| vec![x; hd]).collect();
    let mut out = vec![0f32; 4 * hd];
    attention(&q, &[0], &k, &v, &[0], &params(4, 2, hd, None), &mut out);
    for h in 0..4 {
        let want = if h < 2 { 10.0 } else { 20.0 };
        assert!(
            out[h * hd..(h + 1) * hd].iter().all(|&x| x == want),
            "head {h}"
        );
    }
    // 8 q heads over 1 kv head (E2B): all read kv head 0.
    let q = vec![0.01f32; 8 * hd];
    let mut out = vec![0f32; 8 * hd];
    attention(
        &q,
        &[0],
        &k[..hd],
        &v[..hd],
        &[0],
        &params(8, 1, hd, None),
        &mut out,
    );
    assert!(out.iter().all(|&x| x == 10.0));
}

#[test]
fn two_keys_closed_form_both_head_dims() {
    // q = e0 · a, k1 = e0, k2 = -e0: scores a and -a (scale 1), so the weight
    // of key 1 is 1 / (1 + e^{-2a}) = (1 + tanh a) / 2.
    for (hd, scale) in [(256usize, 1.0f32), (512, 1.0), (512, 0.5)] {
        let a = 0.75f64;
        let mut q = vec![0f32; hd];
        q[0] = a as f32;
        let mut k = vec![0f32; 2 * hd];
        k[0] = 1.0;
        k[hd] = -1.0;
        let mut v = vec![0f32; 2 * hd];
        v[1] = 1.0; // key 1's value marks dim 1
        v[hd + 2] = 1.0; // key 2's value marks dim 2
        let p = AttnParams {
            scale,
            ..params(1, 1, hd, None)
        };
        let mut out = vec![0f32; hd];
        attention(&q, &[4], &k, &v, &[3, 4], &p, &mut out);
        let w1 = (1.0 + (a * scale as f64).tanh()) / 2.0;
        assert!(close(out[1], w1, 1e-7), "hd {hd} scale {scale}: {}", out[1]);
        assert!(close(out[2], 1.0 - w1, 1e-7));
        assert_eq!(out[0], 0.0);
    }
}

#[test]
fn no_visible_key_gives_zeros_and_batches_equal_single_queries() {
    let hd = 8;
    let mut out = vec![1f32; hd];
    attention(
        &[1.0; 8],
        &[0],
        &[1.0; 8],
        &[1.0; 8],
        &[1],
        &params(1, 1, hd, None),
        &mut out,
    );
    assert_eq!(out, vec![0.0; hd]);

    // Prefill of T queries == T single-query calls (same masks per row).
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let (nq, nkv, t) = (4usize, 2usize, 6usize);
    let q = random(&mut rng, t * nq * hd);
    let k = random(&mut rng, t * nkv * hd);
    let v = random(&mut rng, t * nkv * hd);
    let pos: Vec<usize> = (20..20 + t).collect();
    let p = params(nq, nkv, hd, Some(3));
    let mut batch = vec![0f32; t * nq * hd];
    attention(&q, &pos, &k, &v, &pos, &p, &mut batch);
    for i in 0..t {
        let mut one = vec![0f32; nq * hd];
        let qi = &q[i * nq * hd..(i + 1) * nq * hd];
        attention(qi, &pos[i..i + 1], &k, &v, &pos, &p, &mut one);
        assert_eq!(one, batch[i * nq * hd..(i + 1) * nq * hd], "row {i}");
    }
}

#[test]
#[should_panic(expected = "not a multiple of n_kv_heads")]
fn attention_rejects_bad_gqa() {
    attention(
        &[0.0; 6],
        &[0],
        &[0.0; 4],
        &[0.0; 4],
        &[0],
        &params(3, 2, 2, None),
        &mut [0.0; 6],
    );
}
