//! The mixture-of-experts FFN block (26B-A4B) on the CPU. On a MoE model it
//! replaces the dense FFN block of every layer; with `h` the residual stream
//! after the attention block:
//!
//! ```text
//! f1 = RMSNorm(down(gelu(gate a1) ⊙ up a1), post_ffw_norm_1)    a1 = RMSNorm(h, ffn_norm)
//! z  = RMSNorm(h) ⊙ ffn_gate_inp.scale · d^-1/2                 (weightless norm of h itself)
//! p  = softmax(ffn_gate_inp · z) over every expert
//! (e_j, w_j), j < k = route(p)                                   (top k, renormalised, × ffn_down_exps.scale)
//! f2 = RMSNorm(Σ_j w_j · down_ej(gelu(gate_ej a2) ⊙ up_ej a2), post_ffw_norm_2)    a2 = RMSNorm(h, pre_ffw_norm_2)
//! h += RMSNorm(f1 + f2, post_ffw_norm)
//! ```
//!
//! The router reads the residual stream itself (a weightless norm of `h`),
//! not the shared MLP's normed input; `d^-1/2` is the f32 constant.
//!
//! Numerics: every matrix product is the CPU matmul (one fused dequant-dot
//! per output, `cpu::matmul`), norms and GELU are `cpu::ops`, the softmax
//! is the oracle's (f64 inside), the routing weights and each token's sum
//! over its experts are f64 rounded once to f32. The tokens routed to one
//! expert go through its matrices together, but a token's result never
//! depends on which other tokens share its experts (the matmul's outputs
//! are batch-independent and a token's expert outputs are summed in its
//! own rank order), so a prefill and single-token decodes agree bit for
//! bit, as on the dense models.

use gemtune_kernels::oracle;
use gemtune_kernels::quant::QuantError;

use super::matmul::matmul;
use super::ops;
use crate::config::{Gemma4Config, MoeConfig};
use crate::model::{ExpertMats, LayerWeights, MatRef, Model, MoeWeights};

/// The floor of the sum the chosen probabilities are divided by
/// (2^-14, llama.cpp's clamp before its division). A softmax's top `k` of
/// `E` sum to at least `k / E`, so the floor only matters past 16384
/// experts per chosen one; it is kept so that the rule is llama.cpp's.
pub const MIN_WEIGHT_SUM: f64 = 6.103_515_625e-5;

/// One expert a token is routed to and the weight of its output in the
/// token's sum (renormalised probability × the expert's scale).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Choice {
    pub expert: usize,
    pub weight: f32,
}

/// Every expert by rank into `order`: the indices of `logits`, highest
/// router logit first; a token's top `k` are `order[..k]`.
///
/// Ranked by logit, not by the f32 softmax probability: the softmax is
/// monotonic, so the experts are the same wherever the probabilities
/// differ, and the logit is what the `moe_route` kernel ranks (it cannot
/// reproduce the CPU's f32 probabilities bit for bit); two distinct logits
/// that round to one f32 probability rank by logit here and there.
///
/// Tie rule: experts of equal logit rank by index, the lower first (so the
/// lower index is chosen when a tie straddles the k-th place), the rule of
/// `kernels::oracle::route_topk`. llama.cpp selects experts with
/// `ggml_top_k`, whose CPU kernel is a `std::partial_sort` of the indices
/// under the strict `p[a] > p[b]` (an unstable `std::sort` in
/// `ggml_argsort` before it): the order of equal values is unspecified
/// there, so no rule can agree with every build on ties. Where llama.cpp's
/// choice is defined this rule chooses the same experts; on ties it is
/// deterministic, independent of batch and thread count, and what a stable
/// sort gives. A NaN logit ranks above every number (`f32::total_cmp`), so
/// it reaches the output instead of being skipped (the kernel skips it: a
/// NaN router logit is a broken model either way, and the reference shows
/// it).
pub fn rank_experts(logits: &[f32], order: &mut Vec<usize>) {
    order.clear();
    order.extend(0..logits.len());
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
}

