//! Block formats pinned by hand-built blocks.
//!
//! Every block below is assembled byte by byte from the documented layout,
//! and the expected floats are computed here from the chosen fields (or
//! written out as literals), never by the crate's own decoders. Field values
//! are powers of two and small integers so every expected float is exact and
//! the comparisons use `==`.

// Layout tests read most clearly as index arithmetic over element numbers.
#![allow(clippy::needless_range_loop)]

use gemtune_kernels::quant::{
    dequantize_row, dequantize_to_vec, dot_row_f32, dot_row_multi_f32, quantize_row,
    quantize_to_vec, GgmlType, QuantError, QuantOp,
};
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

// Half-precision bit patterns of the scales used below (IEEE binary16).
const H_0_0625: [u8; 2] = [0x00, 0x2c];
const H_0_125: [u8; 2] = [0x00, 0x30];
const H_0_25: [u8; 2] = [0x00, 0x34];
const H_0_5: [u8; 2] = [0x00, 0x38];
const H_1: [u8; 2] = [0x00, 0x3c];
const H_2: [u8; 2] = [0x00, 0x40];
const H_3: [u8; 2] = [0x00, 0x42];
const H_M1: [u8; 2] = [0x00, 0xbc];

fn deq(ty: GgmlType, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; n];
    dequantize_row(ty, bytes, &mut out).expect("valid block");
    out
}

#[test]
fn half_constants_are_what_they_claim() {
    for (bits, v) in [
        (H_0_0625, 0.0625f32),
        (H_0_125, 0.125),
        (H_0_25, 0.25),
        (H_0_5, 0.5),
        (H_1, 1.0),
        (H_2, 2.0),
        (H_3, 3.0),
        (H_M1, -1.0),
    ] {
        assert_eq!(half::f16::from_le_bytes(bits).to_f32(), v);
    }
}

#[test]
fn f32_row_is_little_endian_bits() {
    let vals = [1.5f32, -0.0, f32::INFINITY, 1e-40, -3.25e7];
    let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    let out = deq(GgmlType::F32, &bytes, 5);
    for (a, b) in out.iter().zip(vals) {
        assert_eq!(a.to_bits(), b.to_bits());
    }
}

#[test]
fn f16_known_patterns() {
    let cases: [(u16, f32); 9] = [
        (0x3c00, 1.0),
        (0xc000, -2.0),
        (0x0001, 5.960_464_5e-8), // smallest subnormal, 2^-24
        (0x03ff, 6.097_555e-5),   // largest subnormal, 1023 * 2^-24
        (0x0400, 6.103_515_6e-5), // smallest normal, 2^-14
        (0x7bff, 65504.0),
        (0x3555, 0.333_251_95),
        (0x7c00, f32::INFINITY),
        (0xfc00, f32::NEG_INFINITY),
    ];
    let bytes: Vec<u8> = cases.iter().flat_map(|c| c.0.to_le_bytes()).collect();
    let out = deq(GgmlType::F16, &bytes, cases.len());
    for ((bits, want), got) in cases.iter().zip(&out) {
        assert_eq!(got, want, "f16 {bits:#06x}");
    }
    let neg0 = deq(GgmlType::F16, &0x8000u16.to_le_bytes(), 1)[0];
    assert_eq!(neg0.to_bits(), 0x8000_0000);
    assert!(deq(GgmlType::F16, &0x7e00u16.to_le_bytes(), 1)[0].is_nan());
}

#[test]
fn f16_every_pattern_matches_the_half_crate() {
    let bytes: Vec<u8> = (0..=u16::MAX).flat_map(|h| h.to_le_bytes()).collect();
    let out = deq(GgmlType::F16, &bytes, 65536);
    for (h, got) in (0..=u16::MAX).zip(&out) {
        let want = half::f16::from_bits(h).to_f32();
        if want.is_nan() {
            assert!(got.is_nan(), "{h:#06x}");
        } else {
            assert_eq!(got.to_bits(), want.to_bits(), "{h:#06x}");
        }
    }
}

#[test]
fn bf16_known_patterns() {
    let cases: [(u16, f32); 5] = [
        (0x3f80, 1.0),
        (0xc0a0, -5.0),
        (0x7f80, f32::INFINITY),
        (0x0001, f32::from_bits(0x0001_0000)),
        (0x3eab, 0.333_984_38),
    ];
    let bytes: Vec<u8> = cases.iter().flat_map(|c| c.0.to_le_bytes()).collect();
    let out = deq(GgmlType::Bf16, &bytes, cases.len());
    for ((bits, want), got) in cases.iter().zip(&out) {
        assert_eq!(got, want, "bf16 {bits:#06x}");
    }
}

#[test]
fn q4_0_hand_block() {
    // d = 0.5; qs[j] = j | (15 - j) << 4.
    let mut b = Vec::from(H_0_5);
    for j in 0u8..16 {
        b.push(j | ((15 - j) << 4));
    }
    let out = deq(GgmlType::Q4_0, &b, 32);
    // Low nibbles j -> (j - 8) * 0.5, high nibbles 15 - j -> (7 - j) * 0.5.
    let want: [f32; 32] = [
        -4.0, -3.5, -3.0, -2.5, -2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5,
        3.5, 3.0, 2.5, 2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -1.5, -2.0, -2.5, -3.0, -3.5, -4.0,
    ];
    assert_eq!(out, want);
}

