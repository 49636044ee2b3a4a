//! The report of a `tune` run, once the measurements are done: the vendor
//! references, check.csv, results.csv (L2 rows, then DRAM rows; in each the
//! variants in plan order, then the references), run.json, search.csv,
//! summary.md with its device block, the plots, and `--promote`.

use super::measure::Measured;
use super::rows::{RunCtx, CLOCK_PERIOD};
use super::{references, Args, Session};
use crate::exit::Exit;
use gemtune::checker;
use gemtune::results::{write_csv, TuneRow};
use gemtune::roofline::{self, DevicePeaks};
use gemtune::run_info::RunInfo;
use gemtune_kernels::clocks::ClockSampler;
use gemtune_kernels::gpu::{DeviceInfo, Gpu};
use gemtune_kernels::timing::{measure_ceilings, Ceilings, Launches, TimingConfig};

pub(super) fn write(a: &Args, s: &Session, mut m: Measured) -> anyhow::Result<Exit> {
    let gpu = Gpu::new(s.devices[0].ordinal)?;
    let info = gpu.info().clone();
    let sampler = match ClockSampler::start(&info.pci_bus_id, CLOCK_PERIOD) {
        Ok(c) => Some(c),
        Err(e) => {
            m.notes.push(format!("{e}: rows carry no sampled clocks"));
            None
        }
    };
    let mut check_rows = checker::render_rows(
        &s.jobs,
        &s.planned,
        &s.cells,
        &m.checks,
        &s.opts.target,
        false,
    );
    if a.search.active() && !gemtune::interrupt::requested() {
        for r in check_rows
            .iter_mut()
            .filter(|r| r.verdict == checker::VERDICT_SKIPPED)
        {
            r.reason = format!(
                "not evaluated by the {} search (budget {})",
                a.search.strategy,
                a.search.budget().describe()
            );
        }
    }
    let ceil = measure_ceilings(&gpu)?;
    let peaks = roofline::peaks_for(&info.name, info.cc);
    let cx = RunCtx {
        info: &info,
        ceil: &ceil,
        peaks,
        nvrtc: s.nvrtc.clone(),
        seed: a.seed,
        sampler: sampler.as_ref(),
        launches: a.launches.mode(),
    };
    let cfg = TimingConfig {
        budget_ms: a.budget_ms,
        min_reps: a.min_reps,
        max_reps: a.max_reps,
        launches: a.launches.mode(),
        ..TimingConfig::default()
    };
    let refs = references::run(a, s, &gpu, &cx, &cfg, &mut m.notes);
    check_rows.extend(refs.checks);
    write_csv(&s.out.join("check.csv"), &check_rows)?;
    let outcome = checker::outcome_of(check_rows, false);
    let searched = m.search.is_some();
    crate::cmd::check::print_table(
        &outcome
            .rows
            .iter()
            .filter(|r| r.verdict != "pass" && r.verdict != "rejected")
            // The cells no search chose are listed in check.csv, not here.
            .filter(|r| !(searched && r.verdict == checker::VERDICT_SKIPPED))
            .cloned()
            .collect::<Vec<_>>(),
    );
    let check_exit = crate::cmd::check::verdict(&outcome);

    let mut rows: Vec<TuneRow> = Vec::new();
    for &rn in &s.regimes {
        for wc in &s.cells {
            if let Some(r) = m.timed.get(&(wc.id.clone(), rn.to_string())) {
                rows.push(r.clone());
            }
        }
        rows.extend(
            refs.timed
                .iter()
                .filter(|(r, _)| r == rn)
                .map(|(_, row)| row.clone()),
        );
    }
    gemtune::report::flag_throttled(&mut rows);
    write_csv(&s.out.join("results.csv"), &rows)?;
    run_info(a, s, &m).write(&s.out)?;
    if let Some((_, done)) = &m.search {
        write_csv(&s.out.join("search.csv"), done)?;
    }

    let mut device_block = device_block(a, s, &info, sampler.as_ref(), &ceil, peaks, &refs.library);
    if let Some((line, _)) = &m.search {
        device_block.push(("search".into(), line.clone()));
    }
    let mut md = gemtune::report::summary_md(&gemtune::report::SummaryInput {
        title: format!("gemtune tune {}", a.family),
        device_block,
        rows: &rows,
        checks: &outcome.rows,
        notes: m.notes.clone(),
    });
    if let Some((_, done)) = &m.search {
        md.push('\n');
        md.push_str(&super::search::section(done));
    }
    std::fs::write(s.out.join("summary.md"), md)?;
    let heat_axes: Vec<(String, String, String)> = s
        .jobs
        .iter()
        .filter_map(|j| {
            j.spec
                .sweeps
                .iter()
                .find(|sw| sw.axes.len() >= 2)
                .map(|sw| {
                    (
                        j.family.name().to_string(),
                        sw.axes[0].name.clone(),
                        sw.axes[1].name.clone(),
                    )
                })
        })
        .collect();
    if let Err(e) = gemtune::report::write_plots(&s.out, &rows, &heat_axes) {
        eprintln!("warning: plots: {e:#}");
    }
    let was_interrupted = gemtune::interrupt::requested();
    if a.promote && was_interrupted {
        eprintln!("not promoting: the run was interrupted");
    }
    if a.promote && !was_interrupted && !rows.is_empty() {
        let arch = s.lim.arch;
        let path = s.vdir.join("tuned").join(format!("{arch}.toml"));
        let winners = gemtune::tuned::select_winners(&rows, &s.out.display().to_string());
        let n = winners.len();
        gemtune::tuned::promote(&path, &arch.to_string(), winners)?;
        eprintln!("promoted {n} winners into {}", path.display());
    }
    eprintln!("wrote {}", s.out.display());
    for n in &m.notes {
        eprintln!("note: {n}");
    }
    if was_interrupted {
        return Ok(Exit::Interrupted);
    }
    Ok(check_exit)
}

