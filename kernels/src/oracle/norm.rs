//! RMS normalization.

use super::check_len;

/// `1 / sqrt(mean(x²) + eps)` with the sum of squares in f64: the one
/// definition of the RMS scale (this oracle and the CPU engine's norms).
/// `x` must not be empty.
pub fn rms_inv(x: &[f32], eps: f32) -> f64 {
    let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    1.0 / (ss / x.len() as f64 + eps as f64).sqrt()
}

/// `out[i] = x[i] / sqrt(mean(x²) + eps) * w[i]` (or without `w` when
/// `weight` is `None`, the "no-scale" norm Gemma 4 applies to V).
///
/// The weight is used as given (Gemma 4 stores the raw `w`, no `1 + w`).
/// The mean of squares and every product are computed in f64; each output
/// is rounded to f32 once. `x`, `weight` and `out` must have the same
/// length; an empty `x` is a no-op.
pub fn rms_norm(x: &[f32], weight: Option<&[f32]>, eps: f32, out: &mut [f32]) {
    check_len("rms_norm out", out.len(), x.len());
    if let Some(w) = weight {
        check_len("rms_norm weight", w.len(), x.len());
    }
    if x.is_empty() {
        return;
    }
    let inv = rms_inv(x, eps);
    for (i, (o, &v)) in out.iter_mut().zip(x).enumerate() {
        let w = weight.map_or(1.0, |w| w[i] as f64);
        *o = (v as f64 * inv * w) as f32;
    }
}