#[test]
fn q4_1_hand_block() {
    // d = 0.25, m = -1; qs[j] = j | j << 4: element j and j + 16 both j*0.25 - 1.
    let mut b = Vec::from(H_0_25);
    b.extend(H_M1);
    for j in 0u8..16 {
        b.push(j | (j << 4));
    }
    let out = deq(GgmlType::Q4_1, &b, 32);
    for j in 0..16 {
        let want = j as f32 * 0.25 - 1.0;
        assert_eq!(out[j], want, "element {j}");
        assert_eq!(out[j + 16], want, "element {}", j + 16);
    }
    assert_eq!(out[0], -1.0);
    assert_eq!(out[31], 2.75);
}

#[test]
fn q5_0_hand_block() {
    // d = 2, qh = 0xAAAA5555 (bit j = fifth bit of element j), qs[j] = j | (15 - j) << 4.
    let qh: u32 = 0xaaaa_5555;
    let mut b = Vec::from(H_2);
    b.extend(qh.to_le_bytes());
    for j in 0u8..16 {
        b.push(j | ((15 - j) << 4));
    }
    let out = deq(GgmlType::Q5_0, &b, 32);
    for e in 0..32usize {
        let low = if e < 16 {
            e as i32
        } else {
            15 - (e as i32 - 16)
        };
        let high = ((qh >> e) & 1) as i32;
        let want = ((low | (high << 4)) - 16) as f32 * 2.0;
        assert_eq!(out[e], want, "element {e}");
    }
    // Hand-checked: element 0 has low 0, bit 0 of 0x5555 set -> 16 - 16 = 0;
    // element 1: low 1, bit clear -> (1 - 16) * 2 = -30; element 31: low 0,
    // bit 31 of 0xAAAA.... set -> 0.
    assert_eq!(out[0], 0.0);
    assert_eq!(out[1], -30.0);
    assert_eq!(out[31], 0.0);
}

#[test]
fn q5_1_hand_block() {
    // d = 0.5, m = 3, qh = 0x0000FFFF (elements 0..16 get the fifth bit).
    let qh: u32 = 0x0000_ffff;
    let mut b = Vec::from(H_0_5);
    b.extend(H_3);
    b.extend(qh.to_le_bytes());
    for j in 0u8..16 {
        b.push(j | ((15 - j) << 4));
    }
    let out = deq(GgmlType::Q5_1, &b, 32);
    for j in 0..16usize {
        assert_eq!(out[j], (16 + j) as f32 * 0.5 + 3.0, "element {j}");
        assert_eq!(
            out[j + 16],
            (15 - j) as f32 * 0.5 + 3.0,
            "element {}",
            j + 16
        );
    }
    assert_eq!(out[15], 18.5);
}

#[test]
fn q8_0_hand_block() {
    // d = 0.125, qs[j] = 8j - 128 (as i8): values -16, -15, ..., 15.
    let mut b = Vec::from(H_0_125);
    for j in 0..32i32 {
        b.push((8 * j - 128) as i8 as u8);
    }
    let out = deq(GgmlType::Q8_0, &b, 32);
    let want: Vec<f32> = (-16..16).map(|v| v as f32).collect();
    assert_eq!(out, want);
}

#[test]
fn q8_1_hand_block() {
    // d = 0.25, s = 1.0 (not used for values), qs[j] = j - 16.
    let mut b = Vec::from(H_0_25);
    b.extend(H_1);
    for j in 0..32i32 {
        b.push((j - 16) as i8 as u8);
    }
    let out = deq(GgmlType::Q8_1, &b, 32);
    let want: Vec<f32> = (0..32).map(|j| (j - 16) as f32 * 0.25).collect();
    assert_eq!(out, want);
}

