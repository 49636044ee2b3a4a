//! The mixture-of-experts FFN of a decode step: routing (top-k of the
//! router's softmax, renormalized, per-expert scales) and the weighted sum
//! of the chosen experts' gated FFNs.
//!
//! Selection rule (the contract `moe_route` is held to bit for bit):
//! experts are ranked by their router logit, larger first, and among equal
//! logits the lower expert index ranks first. Ranking by logit is ranking by
//! softmax probability (the softmax is increasing in the logit); ranking
//! the f32 logits rather than the rounded probabilities keeps the rule
//! independent of the exp implementation, whose rounding can give two
//! distinct logits the same probability. Comparisons are IEEE `>` and `==`,
//! so -0.0 and +0.0 tie. Logits must be finite (a NaN never ranks).

use super::{check_len, gelu_tanh, matmul};

/// The smallest sum of the chosen probabilities the weights are divided
/// by (2^-14, the bound llama.cpp clamps it to): only a router whose top-k
/// holds almost no probability reaches it.
pub const ROUTE_MIN_SUM: f64 = 6.103_515_625e-5;

/// Whether (v, i) ranks before (bv, bi) under the selection rule.
fn ranks_before(v: f32, i: usize, bv: f32, bi: usize) -> bool {
    v > bv || (v == bv && i < bi)
}

/// The `k` experts of one token in rank order (see the module rule), from
/// its `logits` over all experts. `k` must not exceed the expert count.
pub fn route_topk(logits: &[f32], k: usize) -> Vec<usize> {
    assert!(
        k <= logits.len(),
        "oracle: route_topk k = {k} exceeds {} experts",
        logits.len()
    );
    let mut taken = vec![false; logits.len()];
    let mut out = Vec::with_capacity(k);
    for _ in 0..k {
        let mut best: Option<usize> = None;
        for (i, &v) in logits.iter().enumerate() {
            if taken[i] || v.is_nan() {
                continue;
            }
            if best.is_none_or(|b| ranks_before(v, i, logits[b], b)) {
                best = Some(i);
            }
        }
        match best {
            Some(b) => {
                taken[b] = true;
                out.push(b);
            }
            None => break,
        }
    }
    out
}

/// The routing weights of the chosen experts `ids` of one token, in f64:
/// `p = softmax(logits)` over every expert, `w_j = p[ids[j]] /
/// max(sum_j p[ids[j]], ROUTE_MIN_SUM) * scale[ids[j]]` (`scale` empty: 1).
pub fn route_weights(logits: &[f32], ids: &[usize], scale: &[f32]) -> Vec<f64> {
    let max = logits
        .iter()
        .fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
    let denom: f64 = logits.iter().map(|&v| (v as f64 - max).exp()).sum();
    let p: Vec<f64> = ids
        .iter()
        .map(|&e| (logits[e] as f64 - max).exp() / denom)
        .collect();
    let sum = p.iter().sum::<f64>().max(ROUTE_MIN_SUM);
    p.iter()
        .zip(ids)
        .map(|(pj, &e)| pj / sum * scale.get(e).map_or(1.0, |&s| s as f64))
        .collect()
}

/// A routing decision for `tokens` tokens: router logits `[tokens][experts]`,
/// chosen experts and their weights `[tokens][k]`, in rank order.
#[derive(Clone, Debug, PartialEq)]
pub struct Routing {
    pub logits: Vec<f32>,
    pub ids: Vec<usize>,
    pub weights: Vec<f32>,
}

/// The router of `tokens` tokens: `logits = router · z` (router `[experts][d]`,
/// z `[tokens][d]`, f64 dots rounded to f32), then `route_topk` and
/// `route_weights` per token (weights rounded to f32). `scale` is the
/// per-expert scale (`[experts]`, or empty for none).
pub fn route(
    router: &[f32],
    z: &[f32],
    scale: &[f32],
    tokens: usize,
    d: usize,
    experts: usize,
    k: usize,
) -> Routing {
    check_len("route router", router.len(), experts * d);
    check_len("route z", z.len(), tokens * d);
    if !scale.is_empty() {
        check_len("route scale", scale.len(), experts);
    }
    let mut logits = vec![0f32; tokens * experts];
    matmul(router, z, tokens, experts, d, &mut logits);
    let mut ids = Vec::with_capacity(tokens * k);
    let mut weights = Vec::with_capacity(tokens * k);
    for row in logits.chunks_exact(experts) {
        let sel = route_topk(row, k);
        weights.extend(route_weights(row, &sel, scale).iter().map(|&w| w as f32));
        ids.extend(sel);
    }
    Routing {
        logits,
        ids,
        weights,
    }
}

