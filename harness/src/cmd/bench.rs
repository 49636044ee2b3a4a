//! `gemtune bench`: prompt processing and generation speed with llama-bench's
//! definitions, so the numbers sit beside llama.cpp's on the same GPU.
//!
//! - `ppN`: a prompt of N random tokens processed from the given depth (the
//!   context already filled, untimed), logits for the last token only;
//!   t/s = N / time.
//! - `tgN`: N single-token decode steps from the depth (random tokens fed
//!   back, as llama-bench does); t/s = N / time.
//! - Each test runs once to warm up, then `-r` timed repetitions; the table
//!   shows mean ± sample standard deviation of t/s.
//! - tg rows also carry the accounting of a decode step
//!   (`gemtune_engine::step_bytes`): the bytes it must move (mean over the
//!   row's steps), the floor time of those bytes at the memory rate
//!   (measured on the GPU at start with the stream-read kernel of
//!   `kernels::timing::measure_ceilings`, or `--hbm-gbps`), and the share
//!   of that floor the measured step reaches (`floor_pct`). The CPU rows
//!   get no floor unless `--hbm-gbps` names a rate.
//! - Every row states its work: the ubatch (tokens per forward chunk) and
//!   the GFLOP per token the engine computed (`gemtune_engine::work`). By
//!   default the layers that write no KV cache (E2B/E4B's shared layers)
//!   run only the rows whose logits are wanted, which is exact;
//!   `--full-work` runs every layer over every row, the work of engines
//!   without that trim (its rows are labelled `full`).
//! - `--profile-phases` runs each test once more after its timed reps, with
//!   GPU time per phase measured: prefill eagerly, decode through a timed
//!   copy of the decode graph (`engine::cuda::phases`); the tg table adds
//!   the step's wall time, the gap (wall time less the phases) and the
//!   untimed step of the reps beside the timed one.
//!
//! Without `-m`, the synthetic e4b q8_0 model is written once into the
//! scratch directory and reused. `--worker` serves `ab`: a JSON-lines
//! protocol on stdin/stdout (`docs/ab-worker.md`).

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use gemtune::results::BenchRow;
use gemtune_engine::config::Gemma4Config;
use gemtune_engine::engine::{Engine, PhaseTimes};
use gemtune_engine::forward::{LogitRows, Logits};
use gemtune_engine::model::Model;
use gemtune_engine::synth::{synth_to_file, SynthOptions, SynthVariant, WeightType};
use gemtune_engine::work::{forward_work, RowWork};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::cli;
use crate::engine_opts::{build_engine, gpu_status, resolve_backend, Backend, CudaArgs};
use crate::exit::Exit;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Md,
    Csv,
    Json,
}

#[derive(clap::Args)]
pub struct Args {
    /// GGUF model (default: synthetic e4b q8_0, written once into the scratch directory).
    #[arg(short = 'm', long)]
    pub model: Option<PathBuf>,
    /// Prompt lengths, comma-separated (0 skips the prompt tests).
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_delimiter = ',',
        default_value = "512,2048",
        value_parser = cli::count
    )]
    pub n_prompt: Vec<usize>,
    /// Generated tokens (0 skips the generation test).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128, value_parser = cli::count)]
    pub n_gen: usize,
    /// Context depth already filled before each test.
    #[arg(short = 'd', long = "depth", default_value_t = 0, value_parser = cli::count)]
    pub depth: usize,
    /// Timed repetitions per test (after one warm-up).
    #[arg(short = 'r', long = "repetitions", default_value_t = 5, value_parser = cli::positive_u64)]
    pub reps: u64,
    /// Prefill chunk (tokens per forward pass).
    #[arg(long, default_value_t = gemtune_engine::cuda::DEFAULT_UBATCH as u64, value_parser = cli::positive_u64)]
    pub ubatch: u64,
    /// Forward implementation.
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    pub backend: Backend,
    #[command(flatten)]
    pub cuda: CudaArgs,
    /// Output format on stdout.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Md)]
    pub output: Output,
    /// Seed of the random prompt tokens.
    #[arg(long, default_value_t = 1, value_parser = cli::seed)]
    pub seed: u64,
    /// Serve `ab` over stdin/stdout (JSON lines) instead of running tests.
    #[arg(long)]
    pub worker: bool,
    /// Memory rate in GB/s for the tg rows' floor, instead of the HBM read
    /// rate measured on the GPU at start (the CPU backend measures none).
    #[arg(long, value_parser = cli::positive_f64)]
    pub hbm_gbps: Option<f64>,
}

