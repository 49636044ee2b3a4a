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
            GgmlType::Q8_0,
            GgmlType::Q4_0,
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