/// Packs eight 6-bit scales and mins the way Q4_K/Q5_K store them.
fn pack_k_scales(sc: [u8; 8], m: [u8; 8]) -> [u8; 12] {
    let mut q = [0u8; 12];
    for j in 0..4 {
        q[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        q[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
        q[j + 8] = (sc[j + 4] & 0x0f) | ((m[j + 4] & 0x0f) << 4);
    }
    q
}

const K_SC: [u8; 8] = [1, 2, 63, 10, 33, 17, 45, 5];
const K_M: [u8; 8] = [0, 3, 7, 63, 12, 40, 1, 20];

#[test]
fn k_scale_packing_hand_bytes() {
    // Worked by hand: byte 0 = 1 | (33 >> 4) << 6 = 0x81, byte 8 = (33 & 15) | (12 & 15) << 4 = 0xC1, ...
    assert_eq!(
        pack_k_scales(K_SC, K_M),
        [0x81, 0x42, 0xbf, 0x0a, 0x00, 0x83, 0x07, 0x7f, 0xc1, 0x81, 0x1d, 0x45]
    );
}

fn k_qs(i: usize) -> u8 {
    ((i * 37 + 11) & 0xff) as u8
}

#[test]
fn q4_k_hand_block() {
    // d = 0.5, dmin = 0.25, scales/mins K_SC/K_M, qs[i] = (37 i + 11) mod 256.
    let mut b = Vec::from(H_0_5);
    b.extend(H_0_25);
    b.extend(pack_k_scales(K_SC, K_M));
    b.extend((0..128).map(k_qs));
    assert_eq!(b.len(), 144);
    let out = deq(GgmlType::Q4K, &b, 256);
    for e in 0..256 {
        let s = e / 32; // sub-block
        let byte = k_qs(32 * (s / 2) + e % 32);
        let nib = if s % 2 == 0 { byte & 0x0f } else { byte >> 4 };
        let want = 0.5 * K_SC[s] as f32 * nib as f32 - 0.25 * K_M[s] as f32;
        assert_eq!(out[e], want, "element {e}");
    }
    // Hand-checked spots: e0: qs[0] = 11, low 11 -> 0.5*1*11 - 0 = 5.5.
    // e32: high nibble of qs[0] = 0 -> -0.25*3. e255: qs[127] = 0x66, high 6 -> 0.5*5*6 - 0.25*20.
    assert_eq!(out[0], 5.5);
    assert_eq!(out[32], -0.75);
    assert_eq!(out[255], 10.0);
}

#[test]
fn q5_k_hand_block() {
    // As Q4_K plus qh[l] = 0x5A ^ l: bit s of qh[l] is the fifth bit of element 32 s + l.
    let qh = |l: usize| (0x5a ^ l) as u8;
    let mut b = Vec::from(H_0_5);
    b.extend(H_0_25);
    b.extend(pack_k_scales(K_SC, K_M));
    b.extend((0..32).map(qh));
    b.extend((0..128).map(k_qs));
    assert_eq!(b.len(), 176);
    let out = deq(GgmlType::Q5K, &b, 256);
    for e in 0..256 {
        let (s, l) = (e / 32, e % 32);
        let byte = k_qs(32 * (s / 2) + l);
        let nib = if s % 2 == 0 { byte & 0x0f } else { byte >> 4 };
        let q = nib as u32 + 16 * ((qh(l) >> s) & 1) as u32;
        let want = 0.5 * K_SC[s] as f32 * q as f32 - 0.25 * K_M[s] as f32;
        assert_eq!(out[e], want, "element {e}");
    }
    // e0: nibble 11, qh[0] = 0x5A bit 0 clear -> 5.5; e32: nibble 0, bit 1 set -> 0.5*2*16 - 0.75.
    assert_eq!(out[0], 5.5);
    assert_eq!(out[32], 15.25);
}

/// Test-side Q6_K packer: 6-bit unsigned values (0..64), i8 scales, f16 d.
fn pack_q6_k(q: &[u8; 256], scales: &[i8; 16], d: [u8; 2]) -> Vec<u8> {
    let mut b = vec![0u8; 210];
    for (e, &v) in q.iter().enumerate() {
        let (h, r) = (e / 128, e % 128);
        let (k, l) = (r / 32, r % 32);
        let qi = 64 * h + l + 32 * (k & 1);
        if k < 2 {
            b[qi] |= v & 0x0f;
        } else {
            b[qi] |= (v & 0x0f) << 4;
        }
        b[128 + 32 * h + l] |= (v >> 4) << (2 * k);
    }
    for (s, &sc) in scales.iter().enumerate() {
        b[192 + s] = sc as u8;
    }
    b[208..210].copy_from_slice(&d);
    b
}

#[test]
fn q6_k_hand_block() {
    let q: [u8; 256] = std::array::from_fn(|e| ((e * 7 + 3) % 64) as u8);
    let scales: [i8; 16] = std::array::from_fn(|s| s as i8 * 3 - 20);
    let b = pack_q6_k(&q, &scales, H_0_0625);
    let out = deq(GgmlType::Q6K, &b, 256);
    for e in 0..256 {
        let want = 0.0625 * scales[e / 16] as f32 * (q[e] as f32 - 32.0);
        assert_eq!(out[e], want, "element {e}");
    }
    // e0: q = 3, scale -20 -> 0.0625 * -20 * -29 = 36.25.
    // e255: q = (1785 + 3) % 64 = 60, scale 25 -> 0.0625 * 25 * 28 = 43.75.
    assert_eq!(out[0], 36.25);
    assert_eq!(out[255], 43.75);
    // A literal byte of the layout: ql[0] holds element 0 (low) and element 64 (high).
    assert_eq!(b[0], (q[0] & 15) | ((q[64] & 15) << 4));
    assert_eq!(
        b[128],
        (q[0] >> 4) | ((q[32] >> 4) << 2) | ((q[64] >> 4) << 4) | ((q[96] >> 4) << 6)
    );
}

#[test]
fn multi_block_rows_decode_block_by_block() {
    // Two Q8_0 blocks with different scales.
    let mut b = Vec::from(H_0_5);
    b.extend([2u8; 32]);
    b.extend(H_2);
    b.extend([0xffu8; 32]); // -1
    let out = deq(GgmlType::Q8_0, &b, 64);
    assert!(out[..32].iter().all(|&v| v == 1.0));
    assert!(out[32..].iter().all(|&v| v == -2.0));
}

// ---------------------------------------------------------------- quantize

#[test]
fn q8_0_quantize_hand_values() {
    // amax 127 -> d = 1, so q = round-half-away(x).
    let mut x = [0f32; 32];
    x[0] = 127.0;
    x[1] = 1.5;
    x[2] = -2.5;
    x[3] = 0.49;
    x[4] = -127.0;
    x[5] = 0.5;
    x[6] = -0.5;
    x[7] = 3.51;
    let mut out = [0u8; 34];
    quantize_row(GgmlType::Q8_0, &x, &mut out).expect("quantize");
    let mut want = [0u8; 34];
    want[..2].copy_from_slice(&H_1);
    for (i, q) in [127i8, 2, -3, 0, -127, 1, -1, 4].iter().enumerate() {
        want[2 + i] = *q as u8;
    }
    assert_eq!(out, want);

    // amax 63.5 -> d = 0.5, 1/d = 2: 0.25 -> 0.5 -> 1 (half away from zero).
    let mut x = [0.25f32; 32];
    x[9] = -63.5;
    x[10] = -0.75;
    let mut out = [0u8; 34];
    quantize_row(GgmlType::Q8_0, &x, &mut out).expect("quantize");
    assert_eq!(out[..2], H_0_5);
    assert_eq!(out[2], 1);
    assert_eq!(out[2 + 9] as i8, -127);
    assert_eq!(out[2 + 10] as i8, -2);

    // All zero: d = 0, all quants 0.
    let mut out = [0xaau8; 34];
    quantize_row(GgmlType::Q8_0, &[0.0; 32], &mut out).expect("quantize");
    assert_eq!(out, [0u8; 34]);
}

#[test]
fn q8_1_quantize_stores_the_sum() {
    // d = 1; quants 127, 2, -3, 0...: Σq = 126, s = 126 * 1.
    let mut x = [0f32; 32];
    x[0] = 127.0;
    x[1] = 1.5;
    x[2] = -2.5;
    let out = quantize_to_vec(GgmlType::Q8_1, &x).expect("quantize");
    assert_eq!(out.len(), 36);
    assert_eq!(out[..2], H_1);
    assert_eq!(half::f16::from_le_bytes([out[2], out[3]]).to_f32(), 126.0);
    assert_eq!(&out[4..7], &[127u8, 2, (-3i8) as u8]);
    assert!(out[7..].iter().all(|&q| q == 0));
}

#[test]
fn q4_0_quantize_hand_values() {
    // Largest magnitude is -8 -> d = -8 / -8 = 1; q = min(15, trunc(x + 8.5)).
    let mut x = [0f32; 32];
    let vals = [
        (0, -8.0f32),
        (1, 7.0),
        (2, 7.5),
        (3, 0.5),
        (4, -0.5),
        (5, 0.49),
        (6, 2.0),
    ];
    for (i, v) in vals {
        x[i] = v;
    }
    x[16] = -7.9; // trunc(0.6) = 0
    x[17] = 3.2; // trunc(11.7) = 11
    let mut out = [0u8; 18];
    quantize_row(GgmlType::Q4_0, &x, &mut out).expect("quantize");
    let low = [0u8, 15, 15, 9, 8, 8, 10, 8, 8, 8, 8, 8, 8, 8, 8, 8];
    let high = [0u8, 11, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8];
    let mut want = [0u8; 18];
    want[..2].copy_from_slice(&H_1);
    for j in 0..16 {
        want[2 + j] = low[j] | (high[j] << 4);
    }
    assert_eq!(out, want);

    // Largest magnitude positive (4, first of the tie with -4): d = -0.5, 1/d = -2.
    let mut x = [0f32; 32];
    x[0] = 4.0;
    x[1] = -4.0; // -4 * -2 + 8.5 = 16.5 -> 16 -> clamped to 15
    x[2] = 1.0; // -2 + 8.5 = 6.5 -> 6
    let mut out = [0u8; 18];
    quantize_row(GgmlType::Q4_0, &x, &mut out).expect("quantize");
    assert_eq!(half::f16::from_le_bytes([out[0], out[1]]).to_f32(), -0.5);
    assert_eq!(out[2], 8 << 4); // x[0] -> 0, x[16] = 0 -> 8
    assert_eq!(out[3] & 15, 15);
    assert_eq!(out[4] & 15, 6);
}

#[test]
fn q6_k_quantize_exact_grid_is_lossless() {
    // Sub-block s holds k * 2^-(2 + s % 3) for k = -32..31 (the -32 end sets
    // the sign of the scale): the reference search finds the exact scale,
    // the i8 scales become -128, -64, -32 against d = -1/512, and every value
    // is recovered bit for bit.
    let x: Vec<f32> = (0..256usize)
        .map(|e| {
            let s = e / 16;
            let k = ((e % 16) * 4) as i32 - 32 + (s as i32 % 4); // -32.. in steps of 4
            k as f32 / (1 << (2 + s % 3)) as f32
        })
        .collect();
    let q = quantize_to_vec(GgmlType::Q6K, &x).expect("quantize");
    let back = dequantize_to_vec(GgmlType::Q6K, &q, 256).expect("dequantize");
    // Sub-blocks with s % 4 != 0 do not contain -32 exactly; they are not
    // guaranteed lossless, so check only those that do.
    for s in (0..16).filter(|s| s % 4 == 0) {
        for e in 16 * s..16 * s + 16 {
            assert_eq!(back[e], x[e], "element {e}");
        }
        let want_sc = -128 >> (s % 3); // -128, -64, -32
        assert_eq!(q[192 + s] as i8, want_sc as i8, "scale of sub-block {s}");
    }
    assert_eq!(
        half::f16::from_le_bytes([q[208], q[209]]).to_f32(),
        -1.0 / 512.0
    );
    // Expected bytes of sub-block 0 from the test's own packer: values
    // k + 32 with k = -32, -28, ..., 28.
    let mut l = [0u8; 256];
    for (e, v) in l.iter_mut().enumerate().take(16) {
        *v = (e * 4) as u8;
    }
    let packed = pack_q6_k(&l, &[0; 16], [0, 0]);
    for i in 0..16 {
        assert_eq!(q[i] & 0x0f, packed[i] & 0x0f, "ql[{i}]");
        assert_eq!(q[128 + i] & 3, packed[128 + i] & 3, "qh[{i}]");
    }
}

/// Two Q6_K blocks as written by ggml's reference `quantize_row_q6_K_ref`
/// (llama.cpp as vendored in llama-cpp-python 0.3.36, compiled and run once
/// on the input of `golden_q6_k_input`). Input values are exact f32
/// quotients and products, so any IEEE machine reproduces them.
const GOLDEN_Q6_K: &str = concat!(
    "e01d4b7895c2f00d3a6895b2ef1d4a777c4e11e4c7996c3f11e4b6896c3f01e4194674a1de0b4976a3d10e3b68a6d300",
    "10436699ccff0235688bbde01346699c04418fcc094784c10e3c79b6f4317ebb5084a7db1e426599cce013476b9ec2e5",
    "f3c6997b4e10e3b6996b3e01f3d6a97cd29f5c19d694511edb985613d09f5c19283b3b3b3777774646468282819191d1",
    "e2e2e3d3d3d3171714040408484849794e4e4d4d5d51111120202024e4f4f7f7f8f4f4f48485858141425252121e1f1f",
    "7d847d8c867c94867ea0847aa9807955180c0d122831588ec3177afc0e8fe03070a050301f0e0d0b0804ffe8c1af6801",
    "9c088c07a442e1a07040201f0d0b07010a001e18315882bd0966d40281e03070a0d01291f04080b0d0e0ff0d0b08040f",
    "1810204b74affa47b40381e13070a0c0e0ff010305070b0ff5ecd0a87e33e78a0cee1190005090c0e0ff0e0d0a07031e",
    "28302a2bebe8a8a8a9b9b9b5858586969292a2a2a1adada9e9e9d818181b5b5b4a4a8a8a8a9a9a9a5e5e516161652524",
    "24e4282b6b6a6a7a7a4686869696969292917f8fcd8070bb8674a688768b6c788e530e86",
);

/// Block 0: v_i = ((7919 i mod 2001) - 1000) / 1000 (uniform-ish);
/// block 1: 0.37 · v_i³ (heavy-tailed, exercises the scale search).
fn golden_q6_k_input() -> Vec<f32> {
    (0..512usize)
        .map(|i| {
            let v = (((i * 7919) % 2001) as f32 - 1000.0) / 1000.0;
            if i < 256 {
                v
            } else {
                v * v * v * 0.37
            }
        })
        .collect()
}

#[test]
fn q6_k_quantize_matches_ggml_reference_bytes() {
    let want: Vec<u8> = (0..GOLDEN_Q6_K.len() / 2)
        .map(|i| u8::from_str_radix(&GOLDEN_Q6_K[2 * i..2 * i + 2], 16).expect("hex"))
        .collect();
    assert_eq!(want.len(), 420);
    let got = quantize_to_vec(GgmlType::Q6K, &golden_q6_k_input()).expect("quantize");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "byte {i} (block {}, offset {})", i / 210, i % 210);
    }
}

