//! Fused dequantize-and-dot for the CPU engine's matrix-vector products.
//!
//! Each kernel keeps 16 independent f32 accumulator lanes so that LLVM
//! vectorizes the loops, and decodes at most one block onto the stack: no
//! heap allocation. The summation order is fixed by the code (lane `l`
//! accumulates `d · (partial products)` of its elements, then the lanes are
//! summed in order), never by the instruction set: the AVX2/F16C kernels
//! use separate multiplies and adds (no FMA contraction), so a row gives the
//! same bits on every x86-64 CPU.
//!
//! On x86-64 the kernels are compiled twice: portable (SSE2) and with
//! AVX2+FMA+F16C, picked at run time. Each type gets its own AVX2 function;
//! a single function holding every kernel came out 2-wide. Block scales are
//! converted with the integer f16 routine even on F16C machines: the scalar
//! `vcvtph2ps` that LLVM emits merges into an accumulator register and
//! serializes the block loop (measured 40% slower for Q8_0).

use super::blocks::*;
use super::dequant::check_encoded;
use super::error::{QuantError, QuantOp};
use super::GgmlType;

/// Σ_i dequant(row)[i] · x[i], with f32 accumulation.
///
/// `row` must hold exactly `x.len()` elements of type `ty` (whole blocks);
/// otherwise an error is returned. Any type with
/// [`GgmlType::can_dequantize`] is accepted; Q8_0, Q4_0, Q6_K, F16, F32 and
/// BF16 have dedicated kernels, the others decode one block at a time into
/// a stack buffer. The result is within f32 rounding of the exact dot of
/// the dequantized row with `x` (it is not bit-identical to
/// `dequantize_row` followed by a sequential sum, whose order differs).
pub fn dot_row_f32(ty: GgmlType, row: &[u8], x: &[f32]) -> Result<f32, QuantError> {
    check_encoded(ty, row.len(), x.len(), QuantOp::Dot, "x")?;
    Ok(dispatch(ty, row, x))
}

type Kernel = fn(&[u8], &[f32]) -> f32;

/// The portable kernel for `ty` (`None` for types without one; lengths are
/// validated before any kernel runs).
fn portable_kernel(ty: GgmlType) -> Option<Kernel> {
    Some(match ty {
        GgmlType::F32 => dot_f32,
        GgmlType::F16 => dot_f16,
        GgmlType::Bf16 => dot_bf16,
        GgmlType::Q8_0 => dot_q8_0,
        GgmlType::Q4_0 => dot_q4_0,
        GgmlType::Q6K => dot_q6_k,
        GgmlType::Q4_1 => dot_q4_1,
        GgmlType::Q5_0 => dot_q5_0,
        GgmlType::Q5_1 => dot_q5_1,
        GgmlType::Q8_1 => dot_q8_1,
        GgmlType::Q4K => dot_q4_k,
        GgmlType::Q5K => dot_q5_k,
        _ => return None,
    })
}

#[cfg(target_arch = "x86_64")]
fn dispatch(ty: GgmlType, row: &[u8], x: &[f32]) -> f32 {
    if avx2::available() {
        if let Some(k) = avx2::kernel(ty) {
            // SAFETY: `available()` checked that the CPU has AVX2, FMA and
            // F16C, which is all the `avx2` kernels were compiled to assume.
            return unsafe { k(row, x) };
        }
    }
    portable_kernel(ty).map_or(0.0, |k| k(row, x))
}

#[cfg(not(target_arch = "x86_64"))]
fn dispatch(ty: GgmlType, row: &[u8], x: &[f32]) -> f32 {
    portable_kernel(ty).map_or(0.0, |k| k(row, x))
}