/// The expert half of the MoE FFN for `tokens` tokens, each with `k` chosen
/// experts (`ids`, `weights`: `[tokens][k]`):
/// `out[t] = sum_j weights[t][j] * down_e · (gelu(gate_e · x_t) ⊙ (up_e · x_t))`
/// with `e = ids[t][j]`. `gate_up` is `[experts][2*ff][d]` (expert e's rows
/// `0..ff` its gate, `ff..2ff` its up), `down` is `[experts][d][ff]`, both
/// dequantized; `x` is `[tokens][d]`, `out` `[tokens][d]`. Each matmul is an
/// oracle op (f64 dots, f32 results, as `gated_ffn`); the gated product is
/// rounded to f32 and the weighted sum over experts runs in f64.
#[allow(clippy::too_many_arguments)]
pub fn moe_ffn(
    x: &[f32],
    gate_up: &[f32],
    down: &[f32],
    ids: &[usize],
    weights: &[f32],
    tokens: usize,
    d: usize,
    ff: usize,
    k: usize,
    out: &mut [f32],
) {
    check_len("moe_ffn x", x.len(), tokens * d);
    check_len("moe_ffn ids", ids.len(), tokens * k);
    check_len("moe_ffn weights", weights.len(), tokens * k);
    check_len("moe_ffn out", out.len(), tokens * d);
    assert!(
        gate_up.len() % (2 * ff * d) == 0 && down.len() == gate_up.len() / 2,
        "oracle: moe_ffn gate_up ({}) and down ({}) are not [E][2*{ff}][{d}] and [E][{d}][{ff}]",
        gate_up.len(),
        down.len()
    );
    let experts = gate_up.len() / (2 * ff * d);
    for t in 0..tokens {
        let xt = &x[t * d..(t + 1) * d];
        let mut acc = vec![0f64; d];
        for j in 0..k {
            let e = ids[t * k + j];
            assert!(e < experts, "oracle: moe_ffn expert {e} of {experts}");
            let h = expert_hidden(&gate_up[e * 2 * ff * d..(e + 1) * 2 * ff * d], xt, d, ff);
            let mut y = vec![0f32; d];
            matmul(&down[e * d * ff..(e + 1) * d * ff], &h, 1, d, ff, &mut y);
            let w = weights[t * k + j] as f64;
            for (a, &v) in acc.iter_mut().zip(&y) {
                *a += w * v as f64;
            }
        }
        for (o, a) in out[t * d..(t + 1) * d].iter_mut().zip(&acc) {
            *o = *a as f32;
        }
    }
}

/// One expert's gated hidden vector `gelu(gate · x) ⊙ (up · x)` (`[ff]`,
/// f32), from its `[2*ff][d]` gate_up rows.
pub fn expert_hidden(gate_up: &[f32], x: &[f32], d: usize, ff: usize) -> Vec<f32> {
    check_len("expert_hidden gate_up", gate_up.len(), 2 * ff * d);
    check_len("expert_hidden x", x.len(), d);
    let mut gu = vec![0f32; 2 * ff];
    matmul(gate_up, x, 1, 2 * ff, d, &mut gu);
    (0..ff)
        .map(|r| (gelu_tanh(gu[r]) as f64 * gu[ff + r] as f64) as f32)
        .collect()
}