#[test]
fn q6_k_quantize_all_zero_block() {
    let q = quantize_to_vec(GgmlType::Q6K, &[0.0; 256]).expect("quantize");
    assert_eq!(q, vec![0u8; 210]);
}

fn gaussian(rng: &mut ChaCha8Rng, n: usize, sigma: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let u1: f32 = rng.random::<f32>().max(1e-7);
            let u2: f32 = rng.random();
            sigma * (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
        })
        .collect()
}

fn rms(v: &[f32]) -> f64 {
    (v.iter().map(|&a| (a as f64).powi(2)).sum::<f64>() / v.len() as f64).sqrt()
}

#[test]
fn quantize_round_trip_error_bounds() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let x = gaussian(&mut rng, 256 * 64, 0.7);

    // Q8_0: every element within 0.5 step, plus the f16 rounding of d.
    let q = quantize_to_vec(GgmlType::Q8_0, &x).expect("q8_0");
    let back = dequantize_to_vec(GgmlType::Q8_0, &q, x.len()).expect("q8_0");
    for (xb, bb) in x.chunks(32).zip(back.chunks(32)) {
        let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
        let step = amax / 127.0;
        for (a, b) in xb.iter().zip(bb) {
            assert!((a - b).abs() <= 0.5 * step + amax * 1e-3, "{a} vs {b}");
        }
    }

    // Q4_0: within half a step, except the clamped +8 side (one full step).
    let q = quantize_to_vec(GgmlType::Q4_0, &x).expect("q4_0");
    let back = dequantize_to_vec(GgmlType::Q4_0, &q, x.len()).expect("q4_0");
    for (xb, bb) in x.chunks(32).zip(back.chunks(32)) {
        let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
        let step = amax / 8.0;
        for (a, b) in xb.iter().zip(bb) {
            assert!(
                (a - b).abs() <= step * 1.001 + 1e-6,
                "{a} vs {b} step {step}"
            );
        }
    }

    // Relative RMS error per type.
    let rel = |ty: GgmlType| {
        let q = quantize_to_vec(ty, &x).expect("quantize");
        let back = dequantize_to_vec(ty, &q, x.len()).expect("dequantize");
        let err: Vec<f32> = x.iter().zip(&back).map(|(a, b)| a - b).collect();
        rms(&err) / rms(&x)
    };
    let q8 = rel(GgmlType::Q8_0);
    let q4 = rel(GgmlType::Q4_0);
    let q6 = rel(GgmlType::Q6K);
    let f16 = rel(GgmlType::F16);
    let bf16 = rel(GgmlType::Bf16);
    assert!(q8 < 0.006, "q8_0 rel rms {q8}");
    assert!(q4 < 0.12, "q4_0 rel rms {q4}");
    assert!(q6 < 0.03, "q6_K rel rms {q6}");
    assert!(
        q6 < q4 / 3.0 && q8 < q6,
        "ordering q8 {q8} < q6 {q6} < q4 {q4}"
    );
    assert!(f16 < 3e-4, "f16 {f16}");
    assert!(bf16 < 3e-3, "bf16 {bf16}");
    assert_eq!(rel(GgmlType::F32), 0.0);
}