/// Routes one token: `probs = softmax(logits)` over every expert, the top
/// `out.len()` of them (`rank_experts`, whose tie rule this is), their
/// probabilities divided by their sum (at least `MIN_WEIGHT_SUM`) and
/// multiplied by `expert_scale[e]`, in f64, rounded once. `probs` is
/// scratch of `logits.len()` elements, `order` scratch for the ranking;
/// `out.len()` must not exceed the number of experts.
pub fn route(
    logits: &[f32],
    expert_scale: &[f32],
    probs: &mut [f32],
    order: &mut Vec<usize>,
    out: &mut [Choice],
) {
    debug_assert_eq!(logits.len(), probs.len());
    debug_assert_eq!(logits.len(), expert_scale.len());
    debug_assert!(out.len() <= logits.len());
    oracle::softmax(logits, probs);
    rank_experts(logits, order);
    let top = &order[..out.len()];
    let sum: f64 = top.iter().map(|&e| probs[e] as f64).sum();
    let sum = sum.max(MIN_WEIGHT_SUM);
    for (c, &e) in out.iter_mut().zip(top) {
        *c = Choice {
            expert: e,
            weight: (probs[e] as f64 / sum * expert_scale[e] as f64) as f32,
        };
    }
}

/// Buffers of the MoE block for up to `max_rows` rows, reused by every
/// layer and call.
pub struct MoeScratch {
    d: usize,
    k: usize,
    fe: usize,
    /// Normed inputs (`a1`, then `a2`), `[rows][d]`.
    a: Vec<f32>,
    shared_gate: Vec<f32>,
    shared_up: Vec<f32>,
    /// `f1`, `[rows][d]`.
    shared: Vec<f32>,
    /// The router input `z`, `[rows][d]`.
    z: Vec<f32>,
    /// Router logits, `[rows][E]`.
    logits: Vec<f32>,
    probs: Vec<f32>,
    order: Vec<usize>,
    /// Each row's choices, `[rows][k]`, highest probability first.
    choices: Vec<Choice>,
    /// The (row, rank) pairs routed to the expert being run.
    group: Vec<(usize, usize)>,
    /// Their inputs, gate, up and output rows.
    gx: Vec<f32>,
    gg: Vec<f32>,
    gu: Vec<f32>,
    gy: Vec<f32>,
    /// Every chosen expert's output, `[rows][k][d]`.
    expert_out: Vec<f32>,
    /// `f2`, `[rows][d]`.
    experts: Vec<f32>,
}

impl MoeScratch {
    pub fn new(cfg: &Gemma4Config, moe: &MoeConfig, max_rows: usize) -> MoeScratch {
        let d = cfg.d_model;
        let (e, k, fe) = (moe.n_experts, moe.n_experts_used, moe.expert_ffn_dim);
        let ff = cfg.layers.iter().map(|l| l.ffn_dim).max().unwrap_or(0);
        let r = max_rows.max(1);
        MoeScratch {
            d,
            k,
            fe,
            a: vec![0.0; r * d],
            shared_gate: vec![0.0; r * ff],
            shared_up: vec![0.0; r * ff],
            shared: vec![0.0; r * d],
            z: vec![0.0; r * d],
            logits: vec![0.0; r * e],
            probs: vec![0.0; e],
            order: Vec::with_capacity(e),
            choices: vec![
                Choice {
                    expert: 0,
                    weight: 0.0
                };
                r * k
            ],
            group: Vec::with_capacity(r * k),
            gx: vec![0.0; r * k * d],
            gg: vec![0.0; r * k * fe],
            gu: vec![0.0; r * k * fe],
            gy: vec![0.0; r * k * d],
            expert_out: vec![0.0; r * k * d],
            experts: vec![0.0; r * d],
        }
    }

    /// The choices of row `r` in the last `moe_block` call, highest
    /// probability first.
    pub fn choices(&self, r: usize) -> &[Choice] {
        &self.choices[r * self.k..(r + 1) * self.k]
    }
}