/// The grouping of a prefill chunk's (token, slot) pairs by expert
/// (`moe_gemm`'s GROUP stage): `ids` is `[tokens][k]`; an id outside
/// `0..experts` marks a skipped pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MoeGrouping {
    /// Pairs per expert, `[experts]`.
    pub counts: Vec<i32>,
    /// Exclusive prefix of `counts`, then the valid pair count, `[experts + 1]`.
    pub offsets: Vec<i32>,
    /// The valid pairs `t*k + j` grouped by expert, ascending inside a
    /// group (the kernel's order inside a group is free).
    pub sorted: Vec<i32>,
    /// Per tile (expert, first sorted row): each expert's rows cut into
    /// `ceil(count / bm)` tiles of `bm`, experts in order, then `(-1, 0)` up
    /// to `ceil(pairs / bm) + experts` entries.
    pub tiles: Vec<[i32; 2]>,
}

/// `MoeGrouping` of `ids` over `experts` experts with `bm` rows per tile.
pub fn group_by_expert(ids: &[i32], experts: usize, bm: usize) -> MoeGrouping {
    assert!(bm > 0, "oracle: group_by_expert bm = 0");
    let valid = |e: i32| e >= 0 && (e as usize) < experts;
    let mut counts = vec![0i32; experts];
    for &e in ids {
        if valid(e) {
            counts[e as usize] += 1;
        }
    }
    let mut offsets = Vec::with_capacity(experts + 1);
    let mut acc = 0i32;
    for &c in &counts {
        offsets.push(acc);
        acc += c;
    }
    offsets.push(acc);
    let mut sorted = vec![0i32; acc as usize];
    let mut cur: Vec<i32> = offsets[..experts].to_vec();
    for (p, &e) in ids.iter().enumerate() {
        if valid(e) {
            sorted[cur[e as usize] as usize] = p as i32;
            cur[e as usize] += 1;
        }
    }
    let max_tiles = ids.len().div_ceil(bm) + experts;
    let mut tiles = Vec::with_capacity(max_tiles);
    for e in 0..experts {
        let mut s = 0;
        while s < counts[e] {
            tiles.push([e as i32, offsets[e] + s]);
            s += bm as i32;
        }
    }
    tiles.resize(max_tiles, [-1, 0]);
    MoeGrouping {
        counts,
        offsets,
        sorted,
        tiles,
    }
}

