//! Random tensor contents, generated straight into their storage format.
//!
//! Quantized blocks are produced directly (random scale, random non-zero
//! quants): no f32 tensor is ever materialized, so an 8 GB file costs one
//! pass of counter-based random numbers and memory writes. Every tensor is
//! cut into fixed-size chunks, each with its own generator seeded from
//! (seed, tensor index, chunk index), and the chunks run in parallel: the
//! bytes depend only on the seed, never on the thread count.
//!
//! No generated value is zero: quant codes that decode to 0 are remapped
//! symmetrically (so the distribution stays centered), and float values
//! are kept away from 0.

use gemtune_kernels::quant::GgmlType;
use half::f16;
use rayon::prelude::*;

/// How the values of one tensor are distributed.
#[derive(Clone, Debug, PartialEq)]
pub enum Dist {
    /// Symmetric around 0 with this standard deviation (projections,
    /// embedding tables).
    Symmetric { std: f32 },
    /// Uniform in `[lo, hi]`, `0 < lo < hi` (norm weights, layer scales).
    Range { lo: f32, hi: f32 },
    /// These exact values (`rope_freqs`).
    Exact(Vec<f32>),
}

/// Why a tensor could not be filled.
#[derive(Debug, thiserror::Error)]
pub enum FillError {
    #[error("type {0} cannot be generated")]
    Type(&'static str),
    #[error("buffer of {found} bytes, expected {expected}")]
    Size { expected: usize, found: usize },
    #[error("{0} exact values for {1} elements")]
    ExactLen(usize, usize),
    #[error("exact values can only be stored as f32/f16")]
    ExactType,
    #[error("tensor '{0}' is missing from the weights file")]
    Missing(String),
    #[error("tensor '{name}': the weights file has dims {found:?}, the model {expected:?}")]
    Shape {
        name: String,
        expected: Vec<u64>,
        found: Vec<u64>,
    },
    #[error("tensor '{name}': {source}")]
    Quant {
        name: String,
        source: gemtune_kernels::quant::QuantError,
    },
}

/// SplitMix64: a tiny, fast, statistically solid counter-based generator.
struct SplitMix64(u64);

impl SplitMix64 {
    fn new(seed: u64, tensor: u64, chunk: u64) -> Self {
        let mut s = SplitMix64(seed ^ 0x6A09_E667_F3BC_C909);
        let a = s.next_u64() ^ tensor.wrapping_mul(0xD1B5_4A32_D192_ED03);
        let mut s = SplitMix64(a);
        let b = s.next_u64() ^ chunk.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut s = SplitMix64(b);
        s.next_u64();
        s
    }

    #[inline]
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    #[inline]
    fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }
}

/// Bytes per parallel chunk (rounded down to whole blocks).
const CHUNK_BYTES: usize = 1 << 20;

/// Standard deviation of the Q8_0 codes: uniform over [-127, 127] \ {0}.
const Q8_CODE_STD: f32 = 74.3;
/// Q4_0 code table: 4 random bits -> nibble whose value (nibble - 8) is in
/// ±1..±7 (±7 twice); never 0 and never the lopsided -8.
const Q4_LUT: [u8; 16] = [1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15, 1, 15];
/// Standard deviation of `Q4_LUT` values: sqrt((2·140 + 2·49) / 16).
const Q4_CODE_STD: f32 = 4.861;
/// Standard deviation of the Q6_K codes (±1..±31, ±31 twice).
const Q6_CODE_STD: f32 = 18.86;
/// Q6_K sub-block scales are drawn from this range.
const Q6_SCALE_LO: i32 = 80;
const Q6_SCALE_HI: i32 = 127;
/// RMS of a uniform integer in [Q6_SCALE_LO, Q6_SCALE_HI].
const Q6_SCALE_RMS: f32 = 104.4;

