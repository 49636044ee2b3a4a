//! The check's inputs and references: each token's distinct experts and
//! weights, the expert tensor with the chosen experts' own weights and a
//! shared decoy elsewhere, the f64 reference of each stage and its replays
//! on the Q8_1 or split activations the dp4a forms make.

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;

use super::Stage;
use crate::families::{
    gelu_tanh_f64, make_weights, q8_1_replay, random_matrix, rng_for, split_q8_replay, QWeights,
};
use crate::gpu::GpuError;
use crate::problem::{MoeProblem, WType};

/// Each token's `used` distinct experts, drawn uniformly, and positive
/// weights summing to one per token, `[tokens][used]`.
pub(crate) fn check_routing(rng: &mut ChaCha8Rng, p: &MoeProblem) -> (Vec<i32>, Vec<f32>) {
    let mut ids = Vec::with_capacity(p.tokens * p.used);
    let mut weights = Vec::with_capacity(p.tokens * p.used);
    for _ in 0..p.tokens {
        let mut pool: Vec<i32> = (0..p.experts as i32).collect();
        for j in 0..p.used {
            let pick = rng.random_range(j..pool.len());
            pool.swap(j, pick);
        }
        ids.extend_from_slice(&pool[..p.used]);
        let w: Vec<f32> = (0..p.used)
            .map(|_| rng.random_range(0.05f32..1.0))
            .collect();
        let s: f32 = w.iter().sum();
        weights.extend(w.iter().map(|v| v / s));
    }
    (ids, weights)
}

/// The distinct experts of `ids` in order of first appearance (the
/// kernel's grouping order).
pub fn distinct_experts(ids: &[i32]) -> Vec<usize> {
    let mut out: Vec<usize> = Vec::new();
    for &e in ids {
        if e >= 0 && !out.contains(&(e as usize)) {
            out.push(e as usize);
        }
    }
    out
}

