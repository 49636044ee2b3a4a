//! Multi-head attention with GQA, causal and sliding-window masks.

use super::check_len;

/// Shape and masking of one attention call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnParams {
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads; must divide `n_heads`.
    pub n_kv_heads: usize,
    /// Elements per head (Gemma 4: 256 on SWA layers, 512 on full layers).
    pub head_dim: usize,
    /// Multiplies `q · k` before the softmax (Gemma 4 uses 1.0).
    pub scale: f32,
    /// Sliding window `W`: key at `k_pos` is visible from `q_pos` only if
    /// `q_pos - k_pos < W`. `None` for full (causal-only) attention.
    pub window: Option<usize>,
}

/// Softmax attention for `T` queries over `S` keys.
///
/// Layouts (row-major): `q` and `out` are `[T][n_heads][head_dim]`, `k` and
/// `v` are `[S][n_kv_heads][head_dim]`; `q_pos[t]` and `k_pos[s]` are the
/// absolute positions of each row. Key `s` is visible from query `t` iff
/// `k_pos[s] <= q_pos[t]` (causal) and, with a window `W`,
/// `q_pos[t] - k_pos[s] < W` (exactly `W` positions including the query's
/// own; a key exactly `W` back is masked).
///
/// Query head `h` reads KV head `h / (n_heads / n_kv_heads)` (contiguous
/// groups, as HF `repeat_kv`). Scores `scale · (q · k)`, the softmax and the
/// weighted sum of values are all computed in f64; each output element is
/// rounded to f32 once. A query that sees no key gets an all-zero output.
pub fn attention(
    q: &[f32],
    q_pos: &[usize],
    k: &[f32],
    v: &[f32],
    k_pos: &[usize],
    p: &AttnParams,
    out: &mut [f32],
) {
    let (nq, nkv, hd) = (p.n_heads, p.n_kv_heads, p.head_dim);
    assert!(
        nkv > 0 && nq % nkv == 0,
        "oracle: n_heads {nq} is not a multiple of n_kv_heads {nkv}"
    );
    let (t_len, s_len) = (q_pos.len(), k_pos.len());
    check_len("attention q", q.len(), t_len * nq * hd);
    check_len("attention k", k.len(), s_len * nkv * hd);
    check_len("attention v", v.len(), s_len * nkv * hd);
    check_len("attention out", out.len(), t_len * nq * hd);
    let group = nq / nkv;
    let mut scores = vec![0f64; s_len];
    let mut acc = vec![0f64; hd];
    for (t, &qp) in q_pos.iter().enumerate() {
        for h in 0..nq {
            let kh = h / group;
            let qv = &q[(t * nq + h) * hd..(t * nq + h + 1) * hd];
            let mut max = f64::NEG_INFINITY;
            for (s, &kp) in k_pos.iter().enumerate() {
                let visible = kp <= qp && p.window.is_none_or(|w| qp - kp < w);
                scores[s] = if visible {
                    let kv = &k[(s * nkv + kh) * hd..(s * nkv + kh + 1) * hd];
                    let dot: f64 = qv.iter().zip(kv).map(|(&a, &b)| a as f64 * b as f64).sum();
                    dot * p.scale as f64
                } else {
                    f64::NEG_INFINITY
                };
                max = max.max(scores[s]);
            }
            let o = &mut out[(t * nq + h) * hd..(t * nq + h + 1) * hd];
            if max == f64::NEG_INFINITY {
                o.iter_mut().for_each(|x| *x = 0.0);
                continue;
            }
            let mut denom = 0f64;
            acc.iter_mut().for_each(|a| *a = 0.0);
            for (s, &sc) in scores.iter().enumerate() {
                if sc == f64::NEG_INFINITY {
                    continue;
                }
                let w = (sc - max).exp();
                denom += w;
                let vv = &v[(s * nkv + kh) * hd..(s * nkv + kh + 1) * hd];
                for (a, &x) in acc.iter_mut().zip(vv) {
                    *a += w * x as f64;
                }
            }
            for (x, a) in o.iter_mut().zip(&acc) {
                *x = (a / denom) as f32;
            }
        }
    }
}
