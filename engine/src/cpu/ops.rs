//! Element-wise and per-vector ops of the CPU forward.
//!
//! Numerics (the contract the CUDA engine is judged against):
//! - RMSNorm accumulates the sum of squares in f64 and applies the scale in
//!   f64 before rounding to f32: the scale is `kernels::oracle::rms_inv`.
//! - GELU (tanh form) and the softcap are the oracle's own
//!   (`kernels::oracle::{gelu_tanh, softcap}`), evaluated in f64 and rounded
//!   to f32.
//! - `dot` is an f32 dot with eight independent partial sums (so the compiler
//!   vectorises it), used by the attention scores; its error is
//!   that of f32 accumulation over the row, ~1e-7·√n relative.

/// f32 dot product with eight partial sums, combined pairwise.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0.0f32; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    for i in 0..ra.len() {
        acc[i] += ra[i] * rb[i];
    }
    let s0 = (acc[0] + acc[4]) + (acc[1] + acc[5]);
    let s1 = (acc[2] + acc[6]) + (acc[3] + acc[7]);
    s0 + s1
}

pub use gemtune_kernels::oracle::{gelu_tanh, softcap};

/// `1 / sqrt(mean(x²) + eps)` with an f64 accumulator (the oracle's).
#[inline]
fn rms_scale(x: &[f32], eps: f32) -> f64 {
    gemtune_kernels::oracle::rms_inv(x, eps)
}

/// In-place RMSNorm: `x = x · (mean(x²) + eps)^(-1/2) · w` (no `1 + w`).
/// `w = None` is the weightless norm (V and the MoE router input).
pub fn rms_norm_inplace(x: &mut [f32], w: Option<&[f32]>, eps: f32) {
    let s = rms_scale(x, eps);
    match w {
        Some(w) => {
            debug_assert_eq!(w.len(), x.len());
            for (v, &g) in x.iter_mut().zip(w) {
                *v = (*v as f64 * s * g as f64) as f32;
            }
        }
        None => {
            for v in x.iter_mut() {
                *v = (*v as f64 * s) as f32;
            }
        }
    }
}

/// `out = RMSNorm(x, w)`.
pub fn rms_norm_into(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let s = rms_scale(x, eps);
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = (v as f64 * s * g as f64) as f32;
    }
}

/// Residual add of a normed block output: `h += RMSNorm(y, w)`.
pub fn add_rms_normed(h: &mut [f32], y: &[f32], w: &[f32], eps: f32) {
    let s = rms_scale(y, eps);
    for ((hv, &v), &g) in h.iter_mut().zip(y).zip(w) {
        *hv += (v as f64 * s * g as f64) as f32;
    }
}

/// `gate = gelu_tanh(gate) ⊙ other`, element-wise.
pub fn gelu_mul(gate: &mut [f32], other: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(other) {
        *g = gelu_tanh(*g) * u;
    }
}

/// Final logit softcap `cap · tanh(x / cap)` over a row.
pub fn softcap_row(x: &mut [f32], cap: f32) {
    for v in x.iter_mut() {
        *v = softcap(*v, cap);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gemtune_kernels::oracle;

    #[test]
    fn gelu_and_softcap_values() {
        assert_eq!(gelu_tanh(0.0), 0.0);
        assert!((gelu_tanh(1.0) - 0.841_192).abs() < 1e-6);
        assert!((gelu_tanh(-3.0) + 0.003_637_4).abs() < 1e-6);
        assert!((softcap(30.0, 30.0) - 30.0 * 1f32.tanh()).abs() < 1e-5);
        assert!((softcap(1e6, 30.0) - 30.0).abs() < 1e-5);
    }

    #[test]
    fn dot_matches_f64_reference() {
        let a: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..37).map(|i| (i as f32 * 0.11).cos()).collect();
        let want: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
        assert!((dot(&a, &b) as f64 - want).abs() < 1e-5);
    }

    #[test]
    fn rms_norm_matches_oracle() {
        let x: Vec<f32> = (0..64).map(|i| (i as f32 * 0.7).sin() * 3.0).collect();
        let w: Vec<f32> = (0..64).map(|i| 0.5 + i as f32 / 64.0).collect();
        let mut want = vec![0.0; 64];
        oracle::rms_norm(&x, Some(&w), 1e-6, &mut want);
        let mut got = x.clone();
        rms_norm_inplace(&mut got, Some(&w), 1e-6);
        // One definition of the scale: the results are bit-identical.
        assert_eq!(got, want);
        oracle::rms_norm(&x, None, 1e-6, &mut want);
        let mut got = x.clone();
        rms_norm_inplace(&mut got, None, 1e-6);
        // One definition of the scale: the results are bit-identical.
        assert_eq!(got, want);
    }
}
