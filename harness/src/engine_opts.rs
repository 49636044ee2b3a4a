//! The engine flags `run`, `logits` and `bench` share, and the one place
//! that turns them into an engine (CPU or CUDA) behind `Engine`.
//!
//! The kernel profile and the tuned table are read and checked on every
//! backend: the CPU engine never launches a kernel, but a profile that the
//! CUDA engine would refuse is refused here too (`crate::choices`), so a
//! typo fails the same way on a laptop as on the GPU host.

use std::path::PathBuf;

use anyhow::bail;
use gemtune_engine::cpu::{CpuEngine, CpuOptions};
use gemtune_engine::cuda::{CudaEngine, CudaOptions};
use gemtune_engine::engine::{Engine, PhaseTimes};
use gemtune_engine::model::Model;
use gemtune_engine::profile::Profile;
use gemtune_engine::tuned::TunedFile;
use gemtune_engine::work::RowWork;
use gemtune_kernels::family::KvType;

/// Which forward implementation runs the model.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Cpu,
    Cuda,
    /// CUDA when a GPU is present, else the CPU.
    Auto,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvTypeArg {
    F16,
    Bf16,
    F32,
}

impl From<KvTypeArg> for KvType {
    fn from(k: KvTypeArg) -> KvType {
        match k {
            KvTypeArg::F16 => KvType::F16,
            KvTypeArg::Bf16 => KvType::Bf16,
            KvTypeArg::F32 => KvType::F32,
        }
    }
}

/// The CUDA engine's flags (the CPU engine ignores all but `ubatch`).
#[derive(clap::Args, Clone, Debug)]
pub struct CudaArgs {
    /// Kernel profile: a name in variants/profiles/ (main, flash-swa, attn-mma, decode-km, strict, cublas, mma-sync, dp4a, mmq, q6k-head, kq-split) or a path to a .toml.
    #[arg(long, default_value = "main")]
    pub profile: String,
    /// K/V cache type (default: the profile's, else f16).
    #[arg(long, value_enum)]
    pub kv_type: Option<KvTypeArg>,
    /// Run decode steps eagerly instead of replaying a captured CUDA graph.
    #[arg(long)]
    pub no_graph: bool,
    /// Print GPU time per forward phase (CUDA events) at the end.
    #[arg(long)]
    pub profile_phases: bool,
    /// Tuned table to read instead of the committed one for the device.
    #[arg(long)]
    pub tuned: Option<PathBuf>,
    /// CUDA device ordinal (default 0); must exist on every backend.
    #[arg(long, value_parser = crate::cli::count)]
    pub device: Option<usize>,
    /// Run every layer over every prompt row. By default the layers from the
    /// first one that writes no KV cache (the KV-shared layers of E2B/E4B)
    /// carry only the rows whose logits are wanted, which is exact; this is
    /// the work of engines without that trim, for equal-work comparisons.
    #[arg(long)]
    pub full_work: bool,
}

impl CudaArgs {
    pub fn device(&self) -> usize {
        self.device.unwrap_or(0)
    }
    pub fn row_work(&self) -> RowWork {
        if self.full_work {
            RowWork::Full
        } else {
            RowWork::Trimmed
        }
    }
}

/// Why CUDA device `ordinal` cannot be used (no driver, no GPU, no such
/// ordinal), or `Ok` when the driver reports it. Opens no context.
pub fn gpu_status(ordinal: usize) -> Result<(), String> {
    match gemtune_kernels::gpu::device_count() {
        Ok(n) if ordinal < n => Ok(()),
        Ok(0) => Err("no CUDA GPU: the driver reports no device".into()),
        Ok(n) => Err(format!(
            "no CUDA device {ordinal}: the driver reports {n} (ordinals 0 to {})",
            n - 1
        )),
        Err(e) => Err(e.to_string()),
    }
}

/// `auto` resolved to a runnable backend, with the reason when `auto`
/// fell back to the CPU.
pub fn resolve_backend(b: Backend, ordinal: usize) -> (Backend, Option<String>) {
    match b {
        Backend::Auto => match gpu_status(ordinal) {
            Ok(()) => (Backend::Cuda, None),
            Err(why) => (Backend::Cpu, Some(why)),
        },
        other => (other, None),
    }
}

/// The profile and tuned table `cuda` names, read and checked whatever the
/// backend (errors name the file and line).
pub fn load_choices(cuda: &CudaArgs) -> anyhow::Result<(Profile, Option<TunedFile>)> {
    let profile = Profile::load(&cuda.profile)?;
    let tuned = cuda
        .tuned
        .as_deref()
        .map(gemtune_engine::tuned::read)
        .transpose()?;
    Ok((profile, tuned))
}

/// Builds the engine for `backend` over `model` with room for `max_seq`
/// positions; the CPU engine batches `cpu_batch` tokens, the CUDA engine
/// prefills in chunks of `cuda_ubatch` (the chunk the CPU-side check of
/// the kernel choices plans at too).
pub fn build_engine<'m>(
    model: &'m Model,
    backend: Backend,
    cuda: &CudaArgs,
    max_seq: usize,
    cpu_batch: usize,
    cuda_ubatch: usize,
) -> anyhow::Result<Box<dyn Engine + 'm>> {
    let (profile, tuned) = load_choices(cuda)?;
    match resolve_backend(backend, cuda.device()).0 {
        Backend::Cpu => {
            if let Some(d) = cuda.device {
                if let Err(why) = gpu_status(d) {
                    bail!("--device {d}: {why}");
                }
            }
            if cuda.profile_phases {
                bail!("--profile-phases measures GPU phases; it needs --backend cuda");
            }
            crate::choices::check(model, &profile, tuned.as_ref(), max_seq, cuda_ubatch)?;
            Ok(Box::new(CpuEngine::new(
                model,
                CpuOptions {
                    max_seq,
                    max_batch: cpu_batch.max(1),
                    row_work: cuda.row_work(),
                },
            )?))
        }
        _ => {
            let mut o = CudaOptions::new(profile);
            o.max_seq = max_seq;
            o.ubatch = cuda_ubatch.max(1);
            o.kv_type = cuda.kv_type.map(KvType::from);
            o.graph = !cuda.no_graph;
            o.phases = cuda.profile_phases;
            o.device = cuda.device();
            o.row_work = cuda.row_work();
            o.tuned = tuned;
            Ok(Box::new(CudaEngine::new(model, o)?))
        }
    }
}

/// Prints the per-phase table of an engine that measured phases.
pub fn print_phases(engine: &mut dyn Engine) {
    if let Some(p) = engine.take_phases() {
        print_phase_table(&p, 1.0);
    }
}

/// Prints `p` (stderr) with every time and mark count divided by `per`
/// (the decode steps it covers, or 1), and the total.
pub fn print_phase_table(p: &PhaseTimes, per: f64) {
    let total = p.total_ms();
    eprintln!(
        "{:<14} {:>12} {:>8} {:>9}",
        "phase", "GPU ms", "share", "marks"
    );
    for (name, ms, n) in &p.phases {
        eprintln!(
            "{name:<14} {:>12.4} {:>7.1}% {:>9}",
            ms / per,
            if total > 0.0 { 100.0 * ms / total } else { 0.0 },
            (*n as f64 / per).round()
        );
    }
    eprintln!("{:<14} {:>12.4}", "sum of phases", total / per);
}