#[test]
fn f16_bf16_quantize_round_to_nearest_even() {
    // 1 + 2^-11 is a tie between 1 and 1 + 2^-10 in f16: even (1.0) wins.
    let q = quantize_to_vec(GgmlType::F16, &[1.0 + 2f32.powi(-11), 65520.0]).expect("f16");
    assert_eq!(q, vec![0x00, 0x3c, 0x00, 0x7c]); // 65520 rounds up to inf
                                                 // bf16: 1 + 2^-8 is a tie -> 1.0; 1 + 3*2^-8 is a tie -> 1 + 2^-6 (even).
    let q = quantize_to_vec(
        GgmlType::Bf16,
        &[1.0 + 2f32.powi(-8), 1.0 + 3.0 * 2f32.powi(-8)],
    )
    .expect("bf16");
    assert_eq!(q, vec![0x80, 0x3f, 0x82, 0x3f]);
}

// ---------------------------------------------------------------- dot

/// A random but valid encoded row of `n` elements: quantized from Gaussian
/// data where the type supports it, else random bytes with sane f16 scales.
fn random_row(ty: GgmlType, n: usize, rng: &mut ChaCha8Rng) -> Vec<u8> {
    if ty.can_quantize() {
        return quantize_to_vec(ty, &gaussian(rng, n, 0.5)).expect("quantize");
    }
    let mut b = vec![0u8; ty.row_bytes(n as u64).expect("whole blocks") as usize];
    rng.fill_bytes(&mut b);
    let f16_offsets: &[usize] = match ty {
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K | GgmlType::Q5K => &[0, 2],
        GgmlType::Q5_0 => &[0],
        _ => panic!("no generator for {ty}"),
    };
    for blk in b.chunks_mut(ty.type_size()) {
        for &o in f16_offsets {
            let v = rng.random_range(-0.05f32..0.05);
            blk[o..o + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
        }
    }
    b
}

#[test]
fn dot_matches_dequantize_then_f64_dot_for_every_type() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let types = GgmlType::ALL.iter().copied().filter(|t| t.can_dequantize());
    let mut seen = 0;
    for ty in types {
        for n in [256usize, 1024, 2816] {
            if n % ty.block_size() != 0 {
                continue;
            }
            let row = random_row(ty, n, &mut rng);
            let x = gaussian(&mut rng, n, 1.0);
            let y = dequantize_to_vec(ty, &row, n).expect("dequantize");
            let exact: f64 = y.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
            let mag: f64 = y
                .iter()
                .zip(&x)
                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                .sum();
            let got = dot_row_f32(ty, &row, &x).expect("dot");
            assert!(
                (got as f64 - exact).abs() <= 1e-5 * mag + 1e-6,
                "{ty} n={n}: dot {got} vs {exact} (mag {mag})"
            );
        }
        seen += 1;
    }
    assert_eq!(seen, 12);
}

