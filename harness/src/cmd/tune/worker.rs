//! A `tune` worker: what it is handed (a cell's check, or its timing in
//! one regime), the worker that owns one GPU and answers those tasks, and
//! `tune --serve`, the process that runs one for another process's pool.

use super::rows::{timed_row, Ident, RunCtx, CLOCK_PERIOD};
use super::Args;
use crate::exit::Exit;
use gemtune::cells::{CellId, WorkCell};
use gemtune::checker::{self, CheckOptions, Compiled};
use gemtune::results::{CheckRow, TuneRow, KIND_VARIANT};
use gemtune::roofline::{self, DevicePeaks};
use gemtune_kernels::clocks::ClockSampler;
use gemtune_kernels::defines::canonical;
use gemtune_kernels::gpu::{DeviceInfo, Gpu};
use gemtune_kernels::timing::{measure_ceilings, time_variant, Ceilings, Regime, TimingConfig};

/// What a tune worker is handed: a cell's check, or its timing in one
/// regime ("l2" | "dram") once its check passed.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub enum TuneTask {
    Check(CellId),
    Time(CellId, String),
}

/// A tune worker's answer.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub enum TuneAnswer {
    Check(Box<CheckRow>),
    Time(Box<TuneRow>),
}

/// Checks come first, then every L2 timing, then every DRAM timing: the
/// pool never starts a later phase while an earlier one has work left, so
/// cold and hot measurements are never interleaved on a GPU.
pub(super) fn phase(t: &TuneTask) -> usize {
    match t {
        TuneTask::Check(_) => 0,
        TuneTask::Time(_, r) if r == "l2" => 1,
        TuneTask::Time(..) => 2,
    }
}

pub(super) fn regime_named(name: &str) -> Regime {
    if name == "l2" {
        Regime::L2
    } else {
        Regime::Dram
    }
}

/// The options a `tune` worker needs to plan and time the same cells.
pub(super) fn worker_args(a: &Args) -> Vec<String> {
    let mut v = vec!["tune".to_string(), a.family.clone()];
    for x in &a.shapes {
        v.extend(["--shapes".into(), x.clone()]);
    }
    for x in &a.variants {
        v.extend(["--variant".into(), x.clone()]);
    }
    if !a.tokens.is_empty() {
        let t: Vec<String> = a.tokens.iter().map(|t| t.to_string()).collect();
        v.extend(["--tokens".into(), t.join(",")]);
    }
    for x in &a.shape_filter {
        v.extend(["--shape".into(), x.clone()]);
    }
    if let Some(x) = &a.variants_dir {
        v.extend(["--variants-dir".into(), x.display().to_string()]);
    }
    v.extend([
        "--budget-ms".into(),
        a.budget_ms.to_string(),
        "--min-reps".into(),
        a.min_reps.to_string(),
        "--max-reps".into(),
        a.max_reps.to_string(),
        "--check-max-m".into(),
        a.check_max_m.to_string(),
        "--seed".into(),
        a.seed.to_string(),
        "--launches".into(),
        a.launches.mode().name().into(),
    ]);
    v
}

/// One GPU's worker: the cell runner (which owns the GPU), the device's
/// measured ceilings and its clock sampler.
pub(super) struct TuneWorker<'a> {
    runner: checker::CellRunner<'a>,
    info: DeviceInfo,
    ceil: Ceilings,
    peaks: Option<&'static DevicePeaks>,
    sampler: Option<ClockSampler>,
    nvrtc: String,
    seed: u64,
    cfg: TimingConfig,
}