/// The kernels compiled with AVX2, FMA and F16C enabled.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use std::arch::x86_64::*;

    type UnsafeKernel = unsafe fn(&[u8], &[f32]) -> f32;

    pub(super) fn available() -> bool {
        std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c")
    }

    macro_rules! avx2_kernels {
        ($($ty:ident => $name:ident = $body:expr),* $(,)?) => {
            $(
                /// # Safety
                /// The CPU must support AVX2, FMA and F16C.
                #[target_feature(enable = "avx2,fma,f16c")]
                unsafe fn $name(row: &[u8], x: &[f32]) -> f32 {
                    $body(row, x)
                }
            )*

            pub(super) fn kernel(ty: GgmlType) -> Option<UnsafeKernel> {
                match ty {
                    $(GgmlType::$ty => Some($name as UnsafeKernel),)*
                    _ => None,
                }
            }
        };
    }

    avx2_kernels!(
        F32 => k_f32 = dot_f32,
        F16 => k_f16 = dot_f16_f16c,
        Bf16 => k_bf16 = dot_bf16,
        Q8_0 => k_q8_0 = dot_q8_0,
        Q4_0 => k_q4_0 = dot_q4_0,
        Q6K => k_q6_k = dot_q6_k,
        Q4_1 => k_q4_1 = dot_q4_1,
        Q5_0 => k_q5_0 = dot_q5_0,
        Q5_1 => k_q5_1 = dot_q5_1,
        Q8_1 => k_q8_1 = dot_q8_1,
        Q4K => k_q4_k = dot_q4_k,
        Q5K => k_q5_k = dot_q5_k,
    );

    /// F16 row with `vcvtph2ps` on 8 values at a time. Same lanes and the
    /// same multiply-then-add order as the portable `dot_f16`.
    #[inline(always)]
    fn dot_f16_f16c(row: &[u8], x: &[f32]) -> f32 {
        let n_full = x.len() / LANES * LANES;
        let mut acc = [0f32; LANES];
        let (rh, rt) = row.split_at(2 * n_full);
        let (xh, xt) = x.split_at(n_full);
        // SAFETY: the intrinsics need AVX and F16C, which the calling
        // `k_f16` is compiled for and only called with (see `available`). Every load reads 16 bytes
        // of a 32-byte `rb` chunk or 8 floats of a 16-float `xb` chunk, all
        // unaligned loads; the stores write 8 floats into the 16 of `acc`.
        unsafe {
            let mut a0 = _mm256_setzero_ps();
            let mut a1 = _mm256_setzero_ps();
            for (rb, xb) in rh.chunks_exact(2 * LANES).zip(xh.chunks_exact(LANES)) {
                let h0 = _mm_loadu_si128(rb.as_ptr().cast());
                let h1 = _mm_loadu_si128(rb.as_ptr().add(16).cast());
                let x0 = _mm256_loadu_ps(xb.as_ptr());
                let x1 = _mm256_loadu_ps(xb.as_ptr().add(8));
                a0 = _mm256_add_ps(a0, _mm256_mul_ps(_mm256_cvtph_ps(h0), x0));
                a1 = _mm256_add_ps(a1, _mm256_mul_ps(_mm256_cvtph_ps(h1), x1));
            }
            _mm256_storeu_ps(acc.as_mut_ptr(), a0);
            _mm256_storeu_ps(acc.as_mut_ptr().add(8), a1);
        }
        for (l, (b, xv)) in rt.chunks_exact(2).zip(xt).enumerate() {
            acc[l] += f16_to_f32(u16::from_le_bytes([b[0], b[1]])) * xv;
        }
        hsum(&acc)
    }
}

const LANES: usize = 16;

/// Sequential sum of the lanes. (A pairwise tree here looks harmless but
/// makes LLVM's SLP vectorizer split the accumulators into 2-wide pieces,
/// costing 3-4x in the block loops.)
#[inline(always)]
fn hsum(acc: &[f32; LANES]) -> f32 {
    acc.iter().sum()
}

/// Dot of plain scalar rows: `conv` decodes one element from its bytes.
#[inline(always)]
fn dot_scalar<const W: usize>(row: &[u8], x: &[f32], conv: impl Fn(&[u8]) -> f32) -> f32 {
    let mut acc = [0f32; LANES];
    let n_full = x.len() / LANES * LANES;
    let (xh, xt) = x.split_at(n_full);
    let (rh, rt) = row.split_at(n_full * W);
    for (rb, xb) in rh.chunks_exact(LANES * W).zip(xh.chunks_exact(LANES)) {
        let xb = &xb[..LANES];
        let rb = &rb[..LANES * W];
        for l in 0..LANES {
            acc[l] += conv(&rb[W * l..W * l + W]) * xb[l];
        }
    }
    for (l, (rb, xv)) in rt.chunks_exact(W).zip(xt).enumerate() {
        acc[l] += conv(rb) * xv;
    }
    hsum(&acc)
}