/// Fills `dst` (exactly the tensor's bytes) with `n` values of `dist`
/// stored as `ty`. Deterministic in (`seed`, `tensor`).
pub fn fill_tensor(
    ty: GgmlType,
    dist: &Dist,
    n: usize,
    seed: u64,
    tensor: u64,
    dst: &mut [u8],
) -> Result<(), FillError> {
    let bs = ty.block_size();
    let ts = ty.type_size();
    let expected = n / bs * ts;
    if n % bs != 0 || dst.len() != expected {
        return Err(FillError::Size {
            expected,
            found: dst.len(),
        });
    }
    if let Dist::Exact(values) = dist {
        if values.len() != n {
            return Err(FillError::ExactLen(values.len(), n));
        }
        return match ty {
            GgmlType::F32 => {
                for (o, v) in dst.chunks_exact_mut(4).zip(values) {
                    o.copy_from_slice(&v.to_le_bytes());
                }
                Ok(())
            }
            GgmlType::F16 => {
                for (o, v) in dst.chunks_exact_mut(2).zip(values) {
                    o.copy_from_slice(&f16::from_f32(*v).to_le_bytes());
                }
                Ok(())
            }
            _ => Err(FillError::ExactType),
        };
    }
    let block_fn: fn(&mut SplitMix64, &Dist, &mut [u8]) = match ty {
        GgmlType::F32 => block_f32,
        GgmlType::F16 => block_f16,
        GgmlType::Q8_0 => block_q8_0,
        GgmlType::Q4_0 => block_q4_0,
        GgmlType::Q6K => block_q6_k,
        GgmlType::Bf16 => block_bf16,
        GgmlType::Q4K => block_q4_k,
        GgmlType::Q5K => block_q5_k,
        GgmlType::Q5_0 => block_q5_0,
        GgmlType::Q5_1 => block_q5_1,
        other => return Err(FillError::Type(other.name())),
    };
    // Float types are generated a "block" of many elements at a time.
    let unit = if bs == 1 { 64 * ts } else { ts };
    let chunk = (CHUNK_BYTES / unit).max(1) * unit;
    dst.par_chunks_mut(chunk).enumerate().for_each(|(ci, c)| {
        let mut rng = SplitMix64::new(seed, tensor, ci as u64);
        for b in c.chunks_mut(unit) {
            block_fn(&mut rng, dist, b);
        }
    });
    Ok(())
}

/// A non-zero float of `dist`.
#[inline]
fn sample(rng: &mut SplitMix64, dist: &Dist) -> f32 {
    match *dist {
        Dist::Symmetric { std } => {
            let a = std * 3f32.sqrt();
            let x = a * (2.0 * rng.unit() - 1.0);
            let floor = a * 1e-3;
            if x.abs() < floor {
                floor.copysign(x)
            } else {
                x
            }
        }
        Dist::Range { lo, hi } => lo + (hi - lo) * rng.unit(),
        Dist::Exact(_) => 1.0,
    }
}

fn sym_std(dist: &Dist) -> f32 {
    match *dist {
        Dist::Symmetric { std } => std,
        Dist::Range { lo, hi } => (lo + hi) * 0.5,
        Dist::Exact(_) => 1.0,
    }
}

fn block_f32(rng: &mut SplitMix64, dist: &Dist, out: &mut [u8]) {
    for o in out.chunks_exact_mut(4) {
        o.copy_from_slice(&sample(rng, dist).to_le_bytes());
    }
}

fn block_f16(rng: &mut SplitMix64, dist: &Dist, out: &mut [u8]) {
    for o in out.chunks_exact_mut(2) {
        o.copy_from_slice(&f16::from_f32(sample(rng, dist)).to_le_bytes());
    }
}

fn block_bf16(rng: &mut SplitMix64, dist: &Dist, out: &mut [u8]) {
    for o in out.chunks_exact_mut(2) {
        o.copy_from_slice(&half::bf16::from_f32(sample(rng, dist)).to_le_bytes());
    }
}

/// Per-block scale jitter in [0.75, 1.25): real blocks differ in range.
#[inline]
fn jitter(rng: &mut SplitMix64) -> f32 {
    0.75 + 0.5 * rng.unit()
}

