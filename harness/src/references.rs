//! Vendor reference rows of `gemtune tune`: which references run at which
//! problems, and their oracle checks before any timing.
//!
//! A reference is run once per distinct problem (m, n, k, weight type) even
//! when several families of one run share the shape (`tune mmq,gemm_dq`);
//! each family's summary picks out the references that apply to it
//! (`gemtune_kernels::reference::references_for`).

use crate::results::CheckRow;
use crate::spec::Shape;
use gemtune_kernels::check::CheckReport;
use gemtune_kernels::gpu::Gpu;
use gemtune_kernels::reference::{check_reference, references_for, Cublas, RefError, RefKind};
use std::collections::BTreeMap;

/// One reference at one problem.
#[derive(Clone, Debug, PartialEq)]
pub struct RefJob {
    pub kind: RefKind,
    /// The first shape (in job order) with this problem; names the rows.
    pub shape: Shape,
    /// `None` until checked; `Some(Ok)` after a passing check; otherwise
    /// the verdict (fail | unavailable | unsupported | error) and reason
    /// its rows carry instead of a measurement.
    pub status: Option<Result<(), (String, String)>>,
}

impl RefJob {
    pub fn ready(&self) -> bool {
        matches!(self.status, Some(Ok(())))
    }
}

/// The reference jobs for (family, shapes) pairs, in first-seen order,
/// one per (reference, m, n, k, weight type).
pub fn plan<'a>(jobs: impl IntoIterator<Item = (&'a str, &'a [Shape])>) -> Vec<RefJob> {
    let mut out: Vec<RefJob> = Vec::new();
    for (family, shapes) in jobs {
        for s in shapes {
            for &kind in references_for(family) {
                let dup = out
                    .iter()
                    .any(|j| j.kind == kind && j.shape.problem == s.problem);
                if !dup {
                    out.push(RefJob {
                        kind,
                        shape: s.clone(),
                        status: None,
                    });
                }
            }
        }
    }
    out
}

fn check_row(j: &RefJob, arch: &str, version: &str) -> CheckRow {
    let s = &j.shape;
    CheckRow {
        schema_version: crate::results::SCHEMA_VERSION,
        family: j.kind.library().to_string(),
        variant: j.kind.name().to_string(),
        shape: s.name.clone(),
        m: s.m,
        n: s.n,
        k: s.k,
        wtype: s.wtype_define(),
        problem: s.problem.describe(),
        arch: arch.to_string(),
        contract: crate::spec::family::contract_name(j.kind.contract()).to_string(),
        defines: version.to_string(),
        ..Default::default()
    }
}

/// Checks every job once at m capped to `check_max_m` (jobs sharing a
/// capped problem share the check) and returns one check row per job.
/// `cublas` is the loaded library or why it could not be loaded; every job
/// then fails as `unavailable`. A job whose check fails is not timed. Once
/// `stop` is set (Ctrl-C), the remaining jobs are `skipped`.
pub fn check_all(
    gpu: &Gpu,
    cublas: Result<&Cublas, &str>,
    jobs: &mut [RefJob],
    check_max_m: usize,
    arch: &str,
    stop: Option<&std::sync::atomic::AtomicBool>,
    mut progress: impl FnMut(&str),
) -> Vec<CheckRow> {
    let version = match cublas {
        Ok(c) => format!("cuBLAS {}", c.version()),
        Err(_) => String::new(),
    };
    let mut done: BTreeMap<(RefKind, String), Result<CheckReport, (String, String)>> =
        BTreeMap::new();
    let mut rows = Vec::new();
    for j in jobs.iter_mut() {
        let mut row = check_row(j, arch, &version);
        let s = &j.shape;
        let (problem, note) = match s.capped(check_max_m) {
            Some(p) => (
                p,
                format!("checked at m={check_max_m} (proxy of m={}); ", s.m),
            ),
            None => (s.problem(), String::new()),
        };
        let seed = crate::checker::seed_for(j.kind.name(), &s.name);
        row.seed = Some(seed);
        let key = (j.kind, format!("{problem:?}"));
        let stopped = stop.is_some_and(|f| f.load(std::sync::atomic::Ordering::SeqCst));
        let result = match (done.get(&key), cublas) {
            _ if stopped => Err(("skipped".to_string(), "interrupted".to_string())),
            (Some(r), _) => r.clone(),
            (None, Err(why)) => Err(("unavailable".to_string(), why.to_string())),
            (None, Ok(c)) => {
                progress(&format!("check {} {}", j.kind.name(), s.name));
                let r = check_reference(gpu, c, j.kind, &problem, seed)
                    .map_err(|e: RefError| (e.verdict().to_string(), e.to_string()));
                done.insert(key, r.clone());
                r
            }
        };
        match result {
            Ok(rep) => {
                crate::checker::fill_report(&mut row, &rep, &note);
                if rep.passed {
                    row.verdict = "pass".into();
                    j.status = Some(Ok(()));
                } else {
                    row.verdict = "fail".into();
                    j.status = Some(Err((
                        "fail".into(),
                        format!("failed its oracle check, not timed: {}", row.reason),
                    )));
                }
            }
            Err((verdict, reason)) => {
                row.verdict = verdict.clone();
                row.reason = reason.clone();
                j.status = Some(Err((verdict, reason)));
            }
        }
        rows.push(row);
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use gemtune_kernels::quant::GgmlType;

    fn shape(base: &str, m: usize, n: usize, k: usize) -> Shape {
        Shape::new(
            format!("{base}@m={m}"),
            base.into(),
            gemtune_kernels::Problem::matmul(m, n, k, GgmlType::Q8_0),
            String::new(),
        )
    }

    #[test]
    fn plan_dedups_problems_across_families() {
        let a = vec![
            shape("e4b.ffn_up", 512, 10240, 2560),
            shape("e4b.ffn_up", 2048, 10240, 2560),
        ];
        // gemm_dq names the same problem under another shape name.
        let b = vec![shape("alias.ffn_up", 2048, 10240, 2560)];
        let c = vec![shape("x", 1, 8, 32)];
        let jobs = plan([
            ("mmq", a.as_slice()),
            ("gemm_dq", b.as_slice()),
            ("quantize_q8_1", c.as_slice()),
        ]);
        let got: Vec<(&str, &str)> = jobs
            .iter()
            .map(|j| (j.kind.name(), j.shape.name.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("cublas-bf16", "e4b.ffn_up@m=512"),
                ("cublas-int8", "e4b.ffn_up@m=512"),
                ("cublas-bf16", "e4b.ffn_up@m=2048"),
                ("cublas-int8", "e4b.ffn_up@m=2048"),
            ]
        );
        assert!(jobs.iter().all(|j| j.status.is_none() && !j.ready()));
    }
}
