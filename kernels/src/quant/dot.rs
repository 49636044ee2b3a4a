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

// ------------------------------------------------------------ many tokens

/// `out[t] = dot_row_f32(ty, row, &xs[t * k..(t + 1) * k])` for every `t <
/// out.len()`, bit for bit, with each weight block decoded once per group
/// of [`GROUP`] tokens instead of once per token.
///
/// `xs` is `[out.len()][k]`, row-major. Bit-identity holds because every
/// token keeps the single-token kernel's arithmetic exactly: the same 16
/// lanes, the same products and scale multiplies in the same order, the
/// same final lane sum; only the decoding of the weights (which is exact:
/// small integers and f16 to f32) is shared. So a batch of tokens and the
/// same tokens one at a time give identical results, on either dispatch
/// path (the portable and AVX2 paths already agree with each other).
///
/// `row` and `k` are checked as `row` and `x.len()` are by [`dot_row_f32`];
/// `xs.len() != out.len() * k` is a [`QuantError::SizeMismatch`] for `"xs"`.
/// On error `out` is untouched.
pub fn dot_row_multi_f32(
    ty: GgmlType,
    row: &[u8],
    xs: &[f32],
    k: usize,
    out: &mut [f32],
) -> Result<(), QuantError> {
    check_encoded(ty, row.len(), k, QuantOp::Dot, "x")?;
    // Saturating: no slice of f32 is usize::MAX long, so overflow is rejected.
    let expected = out.len().saturating_mul(k);
    if xs.len() != expected {
        return Err(QuantError::SizeMismatch {
            ty,
            what: "xs",
            expected,
            actual: xs.len(),
        });
    }
    if k == 0 {
        // No elements: every dot is the empty sum, as the single kernel says.
        let v = dispatch(ty, row, &[]);
        out.iter_mut().for_each(|o| *o = v);
        return Ok(());
    }
    dispatch_multi(ty, row, xs, k, out);
    Ok(())
}

/// Tokens that share one decode of each block. Each token's 16 lanes are
/// updated through a local copy once per block, so they need not all fit in
/// registers; 8 measured fastest (Q4_0 about 15% over 4), while 12 pushed
/// the group's activations out of L1/L2 for wide rows and was slower.
const GROUP: usize = 8;

type MultiKernel = fn(&[u8], &[f32], usize, &mut [f32]);

/// One type's multi-token kernel for a fixed number `G` of tokens; `x[g]`
/// is token `g`'s activations, all of the row's length.
trait Multi {
    fn run<const G: usize>(row: &[u8], x: [&[f32]; G]) -> [f32; G];
}

/// Splits the tokens into groups of [`GROUP`], then fours, then one group
/// of 1-3, and runs `M` on each. `xs.len() == out.len() * k` and `k > 0`.
#[inline(always)]
fn grouped<M: Multi>(row: &[u8], xs: &[f32], k: usize, out: &mut [f32]) {
    let n = out.len();
    let tok = |t: usize| &xs[t * k..(t + 1) * k];
    let mut t = 0;
    while t + GROUP <= n {
        let r = M::run::<GROUP>(row, std::array::from_fn(|g| tok(t + g)));
        out[t..t + GROUP].copy_from_slice(&r);
        t += GROUP;
    }
    // The rest (fewer than GROUP tokens): fours, then one group of 1-3.
    while n - t >= 4 {
        let r = M::run::<4>(row, std::array::from_fn(|g| tok(t + g)));
        out[t..t + 4].copy_from_slice(&r);
        t += 4;
    }
    match n - t {
        1 => out[t..].copy_from_slice(&M::run::<1>(row, [tok(t)])),
        2 => out[t..].copy_from_slice(&M::run::<2>(row, [tok(t), tok(t + 1)])),
        3 => out[t..].copy_from_slice(&M::run::<3>(row, [tok(t), tok(t + 1), tok(t + 2)])),
        _ => {}
    }
}