/// The weighted sum of each token's expert outputs (`moe_gemm`'s COMBINE):
/// `out[t][r] = sum_j weights[t][j] * yp[t*k + j][r]` over the slots whose
/// id is in `0..experts`, in f64 (`yp` `[tokens*k][d]`; rows of skipped
/// pairs are not read).
#[allow(clippy::too_many_arguments)]
pub fn combine_experts(
    yp: &[f32],
    ids: &[i32],
    weights: &[f32],
    tokens: usize,
    d: usize,
    experts: usize,
    k: usize,
) -> Vec<f64> {
    check_len("combine_experts yp", yp.len(), tokens * k * d);
    check_len("combine_experts ids", ids.len(), tokens * k);
    check_len("combine_experts weights", weights.len(), tokens * k);
    let mut out = vec![0f64; tokens * d];
    for t in 0..tokens {
        for j in 0..k {
            let p = t * k + j;
            if ids[p] < 0 || ids[p] as usize >= experts {
                continue;
            }
            let w = weights[p] as f64;
            for (o, &v) in out[t * d..(t + 1) * d]
                .iter_mut()
                .zip(&yp[p * d..(p + 1) * d])
            {
                *o += w * v as f64;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Independent f64 arithmetic: dot products, tanh-GELU and softmax
    /// written out here, not through the oracle ops.
    fn dot(a: &[f32], b: &[f32]) -> f64 {
        a.iter().zip(b).map(|(&p, &q)| p as f64 * q as f64).sum()
    }
    fn gelu(x: f64) -> f64 {
        0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
    }

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    #[test]
    fn ties_rank_the_lower_expert_first() {
        // Experts 1, 4 and 6 tie at the top, 0 and 3 tie below them.
        let l = [2.0f32, 5.0, -1.0, 2.0, 5.0, 0.5, 5.0, 1.0];
        assert_eq!(route_topk(&l, 2), vec![1, 4]);
        assert_eq!(route_topk(&l, 3), vec![1, 4, 6]);
        assert_eq!(route_topk(&l, 5), vec![1, 4, 6, 0, 3]);
        assert_eq!(route_topk(&l, 8), vec![1, 4, 6, 0, 3, 7, 5, 2]);
        // Signed zeros tie; the lower index wins.
        assert_eq!(route_topk(&[0.0, -0.0, -1.0], 2), vec![0, 1]);
        assert_eq!(route_topk(&[-0.0, 0.0, -1.0], 1), vec![0]);
        // A one-ulp difference is not a tie.
        let up = f32::from_bits(1.0f32.to_bits() + 1);
        assert_eq!(route_topk(&[1.0, up, 1.0], 2), vec![1, 0]);
        // NaN never ranks.
        assert_eq!(route_topk(&[f32::NAN, -3.0, -2.0], 2), vec![2, 1]);
    }

    #[test]
    fn ties_agree_with_a_stable_sort() {
        // The rule is a stable sort by descending logit: check it on many
        // random rows with few distinct values (many ties).
        let mut s = 7u64;
        for _ in 0..200 {
            let l: Vec<f32> = (0..16).map(|_| (lcg(&mut s) * 3.0).round()).collect();
            let mut order: Vec<usize> = (0..16).collect();
            order.sort_by(|&a, &b| l[b].partial_cmp(&l[a]).expect("finite"));
            for k in [1, 2, 8, 16] {
                assert_eq!(route_topk(&l, k), order[..k].to_vec(), "{l:?} k={k}");
            }
        }
    }

    #[test]
    fn weights_match_the_definition() {
        let l = [1.0f32, 3.0, 2.0, -4.0, 3.0];
        let ids = route_topk(&l, 3);
        assert_eq!(ids, vec![1, 4, 2]);
        let scale = [1.0f32, 0.5, 2.0, 1.0, 3.0];
        let w = route_weights(&l, &ids, &scale);
        // Renormalizing over the chosen cancels the softmax denominator.
        let e: Vec<f64> = ids.iter().map(|&i| (l[i] as f64).exp()).collect();
        let s: f64 = e.iter().sum();
        for j in 0..3 {
            let want = e[j] / s * scale[ids[j]] as f64;
            assert!((w[j] - want).abs() < 1e-15, "{j}: {} vs {want}", w[j]);
        }
        // No scale: the weights sum to one.
        let w1 = route_weights(&l, &ids, &[]);
        assert!((w1.iter().sum::<f64>() - 1.0).abs() < 1e-15);
        // The clamp: one chosen expert of 2^20 equal ones holds 2^-20 of
        // the probability, below 2^-14, so its weight is 2^-6, not 1.
        let flat = vec![0.0f32; 1 << 20];
        let w = route_weights(&flat, &[5], &[]);
        assert!((w[0] - 1.0 / 64.0).abs() < 1e-12, "{}", w[0]);
    }

    #[test]
    fn route_and_moe_ffn_match_an_f64_reference() {
        let (tokens, d, ff, experts, k) = (3usize, 64usize, 32usize, 6usize, 2usize);
        let mut s = 11u64;
        let mut r = |n: usize| -> Vec<f32> { (0..n).map(|_| lcg(&mut s)).collect() };
        let router = r(experts * d);
        let z = r(tokens * d);
        let x = r(tokens * d);
        let gate_up = r(experts * 2 * ff * d);
        let down = r(experts * d * ff);
        let scale: Vec<f32> = (0..experts).map(|e| 0.5 + e as f32 * 0.25).collect();
        let rt = route(&router, &z, &scale, tokens, d, experts, k);
        for t in 0..tokens {
            let lf: Vec<f64> = (0..experts)
                .map(|e| dot(&router[e * d..(e + 1) * d], &z[t * d..(t + 1) * d]))
                .collect();
            for (got, want) in rt.logits[t * experts..(t + 1) * experts].iter().zip(&lf) {
                assert_eq!(*got, *want as f32);
            }
            // Random logits have no ties: a plain sort gives the ranking.
            let mut order: Vec<usize> = (0..experts).collect();
            order.sort_by(|&a, &b| lf[b].partial_cmp(&lf[a]).expect("finite"));
            assert_eq!(&rt.ids[t * k..(t + 1) * k], &order[..k]);
            let m = lf.iter().cloned().fold(f64::MIN, f64::max);
            let den: f64 = lf.iter().map(|v| (v - m).exp()).sum();
            let p: Vec<f64> = order[..k]
                .iter()
                .map(|&e| (lf[e] - m).exp() / den)
                .collect();
            let ps: f64 = p.iter().sum();
            for j in 0..k {
                let want = p[j] / ps * scale[order[j]] as f64;
                let got = rt.weights[t * k + j] as f64;
                assert!((got - want).abs() <= 1e-6 * want.abs(), "{got} vs {want}");
            }
        }
        let mut out = vec![0f32; tokens * d];
        moe_ffn(
            &x,
            &gate_up,
            &down,
            &rt.ids,
            &rt.weights,
            tokens,
            d,
            ff,
            k,
            &mut out,
        );
        let (mut e2, mut r2) = (0f64, 0f64);
        for t in 0..tokens {
            let xt = &x[t * d..(t + 1) * d];
            let mut want = vec![0f64; d];
            for j in 0..k {
                let e = rt.ids[t * k + j];
                let gu = &gate_up[e * 2 * ff * d..];
                let h: Vec<f64> = (0..ff)
                    .map(|i| {
                        gelu(dot(&gu[i * d..(i + 1) * d], xt))
                            * dot(&gu[(ff + i) * d..(ff + i + 1) * d], xt)
                    })
                    .collect();
                for (o, w) in want.iter_mut().enumerate() {
                    let row = &down[(e * d + o) * ff..(e * d + o + 1) * ff];
                    let y: f64 = row.iter().zip(&h).map(|(&a, &b)| a as f64 * b).sum();
                    *w += rt.weights[t * k + j] as f64 * y;
                }
            }
            for o in 0..d {
                let diff = out[t * d + o] as f64 - want[o];
                e2 += diff * diff;
                r2 += want[o] * want[o];
            }
        }
        // f32 rounding of the two intermediate stages only.
        assert!((e2 / r2).sqrt() < 1e-6, "rms_rel {}", (e2 / r2).sqrt());
    }

    #[test]
    fn grouping_counts_orders_and_tiles() {
        // 4 tokens x 3 slots over 5 experts; -1 and 5 are skipped pairs.
        let ids = [
            2, 0, 4, //
            2, -1, 0, //
            2, 0, 5, //
            2, 1, 0,
        ];
        let g = group_by_expert(&ids, 5, 2);
        assert_eq!(g.counts, vec![4, 1, 4, 0, 1]);
        assert_eq!(g.offsets, vec![0, 4, 5, 9, 9, 10]);
        assert_eq!(g.sorted, vec![1, 5, 7, 11, 10, 0, 3, 6, 9, 2]);
        // Expert 0: 2 tiles, 1: 1, 2: 2, 3: none, 4: 1; then 6 + 5 - 6 empty.
        let want: Vec<[i32; 2]> = vec![[0, 0], [0, 2], [1, 4], [2, 5], [2, 7], [4, 9]];
        assert_eq!(&g.tiles[..6], &want[..]);
        assert_eq!(g.tiles.len(), 12usize.div_ceil(2) + 5);
        assert!(g.tiles[6..].iter().all(|&t| t == [-1, 0]));
        // bm larger than every group: one tile per non-empty expert.
        let g = group_by_expert(&ids, 5, 64);
        assert_eq!(g.tiles[..4], [[0, 0], [1, 4], [2, 5], [4, 9]]);
    }

    #[test]
    fn combine_skips_invalid_slots_and_weights_the_rest() {
        let (tokens, d, k) = (2usize, 3usize, 2usize);
        let yp: Vec<f32> = (0..tokens * k * d).map(|i| i as f32).collect();
        let mut yp_nan = yp.clone();
        // Pair 1 (token 0, slot 1) is skipped: its row is never read.
        for v in &mut yp_nan[d..2 * d] {
            *v = f32::NAN;
        }
        let out = combine_experts(
            &yp_nan,
            &[0, -1, 3, 1],
            &[0.5, 9.0, 0.25, 2.0],
            tokens,
            d,
            4,
            k,
        );
        assert_eq!(out[..3], [0.0, 0.5, 1.0]);
        // Token 1: 0.25 * [6, 7, 8] + 2 * [9, 10, 11].
        assert_eq!(out[3..], [19.5, 21.75, 24.0]);
    }
}
