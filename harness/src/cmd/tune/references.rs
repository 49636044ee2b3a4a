//! The vendor reference rows of a `tune` run (cuBLAS bf16 and int8 GEMM at
//! the families' shapes): checked against the oracle, then timed in each
//! regime on the first GPU once the workers are done, in the first shard
//! only (so a merge holds them once). A reference that cannot run still
//! gets its rows, with the verdict and reason instead of numbers.

use super::rows::{ref_ident, timed_row, untimed_row, RunCtx};
use super::worker::regime_named;
use super::{Args, Session};
use crate::cmd::check;
use gemtune::references::{self, RefJob};
use gemtune::results::{CheckRow, TuneRow};
use gemtune_kernels::gpu::Gpu;
use gemtune_kernels::reference::{time_reference, Cublas};
use gemtune_kernels::timing::TimingConfig;

/// What the references gave: their check rows, their timed rows per regime
/// name, and the summary's one line on the vendor library.
pub(super) struct RefRows {
    pub checks: Vec<CheckRow>,
    pub timed: Vec<(String, TuneRow)>,
    pub library: String,
}

pub(super) fn run(
    a: &Args,
    s: &Session,
    gpu: &Gpu,
    cx: &RunCtx<'_>,
    cfg: &TimingConfig,
    notes: &mut Vec<String>,
) -> RefRows {
    let first_shard = a.sweep.shard.is_none_or(|sh| sh.index == 1);
    let mut jobs: Vec<RefJob> = if a.no_reference || !first_shard {
        Vec::new()
    } else {
        references::plan(
            s.jobs
                .iter()
                .map(|j| (j.family.name(), j.shapes.as_slice())),
        )
    };
    let cublas: Result<Cublas, String> = if jobs.is_empty() {
        Err(if first_shard {
            "none applies to these families".into()
        } else {
            "timed in shard 1".into()
        })
    } else {
        Cublas::new(gpu).map_err(|e| e.to_string())
    };
    let library = if a.no_reference {
        "off (--no-reference)".to_string()
    } else {
        match &cublas {
            Ok(c) => format!(
                "cuBLAS {} (cublasGemmEx; see the references table)",
                c.version()
            ),
            Err(e) => format!("none: {e}"),
        }
    };
    let mut out = RefRows {
        checks: Vec::new(),
        timed: Vec::new(),
        library,
    };
    if jobs.is_empty() || gemtune::interrupt::requested() {
        return out;
    }
    if let Err(e) = &cublas {
        notes.push(format!("vendor references not run: {e}"));
    }
    let rows = references::check_all(
        gpu,
        cublas.as_ref().map_err(|e| e.as_str()),
        &mut jobs,
        a.check_max_m,
        &s.lim.arch.to_string(),
        Some(gemtune::interrupt::flag()),
        check::progress_printer(),
    );
    for r in rows
        .iter()
        .filter(|r| r.verdict == "fail" || r.verdict == "error")
    {
        notes.push(format!(
            "reference {} {}: {} ({}); not timed",
            r.variant, r.shape, r.verdict, r.reason
        ));
    }
    out.checks = rows;
    'phases: for &rn in &s.regimes {
        let regime = regime_named(rn);
        for j in &jobs {
            if gemtune::interrupt::requested() {
                break 'phases;
            }
            let row = match (&j.status, &cublas) {
                (Some(Ok(())), Ok(c)) => {
                    match time_reference(gpu, c, j.kind, &j.shape.problem(), regime, cfg) {
                        Ok(t) => {
                            let mut id = ref_ident(j);
                            id.reason = j.kind.note().to_string();
                            timed_row(cx, id, &t)
                        }
                        Err(e) => {
                            notes.push(format!(
                                "reference {} {} {rn}: {}: {e}",
                                j.kind.name(),
                                j.shape.name,
                                e.verdict()
                            ));
                            untimed_row(cx, ref_ident(j), regime, e.verdict(), e.to_string())
                        }
                    }
                }
                (Some(Err((verdict, reason))), _) => {
                    untimed_row(cx, ref_ident(j), regime, verdict, reason.clone())
                }
                (_, Err(e)) => untimed_row(cx, ref_ident(j), regime, "unavailable", e.clone()),
                (None, Ok(_)) => {
                    untimed_row(cx, ref_ident(j), regime, "error", "not checked".into())
                }
            };
            out.timed.push((rn.to_string(), row));
        }
    }
    out
}