/// The MoE block over `rows` rows of the residual stream `x`
/// (`[rows][d]`, updated in place), for a layer whose weights are `lw`
/// (its `ffn_*` tensors being the shared MLP) and `mw`. `rows` must not
/// exceed the scratch's `max_rows`.
pub fn moe_block(
    m: &Model,
    lw: &LayerWeights,
    mw: &MoeWeights,
    x: &mut [f32],
    rows: usize,
    s: &mut MoeScratch,
) -> Result<(), QuantError> {
    let eps = m.config().rms_eps;
    let d = s.d;
    shared_mlp(m, lw, mw, &x[..rows * d], rows, eps, s)?;
    router(m, mw, &x[..rows * d], rows, eps, s)?;
    experts(m, mw, &x[..rows * d], rows, eps, s)?;
    for r in 0..rows {
        let (f1, f2) = (
            &mut s.shared[r * d..(r + 1) * d],
            &s.experts[r * d..(r + 1) * d],
        );
        for (a, &b) in f1.iter_mut().zip(f2) {
            *a += b;
        }
        ops::add_rms_normed(
            &mut x[r * d..(r + 1) * d],
            &s.shared[r * d..(r + 1) * d],
            &lw.post_ffw_norm,
            eps,
        );
    }
    Ok(())
}

/// `f1`: the dense shared MLP with its own output norm, into `s.shared`.
fn shared_mlp(
    m: &Model,
    lw: &LayerWeights,
    mw: &MoeWeights,
    x: &[f32],
    rows: usize,
    eps: f32,
    s: &mut MoeScratch,
) -> Result<(), QuantError> {
    let d = s.d;
    let ff = lw.ffn_gate.n_out;
    for r in 0..rows {
        ops::rms_norm_into(
            &x[r * d..(r + 1) * d],
            &lw.ffn_norm,
            eps,
            &mut s.a[r * d..(r + 1) * d],
        );
    }
    let a = &s.a[..rows * d];
    mm(m, &lw.ffn_gate, a, rows, &mut s.shared_gate[..rows * ff])?;
    mm(m, &lw.ffn_up, a, rows, &mut s.shared_up[..rows * ff])?;
    ops::gelu_mul(&mut s.shared_gate[..rows * ff], &s.shared_up[..rows * ff]);
    mm(
        m,
        &lw.ffn_down,
        &s.shared_gate[..rows * ff],
        rows,
        &mut s.shared[..rows * d],
    )?;
    for r in 0..rows {
        ops::rms_norm_inplace(
            &mut s.shared[r * d..(r + 1) * d],
            Some(&mw.shared_post_norm),
            eps,
        );
    }
    Ok(())
}

/// The router: `z`, the logits and every row's choices (`route`).
fn router(
    m: &Model,
    mw: &MoeWeights,
    x: &[f32],
    rows: usize,
    eps: f32,
    s: &mut MoeScratch,
) -> Result<(), QuantError> {
    let d = s.d;
    let e = mw.router.n_out;
    let inv_sqrt_d = (1.0f32 / (d as f32).sqrt()) as f64;
    for r in 0..rows {
        let xr = &x[r * d..(r + 1) * d];
        let rms = gemtune_kernels::oracle::rms_inv(xr, eps);
        for ((z, &v), &g) in s.z[r * d..(r + 1) * d]
            .iter_mut()
            .zip(xr)
            .zip(&mw.router_scale)
        {
            *z = (v as f64 * rms * g as f64 * inv_sqrt_d) as f32;
        }
    }
    mm(
        m,
        &mw.router,
        &s.z[..rows * d],
        rows,
        &mut s.logits[..rows * e],
    )?;
    let k = s.k;
    for r in 0..rows {
        route(
            &s.logits[r * e..(r + 1) * e],
            &mw.expert_scale,
            &mut s.probs,
            &mut s.order,
            &mut s.choices[r * k..(r + 1) * k],
        );
    }
    Ok(())
}

