//! The gated feed-forward block.

use super::{check_len, gelu_tanh, matmul};

/// One token through Gemma's gated FFN: `out = down · (gelu(gate · x) ⊙ (up · x))`.
///
/// `x` is `[d]`, `gate` and `up` are `[ff][d]`, `down` is `[d][ff]`
/// (row-major, one row per output feature), `out` is `[d]`. Each stage is
/// an oracle op (f64 inside), and its result is an f32 vector, exactly as
/// the engine holds activations between matmuls.
pub fn gated_ffn(
    x: &[f32],
    gate: &[f32],
    up: &[f32],
    down: &[f32],
    d: usize,
    ff: usize,
    out: &mut [f32],
) {
    check_len("gated_ffn x", x.len(), d);
    check_len("gated_ffn gate", gate.len(), ff * d);
    check_len("gated_ffn up", up.len(), ff * d);
    check_len("gated_ffn down", down.len(), d * ff);
    check_len("gated_ffn out", out.len(), d);
    let mut g = vec![0f32; ff];
    let mut u = vec![0f32; ff];
    matmul(gate, x, 1, ff, d, &mut g);
    matmul(up, x, 1, ff, d, &mut u);
    let h: Vec<f32> = g
        .iter()
        .zip(&u)
        .map(|(&a, &b)| (gelu_tanh(a) as f64 * b as f64) as f32)
        .collect();
    matmul(down, &h, 1, d, ff, out);
}
