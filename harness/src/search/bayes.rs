//! Bayesian optimization with a Gaussian process over the space's feature
//! vectors (`Space::features`), acquiring by expected improvement.
//!
//! Why this model: a space is a few dozen to a few hundred points, so the
//! acquisition can be evaluated on every unevaluated point exactly (no
//! inner optimizer), and a GP with a few hundred observations costs
//! milliseconds, nothing next to compiling and timing one kernel. Times of
//! kernel variants span orders of magnitude and their differences are
//! multiplicative, so the model is fit to the log of the objective,
//! standardized. Hyperparameters (one length scale, the noise) are chosen
//! on a small grid by the marginal likelihood at every step; the grid
//! includes a large noise so a noisy objective is smoothed rather than
//! interpolated.
//!
//! The first `initial` points are a space-filling design: a random point,
//! then each time the open point farthest from every evaluated one.
//! Failed evaluations are modelled at the worst value seen, which steers
//! the search away from regions that do not compile or pass.

use super::{evaluated, Space, Strategy, Trial};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub struct Bayes {
    rng: ChaCha8Rng,
    /// Size of the initial design; 0 chooses from the space (about half
    /// the square root of its size, 2..8).
    pub initial: usize,
    /// Expected-improvement margin, in standardized log units.
    pub xi: f64,
}

impl Bayes {
    pub fn new(seed: u64) -> Bayes {
        Bayes {
            rng: ChaCha8Rng::seed_from_u64(seed),
            initial: 0,
            xi: 0.01,
        }
    }

    fn initial_for(&self, space: &Space) -> usize {
        if self.initial > 0 {
            self.initial
        } else {
            ((space.len() as f64).sqrt() / 2.0).ceil().clamp(2.0, 8.0) as usize
        }
    }

    /// The open point farthest from every evaluated point (ties: a random
    /// one); a random open point when nothing is evaluated.
    fn maximin(&mut self, space: &Space, history: &[Trial], open: &[usize]) -> usize {
        if history.is_empty() {
            return open[self.rng.random_range(0..open.len())];
        }
        let mut best: Vec<usize> = Vec::new();
        let mut best_d = f64::NEG_INFINITY;
        for &p in open {
            let d = history
                .iter()
                .map(|t| sq_dist(space.features(p), space.features(t.point)))
                .fold(f64::INFINITY, f64::min);
            if d > best_d + 1e-12 {
                best_d = d;
                best.clear();
                best.push(p);
            } else if d >= best_d - 1e-12 {
                best.push(p);
            }
        }
        best[self.rng.random_range(0..best.len())]
    }
}

impl Strategy for Bayes {
    fn next(&mut self, space: &Space, history: &[Trial]) -> Option<usize> {
        let done = evaluated(space, history);
        let open: Vec<usize> = (0..space.len()).filter(|&p| !done[p]).collect();
        if open.is_empty() {
            return None;
        }
        let logs: Vec<Option<f64>> = history
            .iter()
            .map(|t| t.value.filter(|v| v.is_finite() && *v > 0.0).map(f64::ln))
            .collect();
        let measured = logs.iter().filter(|v| v.is_some()).count();
        if history.len() < self.initial_for(space) || measured < 2 {
            return Some(self.maximin(space, history, &open));
        }
        let worst = logs
            .iter()
            .flatten()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max);
        let y: Vec<f64> = logs.iter().map(|v| v.unwrap_or(worst)).collect();
        let x: Vec<&[f64]> = history.iter().map(|t| space.features(t.point)).collect();
        let gp = Gp::fit(&x, &y);
        let Some(gp) = gp else {
            return Some(self.maximin(space, history, &open));
        };
        let best = gp.y.iter().copied().fold(f64::INFINITY, f64::min);
        let mut pick = open[0];
        let mut pick_ei = f64::NEG_INFINITY;
        for &p in &open {
            let (mu, var) = gp.predict(space.features(p));
            let ei = expected_improvement(best - self.xi, mu, var.sqrt());
            if ei > pick_ei {
                pick_ei = ei;
                pick = p;
            }
        }
        Some(pick)
    }
}