/// `-m MODEL`, or the synthetic e4b q8_0 written once into the scratch dir.
pub fn model_path(m: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(p) = m {
        return Ok(p.to_path_buf());
    }
    let dir = gemtune::scratch::scratch_dir().join("models");
    let p = dir.join("e4b-q8_0-seed0.gguf");
    if !p.is_file() {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        eprintln!(
            "bench: no -m given; writing the synthetic e4b q8_0 model to {} (once)",
            p.display()
        );
        let tmp = dir.join("e4b-q8_0-seed0.gguf.partial");
        let _tracked = gemtune::interrupt::track_temp(tmp.clone());
        synth_to_file(
            SynthVariant::E4b,
            WeightType::Q8_0,
            &tmp,
            SynthOptions::default(),
        )
        .inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
        .context("writing the synthetic e4b q8_0 model")?;
        std::fs::rename(&tmp, &p).with_context(|| format!("renaming into {}", p.display()))?;
    } else {
        eprintln!("bench: using the cached synthetic model {}", p.display());
    }
    Ok(p)
}

fn random_tokens(rng: &mut ChaCha8Rng, n: usize, vocab: usize) -> Vec<u32> {
    // Skip the special ids at the bottom of the vocabulary.
    let lo = 256.min(vocab.saturating_sub(1)) as u32;
    (0..n).map(|_| rng.random_range(lo..vocab as u32)).collect()
}

/// One timed run of a test; returns (seconds, tokens).
fn run_once(
    e: &mut dyn Engine,
    rng: &mut ChaCha8Rng,
    n_prompt: usize,
    n_gen: usize,
    depth: usize,
) -> anyhow::Result<(f64, f64)> {
    let vocab = e.model().vocab_size();
    e.reset();
    if depth > 0 {
        let fill = random_tokens(rng, depth, vocab);
        e.forward(&fill, LogitRows::None)?;
    }
    // Phases, when measured, are the timed part's only.
    let _ = e.take_phases();
    let mut pp = 0.0;
    if n_prompt > 0 {
        let prompt = random_tokens(rng, n_prompt, vocab);
        let t = Instant::now();
        e.forward(&prompt, LogitRows::Last)?;
        pp = t.elapsed().as_secs_f64();
    }
    let mut tg = 0.0;
    if n_gen > 0 {
        let toks = random_tokens(rng, n_gen, vocab);
        // One logits row reused by every step, as a decode loop keeps it.
        let mut logits = Logits::default();
        let t = Instant::now();
        for &tok in &toks {
            e.forward_into(&[tok], LogitRows::Last, &mut logits)?;
        }
        tg = t.elapsed().as_secs_f64();
    }
    Ok((pp, tg))
}

fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n.max(1.0);
    let var = if v.len() > 1 {
        v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (m, var.sqrt())
}

struct ModelFacts {
    name: String,
    bytes: u64,
    params: u64,
    wtype: String,
}

fn facts(model: &Model, path: &Path) -> ModelFacts {
    let f = model.file();
    let params: u64 = f.tensors().iter().map(|t| t.n_elements()).sum();
    let name = model.config().name.clone().unwrap_or_else(|| {
        path.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    });
    let wtype = model
        .weights()
        .layers
        .first()
        .map(|l| l.ffn_up.ty.name().to_ascii_uppercase())
        .unwrap_or_default();
    ModelFacts {
        name,
        bytes: f.file_len(),
        params,
        wtype,
    }
}

fn gpu_name(backend: &str) -> String {
    if backend == "cuda" {
        gemtune_kernels::gpu::Gpu::new(0)
            .map(|g| g.info().name.clone())
            .unwrap_or_default()
    } else {
        "cpu".into()
    }
}

