//! `CudaEngine`: one sequence on one GPU, built at load from a model, a
//! profile and the device's tuned table.
//!
//! `new` does everything once: it plans the forward pass (`ForwardPlan`),
//! checks that the model fits, uploads the weights in the layouts the plan
//! reads, allocates the cache and the activation buffers, and compiles and
//! loads every kernel the plan launches. The stages (`stages`) and the
//! chunk loop (`forward`) then only execute the plan.

use gemtune_kernels::family::KvType;
use gemtune_kernels::gpu::{Gpu, GpuError};
use gemtune_kernels::runtime::{Graph, Kernel, KernelCache, PinnedBuf};

use super::buffers::MoeBuffers;
use super::buffers::{self, Buffers, Scratch};
use super::forward_plan::{attn_scratch_bytes, BucketPlan, ForwardPlan, LoadedKernels, Sizing};
use super::kv_cache::KvCache;
use super::model_dims::ModelDims;
use super::phases::Phases;
use super::planner::{Decision, PlanError, Planner};
use super::weights::{self, DeviceWeights};
use crate::config::{AttnKind, Gemma4Config};
use crate::engine::EngineError;
use crate::model::Model;
use crate::profile::{DecodeLaunch, Profile};
use crate::tuned::TunedFile;
use crate::work::RowWork;

/// The committed tuned tables, by architecture.
pub const BUILTIN_TUNED: &[(&str, &str)] =
    &[("sm_90", include_str!("../../../variants/tuned/sm_90.toml"))];

/// The default prefill chunk: the largest the engine's prefill buffers are
/// sized for without growing past a few hundred MB on the 12B/31B shapes.
pub const DEFAULT_UBATCH: usize = 2048;

/// Device memory held back for the driver, the loaded modules and cuBLAS's
/// workspace when checking that a model fits.
const DRIVER_MARGIN: u64 = 256 << 20;

/// How a CUDA engine is built.
#[derive(Clone, Debug)]
pub struct CudaOptions {
    /// Most positions the cache holds (capped at the context length).
    pub max_seq: usize,
    /// Most tokens per prefill chunk (sizes the buffers and the SWA rings).
    pub ubatch: usize,
    /// K/V cache type; `None`: the profile's, else F16.
    pub kv_type: Option<KvType>,
    pub profile: Profile,
    /// The tuned table; `None`: the committed one for the device, if any.
    pub tuned: Option<TunedFile>,
    /// Capture decode steps as a CUDA graph and replay it.
    pub graph: bool,
    /// Measure GPU time per phase with events.
    pub phases: bool,
    pub device: usize,
    /// The rows the layers after the last cache-writing layer run.
    pub row_work: RowWork,
}

impl CudaOptions {
    pub fn new(profile: Profile) -> CudaOptions {
        CudaOptions {
            max_seq: 4096,
            ubatch: DEFAULT_UBATCH,
            kv_type: None,
            profile,
            tuned: None,
            graph: true,
            phases: false,
            device: 0,
            row_work: RowWork::Trimmed,
        }
    }
}