fn sq_dist(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum()
}

/// Matern 5/2 correlation at distance `r` with length scale `l`.
fn matern52(r: f64, l: f64) -> f64 {
    let s = 5f64.sqrt() * r / l;
    (1.0 + s + s * s / 3.0) * (-s).exp()
}

/// A fitted GP on standardized targets (zero mean, unit signal variance).
struct Gp {
    x: Vec<Vec<f64>>,
    /// Standardized targets.
    y: Vec<f64>,
    length: f64,
    /// Lower Cholesky factor of K + noise I, row-major n x n.
    chol: Vec<f64>,
    alpha: Vec<f64>,
}

impl Gp {
    /// Fits every (length scale, noise) of the grid and keeps the one of
    /// highest marginal likelihood; None if no fit is numerically possible.
    fn fit(x: &[&[f64]], y_raw: &[f64]) -> Option<Gp> {
        let n = y_raw.len();
        let mean = y_raw.iter().sum::<f64>() / n as f64;
        let var = y_raw.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n as f64;
        let sd = if var > 1e-24 { var.sqrt() } else { 1.0 };
        let y: Vec<f64> = y_raw.iter().map(|v| (v - mean) / sd).collect();
        let dims = x.first().map_or(1, |f| f.len()).max(1) as f64;
        let x: Vec<Vec<f64>> = x.iter().map(|f| f.to_vec()).collect();
        let mut dist = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..i {
                let d = sq_dist(&x[i], &x[j]).sqrt();
                dist[i * n + j] = d;
                dist[j * n + i] = d;
            }
        }
        let mut best: Option<(f64, Gp)> = None;
        for scale in [0.05, 0.1, 0.2, 0.4, 0.8, 1.6] {
            let length = scale * dims.sqrt();
            for noise in [1e-6, 1e-3, 1e-2, 1e-1] {
                let mut k = vec![0.0; n * n];
                for i in 0..n {
                    for j in 0..=i {
                        let v = matern52(dist[i * n + j], length);
                        k[i * n + j] = v;
                        k[j * n + i] = v;
                    }
                    k[i * n + i] += noise;
                }
                let Some(chol) = cholesky(&k, n) else {
                    continue;
                };
                let alpha = solve_upper_t(&chol, n, &solve_lower(&chol, n, &y));
                let fit: f64 = y.iter().zip(&alpha).map(|(a, b)| a * b).sum();
                let logdet: f64 = (0..n).map(|i| chol[i * n + i].ln()).sum();
                let lml = -0.5 * fit - logdet;
                if best.as_ref().is_none_or(|(b, _)| lml > *b) {
                    best = Some((
                        lml,
                        Gp {
                            x: x.clone(),
                            y: y.clone(),
                            length,
                            chol,
                            alpha,
                        },
                    ));
                }
            }
        }
        best.map(|(_, g)| g)
    }

    /// Posterior mean and variance of the latent function at `f`.
    fn predict(&self, f: &[f64]) -> (f64, f64) {
        let n = self.y.len();
        let ks: Vec<f64> = self
            .x
            .iter()
            .map(|xi| matern52(sq_dist(xi, f).sqrt(), self.length))
            .collect();
        let mu = ks.iter().zip(&self.alpha).map(|(a, b)| a * b).sum();
        let v = solve_lower(&self.chol, n, &ks);
        let var = (1.0 - v.iter().map(|a| a * a).sum::<f64>()).max(1e-12);
        (mu, var)
    }
}

/// Lower Cholesky factor of a symmetric positive definite n x n matrix.
fn cholesky(a: &[f64], n: usize) -> Option<Vec<f64>> {
    let mut l = vec![0.0; n * n];
    for i in 0..n {
        for j in 0..=i {
            let s: f64 = (0..j).map(|k| l[i * n + k] * l[j * n + k]).sum();
            if i == j {
                let d = a[i * n + i] - s;
                if d <= 0.0 || !d.is_finite() {
                    return None;
                }
                l[i * n + i] = d.sqrt();
            } else {
                l[i * n + j] = (a[i * n + j] - s) / l[j * n + j];
            }
        }
    }
    Some(l)
}