/// Refuses, before anything is written, a bench that measures the CUDA
/// engine where no GPU can run it: `--backend cuda`, and the synthetic
/// E4B default (no `-m`) whatever the backend, since that 7.5 GB file
/// exists to measure the GPU. `--backend cpu -m MODEL` stays a choice.
fn check_gpu(args: &Args) -> anyhow::Result<()> {
    let Err(why) = gpu_status(args.cuda.device()) else {
        return Ok(());
    };
    if args.model.is_none() {
        bail!(
            "bench without -m measures the CUDA engine on a synthetic E4B, and this machine has {why}; the CPU engine takes --backend cpu -m MODEL.gguf"
        );
    }
    if args.backend == Backend::Cuda {
        bail!("--backend cuda: {why}");
    }
    Ok(())
}

pub fn run(args: Args) -> anyhow::Result<Exit> {
    if let Err(e) = gemtune::interrupt::install(gemtune::interrupt::Mode::Exit) {
        eprintln!("warning: {e}");
    }
    check_gpu(&args)?;
    // A bad profile or tuned table fails before the model is written.
    crate::engine_opts::load_choices(&args.cuda)?;
    let (backend, fell_back) = resolve_backend(args.backend, args.cuda.device());
    if let Some(why) = fell_back {
        eprintln!("bench: --backend auto found no GPU ({why}): measuring the CPU engine");
    }
    let path = model_path(args.model.as_deref())?;
    let model = Model::load(&path).with_context(|| format!("loading {}", path.display()))?;
    let max_p = args.n_prompt.iter().copied().max().unwrap_or(0);
    let mut need = args.depth + max_p.max(args.n_gen) + 1;
    let ctx = model.config().context_length;
    // A worker's request runs the decode steps after the prompt, in one
    // sequence. It holds what the model allows and says so in its ready
    // line; a request that needs more is refused then.
    if args.worker {
        need = (args.depth + max_p + args.n_gen + 1).min(ctx);
    }
    if need > ctx {
        bail!(
            "depth {} + the longest test need {need} positions; the model's context holds {ctx}",
            args.depth
        );
    }
    let ubatch = (args.ubatch as usize).min(need);
    // The memory rate of the floor, before the engine takes device memory.
    let hbm = if args.worker || args.n_gen == 0 {
        None
    } else {
        memory_rate(&args, backend)
    };
    let mut engine = build_engine(&model, backend, &args.cuda, need, ubatch, ubatch)?;
    if let Some(n) = engine.conversion_notice() {
        eprintln!("bench: {n}");
    }
    if args.worker {
        return worker(engine.as_mut(), &model, &path, &args);
    }
    // Phases are measured in a pass of their own after each test's reps.
    let profile_phases = args.cuda.profile_phases && engine.set_phases(false);
    let mf = facts(&model, &path);
    let backend_name = engine.backend().to_string();
    let gpu = gpu_name(&backend_name);
    let profile = if backend_name == "cuda" {
        args.cuda.profile.clone()
    } else {
        "-".into()
    };
    let mut tests: Vec<(String, usize, usize)> = args
        .n_prompt
        .iter()
        .filter(|&&p| p > 0)
        .map(|&p| (format!("pp{p}"), p, 0))
        .collect();
    if args.n_gen > 0 {
        tests.push((format!("tg{}", args.n_gen), 0, args.n_gen));
    }
    let reads = engine.step_reads();
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    let mut results = Vec::new();
    let row_work = args.cuda.row_work();
    for (name, p, g) in &tests {
        let mut label = if args.depth > 0 {
            format!("{name} @ d{}", args.depth)
        } else {
            name.clone()
        };
        if row_work == RowWork::Full {
            label.push_str(" full");
        }
        eprintln!("bench: {label}: warm-up");
        run_once(engine.as_mut(), &mut rng, *p, *g, args.depth)?;
        let mut tps = Vec::new();
        for r in 0..args.reps {
            let (pp, tg) = run_once(engine.as_mut(), &mut rng, *p, *g, args.depth)?;
            let v = if *p > 0 {
                *p as f64 / pp
            } else {
                *g as f64 / tg
            };
            eprintln!("bench: {label}: rep {}/{}: {v:.2} t/s", r + 1, args.reps);
            tps.push(v);
        }
        let (m, sd) = mean_sd(&tps);
        if profile_phases {
            let (phases, wall_s) = profiled_pass(engine.as_mut(), &mut rng, *p, *g, args.depth)?;
            if *g > 0 {
                print_decode_phases(&label, &phases, wall_s * 1e3 / *g as f64, 1e3 / m, *g);
            } else {
                eprintln!("bench: {label} phases: eager prefill, GPU ms for the {p}-token pass:");
                crate::engine_opts::print_phase_table(&phases, 1.0);
            }
        }
        let step = (*g > 0)
            .then(|| reads.map(|r| r.mean_step(model.config(), args.depth, *g)))
            .flatten();
        let floor_ms = step.zip(hbm).map(|(s, gbps)| s.floor_ms(gbps));
        let gflop = test_gflop_per_token(model.config(), *p, *g, args.depth, ubatch, row_work);
        results.push(BenchRow {
            schema_version: gemtune::results::BENCH_SCHEMA_VERSION,
            kind: gemtune::results::KIND_BENCH.into(),
            model: mf.name.clone(),
            model_bytes: mf.bytes,
            params: mf.params,
            wtype: mf.wtype.clone(),
            backend: backend_name.clone(),
            profile: profile.clone(),
            gpu: gpu.clone(),
            test: label,
            n_prompt: *p,
            n_gen: *g,
            depth: args.depth,
            ubatch,
            reps: tps.len(),
            tps_mean: m,
            tps_sd: sd,
            tps_min: tps.iter().copied().fold(f64::INFINITY, f64::min),
            tps_max: tps.iter().copied().fold(0.0, f64::max),
            samples: tps
                .iter()
                .map(|v| format!("{v}"))
                .collect::<Vec<_>>()
                .join(";"),
            step_bytes: step.map(|s| s.total()),
            step_kv_bytes: step.map(|s| s.kv()),
            hbm_gbps: step.and(hbm),
            floor_ms,
            // The step takes 1000 / m ms.
            floor_pct: floor_ms.map(|f| f * m / 10.0),
            row_work: row_work.name().into(),
            gflop_per_token: Some(gflop),
        });
    }
    let mut out = std::io::stdout().lock();
    match args.output {
        Output::Md => {
            writeln!(
                out,
                "| model | size | params | backend | profile | gpu | test | ubatch | t/s | GFLOP/t | TFLOP/s | step MB | floor ms | floor % |"
            )?;
            writeln!(
                out,
                "| --- | ---: | ---: | --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
            )?;
            let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
            for r in &results {
                writeln!(
                    out,
                    "| {} {} | {:.2} GiB | {} | {} | {} | {} | {} | {} | {:.2} ± {:.2} | {} | {} | {} | {} | {} |",
                    r.model,
                    r.wtype,
                    r.model_bytes as f64 / (1u64 << 30) as f64,
                    crate::cmd::info::format_params(r.params),
                    r.backend,
                    r.profile,
                    r.gpu,
                    r.test,
                    r.ubatch,
                    r.tps_mean,
                    r.tps_sd,
                    or_dash(r.gflop_per_token.map(|g| format!("{g:.2}"))),
                    or_dash(r.gflop_per_token.map(|g| format!("{:.1}", g * r.tps_mean / 1e3))),
                    or_dash(r.step_bytes.map(|b| format!("{:.1}", b as f64 / 1e6))),
                    or_dash(r.floor_ms.map(|f| format!("{f:.4}"))),
                    or_dash(r.floor_pct.map(|f| format!("{f:.1}"))),
                )?;
            }
            let trimmed = results
                .iter()
                .any(|r| r.row_work == RowWork::Trimmed.name())
                && model.config().compact_from() < model.config().n_layers;
            writeln!(
                out,
                "\nGFLOP/t: the work the engine computed per token (weight matmuls of the rows each layer ran, attention over the keys each query sees, the head for the wanted rows); TFLOP/s: that work at the measured rate.{}",
                if trimmed {
                    format!(
                        " Layers {}..{} (no KV cache written) ran only the rows whose logits are wanted; --full-work runs every row, as engines without that trim do.",
                        model.config().compact_from(),
                        model.config().n_layers - 1
                    )
                } else {
                    String::new()
                }
            )?;
            if let Some(g) = results.iter().find_map(|r| r.hbm_gbps) {
                writeln!(
                    out,
                    "\nstep MB: bytes a decode step must move (weights it uses, KV read and written, logits); floor: those bytes at {g:.0} GB/s; floor %: floor / measured step time."
                )?;
            }
        }
        Output::Csv => {
            let mut w = csv::Writer::from_writer(out);
            for r in &results {
                w.serialize(r)?;
            }
            w.flush()?;
        }
        Output::Json => {
            serde_json::to_writer_pretty(&mut out, &results)?;
            writeln!(out)?;
        }
    }
    Ok(Exit::Pass)
}

