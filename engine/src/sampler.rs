//! Token sampling: greedy, temperature, top-k, top-p, min-p.
//!
//! Filter order (llama.cpp's default chain, minus penalties and the
//! DRY/typical/XTC samplers): **top-k -> top-p -> min-p -> temperature ->
//! softmax -> draw**. top-p and min-p therefore judge the distribution at
//! temperature 1, and the temperature only reshapes what survives them.
//!
//! - `temperature <= 0` is greedy: the largest logit, ties to the lowest id;
//!   no filter runs and the RNG is not touched.
//! - `top_k == 0` disables top-k; `top_p >= 1` disables top-p; `min_p <= 0`
//!   disables min-p. Every filter keeps at least one token.
//! - top-p keeps the smallest prefix of the sorted candidates whose
//!   probability mass reaches `top_p`; min-p keeps the tokens whose
//!   probability is at least `min_p` times the largest one.
//! - Candidates are sorted by logit, descending, ties by ascending id, so the
//!   result depends only on the logits, the config and the seed.
//! - NaN and -inf logits are never drawn; a +inf logit wins outright. When
//!   nothing can be drawn (every logit NaN or -inf) the result is `argmax`
//!   (NaN ignored; id 0 when every logit is NaN).
//! - The RNG is `ChaCha8Rng::seed_from_u64(seed)`: the same seed and the same
//!   logits give the same tokens on every platform.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Sampling parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplerConfig {
    /// 0 (or below) = greedy.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: usize,
    /// 1.0 = off.
    pub top_p: f32,
    /// 0.0 = off.
    pub min_p: f32,
    pub seed: u64,
}

impl SamplerConfig {
    /// Greedy decoding.
    pub fn greedy() -> SamplerConfig {
        SamplerConfig {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 0,
        }
    }
}

impl Default for SamplerConfig {
    /// Greedy.
    fn default() -> Self {
        SamplerConfig::greedy()
    }
}

/// A seeded sampler. Reuses its candidate buffer between calls.
#[derive(Clone, Debug)]
pub struct Sampler {
    cfg: SamplerConfig,
    rng: ChaCha8Rng,
    cand: Vec<(u32, f32)>,
    probs: Vec<f64>,
}

/// Index of the largest logit, ties to the lowest index, NaN never chosen
/// unless every value is NaN (then 0).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best: Option<(usize, f32)> = None;
    for (i, &x) in logits.iter().enumerate() {
        if x.is_nan() {
            continue;
        }
        match best {
            Some((_, b)) if x <= b => {}
            _ => best = Some((i, x)),
        }
    }
    best.map_or(0, |(i, _)| i as u32)
}

/// Sort order of candidates: logit descending, then id ascending.
fn by_logit_desc(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Self {
        Sampler {
            cfg,
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            cand: Vec::new(),
            probs: Vec::new(),
        }
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Restarts the random stream from `seed`.
    pub fn reseed(&mut self, seed: u64) {
        self.cfg.seed = seed;
        self.rng = ChaCha8Rng::seed_from_u64(seed);
    }

    /// Picks the next token id from one row of logits.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.cfg.temperature <= 0.0 || !self.cfg.temperature.is_finite() {
            return argmax(logits);
        }
        self.candidates(logits);
        if self.cand.is_empty() {
            return argmax(logits);
        }
        if self.cand.len() == 1 {
            return self.cand[0].0;
        }
        // Temperature, softmax (f64), draw.
        let inv_t = 1.0 / f64::from(self.cfg.temperature);
        let max = f64::from(self.cand[0].1);
        self.probs.clear();
        let mut total = 0.0f64;
        for &(_, l) in &self.cand {
            let p = ((f64::from(l) - max) * inv_t).exp();
            total += p;
            self.probs.push(p);
        }
        let u: f64 = self.rng.random::<f64>() * total;
        let mut acc = 0.0;
        for (i, &p) in self.probs.iter().enumerate() {
            acc += p;
            if u < acc {
                return self.cand[i].0;
            }
        }
        // Rounding left u at the very top: the last candidate.
        self.cand[self.cand.len() - 1].0
    }

    /// The candidates that survive top-k, top-p and min-p, sorted (logit
    /// descending, id ascending). Exposed for tests and diagnostics.
    pub fn filtered(&mut self, logits: &[f32]) -> Vec<(u32, f32)> {
        self.candidates(logits);
        self.cand.clone()
    }

    fn candidates(&mut self, logits: &[f32]) {
        self.cand.clear();
        self.cand.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, l)| !l.is_nan() && **l != f32::NEG_INFINITY)
                .map(|(i, &l)| (i as u32, l)),
        );
        if self.cand.is_empty() {
            return;
        }
        // +inf logits: only they can be drawn; keep them alone.
        if self.cand.iter().any(|c| c.1 == f32::INFINITY) {
            self.cand.retain(|c| c.1 == f32::INFINITY);
            self.cand.sort_by(by_logit_desc);
            self.cand.truncate(1);
            return;
        }

        // top-k (partial selection first so a large vocab is not fully sorted).
        let k = self.cfg.top_k;
        if k > 0 && k < self.cand.len() {
            self.cand.select_nth_unstable_by(k - 1, by_logit_desc);
            self.cand.truncate(k);
        }
        self.cand.sort_by(by_logit_desc);

        let max = f64::from(self.cand[0].1);
        // top-p over the temperature-1 softmax of the current candidates.
        let top_p = self.cfg.top_p;
        if top_p < 1.0 {
            let total: f64 = self.cand.iter().map(|c| (f64::from(c.1) - max).exp()).sum();
            let target = f64::from(top_p.max(0.0)) * total;
            let mut acc = 0.0;
            let mut keep = self.cand.len();
            for (i, c) in self.cand.iter().enumerate() {
                acc += (f64::from(c.1) - max).exp();
                if acc >= target {
                    keep = i + 1;
                    break;
                }
            }
            self.cand.truncate(keep.max(1));
        }
        // min-p: p_i >= min_p * p_max  <=>  l_i - l_max >= ln(min_p).
        let min_p = self.cfg.min_p;
        if min_p > 0.0 {
            let floor = f64::from(min_p).ln();
            let keep = self
                .cand
                .iter()
                .take_while(|c| f64::from(c.1) - max >= floor)
                .count();
            self.cand.truncate(keep.max(1));
        }
    }
}
