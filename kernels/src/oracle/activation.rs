//! Element-wise activations and softmax.

use super::check_len;

/// GELU, tanh approximation (PyTorch `gelu(approximate="tanh")`, ggml
/// `gelu`): `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, evaluated in f64
/// with an exact tanh (ggml's CPU path may use an f16 lookup table instead).
pub fn gelu_tanh(x: f32) -> f32 {
    let x = x as f64;
    let c = (2.0 / std::f64::consts::PI).sqrt();
    (0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())) as f32
}

/// Soft capping: `cap · tanh(x / cap)`, in f64. Gemma 4 caps the final
/// logits with `cap = 30`. `cap` must be non-zero.
pub fn softcap(x: f32, cap: f32) -> f32 {
    let c = cap as f64;
    (c * (x as f64 / c).tanh()) as f32
}

/// `out = softmax(x)`, computed in f64 with the maximum subtracted first.
/// Entries equal to `-inf` get probability 0; if every entry is `-inf` the
/// output is all zeros. `out` must have the length of `x`.
pub fn softmax(x: &[f32], out: &mut [f32]) {
    check_len("softmax out", out.len(), x.len());
    let max = x.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
    if max == f64::NEG_INFINITY {
        out.iter_mut().for_each(|o| *o = 0.0);
        return;
    }
    let sum: f64 = x.iter().map(|&v| (v as f64 - max).exp()).sum();
    for (o, &v) in out.iter_mut().zip(x) {
        *o = ((v as f64 - max).exp() / sum) as f32;
    }
}