/// GFLOP per token of a test as the engine runs it (`work::forward_work`):
/// a pp test's prompt from `depth` in chunks of `ubatch`, the last row's
/// logits wanted; a tg test's steps from `depth`, one token each.
fn test_gflop_per_token(
    cfg: &Gemma4Config,
    n_prompt: usize,
    n_gen: usize,
    depth: usize,
    ubatch: usize,
    row_work: RowWork,
) -> f64 {
    if n_prompt > 0 {
        return forward_work(cfg, depth, n_prompt, ubatch, LogitRows::Last, row_work)
            .gflop_per_token(n_prompt);
    }
    let total: f64 = (0..n_gen)
        .map(|i| forward_work(cfg, depth + i, 1, ubatch, LogitRows::Last, row_work).total_flop())
        .sum();
    total / 1e9 / n_gen.max(1) as f64
}

/// The memory rate of the tg rows' floor, GB/s: `--hbm-gbps`, else the
/// HBM read rate measured on the GPU (the CUDA backend); None on the CPU
/// backend without `--hbm-gbps`, or when the measurement fails (said on
/// stderr: the rows then carry no floor rather than a guess).
fn memory_rate(args: &Args, backend: Backend) -> Option<f64> {
    if let Some(g) = args.hbm_gbps {
        eprintln!("bench: floor at --hbm-gbps {g} GB/s");
        return Some(g);
    }
    if backend != Backend::Cuda {
        return None;
    }
    let measured = gemtune_kernels::gpu::Gpu::new(args.cuda.device())
        .and_then(|gpu| gemtune_kernels::measure_ceilings(&gpu));
    match measured {
        Ok(c) => {
            eprintln!(
                "bench: HBM read rate {:.0} GB/s (stream kernel over {:.2} GiB, median of 20 passes; --hbm-gbps overrides): the tg rows' floor",
                c.hbm_read_gbps,
                c.hbm_buffer_bytes as f64 / (1u64 << 30) as f64
            );
            Some(c.hbm_read_gbps)
        }
        Err(e) => {
            eprintln!("bench: could not measure the HBM read rate ({e}); the tg rows get no floor (--hbm-gbps sets one)");
            None
        }
    }
}