/// A CUDA inference session: one sequence on one GPU.
pub struct CudaEngine<'m> {
    pub(super) model: &'m Model,
    pub(super) gpu: Gpu,
    /// Kept for `run -v` and for the lookup count the tests read; the
    /// forward pass never asks it anything.
    pub(super) planner: Planner,
    pub(super) plan: ForwardPlan,
    pub(super) kernels: LoadedKernels,
    /// The last prefill chunk length whose grids differ from its bucket's
    /// bound, with the kernels at those grids (`ForwardPlan::kernels_at`).
    pub(super) regridded: Option<(usize, Vec<Kernel>)>,
    pub(super) w: DeviceWeights,
    pub(super) kv: KvCache,
    pub(super) b: Buffers,
    /// The expert block's buffers (MoE models).
    pub(super) moe_buffers: Option<MoeBuffers>,
    pub(super) pos: usize,
    pub(super) use_graph: bool,
    pub(super) graph: Option<Graph>,
    /// How the captured decode step orders its launches (the profile's
    /// `decode_launch`), and the chain's state while it is captured.
    pub(super) decode_launch: DecodeLaunch,
    pub(super) chain: super::launch_chain::LaunchChain,
    pub(super) phases: std::cell::RefCell<Option<Phases>>,
    /// The phase timing while turned off (`set_phases`), kept with its
    /// timed decode graph for the next time it is turned on.
    pub(super) parked_phases: Option<Phases>,
    pub(super) staging_i32: PinnedBuf<i32>,
    pub(super) staging_logits: PinnedBuf<f32>,
    /// Per-layer activations, when enabled (tests and debugging).
    pub(super) trace: std::cell::RefCell<Option<crate::cpu::Trace>>,
    /// cuBLAS, when a slot is served by the vendor GEMM.
    pub(super) cublas: Option<gemtune_kernels::reference::Cublas>,
    /// Kernels compiled and loaded at load time (for the no-compile-after-
    /// load check).
    pub(super) cache: KernelCache,
    /// What a decode step reads apart from the cache (`step_reads`).
    pub(super) step_reads: crate::step_bytes::StepReads,
    /// The file's bytes of the tensors the weights were uploaded from
    /// (`ModelDims::file_bytes`), next to `weight_bytes`.
    pub(super) file_weight_bytes: u64,
    /// Every weight converted lossily at load (`ModelDims::converted`).
    pub(super) conversions: Vec<String>,
    /// Every weight read widened, values kept (`ModelDims::widened`).
    pub(super) widenings: Vec<String>,
}

pub(super) fn dev(e: GpuError) -> EngineError {
    EngineError::Device(e.to_string())
}

pub(super) fn plan_err(e: PlanError) -> EngineError {
    EngineError::Device(e.to_string())
}

/// The tuned table an engine on `arch` reads: `given`, else the committed
/// one for the architecture, if any.
pub fn tuned_table(given: Option<TunedFile>, arch: &str) -> Result<Option<TunedFile>, EngineError> {
    match given {
        Some(t) => Ok(Some(t)),
        None => BUILTIN_TUNED
            .iter()
            .find(|(a, _)| *a == arch)
            .map(|(a, text)| TunedFile::parse(&format!("builtin:{a}"), text))
            .transpose()
            .map_err(|e| EngineError::Device(e.to_string())),
    }
}

/// The cache type: the option's, else the profile's, else F16.
pub fn kv_type(opts: &CudaOptions) -> Result<KvType, EngineError> {
    match (opts.kv_type, &opts.profile.kv_type) {
        (Some(t), _) => Ok(t),
        (None, Some(s)) => KvType::from_name(s).ok_or_else(|| {
            EngineError::Device(format!(
                "profile {}: kv_type '{s}' is not F16, BF16 or F32",
                opts.profile.name
            ))
        }),
        (None, None) => Ok(KvType::F16),
    }
}

