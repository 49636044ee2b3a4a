//! Matrix products against (dequantized) weights.

use super::check_len;
use crate::quant::{dequantize_row, GgmlType, QuantError};

/// `out[i][j] = Σ_c x[i][c] · w[j][c]` for `i < m` tokens, `j < n` output
/// features, `c < k` input features; every dot product in f64.
///
/// Layouts are row-major: `x` is `[m][k]`, `w` is `[n][k]` (one row per
/// output feature, which is how GGUF stores a linear layer: `ne = [k, n]`),
/// `out` is `[m][n]`.
pub fn matmul(w: &[f32], x: &[f32], m: usize, n: usize, k: usize, out: &mut [f32]) {
    check_len("matmul w", w.len(), n * k);
    check_len("matmul x", x.len(), m * k);
    check_len("matmul out", out.len(), m * n);
    for i in 0..m {
        let xi = &x[i * k..(i + 1) * k];
        for j in 0..n {
            let wj = &w[j * k..(j + 1) * k];
            let acc: f64 = wj.iter().zip(xi).map(|(&a, &b)| a as f64 * b as f64).sum();
            out[i * n + j] = acc as f32;
        }
    }
}

/// [`matmul`] against a weight matrix stored as GGML type `wtype`: each of
/// the `n` rows (`wtype.row_bytes(k)` bytes) is dequantized exactly as ggml
/// does, then multiplied in f64. Errors if `w` does not hold `n` rows of
/// `k` elements of `wtype` or `wtype` cannot be dequantized.
pub fn matmul_quant(
    wtype: GgmlType,
    w: &[u8],
    x: &[f32],
    m: usize,
    n: usize,
    k: usize,
    out: &mut [f32],
) -> Result<(), QuantError> {
    check_len("matmul_quant x", x.len(), m * k);
    check_len("matmul_quant out", out.len(), m * n);
    if k % wtype.block_size() != 0 {
        // Every row must be whole blocks for the row layout to hold.
        return Err(QuantError::PartialBlockElements {
            ty: wtype,
            elements: k,
            block_size: wtype.block_size(),
        });
    }
    let mut wf = vec![0f32; n * k];
    dequantize_row(wtype, w, &mut wf)?;
    matmul(&wf, x, m, n, k, out);
    Ok(())
}