/// One more pass of a test with phases measured, after a warm-up pass
/// with them (which captures the timed decode graph): the phases of the
/// measured pass's timed part, and its wall time in seconds.
fn profiled_pass(
    e: &mut dyn Engine,
    rng: &mut ChaCha8Rng,
    n_prompt: usize,
    n_gen: usize,
    depth: usize,
) -> anyhow::Result<(PhaseTimes, f64)> {
    e.set_phases(true);
    let pass = (|| -> anyhow::Result<(PhaseTimes, f64)> {
        run_once(e, rng, n_prompt, n_gen, depth)?;
        let (pp, tg) = run_once(e, rng, n_prompt, n_gen, depth)?;
        Ok((e.take_phases().unwrap_or_default(), pp + tg))
    })();
    e.set_phases(false);
    pass
}

/// The decode phase table of a tg test (stderr), per step: GPU time per
/// phase, their sum, the replays' span, the timed and untimed step wall
/// times and the gap between the step and its phases.
fn print_decode_phases(label: &str, p: &PhaseTimes, step_ms: f64, untimed_ms: f64, n: usize) {
    let graph = p.graph_steps > 0;
    eprintln!(
        "bench: {label} phases: {}, GPU ms per step:",
        if graph {
            "graph decode (event-record nodes in a timed copy of the decode graph)"
        } else {
            "eager decode (--no-graph)"
        }
    );
    crate::engine_opts::print_phase_table(p, n as f64);
    let sum = p.total_ms() / n as f64;
    let line = |what: &str, ms: f64, note: &str| eprintln!("{what:<14} {ms:>12.4}   {note}");
    if graph {
        line(
            "graph replay",
            p.graph_ms / p.graph_steps as f64,
            "GPU span of a replay, from events around its launch",
        );
    }
    line("step (timed)", step_ms, "wall time per step, host clock");
    line(
        "gap",
        step_ms - sum,
        "step (timed) - sum of phases: input upload, graph launch, logits copy, idle",
    );
    line(
        "step (untimed)",
        untimed_ms,
        &format!(
            "the row's mean step; timing phases costs {:+.1} %",
            100.0 * (step_ms / untimed_ms - 1.0)
        ),
    );
}

