//! Statistics over timing samples: quantiles, and a percentile-bootstrap
//! confidence interval of the median with a seeded generator (the same
//! samples and seed always give the same interval).

use rand::Rng;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// Quantile `q` in [0, 1] of sorted data by linear interpolation between
/// closest ranks (the "type 7" rule of R and NumPy). NaN for empty input.
/// Defined once, in the kernels crate, so the timing loop and every report
/// agree on what a median is.
pub use gemtune_kernels::timing::quantile_sorted;

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

/// Arithmetic mean of the finite values; NaN when there are none.
pub fn mean(xs: &[f64]) -> f64 {
    let v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        f64::NAN
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// Sample standard deviation (n - 1) of the finite values; NaN below two.
pub fn sd(xs: &[f64]) -> f64 {
    let v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.len() < 2 {
        return f64::NAN;
    }
    let m = v.iter().sum::<f64>() / v.len() as f64;
    (v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (v.len() - 1) as f64).sqrt()
}

/// Standard normal CDF, through the complementary error function
/// (Numerical Recipes' `erfcc`, fractional error below 1.2e-7).
pub fn normal_cdf(x: f64) -> f64 {
    let z = x.abs() / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let erfc = t * poly.exp();
    if x >= 0.0 {
        1.0 - 0.5 * erfc
    } else {
        0.5 * erfc
    }
}

/// ln Γ(x) for x > 0 (Lanczos, g = 7, 9 terms; ~1e-15 relative).
fn ln_gamma(x: f64) -> f64 {
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection.
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = C[0];
    let t = x + 7.5;
    for (i, c) in C.iter().enumerate().skip(1) {
        a += c / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// Regularized incomplete beta I_x(a, b) by Lentz's continued fraction.
fn inc_beta(x: f64, a: f64, b: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let front =
        (ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln()).exp();
    // The fraction converges fast for x < (a + 1) / (a + b + 2).
    if x > (a + 1.0) / (a + b + 2.0) {
        return 1.0 - inc_beta(1.0 - x, b, a);
    }
    let tiny = 1e-300;
    let (mut c, mut d) = (1.0, 1.0 - (a + b) * x / (a + 1.0));
    if d.abs() < tiny {
        d = tiny;
    }
    d = 1.0 / d;
    let mut h = d;
    for m in 1..300 {
        let m = m as f64;
        let num = m * (b - m) * x / ((a + 2.0 * m - 1.0) * (a + 2.0 * m));
        d = 1.0 + num * d;
        d = if d.abs() < tiny { tiny } else { d };
        c = 1.0 + num / c;
        c = if c.abs() < tiny { tiny } else { c };
        d = 1.0 / d;
        h *= d * c;
        let num = -(a + m) * (a + b + m) * x / ((a + 2.0 * m) * (a + 2.0 * m + 1.0));
        d = 1.0 + num * d;
        d = if d.abs() < tiny { tiny } else { d };
        c = 1.0 + num / c;
        c = if c.abs() < tiny { tiny } else { c };
        d = 1.0 / d;
        let del = d * c;
        h *= del;
        if (del - 1.0).abs() < 1e-15 {
            break;
        }
    }
    front * h / a
}

/// CDF of Student's t with `df` degrees of freedom.
pub fn t_cdf(t: f64, df: f64) -> f64 {
    let tail = 0.5 * inc_beta(df / (df + t * t), 0.5 * df, 0.5);
    if t >= 0.0 {
        1.0 - tail
    } else {
        tail
    }
}

/// Quantile `p` in (0, 1) of Student's t with `df` degrees of freedom
/// (bisection on `t_cdf`; 1e-10 absolute).
pub fn t_quantile(p: f64, df: f64) -> f64 {
    if !(p > 0.0 && p < 1.0) || df.is_nan() || df <= 0.0 {
        return f64::NAN;
    }
    if p < 0.5 {
        return -t_quantile(1.0 - p, df);
    }
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    while t_cdf(hi, df) < p {
        hi *= 2.0;
        if hi > 1e12 {
            return f64::INFINITY;
        }
    }
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if t_cdf(mid, df) < p {
            lo = mid;
        } else {
            hi = mid;
        }
        if hi - lo < 1e-10 {
            break;
        }
    }
    0.5 * (lo + hi)
}

/// The tail probability the expanded percentile bootstrap reads its
/// interval at, for `n` values and confidence `level`: the normal tail
/// beyond sqrt(n / (n - 1)) * t(1 - alpha/2, n - 1) (Hesterberg 2015, "What
/// teachers should know about the bootstrap", §6: the plain percentile
/// interval is too narrow for small samples; this widens it to what
/// Student's t gives for normal data). For n = 6 at 95 % it is 0.0024
/// instead of 0.025.
pub fn expanded_tail(n: usize, level: f64) -> f64 {
    if n < 2 {
        return 0.0;
    }
    let a = (1.0 - level.clamp(0.0, 1.0)) / 2.0;
    let nf = n as f64;
    let z = (nf / (nf - 1.0)).sqrt() * t_quantile(1.0 - a, nf - 1.0);
    normal_cdf(-z)
}

/// Resamples of `bootstrap_mean_ci`: the expanded interval reads quantiles
/// far into the tails (0.24 % for six values), so more than the median's.
pub const MEAN_RESAMPLES: usize = 10_000;

/// Expanded percentile-bootstrap interval of the mean of `xs` at `level`,
/// resampling the values with `ChaCha8Rng::seed_from_u64(seed)`
/// (`expanded_tail` says where the interval is read). One value gives the
/// degenerate interval (x, x); none gives NaNs.
pub fn bootstrap_mean_ci(xs: &[f64], level: f64, resamples: usize, seed: u64) -> (f64, f64) {
    let v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    match v.len() {
        0 => return (f64::NAN, f64::NAN),
        1 => return (v[0], v[0]),
        _ => {}
    }
    let n = v.len();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut means = Vec::with_capacity(resamples.max(1));
    for _ in 0..resamples.max(1) {
        let mut s = 0.0;
        for _ in 0..n {
            s += v[rng.random_range(0..n)];
        }
        means.push(s / n as f64);
    }
    means.sort_by(f64::total_cmp);
    let tail = expanded_tail(n, level);
    (
        quantile_sorted(&means, tail),
        quantile_sorted(&means, 1.0 - tail),
    )
}

/// Student's t interval of the mean at `level` (NaNs below two values).
pub fn t_mean_ci(xs: &[f64], level: f64) -> (f64, f64) {
    let v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.len() < 2 {
        return (f64::NAN, f64::NAN);
    }
    let n = v.len() as f64;
    let m = mean(&v);
    let half = t_quantile(1.0 - (1.0 - level) / 2.0, n - 1.0) * sd(&v) / n.sqrt();
    (m - half, m + half)
}

/// The interval of a mean that the A/B verdict uses: the expanded
/// percentile bootstrap (`bootstrap_mean_ci`), widened where it is
/// narrower to Student's t interval. For the handful of values an A/B run
/// has (one per ABBA block) the bootstrap alone covers less than its level
/// (about 93 % at six values, 88 % at four, for normal data); the union
/// keeps the bootstrap's shape for skewed data and t's coverage for
/// normal data.
pub fn mean_ci(xs: &[f64], level: f64, resamples: usize, seed: u64) -> (f64, f64) {
    let (blo, bhi) = bootstrap_mean_ci(xs, level, resamples, seed);
    let (tlo, thi) = t_mean_ci(xs, level);
    if tlo.is_nan() {
        return (blo, bhi);
    }
    (blo.min(tlo), bhi.max(thi))
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

    #[test]
    fn normal_and_t_quantiles_match_tables() {
        assert!((normal_cdf(0.0) - 0.5).abs() < 1e-7);
        assert!((normal_cdf(1.959_964) - 0.975).abs() < 1e-6);
        assert!((normal_cdf(-2.575_829) - 0.005).abs() < 1e-6);
        // Student's t, two-sided 95 % and 99 % points.
        for (p, df, want) in [
            (0.975, 1.0, 12.706_205),
            (0.975, 2.0, 4.302_653),
            (0.975, 5.0, 2.570_582),
            (0.975, 30.0, 2.042_272),
            (0.995, 9.0, 3.249_836),
            (0.9, 4.0, 1.533_206),
        ] {
            let t = t_quantile(p, df);
            assert!((t - want).abs() < 1e-5, "t({p}, {df}) = {t}, want {want}");
            assert!((t_quantile(1.0 - p, df) + want).abs() < 1e-5);
        }
        assert!((t_quantile(0.5, 7.0)).abs() < 1e-9);
        // Six values at 95 %: the interval is read at 0.24 %, not 2.5 %.
        let tail = expanded_tail(6, 0.95);
        assert!((tail - 0.00243).abs() < 0.0001, "{tail}");
        assert!(expanded_tail(200, 0.95) > 0.024);
    }

    #[test]
    fn mean_interval_covers_like_students_t() {
        // Normal samples of six (Box-Muller from a seeded generator): the
        // expanded interval should cover the true mean about 95 % of the
        // time; the plain percentile interval covers about 88 % at n = 6.
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let mut normal = || {
            let u1: f64 = rng.random_range(1e-12..1.0);
            let u2: f64 = rng.random_range(0.0..1.0);
            (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
        };
        let trials = 400;
        let mut covered = 0;
        for i in 0..trials {
            let xs: Vec<f64> = (0..6).map(|_| normal()).collect();
            let (lo, hi) = bootstrap_mean_ci(&xs, 0.95, 4000, i);
            if lo <= 0.0 && 0.0 <= hi {
                covered += 1;
            }
        }
        let rate = covered as f64 / trials as f64;
        assert!((0.90..=0.99).contains(&rate), "coverage {rate}");
        // The union with Student's t covers at the level at six values.
        let mut covered = 0;
        for i in 0..trials {
            let xs: Vec<f64> = (0..6).map(|_| normal()).collect();
            let (lo, hi) = mean_ci(&xs, 0.95, 2000, i);
            let (tlo, thi) = t_mean_ci(&xs, 0.95);
            assert!(lo <= tlo && hi >= thi);
            if lo <= 0.0 && 0.0 <= hi {
                covered += 1;
            }
        }
        let rate = covered as f64 / trials as f64;
        assert!((0.93..=0.99).contains(&rate), "coverage {rate}");
        assert_eq!(bootstrap_mean_ci(&[2.0], 0.95, 10, 1), (2.0, 2.0));
        assert!(bootstrap_mean_ci(&[], 0.95, 10, 1).0.is_nan());
        let (lo, hi) = bootstrap_mean_ci(&[1.0, 1.0, 1.0], 0.95, 100, 1);
        assert_eq!((lo, hi), (1.0, 1.0));
    }
}
