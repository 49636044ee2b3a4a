//! Byte layouts of the GGML block formats and per-block decoders.
//!
//! Every decoder reproduces ggml's reference dequantization bit for bit,
//! including the order of the f32 operations (`d * q`, `(d * sc) * q - m`),
//! so results can be compared with `==` against llama.cpp's CPU path.
//! All multi-byte fields are little endian; `f16` fields are IEEE half.
//!
//! Layouts (offsets in bytes, QK = elements per block):
//! - Q4_0 (QK 32, 18 B): d f16 @0, qs[16] @2. Element j < 16 is the low
//!   nibble of qs[j], element j + 16 its high nibble; value (q - 8) * d.
//! - Q4_1 (QK 32, 20 B): d f16 @0, m f16 @2, qs[16] @4; value q * d + m.
//! - Q5_0 (QK 32, 22 B): d f16 @0, qh u32 @2, qs[16] @6. Bit j of qh is the
//!   fifth bit of element j (j < 32); value (q - 16) * d.
//! - Q5_1 (QK 32, 24 B): d f16 @0, m f16 @2, qh u32 @4, qs[16] @8; q * d + m.
//! - Q8_0 (QK 32, 34 B): d f16 @0, qs[32] i8 @2; value q * d.
//! - Q8_1 (QK 32, 36 B): d f16 @0, s f16 @2, qs[32] i8 @4; value q * d.
//!   `s` caches d * Σq for kernels that fold an offset; it plays no part in
//!   the values.
//! - Q4_K (QK 256, 144 B): d f16 @0, dmin f16 @2, scales[12] @4 (eight
//!   6-bit scales and eight 6-bit mins, see [`k_scale_min`]), qs[128] @16.
//!   Sub-block s (32 elements) uses nibbles of qs[32*(s/2)..][..32], low
//!   nibbles for even s, high for odd s; value (d * sc_s) * q - dmin * m_s.
//! - Q5_K (QK 256, 176 B): d, dmin, scales[12] like Q4_K, qh[32] @16,
//!   qs[128] @48. Element l of sub-block s takes its fifth bit from bit s of
//!   qh[l].
//! - Q6_K (QK 256, 210 B): ql[128] @0, qh[64] @128, scales[16] i8 @192,
//!   d f16 @208. Two halves of 128; in half h, element 32*k + l (k < 4,
//!   l < 32) has low 4 bits from ql[64h + l + 32*(k&1)] (low nibble for
//!   k < 2, high for k >= 2) and high 2 bits from bits 2k..2k+1 of
//!   qh[32h + l]; value (d * scales[8h + 2k + l/16]) * (q - 32).

/// Q4_0 block size in bytes.
pub const Q4_0_BYTES: usize = 18;
/// Q4_1 block size in bytes.
pub const Q4_1_BYTES: usize = 20;
/// Q5_0 block size in bytes.
pub const Q5_0_BYTES: usize = 22;
/// Q5_1 block size in bytes.
pub const Q5_1_BYTES: usize = 24;
/// Q8_0 block size in bytes.
pub const Q8_0_BYTES: usize = 34;
/// Q8_1 block size in bytes.
pub const Q8_1_BYTES: usize = 36;
/// Q4_K block size in bytes.
pub const Q4_K_BYTES: usize = 144;
/// Q5_K block size in bytes.
pub const Q5_K_BYTES: usize = 176;
/// Q6_K block size in bytes.
pub const Q6_K_BYTES: usize = 210;
/// Elements per block of the legacy formats.
pub const QK32: usize = 32;
/// Elements per super-block of the k-quants.
pub const QK_K: usize = 256;

/// IEEE half (as bits) to f32, exact for every input including subnormals,
/// infinities and NaN payloads. Branch-free apart from a select, so loops
/// over it vectorize.
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    let h = h as u32;
    let sign = (h & 0x8000) << 16;
    let em = (h & 0x7fff) << 13;
    // Re-biasing the exponent from 15 to 127 is a multiplication by 2^112;
    // it is exact and also normalizes half subnormals.
    let scaled = f32::from_bits(em) * f32::from_bits(0x7780_0000);
    let mag = if em >= 0x0f80_0000 {
        em | 0x7f80_0000
    } else {
        scaled.to_bits()
    };
    f32::from_bits(sign | mag)
}

