//! The check's inputs and references: the routing with skewed and skipped
//! pairs, each stage's random inputs, the f64 reference of the GEMM stages
//! and the f32 replay of COMBINE.

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::{round_op, Stage};
use crate::families::moe_gemv::{distinct_experts, expert_tensor, ExpertTensor};
use crate::families::{gelu_tanh_f64, random_matrix, rng_for};
use crate::gpu::GpuError;
use crate::problem::{MoeProblem, WType};

pub(super) fn valid_id(e: i32, experts: usize) -> bool {
    e >= 0 && (e as usize) < experts
}

/// The ids the check marks skipped, in turn.
pub(super) const INVALID_IDS: [i32; 4] = [-1, i32::MAX, -7, 0];

/// Each token's `used` distinct experts, drawn with a skew toward the low
/// experts (a quartic pick from the remaining pool), the last expert
/// given to pair 0 alone, about one pair in eleven skipped (ids -1,
/// i32::MAX, -7 or E), and positive weights summing to one per token over
/// all its slots, `[tokens][used]`.
pub(crate) fn gemm_routing(rng: &mut ChaCha8Rng, p: &MoeProblem) -> (Vec<i32>, Vec<f32>) {
    let single = p.experts as i32 - 1;
    // The single-pair expert is kept out of the pools when the others
    // still offer `used` distinct experts.
    let reserve = p.experts > p.used;
    let mut ids = Vec::with_capacity(p.tokens * p.used);
    let mut weights = Vec::with_capacity(p.tokens * p.used);
    for t in 0..p.tokens {
        let mut pool: Vec<i32> = (0..p.experts as i32)
            .filter(|&e| !reserve || e != single)
            .collect();
        for j in 0..p.used {
            let u: f64 = rng.random_range(0.0..1.0);
            let last = pool.len() - 1;
            let pick = j + (u.powi(4) * (pool.len() - j) as f64) as usize;
            pool.swap(j, pick.min(last));
        }
        let mut row = pool[..p.used].to_vec();
        if t == 0 && reserve {
            row[0] = single;
        }
        for (j, id) in row.iter_mut().enumerate() {
            let q = t * p.used + j;
            if q > 0 && (t * 7 + j * 3) % 11 == 5 {
                let bad = INVALID_IDS[q % 4];
                *id = if bad == 0 { p.experts as i32 } else { bad };
            }
        }
        ids.extend_from_slice(&row);
        let w: Vec<f32> = (0..p.used)
            .map(|_| rng.random_range(0.05f32..1.0))
            .collect();
        let s: f32 = w.iter().sum();
        weights.extend(w.iter().map(|v| v / s));
    }
    (ids, weights)
}

/// A check's inputs for one (problem, stage, seed).
pub(crate) struct GemmInputs {
    pub(super) ids: Vec<i32>,
    pub(super) weights: Vec<f32>,
    /// GATE_UP x `[tokens][d]`; DOWN h `[pairs][ffn]`; COMBINE yp
    /// `[pairs][d]`; GROUP empty. Rows of skipped pairs are NaN.
    pub(super) act: Vec<f32>,
    pub(super) tensor: Option<ExpertTensor>,
}

pub(super) fn gemm_inputs(
    p: &MoeProblem,
    stage: Stage,
    wt: Option<WType>,
    seed: u64,
) -> Result<GemmInputs, GpuError> {
    let dims = [
        p.tokens,
        p.d_model,
        p.ffn,
        p.experts,
        p.used,
        wt.map_or(99, |w| w as usize),
        stage as usize,
    ];
    let mut rng = rng_for("moe_gemm", &dims, seed);
    let (ids, weights) = gemm_routing(&mut rng, p);
    let pairs = p.tokens * p.used;
    let nan_skipped = |mut v: Vec<f32>, width: usize| -> Vec<f32> {
        for (q, &e) in ids.iter().enumerate() {
            if !valid_id(e, p.experts) {
                v[q * width..(q + 1) * width].fill(f32::NAN);
            }
        }
        v
    };
    let act = match stage {
        Stage::Group => Vec::new(),
        Stage::GateUp => random_matrix(&mut rng, p.tokens, p.d_model),
        Stage::Down => nan_skipped(random_matrix(&mut rng, pairs, p.ffn), p.ffn),
        Stage::Combine => nan_skipped(random_matrix(&mut rng, pairs, p.d_model), p.d_model),
    };
    let tensor = match wt {
        Some(wt) if stage.is_gemm() => {
            let (rows, k) = stage.matrix(p);
            let chosen = distinct_experts(
                &ids.iter()
                    .map(|&e| if valid_id(e, p.experts) { e } else { -1 })
                    .collect::<Vec<_>>(),
            );
            Some(expert_tensor(
                "moe_gemm", &dims, wt, p.experts, rows, k, &chosen, seed,
            )?)
        }
        _ => None,
    };
    Ok(GemmInputs {
        ids,
        weights,
        act,
        tensor,
    })
}

/// A GEMM stage's output rows of the valid pairs `valid`, in that order:
/// the f64 oracle on the exact weights (`round` None) or the replay with
/// both operands rounded to the operand type (`Some(bf16)`), f64 sums.
pub(super) fn gemm_reference(
    p: &MoeProblem,
    stage: Stage,
    inp: &GemmInputs,
    valid: &[usize],
    round: Option<bool>,
) -> Vec<f64> {
    use rayon::prelude::*;
    let (d, ff, k) = (p.d_model, p.ffn, p.used);
    let r = |v: f32| -> f64 {
        match round {
            Some(b) => round_op(v, b) as f64,
            None => v as f64,
        }
    };
    let dot = |w: &[f32], x: &[f64]| -> f64 { w.iter().zip(x).map(|(&a, &b)| r(a) * b).sum() };
    let Some(tensor) = inp.tensor.as_ref() else {
        return Vec::new();
    };
    valid
        .par_iter()
        .flat_map_iter(|&q| {
            let e = inp.ids[q] as usize;
            let w = &tensor.deq[&e];
            let out: Vec<f64> = match stage {
                Stage::GateUp => {
                    let t = q / k;
                    let x: Vec<f64> = inp.act[t * d..(t + 1) * d].iter().map(|&v| r(v)).collect();
                    (0..ff)
                        .map(|o| {
                            let g = dot(&w[o * d..(o + 1) * d], &x);
                            let u = dot(&w[(ff + o) * d..(ff + o + 1) * d], &x);
                            gelu_tanh_f64(g) * u
                        })
                        .collect()
                }
                _ => {
                    let h: Vec<f64> = inp.act[q * ff..(q + 1) * ff]
                        .iter()
                        .map(|&v| r(v))
                        .collect();
                    (0..d).map(|o| dot(&w[o * ff..(o + 1) * ff], &h)).collect()
                }
            };
            out
        })
        .collect()
}

/// COMBINE's defined arithmetic replayed: per output, `acc = fma(w, v,
/// acc)` from 0 over the valid slots in slot order, in f32.
pub(super) fn combine_replay(yp: &[f32], ids: &[i32], weights: &[f32], p: &MoeProblem) -> Vec<f32> {
    let (d, k) = (p.d_model, p.used);
    let mut y = vec![0f32; p.tokens * d];
    for t in 0..p.tokens {
        for j in 0..k {
            let q = t * k + j;
            if !valid_id(ids[q], p.experts) {
                continue;
            }
            let w = weights[q];
            for (o, &v) in y[t * d..(t + 1) * d]
                .iter_mut()
                .zip(&yp[q * d..(q + 1) * d])
            {
                *o = w.mul_add(v, *o);
            }
        }
    }
    y
}
