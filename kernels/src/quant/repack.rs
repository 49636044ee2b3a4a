//! Lossless repacks of the k-quant super-blocks (Q4_K, Q5_K, Q6_K) into the
//! aligned planes the matmul kernels read (and [`block32_planes`], the
//! Q8_0 / Q4_0 split into a quant and a scale plane). `docs/calling-convention.md`
//! ("K-quant planes") is the prose form of these layouts.
//!
//! Every plane is row-major with a fixed number of bytes per 32 or 256
//! elements, so the planes of rows `r0..` of a matrix start at `r0` times the
//! row stride (the engine's fused matrices are addressed that way). Element
//! `e` of a row lies in 32-element group `g = e / 32` of super-block
//! `e / 256`; `q(e)` is its unsigned quant (4 bits for Q4_K, 5 for Q5_K, 6
//! for Q6_K, whose value is `q - 32`).
//!
//! - Nibble plane (shared by the GEMV and the prefill GEMMs): 16 bytes per
//!   group, Q4_0's order: byte `j` holds the low 4 bits of `q(32g + j)` in
//!   its low nibble and of `q(32g + 16 + j)` in its high nibble.
//! - High bits, in "byte-lane order": the bits above the nibble of the
//!   elements whose nibbles sit in byte `b` of nibble word `t` (elements
//!   `32g + 4t + b`, and `32g + 16 + 4t + b` for the high nibbles) are in
//!   byte `b` of the group's high-bit word(s), so one shift and one mask
//!   line them up with the nibbles of word `t`:
//!   - Q5_K, one u32 per group: bit `8b + t` is bit 4 of `q(32g + 4t + b)`,
//!     bit `8b + 4 + t` bit 4 of `q(32g + 16 + 4t + b)`;
//!   - Q6_K, two u32 per group: word 0 bits `8b + 2t, 8b + 2t + 1` are bits
//!     4..5 of `q(32g + 4t + b)`, word 1 the same for `q(32g + 16 + 4t + b)`.
//! - GEMV side records (compact, read by the decode GEMV), one per
//!   super-block, sizes that keep every field's load aligned (16 bytes
//!   for the Q4_K / Q5_K headers, 8 for Q6_K's high-bit word pairs):
//!   - Q4_K, 16 bytes: `d` f16, `dmin` f16, the 12 packed 6-bit scale and
//!     min bytes, exactly the super-block's first 16 bytes;
//!   - Q5_K, 48 bytes: those 16 bytes, then the 8 groups' high-bit words;
//!   - Q6_K, 88 bytes: the 8 groups' two high-bit words (64 bytes), the 16
//!     i8 scales, `d` f16 at byte 80, zeros to 88 (82 bytes of data: the
//!     record holds the file's 210-byte super-block in 216 with the nibble
//!     plane, 2.9 % more).
//! - GEMM side words (read by the prefill GEMMs), f32 or u32 words per group:
//!   - Q4_K, 2: `ds = d * sc_g`, `ms = dmin * m_g` (both exact in f32: an
//!     11-bit significand times a 6-bit integer);
//!   - Q5_K, 4: `ds`, `ms`, the high-bit word, a zero word (so a group's
//!     words are one 16-byte unit);
//!   - Q6_K, 4: `d * scale[2g]`, `d * scale[2g + 1]` (elements 0..15 and
//!     16..31 of the group), the two high-bit words.
//!
//! Values: Q4_K / Q5_K `fma(q, ds, -ms)`, Q6_K `ds_half * (q - 32)`. Since
//! `ds * q` is exact in f32, both equal ggml's `dequantize_row_*` bit for
//! bit ([`dequant_gemv_planes`] and [`dequant_gemm_planes`] model the
//! kernels' arithmetic; the tests hold them to [`super::dequantize_row`]).

use super::blocks::{f16_to_f32, k_scale_min, q6_k_values, rd_f16, QK_K};
use super::error::{QuantError, QuantOp};
use super::GgmlType;

/// Bytes of the nibble plane per 32-element group.
pub const NIBBLE_BYTES: usize = 16;

/// Whether `ty` is one of the k-quants these repacks handle.
pub fn is_kquant(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K)
}

