//! Judging a kernel's output against the CPU reference: the contract a
//! variant is held to, tolerances, the comparison and its report.

use serde::{Deserialize, Serialize};

/// How a variant's output is judged against the CPU oracle (the README's
/// kernel-family table gives each family's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Contract {
    /// Identical bits to the CPU replay of the kernel's defined algorithm.
    Bitexact,
    /// Float rounding differences only (reassociated f32 sums).
    Fp,
    /// Quantized or reduced-precision operands: RMS bound plus a bounded
    /// share of outliers, and a tight check against the CPU replay.
    Approx,
}

/// Bounds a variant must meet. Metrics are defined in `compare`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tolerance {
    /// ||out - ref||_2 / ||ref||_2 against the f64 oracle on dequantized inputs.
    pub rms_rel: f64,
    /// Per-element |out - ref| / (|ref| + rms(ref)); elements above this are outliers.
    pub max_rel: f64,
    /// Largest allowed share of outliers (0.0 = none).
    pub outlier_frac: f64,
    /// ||out - replay||_2 / ||replay||_2 against the CPU replay of the
    /// kernel's own operand rounding (quantized activations, f16 tiles).
    pub replay_rms_rel: f64,
}

impl Tolerance {
    /// The fp contract at an rms bound `fp` (e.g. `fp_rms_bound` of the
    /// dot length): rms within `fp` of the oracle and of the replay, no
    /// element beyond 20x it.
    pub fn fp(fp: f64) -> Tolerance {
        Tolerance {
            rms_rel: fp,
            max_rel: 20.0 * fp,
            outlier_frac: 0.0,
            replay_rms_rel: fp,
        }
    }
    /// The bitexact contract: every output word equal to the reference's.
    pub fn bitexact() -> Tolerance {
        Tolerance {
            rms_rel: 0.0,
            max_rel: 0.0,
            outlier_frac: 0.0,
            replay_rms_rel: 0.0,
        }
    }
}

/// Outcome of one check.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckReport {
    pub passed: bool,
    pub rms_rel: f64,
    pub max_rel: f64,
    pub max_abs: f64,
    pub outliers: usize,
    pub replay_rms_rel: Option<f64>,
    /// Outputs still holding the poison pattern.
    pub unwritten: usize,
    /// NaN/Inf outputs other than the poison.
    pub non_finite: usize,
    pub detail: String,
}

impl CheckReport {
    /// The report of a bit-exact comparison of `n` values of which `bad`
    /// differ and `unwritten` still hold the poison.
    pub fn exact(n: usize, bad: usize, unwritten: usize) -> CheckReport {
        let frac = if n == 0 { 0.0 } else { bad as f64 / n as f64 };
        CheckReport {
            passed: bad == 0 && unwritten == 0,
            rms_rel: frac,
            max_rel: frac,
            max_abs: 0.0,
            outliers: bad,
            replay_rms_rel: Some(frac),
            unwritten,
            non_finite: 0,
            detail: if bad == 0 && unwritten == 0 {
                String::new()
            } else {
                format!("{bad} of {n} values differ from the CPU rule, {unwritten} words unwritten")
            },
        }
    }
}

/// The NaN written over outputs before a run (a quiet NaN with a payload no
/// arithmetic produces), so unwritten elements are told apart from NaN results.
pub const POISON_BITS: u32 = 0x7fc0_dead;

