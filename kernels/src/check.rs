//! Correctness checks: poison, run, download, compare with the CPU
//! reference (and the CPU replay of the kernel's own quantization).

use crate::compile::CompiledVariant;
use crate::defines::Defines;
use crate::gpu::{Gpu, GpuError};
use crate::kernel_family::Family;
use crate::problem::Problem;
pub use crate::verdict::{compare, CheckReport, Tolerance, POISON_BITS};

/// Runs variant `cv` of `f` once on seeded inputs of problem `p` and judges it
/// under the family's contract for `d` with tolerance `tol`.
pub fn check_variant(
    gpu: &Gpu,
    f: &dyn Family,
    cv: &CompiledVariant,
    d: &Defines,
    p: &Problem,
    seed: u64,
    tol: &Tolerance,
) -> Result<CheckReport, GpuError> {
    let geo = f
        .validate(d, p, &gpu.limits())
        .map_err(|r| GpuError::Rejected(format!("{}: {r}", f.name())))?;
    let module = gpu.load(cv)?;
    let wl = f.workload(gpu, d, p, &geo, seed)?;
    wl.poison(gpu)?;
    wl.launch(gpu, &module, 0)?;
    gpu.synchronize()?;
    let mut rep = wl.evaluate(gpu, f.contract(d), tol)?;
    // A second run on the same inputs must give the same bits: a moving
    // result means a race.
    let first = wl.raw_output(gpu)?;
    wl.poison(gpu)?;
    wl.launch(gpu, &module, 0)?;
    gpu.synchronize()?;
    let second = wl.raw_output(gpu)?;
    if first != second {
        let diff = first.iter().zip(&second).filter(|(a, b)| a != b).count();
        rep.passed = false;
        rep.detail = format!(
            "{}; non-deterministic: {diff} of {} output words changed between two runs (race?)",
            rep.detail,
            first.len()
        );
    }
    // A kernel that adds into zeroed outputs would turn an output it never
    // writes into a plausible zero; run it once on the poison itself (an
    // addition onto the poison NaN leaves a different NaN) and count the
    // words that still hold the poison pattern.
    if wl.accumulates() {
        wl.poison(gpu)?;
        wl.launch_kernel_only(gpu, &module, 0)?;
        gpu.synchronize()?;
        let raw = wl.raw_output(gpu)?;
        let untouched = raw.iter().filter(|&&w| w == POISON_BITS).count();
        if untouched > 0 {
            rep.passed = false;
            rep.unwritten = rep.unwritten.max(untouched);
            rep.detail = format!(
                "{}; {untouched} outputs never written by the kernel (seen without the zero fill)",
                rep.detail
            );
        }
    }
    Ok(rep)
}
