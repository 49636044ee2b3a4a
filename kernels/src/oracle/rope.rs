//! Rotary position embedding, NeoX (half-split) convention.

use super::check_len;

/// Rotates one head vector in place for position `pos`.
///
/// NeoX pairing: dimension `i` is paired with `i + rope_dims/2` for
/// `i < rope_dims/2`, and the pair is rotated by
/// `θ_i = pos · freq_base^(−2i/rope_dims) / ff_i`
/// (`ff_i = freq_factors[i]`, or 1 without factors):
/// `(a, b) → (a·cos θ − b·sin θ, a·sin θ + b·cos θ)`.
/// Dimensions from `rope_dims` to `head.len()` are left untouched.
/// Angles, sines and products are computed in f64.
///
/// Gemma 4 uses the default form on SWA layers (`rope_dims = 256`, base
/// 1e4, no factors) and the proportional form on full layers: `rope_dims =
/// 512`, base 1e6 and the factors of [`proportional_freq_factors`] (64 × 1
/// then 192 × 1e30), so pairs `(i, i + 256)` rotate for `i < 64` and the
/// others get `θ < 1e-24`, which leaves any pair of comparable magnitudes
/// bit-identical in f32 (that is llama.cpp's formulation; HF sets those
/// frequencies to exactly 0).
///
/// `rope_dims` must be even and at most `head.len()`; `freq_factors`, when
/// given, must have `rope_dims / 2` entries.
pub fn rope_neox(
    head: &mut [f32],
    pos: usize,
    freq_base: f32,
    rope_dims: usize,
    freq_factors: Option<&[f32]>,
) {
    assert!(
        rope_dims % 2 == 0 && rope_dims <= head.len(),
        "oracle: rope_dims {rope_dims} must be even and at most the head size {}",
        head.len()
    );
    let half = rope_dims / 2;
    if let Some(ff) = freq_factors {
        check_len("rope freq_factors", ff.len(), half);
    }
    let inv_freq = rope_inv_freq(freq_base, rope_dims, freq_factors);
    for (i, &f) in inv_freq.iter().enumerate() {
        let theta = pos as f64 * f;
        let (s, c) = theta.sin_cos();
        let a = head[i] as f64;
        let b = head[i + half] as f64;
        head[i] = (a * c - b * s) as f32;
        head[i + half] = (a * s + b * c) as f32;
    }
}

/// The inverse frequency of each rotated pair, in f64:
/// `inv_freq_i = freq_base^(-2i/rope_dims) / ff_i` for `i < rope_dims/2`
/// (`ff_i = freq_factors[i]`, or 1 without factors). This is the one
/// definition of RoPE's frequencies: the oracle rotates with it, the CPU
/// engine builds its tables from it and the CUDA engine uploads it for
/// `qk_norm_rope`. A factor list shorter than the pairs counts 1 past its
/// end.
pub fn rope_inv_freq(freq_base: f32, rope_dims: usize, freq_factors: Option<&[f32]>) -> Vec<f64> {
    let base = freq_base as f64;
    (0..rope_dims / 2)
        .map(|i| {
            let ff = freq_factors
                .and_then(|f| f.get(i))
                .map_or(1.0, |&f| f as f64);
            base.powf(-2.0 * i as f64 / rope_dims as f64) / ff
        })
        .collect()
}

/// The frequency factors llama.cpp stores for Gemma 4's proportional RoPE
/// (`rope_freqs.weight`): `rope_dims / 2` entries, the first
/// `rotated_pairs` equal to 1 and the rest 1e30. For Gemma 4 full layers:
/// `proportional_freq_factors(512, 64)`.
pub fn proportional_freq_factors(rope_dims: usize, rotated_pairs: usize) -> Vec<f32> {
    (0..rope_dims / 2)
        .map(|i| if i < rotated_pairs { 1.0 } else { 1e30 })
        .collect()
}