#[test]
fn dot_of_plain_rows_with_tails() {
    // Lengths that are not a multiple of the 16 accumulator lanes.
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for n in [1usize, 7, 17, 33, 100] {
        let x = gaussian(&mut rng, n, 1.0);
        let w = gaussian(&mut rng, n, 1.0);
        let exact: f64 = w.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
        for ty in [GgmlType::F32, GgmlType::F16, GgmlType::Bf16] {
            let row = quantize_to_vec(ty, &w).expect("quantize");
            let y = dequantize_to_vec(ty, &row, n).expect("dequantize");
            let exact_q: f64 = y.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
            let got = dot_row_f32(ty, &row, &x).expect("dot") as f64;
            assert!(
                (got - exact_q).abs() < 1e-5 * (1.0 + exact.abs()),
                "{ty} n={n}"
            );
        }
    }
}

#[test]
fn dot_hand_block() {
    // Q8_0 block d = 0.5, quants 1..=32 against x = 1: 0.5 * Σ 1..32 = 264.
    let mut b = Vec::from(H_0_5);
    b.extend(1u8..=32);
    assert_eq!(
        dot_row_f32(GgmlType::Q8_0, &b, &[1.0; 32]).expect("dot"),
        264.0
    );
    // Q4_0 block d = 0.5, qs[j] = j | (15 - j) << 4 against x = 1: the hand
    // table in q4_0_hand_block sums to 0.5 * (Σ(j - 8) + Σ(7 - j)) = 0.5 * (-8 - 8).
    let mut b = Vec::from(H_0_5);
    b.extend((0u8..16).map(|j| j | ((15 - j) << 4)));
    assert_eq!(
        dot_row_f32(GgmlType::Q4_0, &b, &[1.0; 32]).expect("dot"),
        -8.0
    );
}