#[inline(always)]
fn dot_f32(row: &[u8], x: &[f32]) -> f32 {
    dot_scalar::<4>(row, x, |b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

#[inline(always)]
fn dot_f16(row: &[u8], x: &[f32]) -> f32 {
    dot_scalar::<2>(row, x, |b| f16_to_f32(u16::from_le_bytes([b[0], b[1]])))
}

#[inline(always)]
fn dot_bf16(row: &[u8], x: &[f32]) -> f32 {
    dot_scalar::<2>(row, x, |b| bf16_to_f32(u16::from_le_bytes([b[0], b[1]])))
}

#[inline(always)]
fn dot_q8_0(row: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    for (b, xb) in row.chunks_exact(Q8_0_BYTES).zip(x.chunks_exact(QK32)) {
        let d = rd_f16(b, 0);
        let qs = &b[2..34];
        let xb = &xb[..QK32];
        let mut s = [0f32; LANES];
        for l in 0..LANES {
            s[l] = qs[l] as i8 as f32 * xb[l] + qs[l + LANES] as i8 as f32 * xb[l + LANES];
        }
        for l in 0..LANES {
            acc[l] += d * s[l];
        }
    }
    hsum(&acc)
}

#[inline(always)]
fn dot_q4_0(row: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    for (b, xb) in row.chunks_exact(Q4_0_BYTES).zip(x.chunks_exact(QK32)) {
        let d = rd_f16(b, 0);
        let qs = &b[2..18];
        let xb = &xb[..QK32];
        let mut s = [0f32; LANES];
        for l in 0..16 {
            let lo = ((qs[l] & 0x0f) as i32 - 8) as f32;
            let hi = ((qs[l] >> 4) as i32 - 8) as f32;
            s[l] = lo * xb[l] + hi * xb[l + 16];
        }
        for l in 0..LANES {
            acc[l] += d * s[l];
        }
    }
    hsum(&acc)
}

/// Q6_K: unpack the 256 6-bit values onto the stack (a vectorized pass),
/// then one scaled 16-lane product per sub-block. (Decoding each sub-block
/// in place measured 15% slower: its shifts depend on the loop index.)
#[inline(always)]
fn dot_q6_k(row: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let mut q = [0i8; QK_K];
    for (b, xb) in row.chunks_exact(Q6_K_BYTES).zip(x.chunks_exact(QK_K)) {
        q6_k_values(b, &mut q);
        let d = rd_f16(b, 208);
        let sc = &b[192..208];
        let xb = &xb[..QK_K];
        for s in 0..16 {
            let ds = d * (sc[s] as i8) as f32;
            let qs = &q[16 * s..16 * s + 16];
            let xs = &xb[16 * s..16 * s + 16];
            for l in 0..LANES {
                acc[l] += ds * (qs[l] as f32 * xs[l]);
            }
        }
    }
    hsum(&acc)
}

/// Generic path: decode one block of `B` elements onto the stack, then dot.
#[inline(always)]
fn dot_blocks<const B: usize>(
    row: &[u8],
    x: &[f32],
    type_size: usize,
    decode: fn(&[u8], &mut [f32]),
) -> f32 {
    let mut acc = [0f32; LANES];
    let mut buf = [0f32; B];
    for (b, xb) in row.chunks_exact(type_size).zip(x.chunks_exact(B)) {
        decode(b, &mut buf);
        for (yb, xs) in buf.chunks_exact(LANES).zip(xb.chunks_exact(LANES)) {
            for l in 0..LANES {
                acc[l] += yb[l] * xs[l];
            }
        }
    }
    hsum(&acc)
}

#[inline(always)]
fn dot_q4_1(row: &[u8], x: &[f32]) -> f32 {
    dot_blocks::<QK32>(row, x, Q4_1_BYTES, dequant_q4_1)
}

#[inline(always)]
fn dot_q5_0(row: &[u8], x: &[f32]) -> f32 {
    dot_blocks::<QK32>(row, x, Q5_0_BYTES, dequant_q5_0)
}

#[inline(always)]
fn dot_q5_1(row: &[u8], x: &[f32]) -> f32 {
    dot_blocks::<QK32>(row, x, Q5_1_BYTES, dequant_q5_1)
}

#[inline(always)]
fn dot_q8_1(row: &[u8], x: &[f32]) -> f32 {
    dot_blocks::<QK32>(row, x, Q8_1_BYTES, dequant_q8_1)
}

#[inline(always)]
fn dot_q4_k(row: &[u8], x: &[f32]) -> f32 {
    dot_blocks::<QK_K>(row, x, Q4_K_BYTES, dequant_q4_k)
}

#[inline(always)]
fn dot_q5_k(row: &[u8], x: &[f32]) -> f32 {
    dot_blocks::<QK_K>(row, x, Q5_K_BYTES, dequant_q5_k)
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// The AVX2 kernels must give the same bits as the portable ones (the
    /// module's determinism promise). Skipped where the CPU lacks AVX2.
    #[test]
    fn avx2_and_portable_kernels_agree_bitwise() {
        if !avx2::available() {
            eprintln!("CPU without AVX2/FMA/F16C: only the portable path exists");
            return;
        }
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for ty in GgmlType::ALL.iter().copied().filter(|t| t.can_dequantize()) {
            for n in [256usize, 272, 1024] {
                if n % ty.block_size() != 0 {
                    continue;
                }
                let x: Vec<f32> = (0..n)
                    .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
                    .collect();
                let mut row = vec![0u8; n / ty.block_size() * ty.type_size()];
                row.iter_mut().for_each(|b| *b = next() as u8);
                // Keep every f16 field finite: clear bit 14 of each byte pair's
                // high byte so exponents stay below the inf/NaN range.
                if matches!(ty, GgmlType::F16) {
                    row.iter_mut().skip(1).step_by(2).for_each(|b| *b &= 0xbf);
                }
                let p = portable_kernel(ty).expect("portable kernel")(&row, &x);
                let k = avx2::kernel(ty).expect("avx2 kernel");
                // SAFETY: `available()` returned true above.
                let a = unsafe { k(&row, &x) };
                assert!(
                    p.to_bits() == a.to_bits() || (p.is_nan() && a.is_nan()),
                    "{ty} n={n}: portable {p} vs avx2 {a}"
                );
            }
        }
    }
}