impl<'a> TuneWorker<'a> {
    pub(super) fn start(
        device: usize,
        jobs: &'a [checker::FamilyJob],
        planned: &'a [Vec<gemtune::spec::Cell>],
        cells: &[WorkCell],
        opts: &'a CheckOptions,
        a: &Args,
    ) -> Result<Self, String> {
        let gpu = Gpu::new(device).map_err(|e| format!("GPU {device}: {e}"))?;
        let info = gpu.info().clone();
        let ceil = measure_ceilings(&gpu).map_err(|e| format!("GPU {device}: ceilings: {e}"))?;
        let sampler = ClockSampler::start(&info.pci_bus_id, CLOCK_PERIOD).ok();
        Ok(TuneWorker {
            peaks: roofline::peaks_for(&info.name, info.cc),
            runner: checker::CellRunner::new(jobs, planned, cells, Some(gpu), opts),
            info,
            ceil,
            sampler,
            nvrtc: nvrtc_string(),
            seed: a.seed,
            cfg: TimingConfig {
                budget_ms: a.budget_ms,
                min_reps: a.min_reps,
                max_reps: a.max_reps,
                launches: a.launches.mode(),
                ..TimingConfig::default()
            },
        })
    }

    pub(super) fn handle(&mut self, t: &TuneTask) -> Result<TuneAnswer, String> {
        match t {
            TuneTask::Check(id) => {
                let mut rows = self.runner.run(std::slice::from_ref(id), |_| {})?;
                let (_, mut row) = rows.pop().ok_or("no row")?;
                row.device_index = Some(self.info.ordinal);
                Ok(TuneAnswer::Check(Box::new(row)))
            }
            TuneTask::Time(id, regime) => {
                let wc = self
                    .runner
                    .cell(id)
                    .cloned()
                    .ok_or_else(|| format!("{id}: not a cell of this plan"))?;
                self.runner.compile(&[&wc], |_| {});
                let cv = match self.runner.compiled(&wc) {
                    Compiled::Done(cv) => cv,
                    Compiled::Failed(e) => return Err(format!("compile failed: {e}")),
                    Compiled::NotRun => return Err("not compiled".into()),
                };
                let job = self.runner.job(&wc);
                let c = self.runner.plan_cell(&wc);
                let p = &job.points[wc.point];
                let s = &job.shapes[wc.shape];
                let gpu = self.runner.gpu().ok_or("no GPU")?;
                let regime = regime_named(regime);
                let t = time_variant(
                    gpu,
                    job.family,
                    &cv,
                    &c.defines,
                    &s.problem(),
                    regime,
                    &self.cfg,
                )
                .map_err(|e| format!("timing failed: {e}"))?;
                let dyn_smem = c.outcome.as_ref().map(|g| g.dyn_smem).unwrap_or(0);
                let kernel = job
                    .family
                    .validate(&c.defines, &s.problem(), &gpu.limits())
                    .map(|g| g.kernel)
                    .unwrap_or_default();
                let (regs, spill, smem) = match cv.function(&kernel) {
                    Some(f) => (f.registers, f.spill_bytes, f.static_smem),
                    None => (cv.registers, cv.spill_bytes, cv.static_smem),
                };
                let cx = RunCtx {
                    info: &self.info,
                    ceil: &self.ceil,
                    peaks: self.peaks,
                    nvrtc: self.nvrtc.clone(),
                    seed: self.seed,
                    sampler: self.sampler.as_ref(),
                    launches: self.cfg.launches,
                };
                let ident = Ident {
                    kind: KIND_VARIANT,
                    family: job.family.name().to_string(),
                    variant: p.id.clone(),
                    hash: p.hash.clone(),
                    base: p.base.clone(),
                    defines: canonical(&c.defines),
                    shape: s,
                    spec_sha256: job.spec.sha256.clone(),
                    source_sha256: job.source_sha256.clone(),
                    resources: (regs, spill, smem, dyn_smem),
                    instr: roofline::instr_of(job.family.name(), &c.defines),
                    reason: String::new(),
                };
                Ok(TuneAnswer::Time(Box::new(timed_row(&cx, ident, &t))))
            }
        }
    }
}

pub(super) fn nvrtc_string() -> String {
    gemtune_kernels::compile::nvrtc_version()
        .map(|v| format!("{}.{}", v.0, v.1))
        .unwrap_or_else(|e| e.to_string())
}