// ---------------------------------------------------------------- errors

#[test]
fn length_and_type_errors() {
    let mut dst = [7f32; 32];
    assert_eq!(
        dequantize_row(GgmlType::Q8_0, &[0u8; 33], &mut dst),
        Err(QuantError::PartialBlockBytes {
            ty: GgmlType::Q8_0,
            bytes: 33,
            type_size: 34
        })
    );
    assert!(dst.iter().all(|&v| v == 7.0), "dst untouched on error");
    assert_eq!(
        dequantize_row(GgmlType::Q8_0, &[0u8; 68], &mut dst),
        Err(QuantError::SizeMismatch {
            ty: GgmlType::Q8_0,
            what: "destination",
            expected: 64,
            actual: 32
        })
    );
    let mut dst = [0f32; 30];
    assert!(matches!(
        dequantize_row(GgmlType::Q4_0, &[0u8; 18], &mut dst),
        Err(QuantError::PartialBlockElements {
            block_size: 32,
            elements: 30,
            ..
        })
    ));
    let e = dequantize_row(GgmlType::Q2K, &[0u8; 84], &mut [0f32; 256]).unwrap_err();
    assert_eq!(
        e,
        QuantError::Unsupported {
            ty: GgmlType::Q2K,
            op: QuantOp::Dequantize
        }
    );
    assert!(e.to_string().contains("q2_K"), "{e}");

    let e = quantize_row(GgmlType::Q4K, &[0f32; 256], &mut [0u8; 144]).unwrap_err();
    assert!(matches!(
        e,
        QuantError::Unsupported {
            ty: GgmlType::Q4K,
            op: QuantOp::Quantize
        }
    ));
    assert!(e.to_string().contains("q4_K"), "{e}");
    assert!(matches!(
        quantize_row(GgmlType::Q8_0, &[0f32; 40], &mut [0u8; 34]),
        Err(QuantError::PartialBlockElements { .. })
    ));
    assert!(matches!(
        quantize_row(GgmlType::Q8_0, &[0f32; 64], &mut [0u8; 34]),
        Err(QuantError::SizeMismatch {
            expected: 68,
            actual: 34,
            ..
        })
    ));

    assert!(matches!(
        dot_row_f32(GgmlType::Q6K, &[0u8; 210], &[0f32; 255]),
        Err(QuantError::PartialBlockElements { .. })
    ));
    assert!(matches!(
        dot_row_f32(GgmlType::Q6K, &[0u8; 210], &[0f32; 512]),
        Err(QuantError::SizeMismatch {
            expected: 256,
            actual: 512,
            ..
        })
    ));
    assert!(matches!(
        dot_row_f32(GgmlType::Iq4Nl, &[0u8; 18], &[0f32; 32]),
        Err(QuantError::Unsupported {
            op: QuantOp::Dot,
            ..
        })
    ));
}

#[test]
fn capability_lists() {
    use GgmlType::*;
    let deq: Vec<GgmlType> = GgmlType::ALL
        .iter()
        .copied()
        .filter(|t| t.can_dequantize())
        .collect();
    assert_eq!(
        deq,
        vec![F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q4K, Q5K, Q6K, Bf16]
    );
    let q: Vec<GgmlType> = GgmlType::ALL
        .iter()
        .copied()
        .filter(|t| t.can_quantize())
        .collect();
    assert_eq!(q, vec![F32, F16, Q4_0, Q8_0, Q8_1, Q6K, Bf16]);
}

// ---------------------------------------------------------------- many-token dot

#[test]
fn dot_multi_is_bitwise_dot_per_token_for_every_type() {
    let mut rng = ChaCha8Rng::seed_from_u64(29);
    let types = GgmlType::ALL.iter().copied().filter(|t| t.can_dequantize());
    let mut seen = 0;
    for ty in types {
        for n in [256usize, 1024, 2816] {
            if n % ty.block_size() != 0 {
                continue;
            }
            let row = random_row(ty, n, &mut rng);
            for t in [1usize, 2, 3, 5, 8, 13] {
                let xs = gaussian(&mut rng, t * n, 1.0);
                let mut got = vec![f32::NAN; t];
                dot_row_multi_f32(ty, &row, &xs, n, &mut got).expect("multi dot");
                for (i, g) in got.iter().enumerate() {
                    let want = dot_row_f32(ty, &row, &xs[i * n..(i + 1) * n]).expect("dot");
                    assert!(want.is_finite(), "{ty} n={n}: non-finite dot");
                    assert_eq!(g.to_bits(), want.to_bits(), "{ty} n={n} t={t} token {i}");
                }
            }
        }
        seen += 1;
    }
    assert_eq!(seen, 12);
    // Plain rows whose length leaves a tail of fewer than 16 lanes.
    for n in [1usize, 17, 100, 130] {
        for ty in [GgmlType::F32, GgmlType::F16, GgmlType::Bf16] {
            let row = quantize_to_vec(ty, &gaussian(&mut rng, n, 1.0)).expect("quantize");
            let xs = gaussian(&mut rng, 5 * n, 1.0);
            let mut got = [0f32; 5];
            dot_row_multi_f32(ty, &row, &xs, n, &mut got).expect("multi dot");
            for (i, g) in got.iter().enumerate() {
                let want = dot_row_f32(ty, &row, &xs[i * n..(i + 1) * n]).expect("dot");
                assert_eq!(g.to_bits(), want.to_bits(), "{ty} n={n} token {i}");
            }
        }
    }
}