impl<'m> CudaEngine<'m> {
    /// Opens the GPU, plans every launch, checks that the model fits,
    /// uploads the weights, allocates the cache and buffers, and loads
    /// every planned kernel.
    pub fn new(model: &'m Model, opts: CudaOptions) -> Result<CudaEngine<'m>, EngineError> {
        let cfg = model.config();
        check_config(cfg)?;
        let gpu = Gpu::new(opts.device).map_err(dev)?;
        let limits = gpu.limits();
        let tuned = tuned_table(opts.tuned.clone(), &limits.arch.to_string())?;
        let max_seq = opts.max_seq.clamp(1, cfg.context_length.max(1));
        let sizing = Sizing {
            max_seq,
            ubatch: opts.ubatch.clamp(1, max_seq),
            kv_type: kv_type(&opts)?,
        };
        let planner = Planner::new(opts.profile.clone(), tuned, limits);
        let dims = ModelDims::of_model(model, &planner);
        let mut plan = ForwardPlan::resolve(&planner, cfg, &dims, sizing).map_err(plan_err)?;
        plan.set_row_work(cfg, opts.row_work);
        let step_reads = super::step_reads::of_plan(&plan, cfg, &dims).ok_or_else(|| {
            EngineError::Device("the plan has no one-row decode bucket with a head".into())
        })?;

        let scratch = Scratch {
            attn: attn_scratch_bytes(cfg, &sizing),
            scales: super::forward_plan::scale_scratch_bytes(&plan),
        };
        refuse_lossy(&planner.profile, &dims)?;
        let need = super::model_dims::model_bytes(&dims, &plan.layouts)
            + super::kv_cache::cache_bytes(cfg, sizing.max_seq, sizing.ubatch, sizing.kv_type)
            + Buffers::bytes_for(cfg, model.vocab_size(), sizing.ubatch, scratch)
            + MoeBuffers::bytes_for(cfg, sizing.ubatch, plan.moe_gemm_bm())
            + DRIVER_MARGIN;
        let (free, total) = gpu.mem_info().map_err(dev)?;
        if need > free as u64 {
            return Err(EngineError::Device(format!(
                "the model does not fit: it needs {need} bytes of device memory ({:.2} GiB: weights, {} KV cache, buffers) and the GPU has {free} bytes free of {total} ({:.2} GiB free)",
                need as f64 / (1u64 << 30) as f64,
                sizing.kv_type.name(),
                free as f64 / (1u64 << 30) as f64
            )));
        }
        let w = weights::upload(&gpu, model, &plan.layouts).map_err(dev)?;
        let kv = KvCache::new(&gpu, cfg, &sizing).map_err(dev)?;
        let b = Buffers::new(&gpu, cfg, model.vocab_size(), sizing.ubatch, scratch).map_err(dev)?;
        let moe_buffers =
            MoeBuffers::new(&gpu, cfg, sizing.ubatch, plan.moe_gemm_bm()).map_err(dev)?;
        let staging_i32 = PinnedBuf::new(&gpu, sizing.ubatch + 4).map_err(dev)?;
        let staging_logits =
            PinnedBuf::new(&gpu, buffers::HEAD_ROWS * model.vocab_size()).map_err(dev)?;
        let cublas = if plan.uses_vendor {
            Some(gemtune_kernels::reference::Cublas::new(&gpu).map_err(|e| {
                EngineError::Device(format!("profile {} uses cuBLAS: {e}", planner.profile.name))
            })?)
        } else {
            None
        };
        let cache = KernelCache::new(None);
        let kernels = plan.load(&gpu, &cache).map_err(plan_err)?;
        gpu.synchronize().map_err(dev)?;
        let decode_launch = planner.profile.decode_launch;
        Ok(CudaEngine {
            model,
            gpu,
            planner,
            plan,
            kernels,
            regridded: None,
            w,
            kv,
            b,
            moe_buffers,
            pos: 0,
            use_graph: opts.graph,
            graph: None,
            decode_launch,
            chain: Default::default(),
            phases: std::cell::RefCell::new(opts.phases.then(Phases::new)),
            parked_phases: None,
            staging_i32,
            staging_logits,
            trace: std::cell::RefCell::new(None),
            cublas,
            cache,
            step_reads,
            file_weight_bytes: dims.file_bytes,
            conversions: dims.converted,
            widenings: dims.widened,
        })
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }
    pub fn kv_type(&self) -> KvType {
        self.kv.kv_type
    }
    /// Device bytes of the KV cache.
    pub fn cache_bytes(&self) -> u64 {
        self.kv.bytes()
    }
    /// Device bytes of the weights (every layout uploaded).
    pub fn weight_bytes(&self) -> u64 {
        self.w.bytes
    }
    /// The file's bytes of the tensors the weights were uploaded from.
    pub fn file_weight_bytes(&self) -> u64 {
        self.file_weight_bytes
    }
    /// Lines naming every matrix converted lossily at load (empty when
    /// every weight is read in its own type).
    pub fn conversions(&self) -> &[String] {
        &self.conversions
    }
    /// Lines naming every matrix read in a wider type than the file's with
    /// every value kept (Q4_0 / Q5_0 as Q8_0).
    pub fn widenings(&self) -> &[String] {
        &self.widenings
    }
    /// Device bytes of the bf16 weight copies of the cuBLAS profile.
    pub fn extra_bf16_bytes(&self) -> u64 {
        self.w.bf16_bytes
    }
    pub fn buffer_bytes(&self) -> u64 {
        self.b.bytes()
    }
    /// Kernel launches enqueued as programmatic dependents of the launch
    /// before them (a chained decode step's, counted once per capture).
    pub fn chained_launches(&self) -> u64 {
        self.chain.chained()
    }
    /// Graph replays so far (tests assert decode replayed the graph).
    pub fn graph_replays(&self) -> u64 {
        self.graph.as_ref().map(|g| g.replays()).unwrap_or(0)
    }
    /// Replays of the timed decode graph of the current phase measurement
    /// (0 when phases are off).
    pub fn timed_graph_replays(&self) -> u64 {
        self.phases
            .borrow()
            .as_ref()
            .map_or(0, |p| p.graph_replays())
    }
    pub fn ubatch(&self) -> usize {
        self.plan.sizing.ubatch
    }
    /// The plan this engine executes.
    pub fn plan(&self) -> &ForwardPlan {
        &self.plan
    }
    pub fn decisions(&self) -> Vec<Decision> {
        self.plan.decisions()
    }
    /// Slot resolutions the planner has made since it was created (all of
    /// them at load: a forward pass makes none).
    pub fn planner_lookups(&self) -> usize {
        self.planner.lookups()
    }
    /// Distinct variants compiled and loaded since load (all of them at
    /// load: a forward pass loads none).
    pub fn kernels_loaded(&self) -> usize {
        self.cache.compiled().len()
    }

    /// The bucket a chunk of `rows` rows runs.
    pub(super) fn bucket(&self, rows: usize) -> Result<&BucketPlan, EngineError> {
        self.plan.bucket(rows).ok_or_else(|| {
            EngineError::Device(format!(
                "no planned bucket for {rows} rows (chunks hold 1..={})",
                self.plan.sizing.ubatch
            ))
        })
    }

    /// Lines for `run -v`: the device and memory, conversions at load,
    /// then the plan.
    pub(super) fn describe_lines(&self) -> Vec<String> {
        let info = self.gpu.info();
        let s = &self.plan.sizing;
        let mut v = vec![
            format!(
                "cuda: {} (sm_{}{}, {} SMs), profile {} ({})",
                info.name,
                info.cc.0,
                info.cc.1,
                info.sm_count,
                self.planner.profile.name,
                self.planner.profile.source
            ),
            format!(
                "device memory: weights {} B ({:.3}x the file's {} B of those tensors), KV cache {} B ({}), buffers {} B; ubatch {}, max_seq {}",
                self.w.bytes,
                self.w.bytes as f64 / self.file_weight_bytes.max(1) as f64,
                self.file_weight_bytes,
                self.kv.bytes(),
                self.kv.kv_type.name(),
                self.b.bytes(),
                s.ubatch,
                s.max_seq
            ),
        ];
        if self.w.bf16_bytes > 0 {
            v.push(format!(
                "bf16 weight copies (cuBLAS profile): {} B extra",
                self.w.bf16_bytes
            ));
        }
        for c in &self.conversions {
            v.push(format!("converted at load: {c}"));
        }
        for w in &self.widenings {
            v.push(format!("widened at load: {w}"));
        }
        // In the "slot: kernel <- why" form, so `ab` lists it among the
        // differing slots when the arms differ in it.
        let chained = self.chains_decode();
        v.push(format!(
            "decode launches: {} <- profile {} (decode_launch = \"{}\"{}){}",
            if chained { "chained" } else { "plain" },
            self.planner.profile.name,
            self.decode_launch.name(),
            if self.decode_launch == DecodeLaunch::ChainedDense && !chained {
                ": a mixture-of-experts model keeps stream order"
            } else {
                ""
            },
            if chained && info.cc.0 < 9 {
                "; below sm_90 chained launches run in stream order"
            } else {
                ""
            }
        ));
        v.extend(self.plan.describe());
        v
    }
}

/// A lossless profile (`strict`) refuses a model whose weights the engine
/// would convert lossily at load (`ModelDims::converted`), naming them.
pub fn refuse_lossy(profile: &Profile, dims: &ModelDims) -> Result<(), EngineError> {
    if profile.lossless && !dims.converted.is_empty() {
        return Err(EngineError::Device(format!(
            "profile {} converts no weights lossily, and this model needs {} conversion(s): {}",
            profile.name,
            dims.converted.len(),
            dims.converted.join("; ")
        )));
    }
    Ok(())
}

/// What a model's weights take on the device under a profile, planned
/// without a GPU (`gemtune info`).
#[derive(Clone, Debug)]
pub struct WeightPlan {
    /// Device bytes of the weights in the layouts the plan reads.
    pub device_bytes: u64,
    /// The file's bytes of the tensors they are uploaded from.
    pub file_bytes: u64,
    /// Every lossy conversion at load (`ModelDims::converted`).
    pub converted: Vec<String>,
    /// Every exact widening at load (`ModelDims::widened`).
    pub widened: Vec<String>,
}

/// Plans `model` under `profile` on `arch` (with the committed tuned table
/// for it, the default cache and chunk sizes) and returns what its weights
/// take on the device.
pub fn weight_plan(
    model: &Model,
    profile: Profile,
    arch: gemtune_kernels::compile::Arch,
) -> Result<WeightPlan, EngineError> {
    let cfg = model.config();
    let tuned = tuned_table(None, &arch.to_string())?;
    let planner = Planner::new(
        profile,
        tuned,
        gemtune_kernels::family::DeviceLimits::for_arch(arch),
    );
    let dims = ModelDims::of_model(model, &planner);
    let max_seq = 4096.min(cfg.context_length.max(1));
    let sizing = Sizing {
        max_seq,
        ubatch: DEFAULT_UBATCH.min(max_seq),
        kv_type: KvType::F16,
    };
    let plan = ForwardPlan::resolve(&planner, cfg, &dims, sizing).map_err(plan_err)?;
    Ok(WeightPlan {
        device_bytes: super::model_dims::model_bytes(&dims, &plan.layouts),
        file_bytes: dims.file_bytes,
        converted: dims.converted,
        widened: dims.widened,
    })
}

/// Refuses configs the kernels cannot run, before touching the GPU.
fn check_config(cfg: &Gemma4Config) -> Result<(), EngineError> {
    super::forward_plan::refuse_unsupported(cfg).map_err(plan_err)?;
    let bad = |m: String| Err(EngineError::Device(m));
    if cfg.d_model % 32 != 0 {
        return bad(format!(
            "d_model {} is not a multiple of 32 (the quant block)",
            cfg.d_model
        ));
    }
    for l in &cfg.layers {
        if l.n_kv_heads == 0 || l.n_heads % l.n_kv_heads != 0 {
            return bad(format!(
                "layer {}: {} query heads over {} KV heads",
                l.index, l.n_heads, l.n_kv_heads
            ));
        }
        let r = cfg.rope(l.kind);
        if r.dims != l.head_dim {
            return bad(format!(
                "layer {}: RoPE over {} of {} head dims; the qk_norm_rope kernel rotates whole heads",
                l.index, r.dims, l.head_dim
            ));
        }
        if l.ffn_dim % 32 != 0 || l.head_dim % 32 != 0 {
            return bad(format!(
                "layer {}: widths must be multiples of 32 (ffn {}, head dim {})",
                l.index, l.ffn_dim, l.head_dim
            ));
        }
        if l.kind == AttnKind::Sliding && cfg.sliding_window == 0 {
            return bad("a sliding layer with a zero window".into());
        }
    }
    Ok(())
}
