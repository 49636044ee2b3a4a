//! The engine flags `run`, `logits` and `bench` share, and the one place
//! that turns them into an engine (CPU or CUDA) behind `Engine`.

use std::path::PathBuf;

use anyhow::{bail, Context};
use gemtune_engine::cpu::{CpuEngine, CpuOptions};
use gemtune_engine::cuda::{CudaEngine, CudaOptions};
use gemtune_engine::engine::Engine;
use gemtune_engine::model::Model;
use gemtune_engine::profile::Profile;
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
    /// Kernel profile: a name in variants/profiles/ (main, flash-swa, attn-mma, decode-km, strict, cublas, mma-sync, dp4a, mmq, q6k-head) or a path to a .toml.
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
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
}

/// Whether a CUDA GPU can be opened (the `auto` backend's test).
pub fn gpu_present() -> bool {
    gemtune_kernels::gpu::Gpu::new(0).is_ok()
}

/// Resolves `auto` to a runnable backend.
pub fn resolve_backend(b: Backend) -> Backend {
    match b {
        Backend::Auto if gpu_present() => Backend::Cuda,
        Backend::Auto => Backend::Cpu,
        other => other,
    }
}

/// Builds the engine for `backend` over `model` with room for `max_seq`
/// positions and prefill chunks of `ubatch` tokens.
pub fn build_engine<'m>(
    model: &'m Model,
    backend: Backend,
    cuda: &CudaArgs,
    max_seq: usize,
    ubatch: usize,
) -> anyhow::Result<Box<dyn Engine + 'm>> {
    match resolve_backend(backend) {
        Backend::Cpu => {
            if cuda.profile_phases {
                bail!("--profile-phases measures GPU phases; it needs --backend cuda");
            }
            Ok(Box::new(CpuEngine::new(
                model,
                CpuOptions {
                    max_seq,
                    max_batch: ubatch.max(1),
                },
            )?))
        }
        _ => {
            let profile = Profile::load(&cuda.profile)?;
            let mut o = CudaOptions::new(profile);
            o.max_seq = max_seq;
            o.ubatch = ubatch.max(1);
            o.kv_type = cuda.kv_type.map(KvType::from);
            o.graph = !cuda.no_graph;
            o.phases = cuda.profile_phases;
            o.device = cuda.device;
            if let Some(p) = &cuda.tuned {
                o.tuned = Some(
                    gemtune_engine::tuned::read(p)
                        .with_context(|| format!("reading the tuned table {}", p.display()))?,
                );
            }
            Ok(Box::new(CudaEngine::new(model, o)?))
        }
    }
}

/// Prints the per-phase table of an engine that measured phases.
pub fn print_phases(engine: &mut dyn Engine) {
    if let Some(p) = engine.take_phases() {
        let total = p.total_ms();
        eprintln!(
            "{:<14} {:>12} {:>8} {:>9}",
            "phase", "GPU ms", "share", "launches"
        );
        for (name, ms, n) in &p.phases {
            eprintln!(
                "{name:<14} {ms:>12.3} {:>7.1}% {n:>9}",
                if total > 0.0 { 100.0 * ms / total } else { 0.0 }
            );
        }
        eprintln!("{:<14} {total:>12.3}", "total");
    }
}