/// Bytes of a GEMV side record (one per 256-element super-block).
pub fn gemv_side_bytes(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q4K => 16,
        GgmlType::Q5K => 48,
        GgmlType::Q6K => 88,
        _ => 0,
    }
}

/// 4-byte words of GEMM side data per 32-element group.
pub fn gemm_side_words(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q4K => 2,
        GgmlType::Q5K => 4,
        GgmlType::Q6K => 4,
        _ => 0,
    }
}

/// Splits Q8_0 / Q4_0 GGUF blocks of an `[n][k]` matrix into a quant plane
/// (`[n][k]` int8, or `[n][k/2]` nibbles in GGUF block order) and an f16
/// scale plane `[n][k/32]`: the 32-element types' planes, beside the
/// k-quants' below. Every other type comes back as two empty planes (the
/// k-quants have [`repack_kquant`]; F16/BF16 are read as they are).
pub fn block32_planes(ty: GgmlType, gguf: &[u8], n: usize, k: usize) -> (Vec<u8>, Vec<u16>) {
    let qb = match ty {
        GgmlType::Q8_0 => 32,
        GgmlType::Q4_0 => 16,
        _ => return (Vec::new(), Vec::new()),
    };
    let bsz = ty.type_size();
    let nb = k / 32;
    let mut q = Vec::with_capacity(n * nb * qb);
    let mut d = Vec::with_capacity(n * nb);
    for blk in gguf.chunks_exact(bsz).take(n * nb) {
        d.push(u16::from_le_bytes([blk[0], blk[1]]));
        q.extend_from_slice(&blk[2..2 + qb]);
    }
    (q, d)
}

/// The planes of one matrix: the nibble plane and one side plane (GEMV
/// records as bytes, or GEMM words as little-endian bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KPlanes {
    pub nibbles: Vec<u8>,
    pub side: Vec<u8>,
}

/// Which side plane a repack builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KSide {
    /// Compact per-super-block records (decode GEMV).
    Gemv,
    /// f32/u32 words per 32-element group (prefill GEMMs).
    Gemm,
}

fn check(ty: GgmlType, blocks: &[u8], elements: usize) -> Result<(), QuantError> {
    if !is_kquant(ty) {
        return Err(QuantError::Unsupported {
            ty,
            op: QuantOp::Dequantize,
        });
    }
    super::dequant::check_encoded(ty, blocks.len(), elements, QuantOp::Dequantize, "elements")
}