/// `f2`: every chosen expert on its tokens (the tokens routed to one
/// expert run through its matrices together), each row's weighted sum in
/// rank order, and the experts' output norm, into `s.experts`.
fn experts(
    m: &Model,
    mw: &MoeWeights,
    x: &[f32],
    rows: usize,
    eps: f32,
    s: &mut MoeScratch,
) -> Result<(), QuantError> {
    let (d, k, fe) = (s.d, s.k, s.fe);
    for r in 0..rows {
        ops::rms_norm_into(
            &x[r * d..(r + 1) * d],
            &mw.experts_pre_norm,
            eps,
            &mut s.a[r * d..(r + 1) * d],
        );
    }
    for e in 0..mw.router.n_out {
        s.group.clear();
        for r in 0..rows {
            for j in 0..k {
                if s.choices[r * k + j].expert == e {
                    s.group.push((r, j));
                }
            }
        }
        let n = s.group.len();
        if n == 0 {
            continue;
        }
        for (i, &(r, _)) in s.group.iter().enumerate() {
            s.gx[i * d..(i + 1) * d].copy_from_slice(&s.a[r * d..(r + 1) * d]);
        }
        let gx = &s.gx[..n * d];
        expert_mm(m, &mw.gate, e, gx, n, &mut s.gg[..n * fe])?;
        expert_mm(m, &mw.up, e, gx, n, &mut s.gu[..n * fe])?;
        ops::gelu_mul(&mut s.gg[..n * fe], &s.gu[..n * fe]);
        expert_mm(m, &mw.down, e, &s.gg[..n * fe], n, &mut s.gy[..n * d])?;
        for (i, &(r, j)) in s.group.iter().enumerate() {
            let at = (r * k + j) * d;
            s.expert_out[at..at + d].copy_from_slice(&s.gy[i * d..(i + 1) * d]);
        }
    }
    for r in 0..rows {
        let out = &mut s.experts[r * d..(r + 1) * d];
        for (i, o) in out.iter_mut().enumerate() {
            let sum: f64 = (0..k)
                .map(|j| {
                    s.choices[r * k + j].weight as f64 * s.expert_out[(r * k + j) * d + i] as f64
                })
                .sum();
            *o = sum as f32;
        }
        ops::rms_norm_inplace(out, Some(&mw.experts_post_norm), eps);
    }
    Ok(())
}

#[inline]
fn mm(m: &Model, w: &MatRef, x: &[f32], rows: usize, out: &mut [f32]) -> Result<(), QuantError> {
    matmul(w.ty, m.mat_bytes(w), w.n_in, w.n_out, x, rows, out)
}

#[inline]
fn expert_mm(
    m: &Model,
    w: &ExpertMats,
    e: usize,
    x: &[f32],
    rows: usize,
    out: &mut [f32],
) -> Result<(), QuantError> {
    matmul(w.ty, m.expert_bytes(w, e), w.n_in, w.n_out, x, rows, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranks(probs: &[f32], k: usize) -> Vec<usize> {
        let mut order = Vec::new();
        rank_experts(probs, &mut order);
        order.truncate(k);
        order
    }

    #[test]
    fn ranking_is_highest_first_with_ties_highest_first_and_ties_to_the_lower_index() {
        assert_eq!(ranks(&[0.1, 0.4, 0.2, 0.3], 2), vec![1, 3]);
        // A tie straddling the k-th place: the lower index is chosen.
        assert_eq!(ranks(&[0.2, 0.3, 0.3, 0.2], 1), vec![1]);
        assert_eq!(ranks(&[0.25, 0.1, 0.25, 0.25, 0.15], 2), vec![0, 2]);
        // All equal: the first k.
        assert_eq!(ranks(&[0.5; 8], 3), vec![0, 1, 2]);
        // NaN ranks first.
        assert_eq!(ranks(&[0.5, f32::NAN, 0.7], 2), vec![1, 2]);
    }
}