#[test]
fn dot_multi_rejects_bad_lengths() {
    let row = vec![0u8; 2 * 18]; // two Q4_0 blocks: 64 elements
    let mut out = [7f32; 3];
    assert_eq!(
        dot_row_multi_f32(GgmlType::Q4_0, &row, &[0.0; 191], 64, &mut out),
        Err(QuantError::SizeMismatch {
            ty: GgmlType::Q4_0,
            what: "xs",
            expected: 192,
            actual: 191
        })
    );
    assert_eq!(out, [7.0; 3], "nothing written on error");
    assert_eq!(
        dot_row_multi_f32(GgmlType::Q4_0, &row, &[0.0; 96], 32, &mut out),
        Err(QuantError::SizeMismatch {
            ty: GgmlType::Q4_0,
            what: "x",
            expected: 64,
            actual: 32
        })
    );
    assert_eq!(
        dot_row_multi_f32(GgmlType::Q4_0, &row, &[0.0; 93], 31, &mut out),
        Err(QuantError::PartialBlockElements {
            ty: GgmlType::Q4_0,
            elements: 31,
            block_size: 32
        })
    );
    assert!(matches!(
        dot_row_multi_f32(GgmlType::Iq2Xxs, &[], &[], 0, &mut []),
        Err(QuantError::Unsupported {
            op: QuantOp::Dot,
            ..
        })
    ));
}

/// Q4_0 and Q5_0 rows widened to Q8_0 decode to the file's values bit for
/// bit: random rows (finite scales of every exponent, random quants) plus
/// hand blocks at the quants' extremes, whose Q8_0 bytes are written out.
#[test]
fn widening_to_q8_0_is_exact() {
    let mut rng = ChaCha8Rng::seed_from_u64(0x51de);
    for ty in [GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0] {
        for blocks in [1usize, 3, 17] {
            let mut row = vec![0u8; blocks * ty.type_size()];
            rng.fill_bytes(&mut row);
            for b in row.chunks_exact_mut(ty.type_size()) {
                // A finite f16 scale: any sign and mantissa, exponent < 31.
                let h = (rng.random::<u16>() & 0x83ff) | ((rng.random_range(0u16..31)) << 10);
                b[..2].copy_from_slice(&h.to_le_bytes());
            }
            let mut wide = vec![0u8; blocks * 34];
            gemtune_kernels::quant::widen_to_q8_0(ty, &row, &mut wide).expect("widen");
            let want = deq(ty, &row, blocks * 32);
            let got = deq(GgmlType::Q8_0, &wide, blocks * 32);
            for (i, (w, g)) in want.iter().zip(&got).enumerate() {
                assert_eq!(
                    w.to_bits(),
                    g.to_bits(),
                    "{ty} x{blocks} element {i}: {w} vs {g}"
                );
            }
        }
    }
    // Q4_0: nibble 0 -> -8, 15 -> 7; Q5_0: 0 -> -16, 31 -> 15 (high bit
    // from qh).
    let mut q4 = vec![0u8; 18];
    q4[..2].copy_from_slice(&H_1);
    q4[2] = 0xf0; // element 0: 0 -> -8; element 16: 15 -> 7
    let mut w = vec![0u8; 34];
    gemtune_kernels::quant::widen_to_q8_0(GgmlType::Q4_0, &q4, &mut w).expect("q4_0");
    assert_eq!(&w[..2], &H_1);
    assert_eq!((w[2] as i8, w[18] as i8), (-8, 7));
    let mut q5 = vec![0u8; 22];
    q5[..2].copy_from_slice(&H_2);
    q5[2..6].copy_from_slice(&(1u32 << 16).to_le_bytes()); // element 16's high bit
    q5[6] = 0xf0; // element 0: 0 -> -16; element 16: 15 | 16 -> 15
    gemtune_kernels::quant::widen_to_q8_0(GgmlType::Q5_0, &q5, &mut w).expect("q5_0");
    assert_eq!(&w[..2], &H_2);
    assert_eq!((w[2] as i8, w[18] as i8), (-16, 15));
}

/// Types without an exact Q8_0 form, partial blocks and a destination of
/// the wrong size are refused, and the destination is left as it was.
#[test]
fn widening_refuses_what_it_cannot_do_exactly() {
    use gemtune_kernels::quant::{widen_to_q8_0, widens_exactly_to_q8_0};
    let mut dst = vec![0xabu8; 34];
    for ty in [
        GgmlType::Q4_1,
        GgmlType::Q5_1,
        GgmlType::Q4K,
        GgmlType::Q6K,
        GgmlType::F16,
        GgmlType::F32,
    ] {
        assert!(!widens_exactly_to_q8_0(ty), "{ty}");
        let src = vec![0u8; ty.type_size()];
        assert_eq!(
            widen_to_q8_0(ty, &src, &mut dst),
            Err(QuantError::Unsupported {
                ty,
                op: QuantOp::Widen
            })
        );
    }
    assert!(matches!(
        widen_to_q8_0(GgmlType::Q5_0, &[0u8; 21], &mut dst),
        Err(QuantError::PartialBlockBytes { .. })
    ));
    assert!(matches!(
        widen_to_q8_0(GgmlType::Q5_0, &[0u8; 44], &mut dst),
        Err(QuantError::SizeMismatch { .. })
    ));
    assert!(dst.iter().all(|&b| b == 0xab));
}
