//! The compile pool gives what serial compiles give: the same cubin bytes
//! and the same per-function resources, in job order, whatever the thread
//! count; a second pass through the same cubin cache is served from it. No
//! GPU needed; NVRTC must be loadable (CI installs it from PyPI).

use gemtune_kernels::compile::{compile, nvrtc_available, Arch};
use gemtune_kernels::family::family;
use gemtune_kernels::pool::{compile_all, CompileJob};
use gemtune_kernels::quant::GgmlType;

/// Small families at their default defines, on two architectures: enough
/// jobs that every worker takes several.
fn jobs() -> Vec<CompileJob<'static>> {
    let mut v = Vec::new();
    for arch in [Arch(80), Arch(90)] {
        for name in ["quantize_q8_1", "softcap", "rmsnorm", "act_convert"] {
            let f = family(name).unwrap_or_else(|| panic!("family {name}"));
            for wt in [GgmlType::Q8_0, GgmlType::Q4_0] {
                let defines = f.default_defines(wt);
                if !v.iter().any(|j: &CompileJob| {
                    j.family.name() == name && j.arch == arch && j.defines == defines
                }) {
                    v.push(CompileJob {
                        family: f,
                        defines,
                        arch,
                    });
                }
            }
        }
    }
    v
}

#[test]
fn pool_results_equal_serial_compiles() {
    assert!(nvrtc_available(), "NVRTC is needed: . scripts/nvrtc-env.sh");
    let jobs = jobs();
    assert!(jobs.len() >= 8, "{} jobs", jobs.len());
    let serial: Vec<_> = jobs
        .iter()
        .map(|j| compile(j.family, &j.defines, j.arch, None).expect("serial compile"))
        .collect();
    for threads in [1, 3] {
        let mut seen = 0;
        let (pooled, report) = compile_all(&jobs, None, Some(threads), None, |done, total| {
            assert_eq!(total, jobs.len());
            seen = done;
        });
        assert_eq!(seen, jobs.len(), "progress reached the end");
        assert_eq!(report.jobs, jobs.len());
        assert_eq!(report.threads, threads);
        assert_eq!(report.failed, 0);
        assert_eq!(report.from_cache, 0, "no cache given");
        for ((j, s), p) in jobs.iter().zip(&serial).zip(pooled) {
            let p = p.expect("pooled compile");
            let what = format!("{} {} {threads} threads", j.family.name(), j.arch);
            assert_eq!(
                (p.family.as_str(), p.arch),
                (j.family.name(), j.arch),
                "{what}: order"
            );
            assert_eq!(p.cubin, s.cubin, "{what}: cubin bytes");
            assert_eq!(p.functions, s.functions, "{what}: resources");
            assert_eq!(
                (p.registers, p.spill_bytes, p.static_smem),
                (s.registers, s.spill_bytes, s.static_smem),
                "{what}"
            );
            assert_eq!(p.cache_key, s.cache_key, "{what}");
        }
    }
}

#[test]
fn a_second_pool_pass_is_served_by_the_cache() {
    assert!(nvrtc_available(), "NVRTC is needed: . scripts/nvrtc-env.sh");
    let dir = tempfile::tempdir().expect("tempdir");
    let jobs: Vec<_> = jobs().into_iter().take(4).collect();
    let (first, r1) = compile_all(&jobs, Some(dir.path()), Some(2), None, |_, _| {});
    assert_eq!(r1.from_cache, 0);
    let (second, r2) = compile_all(&jobs, Some(dir.path()), Some(2), None, |_, _| {});
    assert_eq!(r2.from_cache, jobs.len());
    for (a, b) in first.into_iter().zip(second) {
        let (a, b) = (a.expect("first"), b.expect("second"));
        assert!(b.from_cache);
        assert_eq!(a.cubin, b.cubin);
        assert_eq!(a.functions, b.functions);
    }
}

#[test]
fn a_stopped_pool_starts_nothing_more() {
    let stop = std::sync::atomic::AtomicBool::new(true);
    let jobs: Vec<_> = jobs().into_iter().take(3).collect();
    let (r, report) = compile_all(&jobs, None, Some(2), Some(&stop), |_, _| {});
    assert_eq!(report.not_run, 3);
    assert_eq!(report.failed, 0);
    assert!(r.iter().all(|r| matches!(
        r,
        Err(gemtune_kernels::compile::CompileError::NotRun { .. })
    )));
}