pub(super) fn check_options(
    arch: gemtune_kernels::compile::Arch,
    a: &Args,
    stop: bool,
) -> CheckOptions {
    CheckOptions {
        arch,
        target: arch.to_string(),
        compile_only: false,
        cache: gemtune_kernels::compile::default_cache_dir(),
        check_max_m: Some(a.check_max_m),
        stop: stop.then(gemtune::interrupt::flag),
    }
}

/// `tune --serve`: plans the same cells and runs the tasks it is handed on
/// the one GPU of `--devices`.
pub(super) fn serve(a: &Args, jobs: &[checker::FamilyJob]) -> anyhow::Result<Exit> {
    let d = a.sweep.devices.first().copied().unwrap_or(0);
    let lim = match Gpu::new(d) {
        Ok(g) => g.limits(),
        Err(e) => {
            gemtune::worker_pool::refuse(&format!("GPU {d}: {e}"))?;
            return Ok(Exit::Infra);
        }
    };
    let opts = check_options(lim.arch, a, false);
    let planned = checker::plan_jobs(jobs, &lim);
    let cells = gemtune::cells::work_cells(jobs, &planned);
    let mut w = match TuneWorker::start(d, jobs, &planned, &cells, &opts, a) {
        Ok(w) => w,
        Err(e) => {
            gemtune::worker_pool::refuse(&e)?;
            return Ok(Exit::Infra);
        }
    };
    let ready = serde_json::json!({ "device": w.info.name, "index": d });
    gemtune::worker_pool::serve(ready, |t: TuneTask| w.handle(&t))?;
    Ok(Exit::Pass)
}

#[cfg(test)]
mod tests {
    use super::super::Args;
    use super::worker_args;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        tune: Args,
    }

    fn parse(args: &[&str]) -> Args {
        match Cli::try_parse_from(std::iter::once("gemtune").chain(args.iter().copied())) {
            Ok(c) => c.tune,
            Err(e) => panic!("{args:?} does not parse: {e}"),
        }
    }

    /// A worker process plans and times the cells its parent hands it, so
    /// it must get every option that changes a plan or a measurement.
    #[test]
    fn a_worker_gets_every_option_that_changes_what_it_measures() {
        let a = parse(&[
            "gemv",
            "--shapes",
            "decode.toml",
            "--variant",
            "split-*",
            "--tokens",
            "1,8",
            "--shape",
            "e4b.",
            "--variants-dir",
            "/tmp/v",
            "--budget-ms",
            "25",
            "--min-reps",
            "7",
            "--max-reps",
            "9",
            "--check-max-m",
            "64",
            "--seed",
            "42",
            "--launches",
            "chained",
        ]);
        let v = worker_args(&a);
        assert_eq!(v.first().map(String::as_str), Some("tune"));
        let strs: Vec<&str> = v[1..].iter().map(String::as_str).collect();
        let w = parse(&strs);
        assert_eq!(w.family, "gemv");
        assert_eq!(w.shapes, ["decode.toml"]);
        assert_eq!(w.variants, ["split-*"]);
        assert_eq!(w.tokens, [1, 8]);
        assert_eq!(w.shape_filter, ["e4b."]);
        assert_eq!(
            w.variants_dir.as_deref(),
            Some(std::path::Path::new("/tmp/v"))
        );
        assert_eq!(w.budget_ms, 25.0);
        assert_eq!(
            (w.min_reps, w.max_reps, w.check_max_m, w.seed),
            (7, 9, 64, 42)
        );
        assert_eq!(w.launches.mode().name(), "chained");
        // The default launch mode travels too.
        let d = worker_args(&parse(&["gemv"]));
        let strs: Vec<&str> = d[1..].iter().map(String::as_str).collect();
        assert_eq!(parse(&strs).launches.mode().name(), "stream");
    }
}