fn phases_json(p: &Option<PhaseTimes>) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    if let Some(p) = p {
        for (name, ms, _) in &p.phases {
            m.insert(name.clone(), serde_json::json!(ms));
        }
    }
    serde_json::Value::Object(m)
}

/// The `ab` worker: JSON lines on stdin, one reply line each on stdout.
fn worker(e: &mut dyn Engine, model: &Model, path: &Path, args: &Args) -> anyhow::Result<Exit> {
    let mf = facts(model, path);
    let backend = e.backend().to_string();
    let mut out = std::io::stdout().lock();
    let gpu = if backend == "cuda" {
        gemtune_kernels::gpu::Gpu::new(args.cuda.device())
            .map(|g| {
                let i = g.info();
                serde_json::json!({"name": i.name, "driver": i.driver_version.to_string(), "sm_count": i.sm_count})
            })
            .unwrap_or_else(|_| serde_json::json!({}))
    } else {
        serde_json::json!({"name": "cpu"})
    };
    let slots: serde_json::Map<String, serde_json::Value> = e
        .describe()
        .into_iter()
        .filter_map(|l| {
            // "slot: family defines <- why": the slot's kernel, without the
            // provenance, so that an arm's unchanged slots compare equal.
            let (kernel, _why) = l.split_once(" <- ")?;
            let (slot, kernel) = kernel.split_once(": ")?;
            Some((slot.to_string(), serde_json::json!(kernel.trim())))
        })
        .collect();
    let ready = serde_json::json!({
        "ready": true,
        "version": env!("CARGO_PKG_VERSION"),
        "git": option_env!("GEMTUNE_GIT_SHA").unwrap_or(""),
        "model": {"path": path.display().to_string(), "name": mf.name, "wtype": mf.wtype, "bytes": mf.bytes, "params": mf.params},
        "backend": backend,
        "profile": args.cuda.profile,
        "ctx": e.max_seq(),
        "gpu": gpu,
        "slots": slots,
    });
    writeln!(out, "{ready}")?;
    out.flush()?;
    let sampler = gemtune_kernels::clocks::ClockSampler::start(
        &gemtune_kernels::gpu::Gpu::new(args.cuda.device())
            .map(|g| g.info().pci_bus_id.clone())
            .unwrap_or_default(),
        std::time::Duration::from_millis(20),
    )
    .ok();
    let stdin = std::io::stdin();
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    for line in stdin.lock().lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let reply = match serde_json::from_str::<serde_json::Value>(&line) {
            Err(err) => serde_json::json!({"ok": false, "error": format!("not JSON: {err}")}),
            Ok(req) => match req.get("op").and_then(|v| v.as_str()) {
                Some("quit") => break,
                Some("logits") => worker_logits(e, &req).unwrap_or_else(
                    |err| serde_json::json!({"ok": false, "error": format!("{err:#}")}),
                ),
                Some("bench") => {
                    let t0 = gemtune_kernels::clocks::now_s();
                    match worker_bench(e, &req, &mut rng) {
                        Ok(mut v) => {
                            let t1 = gemtune_kernels::clocks::now_s();
                            if let Some(s) = &sampler {
                                if let Some(w) = s.window(t0, t0, t1) {
                                    v["clocks"] = serde_json::json!({
                                        "sm_mhz_min": w.sm_min_mhz,
                                        "sm_mhz_mean": w.sm_mean_mhz,
                                        "mem_mhz": w.mem_min_mhz,
                                        "temp_c_max": w.temp_max_c,
                                        "power_w_max": w.power_max_w,
                                        "throttle": gemtune_kernels::clocks::reason_names(w.reasons),
                                    });
                                }
                            }
                            v
                        }
                        Err(err) => serde_json::json!({"ok": false, "error": format!("{err:#}")}),
                    }
                }
                other => serde_json::json!({"ok": false, "error": format!("unknown op {other:?}")}),
            },
        };
        writeln!(out, "{reply}")?;
        out.flush()?;
    }
    Ok(Exit::Pass)
}