/// Solves L z = b.
fn solve_lower(l: &[f64], n: usize, b: &[f64]) -> Vec<f64> {
    let mut z = vec![0.0; n];
    for i in 0..n {
        let s: f64 = (0..i).map(|k| l[i * n + k] * z[k]).sum();
        z[i] = (b[i] - s) / l[i * n + i];
    }
    z
}

/// Solves L^T z = b.
fn solve_upper_t(l: &[f64], n: usize, b: &[f64]) -> Vec<f64> {
    let mut z = vec![0.0; n];
    for i in (0..n).rev() {
        let s: f64 = (i + 1..n).map(|k| l[k * n + i] * z[k]).sum();
        z[i] = (b[i] - s) / l[i * n + i];
    }
    z
}

/// Expected improvement below `target` of a normal(mu, sd) value.
pub(crate) fn expected_improvement(target: f64, mu: f64, sd: f64) -> f64 {
    let imp = target - mu;
    if sd <= 1e-12 {
        return imp.max(0.0);
    }
    let z = imp / sd;
    imp * normal_cdf(z) + sd * normal_pdf(z)
}

fn normal_pdf(z: f64) -> f64 {
    (-0.5 * z * z).exp() / (2.0 * std::f64::consts::PI).sqrt()
}

fn normal_cdf(z: f64) -> f64 {
    0.5 * erfc(-z / std::f64::consts::SQRT_2)
}

/// Complementary error function, relative error below 1.2e-7 everywhere
/// (the Chebyshev fit of Numerical Recipes' `erfcc`).
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let r = t * poly.exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erfc_matches_known_values() {
        // erfc(0) = 1, erfc(1) = 0.157299207..., erfc(-1) = 1.842700792...
        assert!((erfc(0.0) - 1.0).abs() < 1e-7);
        assert!((erfc(1.0) - 0.157_299_207).abs() < 1e-7);
        assert!((erfc(-1.0) - 1.842_700_793).abs() < 1e-7);
        assert!((normal_cdf(1.959_964) - 0.975).abs() < 1e-6);
    }

    #[test]
    fn cholesky_solves_a_known_system() {
        // A = [[4, 2], [2, 3]], b = [2, 1] -> x = [0.5, 0].
        let a = [4.0, 2.0, 2.0, 3.0];
        let l = cholesky(&a, 2).expect("positive definite");
        let x = solve_upper_t(&l, 2, &solve_lower(&l, 2, &[2.0, 1.0]));
        assert!((x[0] - 0.5).abs() < 1e-12 && x[1].abs() < 1e-12, "{x:?}");
        assert!(cholesky(&[1.0, 2.0, 2.0, 1.0], 2).is_none());
    }

    #[test]
    fn gp_interpolates_and_is_uncertain_away_from_data() {
        let pts: Vec<Vec<f64>> = (0..6).map(|i| vec![i as f64 / 5.0]).collect();
        let x: Vec<&[f64]> = pts.iter().map(Vec::as_slice).collect();
        let y: Vec<f64> = pts.iter().map(|p| (3.0 * p[0]).sin()).collect();
        let gp = Gp::fit(&x, &y).expect("fit");
        let (mu_at, var_at) = gp.predict(&[0.4]);
        let (_, var_far) = gp.predict(&[3.0]);
        // Standardized: compare against the standardized target.
        let mean = y.iter().sum::<f64>() / 6.0;
        let sd = (y.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 6.0).sqrt();
        assert!((mu_at - (y[2] - mean) / sd).abs() < 0.1, "{mu_at}");
        assert!(var_at < 0.05 && var_far > 0.5, "{var_at} {var_far}");
    }

    #[test]
    fn expected_improvement_grows_with_mean_gain_and_uncertainty() {
        assert!(expected_improvement(0.0, -1.0, 0.1) > expected_improvement(0.0, -0.5, 0.1));
        assert!(expected_improvement(0.0, 0.5, 1.0) > expected_improvement(0.0, 0.5, 0.1));
        assert_eq!(expected_improvement(0.0, 1.0, 0.0), 0.0);
    }
}