/// A whole expert tensor of `experts` experts of `rows` x `k` (every
/// buffer of `QWeights` for all of them, `deq` left empty) and the exact
/// values of the chosen experts. Unchosen experts hold the decoy.
pub(crate) struct ExpertTensor {
    pub all: QWeights,
    pub deq: BTreeMap<usize, Vec<f32>>,
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn expert_tensor(
    tag: &str,
    dims: &[usize],
    wt: WType,
    experts: usize,
    rows: usize,
    k: usize,
    chosen: &[usize],
    seed: u64,
) -> Result<ExpertTensor, GpuError> {
    use rayon::prelude::*;
    let gen = |e: usize| -> Result<QWeights, GpuError> {
        let mut d = dims.to_vec();
        d.push(e);
        make_weights(&mut rng_for(tag, &d, seed), wt, rows, k)
    };
    let decoy = gen(usize::MAX)?;
    let own: Vec<(usize, QWeights)> = chosen
        .par_iter()
        .map(|&e| gen(e).map(|w| (e, w)))
        .collect::<Result<_, _>>()?;
    let pick = |e: usize| own.iter().find(|(c, _)| *c == e).map_or(&decoy, |(_, w)| w);
    let cat = |f: &dyn Fn(&QWeights) -> &[u8]| -> Vec<u8> {
        let mut v = Vec::with_capacity(f(&decoy).len() * experts);
        for e in 0..experts {
            v.extend_from_slice(f(pick(e)));
        }
        v
    };
    let mut dplane_f16 = Vec::with_capacity(decoy.dplane_f16.len() * experts);
    for e in 0..experts {
        dplane_f16.extend_from_slice(&pick(e).dplane_f16);
    }
    let all = QWeights {
        gguf: cat(&|w| &w.gguf),
        deq: Vec::new(),
        qplane: cat(&|w| &w.qplane),
        dplane_f16,
        side_gemv: cat(&|w| &w.side_gemv),
        side_gemm: cat(&|w| &w.side_gemm),
    };
    let deq = own.into_iter().map(|(e, w)| (e, w.deq)).collect();
    Ok(ExpertTensor { all, deq })
}

/// A check's inputs for one (problem, stage, seed).
pub(super) struct MoeInputs {
    pub(super) ids: Vec<i32>,
    pub(super) weights: Vec<f32>,
    /// x `[tokens][d]` (GATE_UP) or h `[tokens*used][ffn]` (DOWN).
    pub(super) act: Vec<f32>,
    pub(super) tensor: ExpertTensor,
}

pub(super) fn moe_inputs(
    p: &MoeProblem,
    stage: Stage,
    wt: WType,
    seed: u64,
) -> Result<MoeInputs, GpuError> {
    let (rows, k) = stage.matrix(p);
    let dims = [
        p.tokens,
        p.d_model,
        p.ffn,
        p.experts,
        p.used,
        wt as usize,
        stage as usize,
    ];
    let mut rng = rng_for("moe_gemv", &dims, seed);
    let (ids, weights) = check_routing(&mut rng, p);
    let act = match stage {
        Stage::GateUp => random_matrix(&mut rng, p.tokens, p.d_model),
        Stage::Down => random_matrix(&mut rng, p.tokens * p.used, p.ffn),
    };
    let chosen = distinct_experts(&ids);
    let tensor = expert_tensor("moe_gemv", &dims, wt, p.experts, rows, k, &chosen, seed)?;
    Ok(MoeInputs {
        ids,
        weights,
        act,
        tensor,
    })
}

/// The f64 reference of a stage on its inputs: GATE_UP `h [tokens*used][ffn]`,
/// DOWN `y [tokens][d]`.
pub(super) fn reference(p: &MoeProblem, stage: Stage, inp: &MoeInputs) -> Vec<f64> {
    let act: Vec<f64> = inp.act.iter().map(|&v| v as f64).collect();
    reference_on(p, stage, inp, &act)
}

/// ALGO 1's replay: the stage in f64 on the Q8_1 values of the
/// activations (`q_i * d` of each 32-value block, exact in f64), the
/// values the kernel's integer dot products and per-block scales stand for.
pub(super) fn replay_q8_1(p: &MoeProblem, stage: Stage, inp: &MoeInputs) -> Vec<f64> {
    let (q, ds) = q8_1_replay(&inp.act);
    let act: Vec<f64> = q
        .iter()
        .enumerate()
        .map(|(i, &v)| v as f64 * ds[i / 32][0] as f64)
        .collect();
    reference_on(p, stage, inp, &act)
}

/// ALGO 2's replay: the stage in f64 on the values of the activations'
/// split Q8 records (`d1 q1 + d2 q2` per value).
pub(super) fn replay_split(p: &MoeProblem, stage: Stage, inp: &MoeInputs) -> Vec<f64> {
    reference_on(p, stage, inp, &split_q8_replay(&inp.act))
}

/// A stage in f64 on `act` (in place of the inputs' activations).
pub(super) fn reference_on(p: &MoeProblem, stage: Stage, inp: &MoeInputs, act: &[f64]) -> Vec<f64> {
    use rayon::prelude::*;
    let (d, ff, k) = (p.d_model, p.ffn, p.used);
    let dot =
        |w: &[f32], x: &[f64]| -> f64 { w.iter().zip(x).map(|(&a, &b)| a as f64 * b).sum::<f64>() };
    let deq = |e: i32| -> &[f32] { &inp.tensor.deq[&(e as usize)] };
    match stage {
        Stage::GateUp => (0..p.tokens * k)
            .into_par_iter()
            .flat_map_iter(|pair| {
                let t = pair / k;
                let w = deq(inp.ids[pair]);
                let x = &act[t * d..(t + 1) * d];
                (0..ff)
                    .map(|r| {
                        let g = dot(&w[r * d..(r + 1) * d], x);
                        let u = dot(&w[(ff + r) * d..(ff + r + 1) * d], x);
                        gelu_tanh_f64(g) * u
                    })
                    .collect::<Vec<f64>>()
            })
            .collect(),
        Stage::Down => (0..p.tokens)
            .into_par_iter()
            .flat_map_iter(|t| {
                (0..d)
                    .map(|r| {
                        (0..k)
                            .map(|j| {
                                let pair = t * k + j;
                                let w = deq(inp.ids[pair]);
                                let h = &act[pair * ff..(pair + 1) * ff];
                                inp.weights[pair] as f64 * dot(&w[r * ff..(r + 1) * ff], h)
                            })
                            .sum::<f64>()
                    })
                    .collect::<Vec<f64>>()
            })
            .collect(),
    }
}
