//! Attention of a batch of query rows over one layer's KV cache.
//!
//! Contract (same as `kernels::oracle::attention`): scale 1.0 (Gemma 4's
//! q/k norms replace 1/√hd), no logit softcap, causal `k_pos ≤ q_pos`, and on
//! sliding layers `q_pos − k_pos < W` (exactly W keys including the query's
//! own). GQA: query head `h` reads KV head `h / (n_heads / n_kv_heads)`.
//! Keys are visited in position order whatever slot they sit in, so a result
//! does not depend on how the sequence was cut into batches.
//!
//! Numerics: scores are f32 dots (`ops::dot`); the softmax subtracts the
//! maximum and exponentiates and normalises in f64; the weighted sum of V
//! accumulates in f32. Work is split over (row, head) pairs with rayon.

use std::cell::RefCell;

use rayon::prelude::*;

use super::kv_cache::LayerKv;
use super::ops;

thread_local! {
    static SCORES: RefCell<Vec<f64>> = const { RefCell::new(Vec::new()) };
}

/// `q` is `[rows][n_heads × head_dim]` (normed and roped), `q_pos` the
/// position of each row, `out` the same shape as `q`. Every key position the
/// mask admits must be present in `cache`.
pub fn attend(
    q: &[f32],
    q_pos: &[usize],
    cache: &LayerKv,
    n_heads: usize,
    window: Option<usize>,
    out: &mut [f32],
) {
    let hd = cache.head_dim();
    let nkv = cache.n_kv_heads();
    assert!(
        n_heads % nkv == 0,
        "attend: {n_heads} query heads over {nkv} KV heads"
    );
    let group = n_heads / nkv;
    assert_eq!(
        q.len(),
        q_pos.len() * n_heads * hd,
        "attend: q has the wrong length"
    );
    assert_eq!(out.len(), q.len(), "attend: out has the wrong length");

    out.par_chunks_mut(hd).enumerate().for_each(|(i, o)| {
        let row = i / n_heads;
        let h = i % n_heads;
        let kvh = h / group;
        let p = q_pos[row];
        let lo = match window {
            Some(w) => (p + 1).saturating_sub(w),
            None => 0,
        };
        let qh = &q[i * hd..(i + 1) * hd];
        SCORES.with(|cell| {
            let mut sc = cell.borrow_mut();
            sc.clear();
            let mut max = f64::NEG_INFINITY;
            for kp in lo..=p {
                let slot = cache
                    .slot_of(kp)
                    .unwrap_or_else(|| panic!("attend: position {kp} is not in the KV cache"));
                let (k, _) = cache.kv_head(slot, kvh);
                let s = ops::dot(qh, k) as f64;
                max = max.max(s);
                sc.push(s);
            }
            let mut sum = 0.0f64;
            for s in sc.iter_mut() {
                *s = (*s - max).exp();
                sum += *s;
            }
            o.fill(0.0);
            for (j, kp) in (lo..=p).enumerate() {
                let wgt = (sc[j] / sum) as f32;
                let slot = pos_slot(cache, kp);
                let (_, v) = cache.kv_head(slot, kvh);
                for (a, &b) in o.iter_mut().zip(v) {
                    *a += wgt * b;
                }
            }
        });
    });
}

#[inline]
fn pos_slot(cache: &LayerKv, pos: usize) -> usize {
    cache
        .slot_of(pos)
        .unwrap_or_else(|| panic!("attend: position {pos} is not in the KV cache"))
}