/// Q8_0: f16 d, 32 × i8. Codes uniform over [-127, 127] \ {0} (0 -> 127
/// and -128 -> -127 keep it symmetric).
fn block_q8_0(rng: &mut SplitMix64, dist: &Dist, out: &mut [u8]) {
    let d = sym_std(dist) / Q8_CODE_STD * jitter(rng);
    out[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    for q in out[2..34].chunks_exact_mut(8) {
        let r = rng.next_u64().to_le_bytes();
        for (o, b) in q.iter_mut().zip(r) {
            *o = match b as i8 {
                0 => 127,
                -128 => (-127i8) as u8,
                v => v as u8,
            };
        }
    }
}

/// Q4_0: f16 d, 16 bytes of nibbles (value = nibble - 8).
fn block_q4_0(rng: &mut SplitMix64, dist: &Dist, out: &mut [u8]) {
    let d = sym_std(dist) / Q4_CODE_STD * jitter(rng);
    out[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    for q in out[2..18].chunks_exact_mut(8) {
        let r = rng.next_u64();
        for (j, o) in q.iter_mut().enumerate() {
            let lo = Q4_LUT[((r >> (8 * j)) & 15) as usize];
            let hi = Q4_LUT[((r >> (8 * j + 4)) & 15) as usize];
            *o = lo | (hi << 4);
        }
    }
}

/// A 6-bit Q6_K code whose value (code - 32) is in ±1..±31.
#[inline]
fn q6_code(bits: u64) -> u8 {
    match (bits & 63) as u8 {
        32 => 1,
        0 => 63,
        c => c,
    }
}

/// Q6_K super-block (256 elements): ql[128] low nibbles, qh[64] high bit
/// pairs, 16 i8 sub-block scales, f16 d. Each half of 128 elements packs
/// element l (l < 32) and its partners l+32, l+64, l+96 into ql[l],
/// ql[l+32] and qh[l] (ggml's layout).
fn block_q6_k(rng: &mut SplitMix64, dist: &Dist, out: &mut [u8]) {
    let (ql, rest) = out.split_at_mut(128);
    let (qh, rest) = rest.split_at_mut(64);
    let (scales, d_bytes) = rest.split_at_mut(16);
    for half in 0..2 {
        let ql = &mut ql[half * 64..half * 64 + 64];
        let qh = &mut qh[half * 32..half * 32 + 32];
        for l in 0..32 {
            let r = rng.next_u64();
            let q1 = q6_code(r);
            let q2 = q6_code(r >> 6);
            let q3 = q6_code(r >> 12);
            let q4 = q6_code(r >> 18);
            ql[l] = (q1 & 15) | ((q3 & 15) << 4);
            ql[l + 32] = (q2 & 15) | ((q4 & 15) << 4);
            qh[l] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
        }
    }
    let span = (Q6_SCALE_HI - Q6_SCALE_LO + 1) as u64;
    let r = rng.next_u64();
    let r2 = rng.next_u64();
    for (j, s) in scales.iter_mut().enumerate() {
        let bits = if j < 8 {
            r >> (8 * j)
        } else {
            r2 >> (8 * (j - 8))
        };
        *s = (Q6_SCALE_LO + ((bits & 0xFF) % span) as i32) as i8 as u8;
    }
    let d = sym_std(dist) / (Q6_CODE_STD * Q6_SCALE_RMS) * jitter(rng);
    d_bytes.copy_from_slice(&f16::from_f32(d).to_le_bytes());
}

/// Q5_0 code table: 5 random bits -> a 5-bit code whose value (code - 16)
/// is in ±1..±15 (±15 twice); never 0 and never the lopsided -16.
const Q5_LUT: [u8; 32] = [
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27,
    28, 29, 30, 31, 1, 31,
];
/// Standard deviation of `Q5_LUT` values: sqrt((2·1240 + 2·225) / 32).
const Q5_CODE_STD: f32 = 9.569;

/// Q5_0: f16 d, u32 fifth bits, 16 bytes of low nibbles (value = code - 16);
/// element j < 16 in the low nibble of byte j, j + 16 in its high nibble.
fn block_q5_0(rng: &mut SplitMix64, dist: &Dist, out: &mut [u8]) {
    let d = sym_std(dist) / Q5_CODE_STD * jitter(rng);
    out[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    let mut codes = [0u8; 32];
    let (mut r, mut left) = (0u64, 0);
    for c in codes.iter_mut() {
        if left == 0 {
            r = rng.next_u64();
            left = 12;
        }
        *c = Q5_LUT[(r & 31) as usize];
        r >>= 5;
        left -= 1;
    }
    let mut qh = 0u32;
    for j in 0..16 {
        out[6 + j] = (codes[j] & 15) | ((codes[j + 16] & 15) << 4);
        qh |= ((codes[j] >> 4) as u32) << j | ((codes[j + 16] >> 4) as u32) << (j + 16);
    }
    out[2..6].copy_from_slice(&qh.to_le_bytes());
}

/// Q5_1: f16 d, f16 m, u32 fifth bits, 16 bytes of low nibbles (value =
/// code * d + m), m = -15.5 d (nudged until no code gives exactly 0).
fn block_q5_1(rng: &mut SplitMix64, dist: &Dist, out: &mut [u8]) {
    let d = f16::from_f32(sym_std(dist) / 9.23 * jitter(rng));
    let mut m = f16::from_f32(-15.5 * d.to_f32());
    while (0..32).any(|q| q as f32 * d.to_f32() + m.to_f32() == 0.0) {
        m = f16::from_bits(m.to_bits() + 1);
    }
    out[..2].copy_from_slice(&d.to_le_bytes());
    out[2..4].copy_from_slice(&m.to_le_bytes());
    let r = rng.next_u64();
    out[4..8].copy_from_slice(&(r as u32).to_le_bytes());
    out[8..16].copy_from_slice(&rng.next_u64().to_le_bytes());
    out[16..24].copy_from_slice(&rng.next_u64().to_le_bytes());
}

/// The 12 bytes of eight 6-bit (scale, min) pairs, ggml's Q4_K/Q5_K packing
/// (the inverse of `k_scale_min`).
fn pack_scale_min(sc: &[u8; 8], m: &[u8; 8], out: &mut [u8]) {
    for j in 0..4 {
        out[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        out[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
        out[j + 8] = (sc[j + 4] & 15) | ((m[j + 4] & 15) << 4);
    }
}

/// Q4_K / Q5_K super-block header and quants: odd sub-block scales in
/// [33, 63], `dmin = 8 d` (Q4_K) or `16 d` (Q5_K) and the min next to the
/// middle of the code range, so values `d (sc q - 8m)` are centered and,
/// since an odd scale cannot divide `8m < 8 sc`, never 0.
fn block_kquant(rng: &mut SplitMix64, dist: &Dist, out: &mut [u8], bits: u32) {
    let qmax = (1u32 << bits) - 1;
    let dmin_mul = if bits == 4 { 8.0 } else { 16.0 };
    // RMS of an odd integer uniform in [33, 63] (48.6) times the standard
    // deviation of a uniform code in 0..=qmax.
    let code_std = ((qmax * (qmax + 2)) as f32 / 12.0).sqrt();
    let d = f16::from_f32(sym_std(dist) / (48.6 * code_std) * jitter(rng));
    let dmin = f16::from_f32(d.to_f32() * dmin_mul);
    out[..2].copy_from_slice(&d.to_le_bytes());
    out[2..4].copy_from_slice(&dmin.to_le_bytes());
    let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
    let r = rng.next_u64();
    for j in 0..8 {
        let s = 33 + 2 * ((r >> (8 * j)) % 16) as u8;
        sc[j] = s;
        // dmin * m ~ d * sc * qmax / 2: m = round(sc * qmax / (2 dmin_mul)).
        let mm = ((s as f32 * qmax as f32 / (2.0 * dmin_mul)).round() as u8).clamp(1, s - 1);
        m[j] = mm;
    }
    pack_scale_min(&sc, &m, &mut out[4..16]);
    let q_off = if bits == 4 { 16 } else { 48 };
    for q in out[q_off..q_off + 128].chunks_exact_mut(8) {
        q.copy_from_slice(&rng.next_u64().to_le_bytes());
    }
    if bits == 5 {
        for q in out[16..48].chunks_exact_mut(8) {
            q.copy_from_slice(&rng.next_u64().to_le_bytes());
        }
    }
}

fn block_q4_k(rng: &mut SplitMix64, dist: &Dist, out: &mut [u8]) {
    block_kquant(rng, dist, out, 4);
}

fn block_q5_k(rng: &mut SplitMix64, dist: &Dist, out: &mut [u8]) {
    block_kquant(rng, dist, out, 5);
}

#[cfg(test)]
mod tests {
    use super::*;
    use gemtune_kernels::quant::dequantize_row;

    fn stats(ty: GgmlType, dist: &Dist, n: usize) -> (f64, f64, usize) {
        let mut buf = vec![0u8; n / ty.block_size() * ty.type_size()];
        fill_tensor(ty, dist, n, 7, 3, &mut buf).unwrap();
        let mut x = vec![0f32; n];
        dequantize_row(ty, &buf, &mut x).unwrap();
        let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
        let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64;
        let zeros = x.iter().filter(|v| **v == 0.0).count();
        (mean, var.sqrt(), zeros)
    }

    #[test]
    fn symmetric_dists_have_the_requested_std_and_no_zeros() {
        let dist = Dist::Symmetric { std: 0.02 };
        for ty in [
            GgmlType::F32,
            GgmlType::F16,
            GgmlType::Bf16,
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q4K,
            GgmlType::Q5K,
            GgmlType::Q6K,
        ] {
            let (mean, std, zeros) = stats(ty, &dist, 1 << 16);
            assert_eq!(zeros, 0, "{ty:?} produced zeros");
            assert!(mean.abs() < 0.002, "{ty:?} mean {mean}");
            assert!((std / 0.02 - 1.0).abs() < 0.1, "{ty:?} std {std}");
        }
    }

    #[test]
    fn range_dist_stays_in_range() {
        let (mean, _, zeros) = stats(GgmlType::F32, &Dist::Range { lo: 0.5, hi: 1.5 }, 4096);
        assert_eq!(zeros, 0);
        assert!((mean - 1.0).abs() < 0.03, "mean {mean}");
    }

    #[test]
    fn output_does_not_depend_on_thread_count() {
        let n = 3 << 20; // several chunks
        let ty = GgmlType::Q8_0;
        let dist = Dist::Symmetric { std: 0.01 };
        let mut a = vec![0u8; n / 32 * 34];
        let mut b = a.clone();
        fill_tensor(ty, &dist, n, 1, 9, &mut a).unwrap();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        pool.install(|| fill_tensor(ty, &dist, n, 1, 9, &mut b))
            .unwrap();
        assert!(a == b);
        let mut c = vec![0u8; a.len()];
        fill_tensor(ty, &dist, n, 2, 9, &mut c).unwrap();
        assert!(a != c, "a different seed must change the bytes");
    }
}
