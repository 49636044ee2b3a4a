//! The compile pool: many (family, defines, arch) compiles at once.
//!
//! NVRTC compiles are independent (each call owns its program; NVRTC 13 runs
//! concurrent calls in parallel), so a set of cold compiles runs on worker
//! threads that take the next job as they finish one: `GEMTUNE_COMPILE_THREADS`
//! workers, else one per available core, never more than there are jobs. Each
//! job is exactly `compile::compile` (cache lookup, NVRTC, resources, cache
//! write), so the results equal serial compiles: same cubins, same resources,
//! in job order. Progress is reported on the caller's thread.

use crate::compile::{compile, Arch, CompileError, CompiledVariant};
use crate::defines::Defines;
use crate::kernel_family::Family;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// One compile of the pool.
#[derive(Clone)]
pub struct CompileJob<'a> {
    pub family: &'a dyn Family,
    pub defines: Defines,
    pub arch: Arch,
}

/// What a pool run did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PoolReport {
    pub jobs: usize,
    /// Served from the on-disk cubin cache.
    pub from_cache: usize,
    /// Failed to compile (not counting `not_run`).
    pub failed: usize,
    /// Not started because `stop` was set first (`CompileError::NotRun`).
    pub not_run: usize,
    /// Worker threads used.
    pub threads: usize,
    pub elapsed: Duration,
}

impl PoolReport {
    /// One line: "compiled 176 define sets for sm_90 in 41.2 s on 16 threads (12 from the cubin cache)".
    pub fn summary(&self, what: &str) -> String {
        let mut s = format!(
            "compiled {} {what} in {:.1} s on {} thread{}",
            self.jobs - self.not_run,
            self.elapsed.as_secs_f64(),
            self.threads,
            if self.threads == 1 { "" } else { "s" }
        );
        let mut notes = Vec::new();
        if self.from_cache > 0 {
            notes.push(format!("{} from the cubin cache", self.from_cache));
        }
        if self.failed > 0 {
            notes.push(format!("{} failed", self.failed));
        }
        if self.not_run > 0 {
            notes.push(format!("{} not run: stopped", self.not_run));
        }
        if !notes.is_empty() {
            s.push_str(&format!(" ({})", notes.join(", ")));
        }
        s
    }
}

/// Worker threads for `jobs` compiles: `GEMTUNE_COMPILE_THREADS` when set to
/// a positive number, else the available parallelism; at most `jobs`, at
/// least 1.
pub fn pool_threads(jobs: usize) -> usize {
    let wanted = std::env::var("GEMTUNE_COMPILE_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        });
    wanted.min(jobs).max(1)
}

/// Compiles every job through the cubin cache at `cache` on `threads`
/// workers (`None`: `pool_threads`). Returns the results in job order and a
/// report; `progress(done, total)` runs on the calling thread after each job.
/// Once `stop` is set no job is started (those running finish); the jobs
/// never started come back as `CompileError::NotRun`.
pub fn compile_all(
    jobs: &[CompileJob<'_>],
    cache: Option<&Path>,
    threads: Option<usize>,
    stop: Option<&AtomicBool>,
    mut progress: impl FnMut(usize, usize),
) -> (Vec<Result<CompiledVariant, CompileError>>, PoolReport) {
    let start = Instant::now();
    let threads = threads.unwrap_or_else(|| pool_threads(jobs.len())).max(1);
    let threads = threads.min(jobs.len()).max(1);
    let mut slots: Vec<Option<Result<CompiledVariant, CompileError>>> =
        (0..jobs.len()).map(|_| None).collect();
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        let (tx, rx) = mpsc::channel();
        for _ in 0..threads {
            let tx = tx.clone();
            let next = &next;
            scope.spawn(move || loop {
                if stop.is_some_and(|s| s.load(Ordering::SeqCst)) {
                    break;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = jobs.get(i) else { break };
                let r = compile(job.family, &job.defines, job.arch, cache);
                if tx.send((i, r)).is_err() {
                    break;
                }
            });
        }
        drop(tx);
        for (done, (i, r)) in rx.into_iter().enumerate() {
            slots[i] = Some(r);
            progress(done + 1, jobs.len());
        }
    });
    // A slot stays empty only when its job was never started: `stop` was
    // set before a worker took it.
    let results: Vec<Result<CompiledVariant, CompileError>> = slots
        .into_iter()
        .zip(jobs)
        .map(|(r, job)| {
            r.unwrap_or_else(|| {
                Err(CompileError::NotRun {
                    family: job.family.name().to_string(),
                    defines: crate::defines::canonical(&job.defines),
                })
            })
        })
        .collect();
    let not_run = results
        .iter()
        .filter(|r| matches!(r, Err(CompileError::NotRun { .. })))
        .count();
    let report = PoolReport {
        jobs: jobs.len(),
        from_cache: results
            .iter()
            .filter(|r| r.as_ref().is_ok_and(|cv| cv.from_cache))
            .count(),
        failed: results.iter().filter(|r| r.is_err()).count() - not_run,
        not_run,
        threads,
        elapsed: start.elapsed(),
    };
    (results, report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_count_is_capped_by_the_jobs() {
        assert_eq!(pool_threads(1), 1);
        assert!(pool_threads(0) >= 1);
        assert!(pool_threads(1000) >= 1);
    }

    #[test]
    fn summary_names_cache_hits_and_failures() {
        let r = PoolReport {
            jobs: 176,
            from_cache: 12,
            failed: 1,
            not_run: 6,
            threads: 16,
            elapsed: Duration::from_millis(41_230),
        };
        assert_eq!(
            r.summary("define sets for sm_90"),
            "compiled 170 define sets for sm_90 in 41.2 s on 16 threads (12 from the cubin cache, 1 failed, 6 not run: stopped)"
        );
        let one = PoolReport {
            jobs: 1,
            threads: 1,
            ..Default::default()
        };
        assert_eq!(
            one.summary("kernels"),
            "compiled 1 kernels in 0.0 s on 1 thread"
        );
    }
}