fn worker_logits(e: &mut dyn Engine, req: &serde_json::Value) -> anyhow::Result<serde_json::Value> {
    let tokens: Vec<u32> = req
        .get("tokens")
        .and_then(|t| t.as_array())
        .context("logits: `tokens` must be an array of ids")?
        .iter()
        .map(|v| {
            v.as_u64()
                .map(|x| x as u32)
                .context("logits: token ids must be integers")
        })
        .collect::<anyhow::Result<_>>()?;
    let rows = match req.get("rows").and_then(|v| v.as_str()).unwrap_or("last") {
        "all" => LogitRows::All,
        "last" => LogitRows::Last,
        other => bail!("logits: rows must be \"all\" or \"last\", not {other:?}"),
    };
    let path = req
        .get("path")
        .and_then(|v| v.as_str())
        .context("logits: `path` is required")?;
    e.reset();
    let l = e.forward(&tokens, rows)?;
    let mut bytes = Vec::with_capacity(l.data.len() * 4);
    for v in &l.data {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    std::fs::write(path, bytes).with_context(|| format!("writing {path}"))?;
    Ok(serde_json::json!({"ok": true, "rows": l.n_rows(), "vocab": l.vocab}))
}

fn worker_bench(
    e: &mut dyn Engine,
    req: &serde_json::Value,
    rng: &mut ChaCha8Rng,
) -> anyhow::Result<serde_json::Value> {
    let get = |k: &str| req.get(k).and_then(|v| v.as_u64()).unwrap_or(0) as usize;
    let (p, g, d) = (get("n_prompt"), get("n_gen"), get("depth"));
    if p + g + d + 1 > e.max_seq() {
        bail!(
            "bench: depth + prompt + generation = {} exceeds the worker's context of {}",
            p + g + d,
            e.max_seq()
        );
    }
    // A backend that cannot time phases answers without them.
    let want_phases =
        req.get("phases").and_then(|v| v.as_bool()).unwrap_or(false) && e.set_phases(true);
    let vocab = e.model().vocab_size();
    if want_phases && g > 0 {
        // One decode step first, untimed: it captures the timed decode
        // graph (once per worker), which the timed steps then only replay.
        e.reset();
        e.forward(&[2], LogitRows::Last)?;
    }
    let _ = e.take_phases();
    e.reset();
    if d > 0 {
        e.forward(&random_tokens(rng, d, vocab), LogitRows::None)?;
    }
    let _ = e.take_phases();
    let mut v = serde_json::json!({"ok": true});
    if p > 0 {
        let prompt = random_tokens(rng, p, vocab);
        let t = Instant::now();
        e.forward(&prompt, LogitRows::Last)?;
        let s = t.elapsed().as_secs_f64();
        v["pp_ms"] = serde_json::json!(s * 1e3);
        v["pp_tps"] = serde_json::json!(p as f64 / s);
    }
    let pp_phases = e.take_phases();
    if g > 0 {
        let toks = random_tokens(rng, g, vocab);
        let mut logits = Logits::default();
        let t = Instant::now();
        for &tok in &toks {
            e.forward_into(&[tok], LogitRows::Last, &mut logits)?;
        }
        let s = t.elapsed().as_secs_f64();
        v["tg_ms"] = serde_json::json!(s * 1e3);
        v["tg_tps"] = serde_json::json!(g as f64 / s);
    }
    let mut tg_phases = e.take_phases();
    if let Some(tp) = tg_phases.as_mut() {
        for ph in tp.phases.iter_mut() {
            ph.1 /= g.max(1) as f64;
        }
    }
    if want_phases {
        v["phases"] = serde_json::json!({"prefill": phases_json(&pp_phases), "decode": phases_json(&tg_phases)});
        e.set_phases(false);
    }
    Ok(v)
}
