//! Statistics over timing samples: quantiles, and a percentile-bootstrap
//! confidence interval of the median with a seeded generator (the same
//! samples and seed always give the same interval).

use rand::Rng;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// Quantile `q` in [0, 1] of sorted data by linear interpolation between
/// closest ranks (the "type 7" rule of R and NumPy). NaN for empty input.
pub fn quantile_sorted(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let q = q.clamp(0.0, 1.0);
    let h = (sorted.len() - 1) as f64 * q;
    let lo = h.floor() as usize;
    let hi = h.ceil() as usize;
    sorted[lo] + (h - lo as f64) * (sorted[hi] - sorted[lo])
}

pub fn sorted(samples: &[f64]) -> Vec<f64> {
    let mut s: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
    s.sort_by(f64::total_cmp);
    s
}

pub fn median(samples: &[f64]) -> f64 {
    quantile_sorted(&sorted(samples), 0.5)
}

/// Percentile-bootstrap interval of the median at `level` (e.g. 0.95) from
/// `resamples` resamples drawn with `ChaCha8Rng::seed_from_u64(seed)`.
pub fn bootstrap_median_ci(samples: &[f64], level: f64, resamples: usize, seed: u64) -> (f64, f64) {
    let s = sorted(samples);
    if s.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    if s.len() == 1 {
        return (s[0], s[0]);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut meds = Vec::with_capacity(resamples.max(1));
    let mut buf = vec![0.0; s.len()];
    for _ in 0..resamples.max(1) {
        for b in buf.iter_mut() {
            *b = s[rng.random_range(0..s.len())];
        }
        buf.sort_by(f64::total_cmp);
        meds.push(quantile_sorted(&buf, 0.5));
    }
    meds.sort_by(f64::total_cmp);
    let a = (1.0 - level.clamp(0.0, 1.0)) / 2.0;
    (quantile_sorted(&meds, a), quantile_sorted(&meds, 1.0 - a))
}

/// What a timing row reports.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    pub n: usize,
    pub median: f64,
    pub p10: f64,
    pub p90: f64,
    pub min: f64,
    pub max: f64,
    pub mean: f64,
    /// 95 % bootstrap interval of the median.
    pub ci_lo: f64,
    pub ci_hi: f64,
}

/// Resamples used for the interval: enough for stable 2.5/97.5 % points.
pub const BOOTSTRAP_RESAMPLES: usize = 2000;

pub fn summarize(samples: &[f64], seed: u64) -> Summary {
    let s = sorted(samples);
    let (ci_lo, ci_hi) = bootstrap_median_ci(&s, 0.95, BOOTSTRAP_RESAMPLES, seed);
    Summary {
        n: s.len(),
        median: quantile_sorted(&s, 0.5),
        p10: quantile_sorted(&s, 0.1),
        p90: quantile_sorted(&s, 0.9),
        min: s.first().copied().unwrap_or(f64::NAN),
        max: s.last().copied().unwrap_or(f64::NAN),
        mean: if s.is_empty() {
            f64::NAN
        } else {
            s.iter().sum::<f64>() / s.len() as f64
        },
        ci_lo,
        ci_hi,
    }
}

/// Two intervals overlap (inclusive ends).
pub fn overlaps(a: (f64, f64), b: (f64, f64)) -> bool {
    a.0 <= b.1 && b.0 <= a.1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate() {
        let s = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0];
        assert_eq!(quantile_sorted(&s, 0.5), 5.5);
        assert!((quantile_sorted(&s, 0.1) - 1.9).abs() < 1e-12);
        assert!((quantile_sorted(&s, 0.9) - 9.1).abs() < 1e-12);
        assert_eq!(quantile_sorted(&s, 0.0), 1.0);
        assert_eq!(quantile_sorted(&s, 1.0), 10.0);
        assert!(quantile_sorted(&[], 0.5).is_nan());
    }
}
