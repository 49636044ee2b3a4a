//! Multi-threaded `out[t][o] = Σ_i W[o][i] · x[t][i]` against quantized rows.
//!
//! Every output element is exactly `quant::dot_row_f32(row_o, x_t)`, whatever
//! the number of tokens. That makes a token's result independent of the
//! batch it is computed in: a prefill of T tokens and T single-token decodes
//! produce bit-identical activations, so the CPU oracle has one answer per
//! input, not one per batching. Several tokens go through
//! `quant::dot_row_multi_f32`, which decodes each weight block once for a
//! group of tokens but keeps every token's arithmetic identical to the
//! single-token kernel (dequantizing a whole row to f32 and reusing it would
//! be simpler but rounds differently from the decode path).
//!
//! Work is split over blocks of output rows (rayon). Within a block the
//! tokens are taken [`TOKEN_CHUNK`] at a time and every row of the block is
//! run against the chunk, so the block's rows stay in L1/L2 while the chunk's
//! activations are reused by every row. Nothing is allocated.

use gemtune_kernels::quant::{self, GgmlType, QuantError};
use rayon::prelude::*;

/// Output rows per task.
const ROW_BLOCK: usize = 8;

/// Tokens per call of the many-token kernel, one kernel group: the chunk's
/// activations stay in L2 while every row of the block reads them. Larger
/// chunks measured slower (the kernel streams the whole chunk once per row),
/// smaller ones decode each block more often.
const TOKEN_CHUNK: usize = 8;

/// A raw output pointer shared by tasks that write disjoint elements.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: every task writes a disjoint set of elements (its own output
// columns `o`), and the owning `&mut [f32]` outlives the parallel loop.
unsafe impl Send for OutPtr {}
// SAFETY: as above; no element is read or written by two tasks.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// # Safety
    /// `i` must be in bounds of the output slice and written by no other task.
    #[inline]
    unsafe fn write(self, i: usize, v: f32) {
        // SAFETY: guaranteed by the caller.
        unsafe { *self.0.add(i) = v };
    }
}

/// `w` holds `n_out` rows of `n_in` elements of type `ty`; `x` is
/// `[tokens][n_in]`, `out` is `[tokens][n_out]`.
pub fn matmul(
    ty: GgmlType,
    w: &[u8],
    n_in: usize,
    n_out: usize,
    x: &[f32],
    tokens: usize,
    out: &mut [f32],
) -> Result<(), QuantError> {
    assert_eq!(x.len(), tokens * n_in, "matmul: x has the wrong length");
    assert_eq!(
        out.len(),
        tokens * n_out,
        "matmul: out has the wrong length"
    );
    if tokens == 0 || n_out == 0 {
        return Ok(());
    }
    let row_bytes = w.len() / n_out;
    assert_eq!(
        row_bytes * n_out,
        w.len(),
        "matmul: weight bytes are not n_out rows"
    );
    let row = |r: usize| &w[r * row_bytes..(r + 1) * row_bytes];

    if tokens == 1 {
        return out
            .par_chunks_mut(ROW_BLOCK)
            .enumerate()
            .try_for_each(|(b, chunk)| {
                for (j, o) in chunk.iter_mut().enumerate() {
                    *o = quant::dot_row_f32(ty, row(b * ROW_BLOCK + j), x)?;
                }
                Ok(())
            });
    }

    if n_in == 0 {
        // Empty rows: no chunks to walk; every output is the empty dot.
        for (i, o) in out.iter_mut().enumerate() {
            *o = quant::dot_row_f32(ty, row(i % n_out), &[])?;
        }
        return Ok(());
    }

    let ptr = OutPtr(out.as_mut_ptr());
    (0..n_out.div_ceil(ROW_BLOCK))
        .into_par_iter()
        .try_for_each(|b| {
            let r0 = b * ROW_BLOCK;
            let r1 = (r0 + ROW_BLOCK).min(n_out);
            let mut res = [0f32; TOKEN_CHUNK];
            for (c, xc) in x.chunks(TOKEN_CHUNK * n_in).enumerate() {
                let t0 = c * TOKEN_CHUNK;
                let res = &mut res[..xc.len() / n_in];
                for r in r0..r1 {
                    quant::dot_row_multi_f32(ty, row(r), xc, n_in, res)?;
                    for (j, &v) in res.iter().enumerate() {
                        // SAFETY: `t0 + j < tokens` and `r < n_out`, so the
                        // index is inside `out`; column `r` belongs to this
                        // task only.
                        unsafe { ptr.write((t0 + j) * n_out + r, v) };
                    }
                }
            }
            Ok(())
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Uniform [-1, 1) weights quantized to `ty`, row by row; returns the
    /// rows, the bytes per row and the generator for the caller's inputs.
    fn random_weights(
        ty: GgmlType,
        n_in: usize,
        n_out: usize,
        seed: u64,
    ) -> (Vec<u8>, usize, ChaCha8Rng) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let wf: Vec<f32> = (0..n_in * n_out)
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        let rb = ty.row_bytes(n_in as u64).unwrap() as usize;
        let mut wq = vec![0u8; rb * n_out];
        for r in 0..n_out {
            quant::quantize_row(
                ty,
                &wf[r * n_in..(r + 1) * n_in],
                &mut wq[r * rb..(r + 1) * rb],
            )
            .unwrap();
        }
        (wq, rb, rng)
    }

    fn check(ty: GgmlType, n_in: usize, n_out: usize, tokens: usize) {
        let (wq, rb, mut rng) = random_weights(ty, n_in, n_out, 7);
        // The reference uses the dequantized weights, so only accumulation differs.
        let mut wd = vec![0.0f32; n_in * n_out];
        for r in 0..n_out {
            quant::dequantize_row(
                ty,
                &wq[r * rb..(r + 1) * rb],
                &mut wd[r * n_in..(r + 1) * n_in],
            )
            .unwrap();
        }
        let x: Vec<f32> = (0..tokens * n_in)
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        let mut want = vec![0.0f32; tokens * n_out];
        gemtune_kernels::oracle::matmul(&wd, &x, tokens, n_out, n_in, &mut want);
        let mut got = vec![f32::NAN; tokens * n_out];
        matmul(ty, &wq, n_in, n_out, &x, tokens, &mut got).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() < 1e-4 * (n_in as f32).sqrt(),
                "{ty} t={tokens} [{i}]: {g} vs {w}"
            );
        }
    }

    /// A token's outputs do not depend on the other tokens of the batch.
    fn batch_independent(ty: GgmlType, n_in: usize, n_out: usize) {
        let (wq, _, mut rng) = random_weights(ty, n_in, n_out, 3);
        let x: Vec<f32> = (0..5 * n_in).map(|_| rng.random_range(-1.0..1.0)).collect();
        let mut all = vec![0.0f32; 5 * n_out];
        matmul(ty, &wq, n_in, n_out, &x, 5, &mut all).unwrap();
        for t in 0..5 {
            let mut one = vec![0.0f32; n_out];
            matmul(
                ty,
                &wq,
                n_in,
                n_out,
                &x[t * n_in..(t + 1) * n_in],
                1,
                &mut one,
            )
            .unwrap();
            assert_eq!(one, all[t * n_out..(t + 1) * n_out], "{ty} token {t}");
        }
    }

    #[test]
    fn matmul_matches_oracle_for_every_path() {
        for ty in [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0] {
            for tokens in [1, 2, 3, 9] {
                check(ty, 64, 13, tokens);
            }
            batch_independent(ty, 96, 21);
        }
        check(GgmlType::Q6K, 256, 7, 5);
    }
}