fn portable_multi(ty: GgmlType) -> Option<MultiKernel> {
    Some(match ty {
        GgmlType::F32 => grouped::<MF32>,
        GgmlType::F16 => grouped::<MF16>,
        GgmlType::Bf16 => grouped::<MBf16>,
        GgmlType::Q8_0 => grouped::<MQ8_0>,
        GgmlType::Q4_0 => grouped::<MQ4_0>,
        GgmlType::Q6K => grouped::<MQ6K>,
        GgmlType::Q4_1 => grouped::<MQ4_1>,
        GgmlType::Q5_0 => grouped::<MQ5_0>,
        GgmlType::Q5_1 => grouped::<MQ5_1>,
        GgmlType::Q8_1 => grouped::<MQ8_1>,
        GgmlType::Q4K => grouped::<MQ4K>,
        GgmlType::Q5K => grouped::<MQ5K>,
        _ => return None,
    })
}

#[cfg(target_arch = "x86_64")]
fn dispatch_multi(ty: GgmlType, row: &[u8], xs: &[f32], k: usize, out: &mut [f32]) {
    if avx2::available() {
        if let Some(m) = avx2_multi::multi(ty) {
            // SAFETY: `available()` checked that the CPU has AVX2, FMA and
            // F16C, which is all the `avx2` kernels were compiled to assume.
            unsafe { m(row, xs, k, out) };
            return;
        }
    }
    if let Some(m) = portable_multi(ty) {
        m(row, xs, k, out);
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn dispatch_multi(ty: GgmlType, row: &[u8], xs: &[f32], k: usize, out: &mut [f32]) {
    if let Some(m) = portable_multi(ty) {
        m(row, xs, k, out);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2_multi {
    use super::*;
    use std::arch::x86_64::*;

    type UnsafeMulti = unsafe fn(&[u8], &[f32], usize, &mut [f32]);

    macro_rules! avx2_multi {
        ($($ty:ident => $name:ident = $m:ty),* $(,)?) => {
            $(
                /// # Safety
                /// The CPU must support AVX2, FMA and F16C.
                #[target_feature(enable = "avx2,fma,f16c")]
                unsafe fn $name(row: &[u8], xs: &[f32], k: usize, out: &mut [f32]) {
                    grouped::<$m>(row, xs, k, out)
                }
            )*

            pub(super) fn multi(ty: GgmlType) -> Option<UnsafeMulti> {
                match ty {
                    $(GgmlType::$ty => Some($name as UnsafeMulti),)*
                    _ => None,
                }
            }
        };
    }

    /// F16 rows decoded with `vcvtph2ps` (exact, like the portable routine).
    struct MF16C;
    impl Multi for MF16C {
        #[inline(always)]
        fn run<const G: usize>(row: &[u8], x: [&[f32]; G]) -> [f32; G] {
            let conv = |b: &[u8]| f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            multi_scalar_with::<G, 2>(row, x, conv, |rb, buf| {
                let rb = &rb[..2 * SCALAR_CHUNK];
                for (h, y) in rb.chunks_exact(16).zip(buf.chunks_exact_mut(8)) {
                    // SAFETY: only inlined into `m_f16`, compiled for F16C
                    // and called only when the CPU has it; each load reads
                    // the 16 bytes of `h`, each store the 8 floats of `y`.
                    unsafe {
                        let v = _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr().cast()));
                        _mm256_storeu_ps(y.as_mut_ptr(), v);
                    }
                }
            })
        }
    }

    avx2_multi!(
        F32 => m_f32 = MF32,
        F16 => m_f16 = MF16C,
        Bf16 => m_bf16 = MBf16,
        Q8_0 => m_q8_0 = MQ8_0,
        Q4_0 => m_q4_0 = MQ4_0,
        Q6K => m_q6_k = MQ6K,
        Q4_1 => m_q4_1 = MQ4_1,
        Q5_0 => m_q5_0 = MQ5_0,
        Q5_1 => m_q5_1 = MQ5_1,
        Q8_1 => m_q8_1 = MQ8_1,
        Q4K => m_q4_k = MQ4K,
        Q5K => m_q5_k = MQ5K,
    );
}

/// `acc[g][l] += y[16 j + l] · x[g][off + 16 j + l]` for every chunk `j` of
/// `y` (whose length is a multiple of 16): the plain lane update of
/// `dot_scalar` and `dot_blocks`.
#[inline(always)]
fn acc_plain<const G: usize>(acc: &mut [[f32; LANES]; G], y: &[f32], x: &[&[f32]; G], off: usize) {
    for (a, xt) in acc.iter_mut().zip(x) {
        let xs = &xt[off..off + y.len()];
        let mut l16 = *a;
        for (yb, xb) in y.chunks_exact(LANES).zip(xs.chunks_exact(LANES)) {
            let (yb, xb) = (&yb[..LANES], &xb[..LANES]);
            for l in 0..LANES {
                l16[l] += yb[l] * xb[l];
            }
        }
        *a = l16;
    }
}

/// Elements decoded per step by the plain scalar rows.
const SCALAR_CHUNK: usize = 64;

/// Many-token `dot_scalar`: element `i` goes to lane `i % 16`, in element
/// order, the tail (`len % 16` elements) to lanes `0..`.
#[inline(always)]
fn multi_scalar<const G: usize, const W: usize>(
    row: &[u8],
    x: [&[f32]; G],
    conv: impl Fn(&[u8]) -> f32,
) -> [f32; G] {
    multi_scalar_with::<G, W>(row, x, &conv, |rb, buf| {
        for (y, b) in buf.iter_mut().zip(rb.chunks_exact(W)) {
            *y = conv(b);
        }
    })
}

/// [`multi_scalar`] with a separate decoder for whole chunks of
/// [`SCALAR_CHUNK`] elements (`conv` still decodes the tail). Both must
/// decode exactly, so which one handles an element changes no bits.
#[inline(always)]
fn multi_scalar_with<const G: usize, const W: usize>(
    row: &[u8],
    x: [&[f32]; G],
    conv: impl Fn(&[u8]) -> f32,
    chunk: impl Fn(&[u8], &mut [f32; SCALAR_CHUNK]),
) -> [f32; G] {
    let n = row.len() / W;
    let mut acc = [[0f32; LANES]; G];
    let mut buf = [0f32; SCALAR_CHUNK];
    let n_chunks = n / SCALAR_CHUNK;
    for (c, rb) in row.chunks_exact(SCALAR_CHUNK * W).enumerate() {
        chunk(rb, &mut buf);
        acc_plain(&mut acc, &buf, &x, c * SCALAR_CHUNK);
    }
    let base = n_chunks * SCALAR_CHUNK;
    let rest = n - base;
    for (y, b) in buf.iter_mut().zip(row[base * W..].chunks_exact(W)) {
        *y = conv(b);
    }
    let full = rest / LANES * LANES;
    acc_plain(&mut acc, &buf[..full], &x, base);
    for g in 0..G {
        let xt = &x[g][base + full..n];
        for (l, (y, xv)) in buf[full..rest].iter().zip(xt).enumerate() {
            acc[g][l] += y * xv;
        }
    }
    std::array::from_fn(|g| hsum(&acc[g]))
}

/// Many-token `dot_blocks`: decode each block once, then the plain update.
#[inline(always)]
fn multi_blocks<const G: usize, const B: usize>(
    row: &[u8],
    x: [&[f32]; G],
    type_size: usize,
    decode: fn(&[u8], &mut [f32]),
) -> [f32; G] {
    let mut acc = [[0f32; LANES]; G];
    let mut buf = [0f32; B];
    for (i, b) in row.chunks_exact(type_size).enumerate() {
        decode(b, &mut buf);
        acc_plain(&mut acc, &buf, &x, i * B);
    }
    std::array::from_fn(|g| hsum(&acc[g]))
}

/// Many-token form of `dot_q8_0` / `dot_q4_0`: `decode` writes a block's 32
/// integer values as floats and returns its scale `d`; per token, lane `l`
/// adds `d · (v[l]·x[l] + v[l+16]·x[l+16])`.
#[inline(always)]
fn multi_pairs<const G: usize>(
    row: &[u8],
    x: [&[f32]; G],
    type_size: usize,
    decode: impl Fn(&[u8], &mut [f32; QK32]) -> f32,
) -> [f32; G] {
    let mut acc = [[0f32; LANES]; G];
    let mut v = [0f32; QK32];
    for (i, b) in row.chunks_exact(type_size).enumerate() {
        let d = decode(b, &mut v);
        for (a, xt) in acc.iter_mut().zip(&x) {
            let xb = &xt[QK32 * i..QK32 * i + QK32];
            let mut s = [0f32; LANES];
            for l in 0..LANES {
                s[l] = v[l] * xb[l] + v[l + LANES] * xb[l + LANES];
            }
            for l in 0..LANES {
                a[l] += d * s[l];
            }
        }
    }
    std::array::from_fn(|g| hsum(&acc[g]))
}

macro_rules! multi_types {
    ($($name:ident => |$row:ident, $x:ident| $body:expr;)*) => {
        $(
            struct $name;
            impl Multi for $name {
                #[inline(always)]
                fn run<const G: usize>($row: &[u8], $x: [&[f32]; G]) -> [f32; G] {
                    $body
                }
            }
        )*
    };
}

multi_types! {
    MF32 => |row, x| multi_scalar::<G, 4>(row, x, |b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    MF16 => |row, x| multi_scalar::<G, 2>(row, x, |b| f16_to_f32(u16::from_le_bytes([b[0], b[1]])));
    MBf16 => |row, x| multi_scalar::<G, 2>(row, x, |b| bf16_to_f32(u16::from_le_bytes([b[0], b[1]])));
    MQ8_0 => |row, x| multi_pairs(row, x, Q8_0_BYTES, |b, v| {
        let qs = &b[2..34];
        for (y, q) in v.iter_mut().zip(qs) {
            *y = *q as i8 as f32;
        }
        rd_f16(b, 0)
    });
    MQ4_0 => |row, x| multi_pairs(row, x, Q4_0_BYTES, |b, v| {
        let qs = &b[2..18];
        for l in 0..16 {
            v[l] = ((qs[l] & 0x0f) as i32 - 8) as f32;
            v[l + 16] = ((qs[l] >> 4) as i32 - 8) as f32;
        }
        rd_f16(b, 0)
    });
    MQ6K => |row, x| multi_q6_k(row, x);
    MQ4_1 => |row, x| multi_blocks::<G, QK32>(row, x, Q4_1_BYTES, dequant_q4_1);
    MQ5_0 => |row, x| multi_blocks::<G, QK32>(row, x, Q5_0_BYTES, dequant_q5_0);
    MQ5_1 => |row, x| multi_blocks::<G, QK32>(row, x, Q5_1_BYTES, dequant_q5_1);
    MQ8_1 => |row, x| multi_blocks::<G, QK32>(row, x, Q8_1_BYTES, dequant_q8_1);
    MQ4K => |row, x| multi_blocks::<G, QK_K>(row, x, Q4_K_BYTES, dequant_q4_k);
    MQ5K => |row, x| multi_blocks::<G, QK_K>(row, x, Q5_K_BYTES, dequant_q5_k);
}

/// Many-token `dot_q6_k`: per token and sub-block `s`, lane `l` adds
/// `ds[s] · (q[16s+l] · x[16s+l])`.
#[inline(always)]
fn multi_q6_k<const G: usize>(row: &[u8], x: [&[f32]; G]) -> [f32; G] {
    let mut acc = [[0f32; LANES]; G];
    let mut q = [0i8; QK_K];
    let mut qf = [0f32; QK_K];
    let mut ds = [0f32; 16];
    for (i, b) in row.chunks_exact(Q6_K_BYTES).enumerate() {
        q6_k_values(b, &mut q);
        for (f, v) in qf.iter_mut().zip(&q) {
            *f = *v as f32;
        }
        let d = rd_f16(b, 208);
        for (o, sc) in ds.iter_mut().zip(&b[192..208]) {
            *o = d * (*sc as i8) as f32;
        }
        // One token at a time, through a local copy of its lanes: indexing
        // `acc[g]` inside the sub-block loop made LLVM keep the lanes in
        // memory and go scalar.
        for (a, xt) in acc.iter_mut().zip(&x) {
            let xb = &xt[QK_K * i..QK_K * i + QK_K];
            let mut l16 = *a;
            for s in 0..16 {
                let d = ds[s];
                let qs = &qf[16 * s..16 * s + 16];
                let xs = &xb[16 * s..16 * s + 16];
                for l in 0..LANES {
                    l16[l] += d * (qs[l] * xs[l]);
                }
            }
            *a = l16;
        }
    }
    std::array::from_fn(|g| hsum(&acc[g]))
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

    /// On each dispatch path separately, the many-token kernel gives the
    /// single-token kernel's bits for every token of the batch.
    #[test]
    fn multi_kernels_match_single_kernels_on_both_paths() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let avx = avx2::available();
        for ty in GgmlType::ALL.iter().copied().filter(|t| t.can_dequantize()) {
            for n in [16usize, 48, 256, 272, 1024, 1040] {
                if n % ty.block_size() != 0 {
                    continue;
                }
                let mut row = vec![0u8; n / ty.block_size() * ty.type_size()];
                row.iter_mut().for_each(|b| *b = next() as u8);
                // Keep every float field (f16 scales, f16/bf16/f32 elements)
                // finite and small by clearing its exponent's top bit, so the
                // results are numbers and compare by their bits alone.
                let f16_at: &[usize] = match ty {
                    GgmlType::F16 | GgmlType::Bf16 => &[0],
                    GgmlType::F32 => &[2],
                    GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
                    GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q8_1 => &[0, 2],
                    GgmlType::Q4K | GgmlType::Q5K => &[0, 2],
                    GgmlType::Q6K => &[208],
                    _ => &[],
                };
                for blk in row.chunks_mut(ty.type_size()) {
                    for &o in f16_at {
                        blk[o + 1] &= 0xbf;
                    }
                }
                for t in [1usize, 2, 3, 4, 5, 6, 8, 13, 15, 17] {
                    let xs: Vec<f32> = (0..t * n)
                        .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
                        .collect();
                    let mut got = vec![f32::NAN; t];
                    portable_multi(ty).expect("portable multi")(&row, &xs, n, &mut got);
                    let single = portable_kernel(ty).expect("portable kernel");
                    for (i, g) in got.iter().enumerate() {
                        let want = single(&row, &xs[i * n..(i + 1) * n]);
                        assert!(want.is_finite(), "{ty} n={n}: non-finite test row");
                        assert_eq!(
                            g.to_bits(),
                            want.to_bits(),
                            "portable {ty} n={n} t={t} [{i}]"
                        );
                    }
                    if !avx {
                        continue;
                    }
                    let m = avx2_multi::multi(ty).expect("avx2 multi");
                    let k = avx2::kernel(ty).expect("avx2 kernel");
                    // SAFETY: `available()` returned true above.
                    unsafe { m(&row, &xs, n, &mut got) };
                    for (i, g) in got.iter().enumerate() {
                        // SAFETY: as above.
                        let want = unsafe { k(&row, &xs[i * n..(i + 1) * n]) };
                        assert_eq!(g.to_bits(), want.to_bits(), "avx2 {ty} n={n} t={t} [{i}]");
                    }
                }
            }
        }
    }
}