/// f32 to IEEE half bits, round to nearest even (what ggml's conversion
/// does on every platform it supports).
#[inline]
pub fn f32_to_f16(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

/// bf16 bits to f32 (exact: bf16 is the top half of an f32).
#[inline(always)]
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// f32 to bf16 bits as ggml rounds: nearest even, NaN kept quiet.
#[inline]
pub fn f32_to_bf16(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

#[inline(always)]
pub(crate) fn rd_f16(b: &[u8], off: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[off], b[off + 1]]))
}

#[inline(always)]
pub(crate) fn rd_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Scale and min of sub-block `j` (0..8) from the 12 packed bytes of a
/// Q4_K/Q5_K block. Sub-blocks 0..4 keep their 6 bits in the low bits of
/// bytes j (scale) and j+4 (min); sub-blocks 4..8 keep their low 4 bits in
/// the nibbles of byte j+4 and their top 2 bits in the top bits of bytes
/// j-4 (scale) and j (min).
#[inline(always)]
pub fn k_scale_min(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Decode one Q4_0 block (18 bytes) into 32 floats.
#[inline(always)]
pub fn dequant_q4_0(b: &[u8], y: &mut [f32]) {
    let (b, y) = (&b[..Q4_0_BYTES], &mut y[..QK32]);
    let d = rd_f16(b, 0);
    let qs = &b[2..18];
    for j in 0..16 {
        let x0 = (qs[j] & 0x0f) as i32 - 8;
        let x1 = (qs[j] >> 4) as i32 - 8;
        y[j] = x0 as f32 * d;
        y[j + 16] = x1 as f32 * d;
    }
}

/// Decode one Q4_1 block (20 bytes) into 32 floats.
#[inline(always)]
pub fn dequant_q4_1(b: &[u8], y: &mut [f32]) {
    let (b, y) = (&b[..Q4_1_BYTES], &mut y[..QK32]);
    let d = rd_f16(b, 0);
    let m = rd_f16(b, 2);
    let qs = &b[4..20];
    for j in 0..16 {
        y[j] = (qs[j] & 0x0f) as f32 * d + m;
        y[j + 16] = (qs[j] >> 4) as f32 * d + m;
    }
}

/// Decode one Q5_0 block (22 bytes) into 32 floats.
#[inline(always)]
pub fn dequant_q5_0(b: &[u8], y: &mut [f32]) {
    let (b, y) = (&b[..Q5_0_BYTES], &mut y[..QK32]);
    let d = rd_f16(b, 0);
    let qh = rd_u32(b, 2);
    let qs = &b[6..22];
    for j in 0..16 {
        let h0 = ((qh >> j) & 1) << 4;
        let h1 = ((qh >> (j + 16)) & 1) << 4;
        let x0 = ((qs[j] & 0x0f) as u32 | h0) as i32 - 16;
        let x1 = ((qs[j] >> 4) as u32 | h1) as i32 - 16;
        y[j] = x0 as f32 * d;
        y[j + 16] = x1 as f32 * d;
    }
}

/// Decode one Q5_1 block (24 bytes) into 32 floats.
#[inline(always)]
pub fn dequant_q5_1(b: &[u8], y: &mut [f32]) {
    let (b, y) = (&b[..Q5_1_BYTES], &mut y[..QK32]);
    let d = rd_f16(b, 0);
    let m = rd_f16(b, 2);
    let qh = rd_u32(b, 4);
    let qs = &b[8..24];
    for j in 0..16 {
        let h0 = ((qh >> j) & 1) << 4;
        let h1 = ((qh >> (j + 16)) & 1) << 4;
        y[j] = ((qs[j] & 0x0f) as u32 | h0) as f32 * d + m;
        y[j + 16] = ((qs[j] >> 4) as u32 | h1) as f32 * d + m;
    }
}

/// Decode one Q8_0 block (34 bytes) into 32 floats.
#[inline(always)]
pub fn dequant_q8_0(b: &[u8], y: &mut [f32]) {
    let (b, y) = (&b[..Q8_0_BYTES], &mut y[..QK32]);
    let d = rd_f16(b, 0);
    for (yj, &q) in y.iter_mut().zip(&b[2..34]) {
        *yj = q as i8 as f32 * d;
    }
}

/// Decode one Q8_1 block (36 bytes) into 32 floats.
#[inline(always)]
pub fn dequant_q8_1(b: &[u8], y: &mut [f32]) {
    let (b, y) = (&b[..Q8_1_BYTES], &mut y[..QK32]);
    let d = rd_f16(b, 0);
    for (yj, &q) in y.iter_mut().zip(&b[4..36]) {
        *yj = q as i8 as f32 * d;
    }
}

/// Decode one Q4_K super-block (144 bytes) into 256 floats.
#[inline(always)]
pub fn dequant_q4_k(b: &[u8], y: &mut [f32]) {
    let (b, y) = (&b[..Q4_K_BYTES], &mut y[..QK_K]);
    let d = rd_f16(b, 0);
    let dmin = rd_f16(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..144];
    for c in 0..4 {
        let (sc0, m0) = k_scale_min(2 * c, scales);
        let (sc1, m1) = k_scale_min(2 * c + 1, scales);
        let (d0, mm0) = (d * sc0 as f32, dmin * m0 as f32);
        let (d1, mm1) = (d * sc1 as f32, dmin * m1 as f32);
        let q = &qs[32 * c..32 * c + 32];
        let out = &mut y[64 * c..64 * c + 64];
        for l in 0..32 {
            out[l] = d0 * (q[l] & 0x0f) as f32 - mm0;
            out[l + 32] = d1 * (q[l] >> 4) as f32 - mm1;
        }
    }
}

/// Decode one Q5_K super-block (176 bytes) into 256 floats.
#[inline(always)]
pub fn dequant_q5_k(b: &[u8], y: &mut [f32]) {
    let (b, y) = (&b[..Q5_K_BYTES], &mut y[..QK_K]);
    let d = rd_f16(b, 0);
    let dmin = rd_f16(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for c in 0..4 {
        let (sc0, m0) = k_scale_min(2 * c, scales);
        let (sc1, m1) = k_scale_min(2 * c + 1, scales);
        let (d0, mm0) = (d * sc0 as f32, dmin * m0 as f32);
        let (d1, mm1) = (d * sc1 as f32, dmin * m1 as f32);
        let q = &qs[32 * c..32 * c + 32];
        let out = &mut y[64 * c..64 * c + 64];
        for l in 0..32 {
            let h0 = ((qh[l] >> (2 * c)) & 1) << 4;
            let h1 = ((qh[l] >> (2 * c + 1)) & 1) << 4;
            out[l] = d0 * ((q[l] & 0x0f) | h0) as f32 - mm0;
            out[l + 32] = d1 * ((q[l] >> 4) | h1) as f32 - mm1;
        }
    }
}

/// The 256 signed 6-bit values (-32..=31) of a Q6_K super-block, in element
/// order.
#[inline(always)]
pub fn q6_k_values(b: &[u8], q: &mut [i8; QK_K]) {
    let b = &b[..Q6_K_BYTES];
    for h in 0..2 {
        let ql = &b[64 * h..64 * h + 64];
        let qh = &b[128 + 32 * h..128 + 32 * h + 32];
        let out = &mut q[128 * h..128 * h + 128];
        for l in 0..32 {
            let hi = qh[l];
            out[l] = ((ql[l] & 0x0f) | ((hi & 3) << 4)) as i8 - 32;
            out[l + 32] = ((ql[l + 32] & 0x0f) | (((hi >> 2) & 3) << 4)) as i8 - 32;
            out[l + 64] = ((ql[l] >> 4) | (((hi >> 4) & 3) << 4)) as i8 - 32;
            out[l + 96] = ((ql[l + 32] >> 4) | (((hi >> 6) & 3) << 4)) as i8 - 32;
        }
    }
}

/// Decode one Q6_K super-block (210 bytes) into 256 floats.
#[inline(always)]
pub fn dequant_q6_k(b: &[u8], y: &mut [f32]) {
    let (b, y) = (&b[..Q6_K_BYTES], &mut y[..QK_K]);
    let mut q = [0i8; QK_K];
    q6_k_values(b, &mut q);
    let d = rd_f16(b, 208);
    let sc = &b[192..208];
    for s in 0..16 {
        let ds = d * (sc[s] as i8) as f32;
        for l in 0..16 {
            y[16 * s + l] = ds * q[16 * s + l] as f32;
        }
    }
}