/// run.json: what ran, on what, and how many cells are finished (checked
/// and failed, or timed in every regime).
fn run_info(a: &Args, s: &Session, m: &Measured) -> RunInfo {
    RunInfo {
        command: "tune".into(),
        compile_only: false,
        target: s.opts.target.clone(),
        nvrtc: s.nvrtc.clone(),
        params: s.key.params.clone(),
        source_sha256: s
            .jobs
            .iter()
            .map(|j| (j.family.name().to_string(), j.source_sha256.clone()))
            .collect(),
        devices: s
            .devices
            .iter()
            .map(crate::cmd::check::device_entry)
            .collect(),
        shards: a.sweep.shard.into_iter().collect(),
        cells: s.cells.len(),
        finished: s
            .cells
            .iter()
            .filter(|c| {
                m.checks.get(&c.id).is_some_and(|r| r.verdict != "pass")
                    || s.regimes
                        .iter()
                        .all(|r| m.timed.contains_key(&(c.id.clone(), r.to_string())))
            })
            .count(),
    }
}

/// The summary's device block: the GPU, its measured ceilings and peaks,
/// the clock sampling, the vendor library and how the timing ran.
fn device_block(
    a: &Args,
    s: &Session,
    info: &DeviceInfo,
    sampler: Option<&ClockSampler>,
    ceil: &Ceilings,
    peaks: Option<&'static DevicePeaks>,
    library: &str,
) -> Vec<(String, String)> {
    vec![
        ("device".to_string(), info.name.clone()),
        ("compute capability".into(), format!("{}.{}", info.cc.0, info.cc.1)),
        ("SMs".into(), info.sm_count.to_string()),
        ("L2".into(), format!("{} B", info.l2_bytes)),
        ("SM clock (max)".into(), format!("{} MHz", info.clock_mhz)),
        ("memory clock".into(), format!("{} MHz", info.mem_clock_mhz)),
        ("driver".into(), match sampler {
            Some(c) => format!("{} (CUDA {})", c.facts().driver, info.driver_version),
            None => format!("CUDA {}", info.driver_version),
        }),
        ("PCI bus id".into(), info.pci_bus_id.clone()),
        ("GPUs".into(), s
            .devices
            .iter()
            .map(|i| format!("{} ({})", i.ordinal, i.pci_bus_id))
            .collect::<Vec<_>>()
            .join(", ")
            + "; each row names its GPU (device_index, pci_bus_id)"),
        ("clock sampling".into(), match sampler {
            Some(c) => {
                let f = c.facts();
                let opt = |v: Option<u32>| v.map_or("?".to_string(), |x| x.to_string());
                format!(
                    "NVML {} every {} ms during each row's measured samples, read-only (clocks are never set); max SM {} MHz, max memory {} MHz, power limit {}",
                    f.nvml_version,
                    c.period().as_millis(),
                    opt(f.max_sm_mhz),
                    opt(f.max_mem_mhz),
                    f.power_limit_w.map_or("?".to_string(), |w| format!("{w:.0} W"))
                )
            }
            None => "not sampled: NVML (libnvidia-ml.so.1) could not be loaded".into(),
        }),
        ("vendor references".into(), library.to_string()),
        ("NVRTC".into(), s.nvrtc.clone()),
        ("HBM read (measured)".into(), format!("{:.0} GB/s", ceil.hbm_read_gbps)),
        ("L2 read (measured)".into(), format!("{:.0} GB/s", ceil.l2_read_gbps)),
        (
            "launch floor (measured)".into(),
            format!(
                "{:.2} us per launch (an empty kernel, one block per SM, enqueued back to back); {:.2} us replayed from a graph, {:.2} us chained in the graph",
                ceil.launch_floor_us, ceil.graph_launch_floor_us, ceil.chained_launch_floor_us
            ),
        ),
        (
            "instruction peaks".into(),
            peaks.map_or("none known for this device: % of roof uses bandwidth only".to_string(), |p| {
                format!(
                    "mma.s8 {:.0} TOPS, mma.f16 {:.0} TFLOP/s, dp4a {:.0} TOPS, ffma {:.0} TFLOP/s; wgmma and reference rows: tc.bf16 {:.0} TFLOP/s, tc.s8 {:.0} TOPS ({})",
                    p.mma_s8 / 1e12,
                    p.mma_f16 / 1e12,
                    p.dp4a / 1e12,
                    p.ffma / 1e12,
                    p.dense_bf16 / 1e12,
                    p.dense_s8 / 1e12,
                    p.source
                )
            }),
        ),
        (
            "timing".into(),
            format!(
                "CUDA events, budget {} ms/cell, {}..{} samples, bootstrap CI seed {:#x}; launches: {}; correctness of m > {} checked at m = {}",
                a.budget_ms,
                a.min_reps,
                a.max_reps,
                a.seed,
                match a.launches.mode() {
                    Launches::Stream => "stream (one enqueue per call)",
                    Launches::Graph => "graph (each sample's calls captured once into a CUDA graph and replayed)",
                    Launches::Chained => "chained (each sample's calls captured into a CUDA graph, every launch after a kernel a programmatic dependent of it)",
                },
                a.check_max_m,
                a.check_max_m
            ),
        ),
    ]
}