/// Compares `out` with the f64 reference `reference` and optionally with the
/// replay. `passed` requires: no unwritten or non-finite outputs,
/// rms_rel <= tol.rms_rel, outliers <= tol.outlier_frac * len, and the replay
/// within tol.replay_rms_rel. For `Bitexact`, `out` must equal `replay` (or
/// `reference` without replay) bit for bit after rounding to f32.
pub fn compare(
    out: &[f32],
    reference: &[f64],
    replay: Option<&[f64]>,
    contract: Contract,
    tol: &Tolerance,
) -> CheckReport {
    let n = out.len().min(reference.len());
    let mut unwritten = 0usize;
    let mut non_finite = 0usize;
    let mut first_bad: Option<usize> = None;
    for (i, &o) in out.iter().enumerate().take(n) {
        if o.to_bits() == POISON_BITS {
            unwritten += 1;
            first_bad.get_or_insert(i);
        } else if !o.is_finite() {
            non_finite += 1;
            first_bad.get_or_insert(i);
        }
    }
    let ref_sq: f64 = reference.iter().take(n).map(|r| r * r).sum();
    let ref_rms = (ref_sq / n.max(1) as f64).sqrt();
    let mut err_sq = 0.0f64;
    let mut max_rel = 0.0f64;
    let mut max_abs = 0.0f64;
    let mut outliers = 0usize;
    let mut worst = 0usize;
    for i in 0..n {
        let o = out[i] as f64;
        if !o.is_finite() {
            continue;
        }
        let e = (o - reference[i]).abs();
        err_sq += e * e;
        let rel = e / (reference[i].abs() + ref_rms + f64::MIN_POSITIVE);
        if rel > max_rel {
            max_rel = rel;
            worst = i;
        }
        max_abs = max_abs.max(e);
        if rel > tol.max_rel {
            outliers += 1;
        }
    }
    let rms_rel = if ref_sq > 0.0 {
        (err_sq / ref_sq).sqrt()
    } else {
        err_sq.sqrt()
    };
    let replay_rms_rel = replay.map(|rp| {
        let mut e2 = 0.0;
        let mut r2 = 0.0;
        for i in 0..n.min(rp.len()) {
            let o = out[i] as f64;
            if o.is_finite() {
                e2 += (o - rp[i]) * (o - rp[i]);
            }
            r2 += rp[i] * rp[i];
        }
        if r2 > 0.0 {
            (e2 / r2).sqrt()
        } else {
            e2.sqrt()
        }
    });
    let mut reasons = Vec::new();
    if unwritten > 0 {
        reasons.push(format!(
            "{unwritten} outputs unwritten (first at {})",
            first_bad.unwrap_or(0)
        ));
    }
    if non_finite > 0 {
        reasons.push(format!("{non_finite} outputs NaN/Inf"));
    }
    match contract {
        Contract::Bitexact => {
            let target = replay.unwrap_or(reference);
            let mism = (0..n)
                .filter(|&i| out[i].to_bits() != (target[i] as f32).to_bits())
                .count();
            if mism > 0 {
                let i = (0..n)
                    .find(|&i| out[i].to_bits() != (target[i] as f32).to_bits())
                    .unwrap_or(0);
                reasons.push(format!(
                    "{mism} elements differ bitwise (first at {i}: got {} want {})",
                    out[i], target[i] as f32
                ));
            }
        }
        Contract::Fp | Contract::Approx => {
            if rms_rel > tol.rms_rel {
                reasons.push(format!("rms_rel {rms_rel:.3e} > {:.3e}", tol.rms_rel));
            }
            let allowed = (tol.outlier_frac * n as f64).floor() as usize;
            if outliers > allowed {
                reasons.push(format!(
                    "{outliers} outliers above max_rel {:.3e} (allowed {allowed}); worst at {worst}: got {} want {}",
                    tol.max_rel, out[worst], reference[worst]
                ));
            }
            if let Some(r) = replay_rms_rel {
                if r > tol.replay_rms_rel {
                    reasons.push(format!(
                        "replay_rms_rel {r:.3e} > {:.3e}",
                        tol.replay_rms_rel
                    ));
                }
            }
        }
    }
    CheckReport {
        passed: reasons.is_empty(),
        rms_rel,
        max_rel,
        max_abs,
        outliers,
        replay_rms_rel,
        unwritten,
        non_finite,
        detail: if reasons.is_empty() {
            format!("ok ({n} outputs)")
        } else {
            reasons.join("; ")
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOL: Tolerance = Tolerance {
        rms_rel: 1e-3,
        max_rel: 1e-2,
        outlier_frac: 0.0,
        replay_rms_rel: 1e-6,
    };

    #[test]
    fn poison_and_nan_are_counted_apart() {
        let out = [1.0, f32::from_bits(POISON_BITS), f32::NAN, 4.0];
        let r = compare(&out, &[1.0, 2.0, 3.0, 4.0], None, Contract::Fp, &TOL);
        assert!(!r.passed);
        assert_eq!(r.unwritten, 1);
        assert_eq!(r.non_finite, 1);
        assert!(
            r.detail.contains("1 outputs unwritten (first at 1)"),
            "{}",
            r.detail
        );
    }

    #[test]
    fn metrics_are_exact_on_a_small_case() {
        let r = compare(
            &[1.0, 2.0, 3.0, 4.5],
            &[1.0, 2.0, 3.0, 4.0],
            None,
            Contract::Fp,
            &TOL,
        );
        let ref_norm = (1.0f64 + 4.0 + 9.0 + 16.0).sqrt();
        assert!((r.rms_rel - 0.5 / ref_norm).abs() < 1e-12);
        assert_eq!(r.max_abs, 0.5);
        assert_eq!(r.outliers, 1);
        assert!(!r.passed);
        let ok = compare(
            &[1.0, 2.0, 3.0, 4.0],
            &[1.0, 2.0, 3.0, 4.0],
            Some(&[1.0, 2.0, 3.0, 4.0]),
            Contract::Approx,
            &TOL,
        );
        assert!(ok.passed, "{}", ok.detail);
        assert_eq!(ok.replay_rms_rel, Some(0.0));
    }

    #[test]
    fn bitexact_needs_identical_bits() {
        let r = compare(&[1.0, 2.0], &[1.0, 2.001], None, Contract::Bitexact, &TOL);
        assert!(!r.passed);
        assert!(
            r.detail.contains("1 elements differ bitwise"),
            "{}",
            r.detail
        );
    }
}