/// The 256 unsigned quants of one super-block, in element order (Q6_K:
/// 0..63, its value minus 32).
fn unsigned_quants(ty: GgmlType, b: &[u8], q: &mut [u8; QK_K]) {
    match ty {
        GgmlType::Q4K => {
            let qs = &b[16..144];
            for c in 0..4 {
                for l in 0..32 {
                    q[64 * c + l] = qs[32 * c + l] & 0x0f;
                    q[64 * c + 32 + l] = qs[32 * c + l] >> 4;
                }
            }
        }
        GgmlType::Q5K => {
            let qh = &b[16..48];
            let qs = &b[48..176];
            for c in 0..4 {
                for l in 0..32 {
                    q[64 * c + l] = (qs[32 * c + l] & 0x0f) | (((qh[l] >> (2 * c)) & 1) << 4);
                    q[64 * c + 32 + l] =
                        (qs[32 * c + l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4);
                }
            }
        }
        _ => {
            let mut v = [0i8; QK_K];
            q6_k_values(b, &mut v);
            for (o, x) in q.iter_mut().zip(v) {
                *o = (x as i32 + 32) as u8;
            }
        }
    }
}

/// The nibble plane bytes of group `g` of a super-block's quants.
fn nibble_group(q: &[u8; QK_K], g: usize, out: &mut [u8]) {
    for j in 0..16 {
        out[j] = (q[32 * g + j] & 0x0f) | ((q[32 * g + 16 + j] & 0x0f) << 4);
    }
}

/// Q5_K's high-bit word of group `g` (byte-lane order).
fn q5_high_word(q: &[u8; QK_K], g: usize) -> u32 {
    let mut w = 0u32;
    for b in 0..4 {
        for t in 0..4 {
            w |= (((q[32 * g + 4 * t + b] >> 4) & 1) as u32) << (8 * b + t);
            w |= (((q[32 * g + 16 + 4 * t + b] >> 4) & 1) as u32) << (8 * b + 4 + t);
        }
    }
    w
}

/// Q6_K's two high-bit words of group `g` (byte-lane order).
fn q6_high_words(q: &[u8; QK_K], g: usize) -> [u32; 2] {
    let mut w = [0u32; 2];
    for (h, word) in w.iter_mut().enumerate() {
        for b in 0..4 {
            for t in 0..4 {
                *word |= (((q[32 * g + 16 * h + 4 * t + b] >> 4) & 3) as u32) << (8 * b + 2 * t);
            }
        }
    }
    w
}

/// Repacks `elements` values of `ty` (GGUF super-blocks, row-major, every
/// row a whole number of super-blocks) into the nibble plane and the
/// `side` plane. Lossless: [`dequant_gemv_planes`] / [`dequant_gemm_planes`]
/// give back ggml's dequantized values bit for bit.
pub fn repack_kquant(
    ty: GgmlType,
    blocks: &[u8],
    elements: usize,
    side: KSide,
) -> Result<KPlanes, QuantError> {
    check(ty, blocks, elements)?;
    let ts = ty.type_size();
    let nsb = elements / QK_K;
    let mut nibbles = vec![0u8; elements / 2];
    let side_len = match side {
        KSide::Gemv => nsb * gemv_side_bytes(ty),
        KSide::Gemm => elements / 32 * gemm_side_words(ty) * 4,
    };
    let mut sp = vec![0u8; side_len];
    let mut q = [0u8; QK_K];
    for (s, b) in blocks.chunks_exact(ts).enumerate() {
        unsigned_quants(ty, b, &mut q);
        for g in 0..8 {
            let o = (8 * s + g) * NIBBLE_BYTES;
            nibble_group(&q, g, &mut nibbles[o..o + NIBBLE_BYTES]);
        }
        match side {
            KSide::Gemv => {
                let rec = &mut sp[s * gemv_side_bytes(ty)..(s + 1) * gemv_side_bytes(ty)];
                match ty {
                    GgmlType::Q4K => rec.copy_from_slice(&b[..16]),
                    GgmlType::Q5K => {
                        rec[..16].copy_from_slice(&b[..16]);
                        for g in 0..8 {
                            rec[16 + 4 * g..20 + 4 * g]
                                .copy_from_slice(&q5_high_word(&q, g).to_le_bytes());
                        }
                    }
                    _ => {
                        for g in 0..8 {
                            let w = q6_high_words(&q, g);
                            rec[8 * g..8 * g + 4].copy_from_slice(&w[0].to_le_bytes());
                            rec[8 * g + 4..8 * g + 8].copy_from_slice(&w[1].to_le_bytes());
                        }
                        rec[64..80].copy_from_slice(&b[192..208]);
                        rec[80..82].copy_from_slice(&b[208..210]);
                    }
                }
            }
            KSide::Gemm => {
                let nw = gemm_side_words(ty);
                for g in 0..8 {
                    let words: Vec<u32> = match ty {
                        GgmlType::Q4K | GgmlType::Q5K => {
                            let (d, dmin) = (rd_f16(b, 0), rd_f16(b, 2));
                            let (sc, m) = k_scale_min(g, &b[4..16]);
                            let mut w =
                                vec![(d * sc as f32).to_bits(), (dmin * m as f32).to_bits()];
                            if ty == GgmlType::Q5K {
                                // The high word, then a zero word: four
                                // words (one 16-byte unit) per group.
                                w.push(q5_high_word(&q, g));
                                w.push(0);
                            }
                            w
                        }
                        _ => {
                            let d = rd_f16(b, 208);
                            let sc = |i: usize| b[192 + i] as i8 as f32;
                            let h = q6_high_words(&q, g);
                            vec![
                                (d * sc(2 * g)).to_bits(),
                                (d * sc(2 * g + 1)).to_bits(),
                                h[0],
                                h[1],
                            ]
                        }
                    };
                    let o = (8 * s + g) * nw * 4;
                    for (i, w) in words.iter().enumerate() {
                        sp[o + 4 * i..o + 4 * i + 4].copy_from_slice(&w.to_le_bytes());
                    }
                }
            }
        }
    }
    Ok(KPlanes { nibbles, side: sp })
}

fn word(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// The unsigned quant of element `j` (0..32) of a group from its nibble
/// bytes and high-bit words, as the kernels extract it: nibble word
/// `t = (j % 16) / 4`, byte `b = j % 4`, then the high bits of byte `b`
/// shifted by `t` (Q5_K) or `2t` (Q6_K).
fn group_quant(ty: GgmlType, nib: &[u8], high: [u32; 2], j: usize) -> u32 {
    let (hi_half, jj) = (j / 16, j % 16);
    let (t, b) = (jj / 4, jj % 4);
    let w = word(nib, 4 * t);
    let lo = ((w >> (4 * hi_half as u32)) >> (8 * b)) & 0x0f;
    match ty {
        GgmlType::Q4K => lo,
        GgmlType::Q5K => {
            let sh = t + 4 * hi_half;
            lo | (((high[0] >> sh) >> (8 * b)) & 1) << 4
        }
        _ => lo | (((high[hi_half] >> (2 * t)) >> (8 * b)) & 3) << 4,
    }
}

/// Decodes the nibble plane and GEMV side records as the GEMV does:
/// `out[e]` for `elements` values.
pub fn dequant_gemv_planes(
    ty: GgmlType,
    nibbles: &[u8],
    side: &[u8],
    out: &mut [f32],
) -> Result<(), QuantError> {
    let elements = out.len();
    if !is_kquant(ty) || elements % QK_K != 0 {
        return Err(QuantError::PartialBlockElements {
            ty,
            elements,
            block_size: QK_K,
        });
    }
    let nsb = elements / QK_K;
    let rb = gemv_side_bytes(ty);
    if nibbles.len() != elements / 2 || side.len() != nsb * rb {
        return Err(QuantError::SizeMismatch {
            ty,
            what: "planes",
            expected: elements / 2 + nsb * rb,
            actual: nibbles.len() + side.len(),
        });
    }
    for s in 0..nsb {
        let rec = &side[s * rb..(s + 1) * rb];
        for g in 0..8 {
            let nib = &nibbles[(8 * s + g) * 16..(8 * s + g + 1) * 16];
            let y = &mut out[256 * s + 32 * g..256 * s + 32 * g + 32];
            match ty {
                GgmlType::Q4K | GgmlType::Q5K => {
                    let (d, dmin) = (rd_f16(rec, 0), rd_f16(rec, 2));
                    let (sc, m) = k_scale_min(g, &rec[4..16]);
                    let (ds, ms) = (d * sc as f32, dmin * m as f32);
                    let high = if ty == GgmlType::Q5K {
                        [word(rec, 16 + 4 * g), 0]
                    } else {
                        [0, 0]
                    };
                    for (j, v) in y.iter_mut().enumerate() {
                        let q = group_quant(ty, nib, high, j) as f32;
                        *v = q.mul_add(ds, -ms);
                    }
                }
                _ => {
                    let high = [word(rec, 8 * g), word(rec, 8 * g + 4)];
                    let d = f16_to_f32(u16::from_le_bytes([rec[80], rec[81]]));
                    let ds = [
                        d * (rec[64 + 2 * g] as i8) as f32,
                        d * (rec[65 + 2 * g] as i8) as f32,
                    ];
                    for (j, v) in y.iter_mut().enumerate() {
                        let q = group_quant(ty, nib, high, j) as f32 - 32.0;
                        *v = ds[j / 16] * q;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Decodes the nibble plane and GEMM side words as the prefill GEMMs do.
pub fn dequant_gemm_planes(
    ty: GgmlType,
    nibbles: &[u8],
    side: &[u8],
    out: &mut [f32],
) -> Result<(), QuantError> {
    let elements = out.len();
    if !is_kquant(ty) || elements % QK_K != 0 {
        return Err(QuantError::PartialBlockElements {
            ty,
            elements,
            block_size: QK_K,
        });
    }
    let nw = gemm_side_words(ty);
    if nibbles.len() != elements / 2 || side.len() != elements / 32 * nw * 4 {
        return Err(QuantError::SizeMismatch {
            ty,
            what: "planes",
            expected: elements / 2 + elements / 32 * nw * 4,
            actual: nibbles.len() + side.len(),
        });
    }
    for (g, y) in out.chunks_exact_mut(32).enumerate() {
        let nib = &nibbles[16 * g..16 * g + 16];
        let w = |i: usize| word(side, (g * nw + i) * 4);
        match ty {
            GgmlType::Q4K | GgmlType::Q5K => {
                let (ds, ms) = (f32::from_bits(w(0)), f32::from_bits(w(1)));
                let high = if ty == GgmlType::Q5K {
                    [w(2), 0]
                } else {
                    [0, 0]
                };
                for (j, v) in y.iter_mut().enumerate() {
                    *v = (group_quant(ty, nib, high, j) as f32).mul_add(ds, -ms);
                }
            }
            _ => {
                let ds = [f32::from_bits(w(0)), f32::from_bits(w(1))];
                let high = [w(2), w(3)];
                for (j, v) in y.iter_mut().enumerate() {
                    *v = ds[j / 16] * (group_quant(ty, nib, high, j) as f32 - 32.0);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize_row;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Random super-blocks: every byte random, then `d`/`dmin` replaced by
    /// finite f16 values of both signs (all bit patterns of the quants,
    /// scales, mins and high bits occur).
    fn random_blocks(ty: GgmlType, nsb: usize, seed: u64) -> Vec<u8> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let ts = ty.type_size();
        let mut b: Vec<u8> = (0..nsb * ts).map(|_| rng.random()).collect();
        for blk in b.chunks_exact_mut(ts) {
            let f16 = |rng: &mut ChaCha8Rng| -> [u8; 2] {
                let v: f32 = rng.random_range(-2.0f32..2.0) * 1e-2;
                half::f16::from_f32(v).to_bits().to_le_bytes()
            };
            match ty {
                GgmlType::Q6K => {
                    let d = f16(&mut rng);
                    blk[208..210].copy_from_slice(&d);
                }
                _ => {
                    let d = f16(&mut rng);
                    let m = f16(&mut rng);
                    blk[0..2].copy_from_slice(&d);
                    blk[2..4].copy_from_slice(&m);
                }
            }
        }
        b
    }

    #[test]
    fn both_repacks_round_trip_to_ggml_values_bit_for_bit() {
        for ty in [GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K] {
            let nsb = 37;
            let blocks = random_blocks(ty, nsb, ty.id() as u64);
            let n = nsb * QK_K;
            let mut want = vec![0f32; n];
            dequantize_row(ty, &blocks, &mut want).expect("dequantize");
            for side in [KSide::Gemv, KSide::Gemm] {
                let p = repack_kquant(ty, &blocks, n, side).expect("repack");
                assert_eq!(p.nibbles.len(), n / 2);
                let mut got = vec![f32::NAN; n];
                match side {
                    KSide::Gemv => {
                        assert_eq!(p.side.len(), nsb * gemv_side_bytes(ty));
                        dequant_gemv_planes(ty, &p.nibbles, &p.side, &mut got)
                    }
                    KSide::Gemm => {
                        assert_eq!(p.side.len(), n / 32 * gemm_side_words(ty) * 4);
                        dequant_gemm_planes(ty, &p.nibbles, &p.side, &mut got)
                    }
                }
                .expect("decode");
                for (e, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        g.to_bits(),
                        w.to_bits(),
                        "{ty} {side:?} element {e}: {g} vs {w}"
                    );
                }
            }
        }
    }

    #[test]
    fn every_quant_bit_reaches_its_element() {
        // One quant at its maximum, all others zero, for each element: the
        // decode must see it at that element only (catches a permutation
        // the random test could only see through values).
        for ty in [GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K] {
            let qmax: u8 = match ty {
                GgmlType::Q4K => 15,
                GgmlType::Q5K => 31,
                _ => 63,
            };
            for e in [
                0usize, 1, 5, 15, 16, 17, 31, 32, 63, 64, 100, 127, 128, 200, 255,
            ] {
                let mut q = [0u8; QK_K];
                q[e] = qmax;
                let mut want = [0u8; QK_K];
                let mut blk = vec![0u8; ty.type_size()];
                encode_block(ty, &q, &mut blk);
                unsigned_quants(ty, &blk, &mut want);
                assert_eq!(want, q, "{ty}: encode_block is the test's inverse");
                for side in [KSide::Gemv, KSide::Gemm] {
                    let p = repack_kquant(ty, &blk, QK_K, side).expect("repack");
                    for (j, &qj) in q.iter().enumerate() {
                        let g = j / 32;
                        let high = match (ty, side) {
                            (GgmlType::Q5K, KSide::Gemv) => [word(&p.side, 16 + 4 * g), 0],
                            (GgmlType::Q5K, KSide::Gemm) => [word(&p.side, (4 * g + 2) * 4), 0],
                            (GgmlType::Q6K, KSide::Gemv) => {
                                [word(&p.side, 8 * g), word(&p.side, 8 * g + 4)]
                            }
                            (GgmlType::Q6K, KSide::Gemm) => [
                                word(&p.side, (4 * g + 2) * 4),
                                word(&p.side, (4 * g + 3) * 4),
                            ],
                            _ => [0, 0],
                        };
                        let got = group_quant(ty, &p.nibbles[16 * g..16 * g + 16], high, j % 32);
                        assert_eq!(got, qj as u32, "{ty} {side:?} quant at {e}, read {j}");
                    }
                }
            }
        }
    }

    /// Writes the 256 unsigned quants into a zeroed super-block in ggml's
    /// layout (scales, d and dmin left zero).
    fn encode_block(ty: GgmlType, q: &[u8; QK_K], b: &mut [u8]) {
        match ty {
            GgmlType::Q4K => {
                for c in 0..4 {
                    for l in 0..32 {
                        b[16 + 32 * c + l] = q[64 * c + l] | (q[64 * c + 32 + l] << 4);
                    }
                }
            }
            GgmlType::Q5K => {
                for c in 0..4 {
                    for l in 0..32 {
                        let (a, h) = (q[64 * c + l], q[64 * c + 32 + l]);
                        b[48 + 32 * c + l] = (a & 15) | ((h & 15) << 4);
                        b[16 + l] |= ((a >> 4) << (2 * c)) | ((h >> 4) << (2 * c + 1));
                    }
                }
            }
            _ => {
                for h in 0..2 {
                    for l in 0..32 {
                        let e = |k: usize| q[128 * h + 32 * k + l];
                        b[64 * h + l] = (e(0) & 15) | ((e(2) & 15) << 4);
                        b[64 * h + 32 + l] = (e(1) & 15) | ((e(3) & 15) << 4);
                        b[128 + 32 * h + l] = (e(0) >> 4)
                            | ((e(1) >> 4) << 2)
                            | ((e(2) >> 4) << 4)
                            | ((e(3) >> 4) << 6);
                    }
                }
            }
        }
    }

    #[test]
    fn wrong_types_and_sizes_are_errors() {
        let b = vec![0u8; 144];
        assert!(repack_kquant(GgmlType::Q8_0, &b, 256, KSide::Gemv).is_err());
        assert!(repack_kquant(GgmlType::Q4K, &b[..143], 256, KSide::Gemv).is_err());
        assert!(repack_kquant(GgmlType::Q4K, &b, 512, KSide::Gemm).is_err());
        let mut out = vec![0f32; 256];
        assert!(dequant_gemv_planes(GgmlType::Q4K, &[0; 128], &[0; 15], &mut out).is_err());
        assert!(dequant_gemm_planes(GgmlType::Q6K, &[0; 128], &[0; 127], &mut out).is_err());
        let mut short = vec![0f32; 255];
        assert!(dequant_gemm_planes(GgmlType::Q4K, &[0; 128], &[0; 64], &mut short).is_err());
    }
}
